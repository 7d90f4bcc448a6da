"""A conversation that shares a prompt prefix with another (a coding agent's subagent, or a second
agent: the same system prompt and tools, another task) starts from the other's state, copied
(DecoderModel.copy_prefix, Session.take_prefix), instead of computing the prefix again, and the
other conversation keeps its own state; a model whose caches are not all read by position
(recurrent layers) computes it again, as before."""

from __future__ import annotations

import pytest
import torch

from runtime.engine import Session
from runtime.loading.registered import open_model
from runtime.loading.runnable import load
from runtime.models.base import DecodeState
from runtime.text.sampling import SamplingParams
from runtime.text.tokenizer import Tokenizer
from tests.test_prefix_blocks import _stored
from tests.test_server_util import LiveServer, pulled_home

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return pulled_home(tmp_path_factory.mktemp("sharing-home"))


@pytest.fixture(scope="module")
def tiny(store):
    return load(store, "tiny", torch.float32).model, Tokenizer.from_model(open_model(store, "tiny"))


def test_a_copied_prefix_answers_as_one_computed(tiny) -> None:
    model, tokenizer = tiny
    shared, first_task, second_task = list(range(5, 105)), [7, 8, 9, 10], [11, 12, 13]
    donor = Session(model, tokenizer, 256)
    donor.generate(shared + first_task, GREEDY)
    held = list(donor.tokens)
    taker = Session(model, tokenizer, 256)
    assert taker.take_prefix(donor, len(shared))
    reply = taker.generate(shared + second_task, GREEDY)
    assert (reply.stats.cached_tokens, reply.stats.prompt_tokens) == (len(shared), len(second_task))
    fresh = Session(model, tokenizer, 256).generate(shared + second_task, GREEDY)
    assert reply.tokens == fresh.tokens
    assert donor.tokens == held and donor.state.length == len(held)  # the donor keeps its own
    again = donor.generate(held + [3], GREEDY)
    assert again.stats.cached_tokens == len(held)


def test_caches_not_read_by_position_are_not_copied(tiny, monkeypatch) -> None:
    model, tokenizer = tiny
    source, target = model.new_state(64), model.new_state(64)
    model.forward(torch.arange(5, 25), source)
    assert model.copy_prefix(source, target, 10) and target.length == 10
    assert not model.copy_prefix(source, model.new_state(32), 10)  # another size
    assert not model.copy_prefix(source, target, 30)  # more than it holds

    class Summary:  # a running state: no row a position
        def __init__(self) -> None:
            self.total = torch.zeros(3, 4)

    odd = DecodeState(64, [*source.caches[:-1], Summary()], length=20)
    assert not model.copy_prefix(odd, DecodeState(64, [*target.caches[:-1], Summary()]), 10)
    donor, taker = Session(model, tokenizer, 64), Session(model, tokenizer, 64)
    donor.generate(list(range(5, 25)), GREEDY)
    monkeypatch.setattr(model.blocks[0].mixer, "recurrent", True, raising=False)  # a recurrent layer: no copy
    assert not model.rewinds and not taker.take_prefix(donor, 10)
    assert taker.tokens == [] and taker.state.length == 0


