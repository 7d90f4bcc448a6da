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
