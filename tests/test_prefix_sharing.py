"""A conversation that shares a prompt prefix with another (a coding agent's subagent, or a second
agent: the same system prompt and tools, another task) starts from the other's state, copied
(DecoderModel.copy_prefix, Session.take_prefix), instead of computing the prefix again, and the
other conversation keeps its own state; a model whose caches are not all read by position
(recurrent layers) computes it again, as before."""

from __future__ import annotations

import pytest
import torch

from runtime.engine import ParkedConversation, Session
from runtime.loading.registered import open_model
from runtime.loading.runnable import load
from runtime.models.base import DecodeState
from runtime.text.sampling import SamplingParams
from runtime.text.tokenizer import Tokenizer
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
    assert [c.tokens for c in pool.parked] == [held] and pool.parked_bytes > 0
    turn = held + [7, 8, 9]
    again_session, again = _generation(pool, turn)
    assert again_session is session and again.stats.cached_tokens == len(held)
    assert again.tokens == Session(model, tokenizer, 256).generate(turn, GREEDY).tokens
    assert [c.tokens[:2] for c in pool.parked] == [[200, 201]]  # the side request's, parked in turn

    unparked = SessionPool(lambda context: Session(model, tokenizer, context), 256, size=1)
    _generation(unparked, main)
    _generation(unparked, side)
    assert _generation(unparked, turn)[1].stats.cached_tokens == 0 and not unparked.parked


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
    assert held in [c.tokens for c in pool.parked]  # still parked, whole
    turn = held + [7, 8, 9]
    _, again = _generation(pool, turn)
    assert again.stats.cached_tokens == len(held)
    assert again.tokens == Session(model, tokenizer, 256).generate(turn, GREEDY).tokens
    assert held not in [c.tokens for c in pool.parked]  # continued whole: the session holds it now


def test_the_oldest_parked_conversation_goes_first_when_the_budget_is_full(tiny) -> None:
    from runtime.server.session_pool import SessionPool

    model, tokenizer = tiny
    pool = SessionPool(lambda context: Session(model, tokenizer, context), 256, size=1, park_bytes=1 << 30)
    conversations = [[300 + i] + list(range(5, 100)) for i in range(3)]
    for prompt in conversations:
        _generation(pool, prompt)
    one = pool.parked[0].state.nbytes
    assert len(pool.parked) == 2
    pool.park_bytes = one + one // 2  # room for one
    _generation(pool, [400] + list(range(5, 100)))
    assert [c.tokens[0] for c in pool.parked] == [302]


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
        assert shown["parked_sessions"] == 1 and 0 < shown["parked_bytes"] <= shown["park_budget_bytes"]
        turn = [*main, {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Now run the tests."}]
        second = client.chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0)
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_parking_a_conversation_again_copies_only_what_it_added(tiny) -> None:
    """A conversation parked, brought back and gone on, then parked again: the second parking shares
    the first one's rows (the same host memory) and copies only the tokens added since; a prefix of
    it (a subagent's shared system prompt) shares them too. Brought back, either answers as one
    computed whole."""
    from runtime.models.state_copy import host_bytes

    model, tokenizer = tiny
    first_turn = list(range(5, 105))
    session = Session(model, tokenizer, 256)
    session.generate(first_turn, GREEDY)
    parked = session.park()
    assert parked is not None and len(parked.state.parts) == 1 and session.parked_copy is parked
    held = list(session.tokens)
    other = Session(model, tokenizer, 256)
    assert other.unpark(parked) and other.parked_copy is parked
    other.generate(held + [7, 8, 9], GREEDY)
    again = other.park()
    assert again is not None and again.state.parts[0] is parked.state.parts[0]  # shared, not copied
    assert [(p.start, p.end) for p in again.state.parts] == [(0, len(held)), (len(held), len(other.tokens))]
    assert host_bytes([parked.state, again.state]) == again.state.nbytes < parked.state.nbytes + again.state.nbytes

    turn = list(again.tokens) + [11, 12]
    back = Session(model, tokenizer, 256)
    assert back.unpark(again)
    reply = back.generate(turn, GREEDY)
    assert reply.stats.cached_tokens == len(again.tokens)
    assert reply.tokens == Session(model, tokenizer, 256).generate(turn, GREEDY).tokens

    shared = again.state.prefix(50)  # the first 50 positions, views of the same rows
    assert shared is not None and shared.length == 50 and host_bytes([again.state, shared]) == again.state.nbytes
    sub = Session(model, tokenizer, 256)
    assert sub.unpark(ParkedConversation(again.tokens[:50], 50, shared))
    sub_turn = again.tokens[:50] + [13, 14, 15]
    assert sub.generate(sub_turn, GREEDY).tokens == Session(model, tokenizer, 256).generate(sub_turn, GREEDY).tokens


def test_a_pool_parks_the_main_conversation_incrementally_at_each_switch(tiny) -> None:
    """One session, a side request between every main turn: each time the main conversation is
    parked again it shares its earlier rows, so the parked memory grows by the turns added, not by
    the whole history; every main turn finds its whole history and answers as computed whole."""
    from runtime.server.session_pool import SessionPool

    model, tokenizer = tiny
    pool = SessionPool(lambda context: Session(model, tokenizer, context), 512, size=1, park_bytes=1 << 30)
    main, held = list(range(5, 105)), []
    parkings = []
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
        parkings.append(next(c for c in pool.parked if c.tokens == held))
        main = held + [7 + turn, 8, 9]
    last = parkings[-1].state
    assert [p.start for p in last.parts] == [0] + [len(c.tokens) for c in parkings[:-1]]  # one part a parking
    assert all(last.parts[i] is c.state.parts[i] for i, c in enumerate(parkings))  # the earlier ones' own rows
    assert not any(c.tokens == parkings[0].tokens for c in pool.parked)  # superseded by the later parkings


def _generation_at(pool, prompt: list[int], context: int):
    session = pool.choose(prompt, context)
    try:
        return session.generate(prompt, GREEDY)
    finally:
        pool.give_back(session)
