"""Generations taking turns at a model's only state (runtime/server/time_share.py; a GPU model's one
session, forced here on the CPU's tiny model with a park budget as the GPU's has): the policy's
rule; the pool's mechanism (a conversation suspended at a turn boundary, another taking the state
over, the first restored and answering as if alone); and through ft serve, a short request
answered while a long generation streams, both greedy outputs equal to each alone, two concurrent
streams through the real openai client, and today's one-after-another where the model's state
cannot be parked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from runtime.engine import Session
from runtime.loading.registered import open_model
from runtime.loading.runnable import load
from runtime.models.prefix_blocks import BlockStore
from runtime.server.session_pool import SessionPool
from runtime.server.time_share import SwitchPolicy
from runtime.text.sampling import SamplingParams
from runtime.text.tokenizer import Tokenizer
from tests.test_server_util import LiveServer, pulled_home

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return pulled_home(tmp_path_factory.mktemp("time-share-home"))


@pytest.fixture(scope="module")
def tiny(store):
    return load(store, "tiny", torch.float32).model, Tokenizer.from_model(open_model(store, "tiny"))


# ---- the policy ------------------------------------------------------------------------------------

def test_the_policy_switches_only_for_a_waiter_after_a_quantum_worth_the_switch() -> None:
    policy = SwitchPolicy(decode_steps=16, cost_factor=4.0)
    ready = dict(waiting=1, slices=0, steps=16, held_s=1.0, switch_s=0.01, remaining_s=None)
    assert policy.should_switch(**ready)
    assert not policy.should_switch(**{**ready, "waiting": 0})  # nobody waits: no copy paid
    assert not policy.should_switch(**{**ready, "steps": 15})  # not a quantum yet
    assert policy.should_switch(**{**ready, "steps": 0, "slices": 1})  # a prompt slice is one
    assert not policy.should_switch(**{**ready, "held_s": 0.03})  # held less than 4 switches' cost
    assert not policy.should_switch(**{**ready, "remaining_s": 0.005})  # it ends sooner than a switch
    assert policy.should_switch(**{**ready, "remaining_s": 0.5})


# ---- the mechanism ---------------------------------------------------------------------------------

def _pool(model, tokenizer, park_bytes: int = 1 << 30) -> SessionPool:
    pool = SessionPool(lambda context: Session(model, tokenizer, context), 256, size=1, park_bytes=park_bytes)
    pool.parked = BlockStore(block_tokens=16)
    return pool


@pytest.mark.parametrize("park_bytes", [1 << 30, 1])  # 1: its blocks evicted, computed again on resume
def test_a_suspended_conversation_comes_back_and_answers_as_alone(tiny, park_bytes) -> None:
    model, tokenizer = tiny
    pool = _pool(model, tokenizer, park_bytes)
    first, other = list(range(5, 90)), [300, 301] + list(range(120, 170))
    a = pool.choose(first, 256)
    a.generate(first, GREEDY)  # (in the server it would be mid-generation, at a pass boundary)
    held = list(a.tokens)
    assert pool.suspend(a)
    b = pool.choose(other, 256)  # a is suspended: b takes the state over, none allocated
    assert b is not a and b.state is a.state and pool.sessions == [b]
    assert b.generate(other, GREEDY).tokens == Session(model, tokenizer, 256).generate(other, GREEDY).tokens
    pool.resume(a)  # b is still running (suspended or not): a takes the state back
    assert a.tokens == held and a.state.length == len(held) and pool.sessions == [a]
    turn = held + [7, 8, 9]
    reply = a.generate(turn, GREEDY)
    assert reply.stats.cached_tokens == len(held)
    assert reply.tokens == Session(model, tokenizer, 256).generate(turn, GREEDY).tokens
    pool.give_back(b)
    pool.give_back(a)
    assert pool.sessions == [a]


def test_a_state_that_cannot_be_parked_is_not_suspended(tiny, monkeypatch) -> None:
    """A recurrent layer whose cache cannot be saved (no checkpoint): suspend refuses, nothing
    stored, and the generation keeps the state (today's one after another)."""
    model, tokenizer = tiny
    pool = _pool(model, tokenizer)
    a = pool.choose(list(range(5, 90)), 256)
    a.generate(list(range(5, 90)), GREEDY)
    monkeypatch.setattr(model.blocks[0].mixer, "recurrent", True, raising=False)
    assert not pool.suspend(a) and len(pool.parked) == 0 and pool.sessions == [a]


# ---- through ft serve ------------------------------------------------------------------------------

class SlowModel:
    """The model, its forward passes slowed (a decode step at least `delay_s`), everything else its own
    (park_parts and the rest), or without the parking methods (`parks` False)."""

    PARKING = ("park", "park_parts", "unpark")

    def __init__(self, model: Any, delay_s: float, parks: bool = True) -> None:
        self.model, self.delay_s, self.parks = model, delay_s, parks

    def forward(self, input_ids: Any, state: Any, last_only: bool = False) -> Any:
        time.sleep(self.delay_s)
        return self.model.forward(input_ids, state, last_only)

    def __getattr__(self, name: str) -> Any:
        if not self.parks and name in self.PARKING:
            raise AttributeError(name)
        return getattr(self.model, name)


@pytest.fixture(scope="module")
def server(store) -> Iterator[LiveServer]:
    from runtime.server import runner

    with pytest.MonkeyPatch.context() as patch:  # one session with a park budget: the GPU's
        patch.setattr(runner, "sessions_for", lambda plan: 1)
        patch.setattr(runner, "park_bytes_for", lambda plan: 1 << 30)
        with LiveServer(store, max_queue=8) as live:
            yield live


@pytest.fixture
def slow(server: LiveServer, request) -> Iterator[Any]:
    """tiny loaded into the server, its passes slowed to 10 ms (parking or not: the parameter)."""
    import ollama

    ollama.Client(host=server.url).generate(model="tiny", keep_alive=-1)
    (runner,) = server.manager.runners.values()
    assert runner.share is not None and runner.sessions.time_shared
    fast = runner.model.model
    runner.model.model = SlowModel(fast, 0.01, parks=getattr(request, "param", True))
    runner.sessions.parked.clear()  # (nothing stored by another test's generations)
    yield runner
    runner.model.model = fast


def _stream(url: str, messages: list[dict], num_predict: int, log: list, name: str) -> str:
    """An Ollama chat streamed greedily; each chunk's arrival logged as (time, name, done)."""
    import ollama

    text = []
    for chunk in ollama.Client(host=url, timeout=120).chat(model="tiny", messages=messages, stream=True,
                                                            options={"num_predict": num_predict, "temperature": 0}):
        log.append((time.monotonic(), name, chunk.done))
        text.append(chunk.message.content)
        if chunk.done:
            assert chunk.eval_count == num_predict or chunk.done_reason == "stop"
    return "".join(text)


LONG = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
SHORT = [{"role": "system", "content": "Write a five-word title."}, {"role": "user", "content": "the story"}]


def _long_and_short(url: str) -> tuple[dict[str, str], list]:
    """The long generation streaming, the short request sent once it has streamed a few chunks."""
    log: list = []
    texts: dict[str, str] = {}
    long = threading.Thread(target=lambda: texts.__setitem__("long", _stream(url, LONG, 150, log, "long")))
    long.start()
    deadline = time.monotonic() + 30
    while sum(1 for _, n, _ in log if n == "long") < 3:
        assert time.monotonic() < deadline and long.is_alive(), "the long stream did not start"
        time.sleep(0.005)
    texts["short"] = _stream(url, SHORT, 8, log, "short")
    long.join(60)
    return texts, log


def test_a_short_request_is_answered_while_a_long_generation_streams(server: LiveServer, slow) -> None:
    alone = {"long": _stream(server.url, LONG, 150, [], "long"), "short": _stream(server.url, SHORT, 8, [], "short")}
    switches = slow.share.switches
    texts, log = _long_and_short(server.url)
    assert texts == alone  # greedy: each as it answers alone, nothing lost or reordered
    short_first = min(t for t, n, _ in log if n == "short")
    long_done = max(t for t, n, _ in log if n == "long")
    assert short_first < long_done and max(t for t, n, _ in log if n == "short") < long_done
    assert slow.share.switches > switches  # the long one parked for it, and restored
    assert server.wait_for(lambda: slow.active == 0)


@pytest.mark.parametrize("slow", [False], indirect=True)
def test_a_model_whose_state_cannot_be_parked_answers_one_after_another(server: LiveServer, slow) -> None:
    alone = {"long": _stream(server.url, LONG, 150, [], "long"), "short": _stream(server.url, SHORT, 8, [], "short")}
    switches = slow.share.switches
    texts, log = _long_and_short(server.url)
    assert texts == alone
    short_first = min(t for t, n, _ in log if n == "short")
    assert short_first > max(t for t, n, _ in log if n == "long")  # behind the whole long one
    assert slow.share.switches == switches


def test_two_concurrent_openai_streams_take_turns(server: LiveServer, slow) -> None:
    """Two conversations streamed at once through the openai client: their chunks interleave, each
    text is what it answers alone, and each conversation's next turn finds its history cached
    (both parked and restored along the way)."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    chats = {"a": [{"role": "system", "content": "You are agent A. " + "Read files first. " * 20},
                   {"role": "user", "content": "Fix the parser."}],
             "b": [{"role": "system", "content": "You are agent B. " + "Run tests often. " * 20},
                   {"role": "user", "content": "Rename parse_body."}]}

    def stream(name: str, log: list) -> tuple[str, Any]:
        text, usage = [], None
        for chunk in client.chat.completions.create(model="tiny", messages=chats[name], max_tokens=60, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}):
            log.append((time.monotonic(), name))
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        return "".join(text), usage

    alone = {name: stream(name, [])[0] for name in chats}
    log: list = []
    results: dict[str, tuple[str, Any]] = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, stream(n, log))) for n in chats]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(60)
    assert {n: r[0] for n, r in results.items()} == alone
    order = [n for _, n in sorted(log)]
    assert order.index("b") < len(order) - 1 - order[::-1].index("a")  # b began before a ended
    for name in chats:
        text, usage = results[name]
        turn = [*chats[name], {"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
        again = client.chat.completions.create(model="tiny", messages=turn, max_tokens=2, temperature=0)
        assert again.usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens


def test_a_queued_step_in_flight_is_never_a_switch_point() -> None:
    """On the GPU a holder queues its next decode step while the one before runs: the state is
    handed over only at a queue_decode with no queued step unread (the next holder's steps would
    write the logits buffers it reads)."""
    from runtime.server.scheduler import CancellableModel
    from runtime.server.time_share import TimeShare

    class Queued:
        def start(self, token, needed=None): ...
        def logits(self): return "logits"
        def cancel(self): ...

    class Model:
        can_queue = True
        def queue_decode(self, state): return Queued()

    share, asked = TimeShare(), []
    share.boundary = lambda num_tokens, may_switch=True: asked.append(may_switch)  # type: ignore[method-assign]
    model = CancellableModel(Model(), queue_ahead=True, share=share)
    first = model.queue_decode(None)
    second = model.queue_decode(None)  # queued while `first` runs
    first.start(1)
    assert first.logits() == "logits"
    second.start(2)
    second.logits()
    model.queue_decode(None).cancel()
    model.queue_decode(None)
    assert asked == [True, False, True, True]