def test_a_subagent_sharing_the_system_prompt_starts_from_the_main_conversation(store) -> None:
    """Through ft serve: the main conversation, then a subagent with the same long system prompt and
    another task (its prompt served from the main one's state, as the API reports), then the main
    conversation's next turn, still whole."""
    import openai

    system = {"role": "system", "content": "You are a careful coding agent. " + " ".join(
        f"Rule {i}: read the file before you edit it, and run the tests after." for i in range(12))}
    main = [system, {"role": "user", "content": "Fix the failing test in the parser."}]
    subagent = [system, {"role": "user", "content": "Search the repository for uses of parse_header."}]
    with LiveServer(store) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        first = client.chat.completions.create(model="tiny", messages=main, max_tokens=8, temperature=0)
        assert first.usage.prompt_tokens > 2 * 64
        sub = client.chat.completions.create(model="tiny", messages=subagent, max_tokens=8, temperature=0)
        shared = sub.usage.prompt_tokens_details.cached_tokens
        assert 64 <= shared < sub.usage.prompt_tokens and shared > 0.7 * first.usage.prompt_tokens
        turn = [*main, {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Now run the tests."}]
        second = client.chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0)
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def _generation(pool, prompt: list[int]):
    session = pool.choose(prompt, 256)
    try:
        return session, session.generate(prompt, GREEDY)
    finally:
        pool.give_back(session)


def test_a_parked_conversation_comes_back_with_its_state(tiny) -> None:
    """One session (a GPU model's, in VRAM) and a parking budget: the main conversation, displaced
    by a side request, is parked in host memory and copied back for its next turn, which finds
    its whole history; the side request is parked in turn. No budget: it starts over, as before."""
    from runtime.server.session_pool import SessionPool

    model, tokenizer = tiny
    main = list(range(5, 105))
    side = [200, 201] + list(range(120, 190))  # another conversation, 72 tokens
    pool = SessionPool(lambda context: Session(model, tokenizer, context), 256, size=1, park_bytes=1 << 30)
    session, first = _generation(pool, main)
    held = list(session.tokens)
    _generation(pool, side)
    assert _stored(pool.parked) == [held] and pool.parked_bytes > 0
    turn = held + [7, 8, 9]
    again_session, again = _generation(pool, turn)
    assert again_session is session and again.stats.cached_tokens == len(held)
    assert again.tokens == Session(model, tokenizer, 256).generate(turn, GREEDY).tokens
    assert [c[:2] for c in _stored(pool.parked)] == [[5, 6], [200, 201]]  # the side request's, parked in turn
    assert (pool.parked.hits, pool.parked.hit_tokens) == (1, len(held))

    unparked = SessionPool(lambda context: Session(model, tokenizer, context), 256, size=1)
    _generation(unparked, main)
    _generation(unparked, side)
    assert _generation(unparked, turn)[1].stats.cached_tokens == 0 and not len(unparked.parked)


def test_a_subagent_starting_from_a_parked_conversation_leaves_it_parked(tiny) -> None:
    """One session: the main conversation, a side request (the main one parked), then a subagent
    sharing the main one's system prompt, served from the parked state, then the main
    conversation's next turn, which still finds its whole history: the subagent took a copy of the
    shared prefix, not the parked conversation (before, it was unparked for the subagent, cut to
    the shared prefix, and the main turn computed its history again)."""
    from runtime.server.session_pool import SessionPool

    model, tokenizer = tiny
    system = list(range(5, 85))  # 80 tokens shared by the main conversation and the subagent
    main = system + list(range(90, 130))
    side = [200, 201] + list(range(130, 200))
    subagent = system + [210, 211, 212]
    pool = SessionPool(lambda context: Session(model, tokenizer, context), 256, size=1, park_bytes=1 << 30)
    session, _ = _generation(pool, main)
    held = list(session.tokens)
    _generation(pool, side)
    _, sub = _generation(pool, subagent)
    assert sub.stats.cached_tokens == len(system)
    assert held in _stored(pool.parked)  # still parked, whole
    turn = held + [7, 8, 9]
    _, again = _generation(pool, turn)
    assert again.stats.cached_tokens == len(held)
    assert again.tokens == Session(model, tokenizer, 256).generate(turn, GREEDY).tokens


def test_the_oldest_parked_conversation_goes_first_when_the_budget_is_full(tiny) -> None:
    from runtime.server.session_pool import SessionPool

    model, tokenizer = tiny
    pool = SessionPool(lambda context: Session(model, tokenizer, context), 256, size=1, park_bytes=1 << 30)
    conversations = [[300 + i] + list(range(5, 100)) for i in range(3)]
    for prompt in conversations:
        _generation(pool, prompt)
    one = pool.parked.nbytes // 2
    assert len(_stored(pool.parked)) == 2
    pool.park_bytes = one + one // 2  # room for one
    _generation(pool, [400] + list(range(5, 100)))
    assert [c[0] for c in _stored(pool.parked)] == [302]


def test_a_server_with_one_session_parks_the_main_conversation_for_a_side_request(store, monkeypatch) -> None:
    """Through ft serve, as on the GPU (one session): the main conversation, a side request with
    its own system prompt, then the main conversation's next turn, which finds its history cached
    (it came back from host memory); `ft ps`'s fields show what is parked."""
    import httpx
    import openai

    from runtime.server import runner

    monkeypatch.setattr(runner, "sessions_for", lambda plan: 1)
    monkeypatch.setattr(runner, "park_bytes_for", lambda plan: 1 << 30)
    main = [{"role": "system", "content": "You are a careful coding agent. " + " ".join(
                f"Rule {i}: read the file before you edit it." for i in range(10))},
            {"role": "user", "content": "Fix the failing test in the parser."}]
    side = [{"role": "system", "content": "Write a five-word title."}, {"role": "user", "content": "fix the parser"}]
    with LiveServer(store) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        first = client.chat.completions.create(model="tiny", messages=main, max_tokens=8, temperature=0)
        client.chat.completions.create(model="tiny", messages=side, max_tokens=4, temperature=0)
        shown = httpx.get(server.url + "/api/ps", timeout=30).json()["models"][0]["ft"]
        assert shown["sessions"] == shown["max_sessions"] == 1
        assert shown["parked_blocks"] == 1 and 0 < shown["parked_bytes"] <= shown["park_budget_bytes"]
        turn = [*main, {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Now run the tests."}]
        second = client.chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0)
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_a_pool_parks_the_main_conversation_incrementally_at_each_switch(tiny) -> None:
    """One session, a side request between every main turn: each time the main conversation is
    parked again its blocks stored before are shared (the same objects) and only the blocks after
    them copied, so the parked memory grows by the turns added, not by the whole history; every
    main turn finds its whole history and answers as computed whole."""
    from runtime.models.prefix_blocks import BlockStore
    from runtime.server.session_pool import SessionPool

    model, tokenizer = tiny
    pool = SessionPool(lambda context: Session(model, tokenizer, context), 512, size=1, park_bytes=1 << 30)
    pool.parked = BlockStore(block_tokens=16)
    main, held, before = list(range(5, 105)), [], {}
    for turn in range(3):
        session = pool.choose(main, 512)
        try:
            reply = session.generate(main, GREEDY)
        finally:
            pool.give_back(session)
        if turn:
            assert reply.stats.cached_tokens == len(held)
        held = list(session.tokens)
        assert reply.tokens == Session(model, tokenizer, 512).generate(main, GREEDY).tokens
        _generation_at(pool, [200 + turn, 201] + list(range(120, 190)), 512)  # a side request parks it
        assert held in _stored(pool.parked)
        found = pool.parked.lookup(held + [0], rewinds=True)
        assert found is not None and found.length == len(held)
        now = {b.start: b for b in found.blocks}
        kept = [s for s, b in before.items() if len(b.tokens) == 16]  # the whole blocks of the last parking
        assert not turn or (kept and all(now[s] is before[s] for s in kept))  # shared, not copied again
        before = now
        main = held + [7 + turn, 8, 9]
    assert len([s for s in _stored(pool.parked) if s[0] == 5]) == 1  # the main one's latest, its older leaves replaced


def _generation_at(pool, prompt: list[int], context: int):
    session = pool.choose(prompt, context)
    try:
        return session.generate(prompt, GREEDY)
    finally:
        pool.give_back(session)
