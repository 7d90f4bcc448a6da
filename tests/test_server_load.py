"""The model manager under load: a bounded queue (503 beyond it, nothing lost), client disconnects
freeing their slot, one load for concurrent first requests, memory-pressure unloading."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import ollama
import pytest

from registry import Store
from runtime.loading.registered import open_model
from runtime.planner.plan import RAM_RESERVE_BYTES
from runtime.server import room
from runtime.server.backend import ModelManager
from runtime.server.protocol import Busy, ChatRequest, Done
from tests.test_server_util import LiveServer, pulled_home

TINY = "ft.local/library/tiny:latest"
TWIN = "ft.local/library/tiny-twin:latest"
LOAD_CLIENTS = 16
LOAD_SECONDS = 10.0
MAX_QUEUE = 4


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return pulled_home(tmp_path_factory.mktemp("ft_home"))


@pytest.fixture(scope="module")
def server(store: Store) -> Iterator[LiveServer]:
    with LiveServer(store, max_queue=MAX_QUEUE) as live:
        yield live


def check_stream(chunks: list[Any], num_predict: int) -> None:
    """A complete, well-formed Ollama chat stream."""
    assert chunks, "empty stream"
    *body, final = chunks
    for c in body:
        assert c.done is False and c.model == "tiny" and c.message.role == "assistant" and c.created_at
    assert final.done is True and final.done_reason in ("stop", "length")
    assert 0 <= final.eval_count <= num_predict and final.prompt_eval_count > 0
    assert final.total_duration >= final.eval_duration >= 0 and final.prompt_eval_duration > 0
    if final.done_reason == "length":
        assert final.eval_count == num_predict


def test_load_bounded_queue_nothing_lost(server: LiveServer) -> None:
    """16 streaming clients for ~10 s against a queue of 4: each request streams to its end or gets
    a clean 503; afterwards the queue is empty and the server answers."""
    done: list[tuple[float, int]] = []  # (latency, tokens)
    busy: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + LOAD_SECONDS

    def worker(i: int) -> None:
        client = ollama.Client(host=server.url, timeout=60)
        rng = random.Random(i)
        n = 0
        while time.monotonic() < deadline:
            n += 1
            num_predict = rng.randint(4, 24)
            start = time.monotonic()
            try:
                chunks = list(client.chat(model="tiny", stream=True, options={"num_predict": num_predict},
                                          messages=[{"role": "user", "content": f"client {i} request {n}"}]))
                check_stream(chunks, num_predict)
                with lock:
                    done.append((time.monotonic() - start, chunks[-1].eval_count))
            except ollama.ResponseError as e:
                if e.status_code != 503 or "FT_MAX_QUEUE" not in e.error:
                    with lock:
                        failures.append(f"client {i}: {e.status_code} {e.error}")
                    return
                with lock:
                    busy.append(e.error)
                time.sleep(rng.uniform(0.02, 0.2))
            except Exception as e:  # a broken stream, a timeout, a malformed chunk
                with lock:
                    failures.append(f"client {i}: {type(e).__name__}: {e}")
                return

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(LOAD_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=LOAD_SECONDS + 60)
    elapsed = time.monotonic() - started
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert failures == []
    assert done and busy  # both outcomes happen with 16 clients and 4 places
    latencies = sorted(lat for lat, _ in done)
    tokens = sum(n for _, n in done)
    print(f"\nload: {LOAD_CLIENTS} clients, {elapsed:.1f}s, max queue {MAX_QUEUE}: {len(done)} complete, "
          f"{len(busy)} x 503, {tokens} tokens ({tokens / elapsed:.1f} tokens/s), latency p50 "
          f"{statistics.median(latencies):.2f}s p95 {latencies[int(0.95 * (len(latencies) - 1))]:.2f}s")
    assert server.wait_for(lambda: server.manager.admission.waiting == 0 and
                           all(r.active == 0 for r in server.manager.runners.values()))
    after = ollama.Client(host=server.url).chat(model="tiny", messages=[{"role": "user", "content": "after"}],
                                                options={"num_predict": 4})
    assert after.done and after.eval_count == 4


class SlowModel:
    """A model that takes at least `delay_s` per forward pass, so a generation outlives the test's checks."""

    def __init__(self, model: Any, delay_s: float) -> None:
        self.model, self.delay_s = model, delay_s

    def new_state(self, max_tokens: int) -> Any:
        return self.model.new_state(max_tokens)

    def reset_state(self, state: Any) -> Any:
        return self.model.reset_state(state)

    def forward(self, input_ids: Any, state: Any, last_only: bool = False) -> Any:
        time.sleep(self.delay_s)
        return self.model.forward(input_ids, state, last_only)


def test_a_client_that_leaves_during_its_models_load_leaves_one_load_and_a_kept_model(store: Store,
                                                                                    monkeypatch) -> None:
    """The request is cancelled while the load thread runs: the load ends under the load lock
    (a second request waits for it, and does not load beside it), and its model is kept, idle."""
    loads, release = [], threading.Event()
    real = ModelManager._load

    def held_load(self, registered, fitted):
        loads.append(time.monotonic())
        release.wait(10)
        return real(self, registered, fitted)

    monkeypatch.setattr(ModelManager, "_load", held_load)
    with LiveServer(store) as live:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(httpx.TimeoutException):  # the client gives up while the model loads
            httpx.post(live.url + "/api/chat", json=body, timeout=httpx.Timeout(0.5))
        assert live.wait_for(lambda: len(loads) == 1)
        time.sleep(0.5)  # the server notices the disconnect and cancels the request
        second = threading.Thread(target=lambda: httpx.post(
            live.url + "/api/chat", json={**body, "stream": False, "options": {"num_predict": 2}}, timeout=30))
        second.start()
        time.sleep(0.3)
        release.set()
        second.join(30)
        assert len(loads) == 1 and list(live.manager.runners) == [TINY]
        (runner,) = live.manager.runners.values()
        assert runner.loaded is not None and live.wait_for(lambda: runner.active == 0)  # (counted down after the reply)


@pytest.fixture
def slow_tiny(server: LiveServer) -> Iterator[Any]:
    """tiny loaded, its forward passes slowed to 10 ms (a greedy answer then runs ~20 s: to the context)."""
    ollama.Client(host=server.url).generate(model="tiny", keep_alive=-1)
    runner = server.manager.runners[TINY]
    fast = runner.model.model
    runner.model.model = SlowModel(fast, 0.01)
    yield runner
    runner.model.model = fast


@contextmanager
def long_stream(server: LiveServer) -> Iterator[Iterator[str]]:
    """A streamed chat that would run to the context's end, its first three chunks read; the
    stream's remaining lines (the client leaves when the block ends)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "a long story"}],
            "options": {"num_predict": 100000, "temperature": 0}}
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            assert json.loads(next(lines))["done"] is False
        yield lines


def test_disconnect_mid_stream_frees_the_slot(server: LiveServer, slow_tiny: Any) -> None:
    with long_stream(server):
        assert slow_tiny.active == 1
    assert server.wait_for(lambda: slow_tiny.active == 0, timeout_s=2), "the generation went on without a client"
    assert len(slow_tiny.session.tokens) == slow_tiny.session.state.length  # the session stays reusable
    start = time.monotonic()
    r = ollama.Client(host=server.url).chat(model="tiny", messages=[{"role": "user", "content": "next"}],
                                            options={"num_predict": 4})
    assert r.done and time.monotonic() - start < 3


def test_a_second_client_is_answered_while_a_long_generation_runs(server: LiveServer, slow_tiny: Any) -> None:
    """On the CPU a model keeps several sessions, and as many generations run at once, their
    forward passes taking turns: a short request is answered while another client's long one
    streams (one at a time, it waited for the whole of it), and the long one goes on."""
    assert slow_tiny.sessions.size >= 2, "the test machine's RAM holds one tiny session only"
    with long_stream(server) as lines:
        start = time.monotonic()
        short = ollama.Client(host=server.url).chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                    options={"num_predict": 8, "temperature": 0})
        answered_s = time.monotonic() - start
        assert short.done and short.eval_count == 8
        assert server.wait_for(lambda: slow_tiny.active == 1, timeout_s=2), \
            "the long generation ended (or stopped) while the short one ran"  # (the short one counted down)
        assert answered_s < 3, f"the short request waited {answered_s:.1f} s for the long one"
        for _ in range(3):  # the long one streams on
            assert json.loads(next(lines))["done"] is False
    assert server.wait_for(lambda: slow_tiny.active == 0, timeout_s=3)
    assert all(len(s.tokens) == s.state.length for s in slow_tiny.sessions.sessions)  # each session reusable


def test_disconnect_while_queued_leaves_the_queue(server: LiveServer, slow_tiny: Any) -> None:
    blocker = threading.Event()
    for _ in range(slow_tiny.sessions.size):  # every worker busy (one a session): requests queue behind them
        slow_tiny.executor.submit(blocker.wait, 30)
    try:
        payload = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "queued"}]}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        assert server.wait_for(lambda: server.manager.admission.waiting == 1 and slow_tiny.active == 1)
        sock.close()
        assert server.wait_for(lambda: server.manager.admission.waiting == 0, timeout_s=2)
    finally:
        blocker.set()
    assert server.wait_for(lambda: slow_tiny.active == 0, timeout_s=2)  # its job never generated


async def _chat(manager: ModelManager, model: str, num_predict: int = 2, **kwargs: Any) -> list[Any]:
    request = ChatRequest(model=model, messages=[{"role": "user", "content": "hi"}],
                          options={"num_predict": num_predict}, **kwargs)
    return [event async for event in manager.chat(request)]


def test_concurrent_first_requests_load_once(store: Store) -> None:
    manager = ModelManager(store, max_queue=8)
    loads = []
    real_load = manager._load

    def counting_load(*args: Any) -> Any:
        loads.append(args)
        return real_load(*args)

    manager._load = counting_load  # type: ignore[method-assign]

    async def main() -> list[list[Any]]:
        return await asyncio.gather(*(_chat(manager, "tiny") for _ in range(5)))

    results = asyncio.run(main())
    assert len(loads) == 1 and all(isinstance(r[-1], Done) for r in results)
    assert results[0][-1].load_seconds > 0 or any(r[-1].load_seconds > 0 for r in results)
    manager.close()


def test_memory_pressure_unloads_idle_models(store: Store, monkeypatch) -> None:
    monkeypatch.setattr(room, "ROOM_WAIT_S", 0.2)
    store.copy("tiny", "tiny-twin")
    need = ModelManager(store)._plan(open_model(store, "tiny"), None, None).ram_needed_bytes
    budget = need + (need - RAM_RESERVE_BYTES) // 2  # room for one model, not two
    manager = ModelManager(store, ram_budget_bytes=budget, keep_alive_s=-1)

    async def main() -> None:
        await _chat(manager, "tiny")
        assert list(manager.runners) == [TINY]
        await _chat(manager, "tiny-twin")  # tiny is idle: unloaded to make room
        assert list(manager.runners) == [TWIN]
        twin = manager.runners[TWIN]
        twin.active += 1  # as if generating: it cannot be unloaded, so tiny cannot come in
        with pytest.raises(Busy, match="not enough memory"):  # after waiting ROOM_WAIT_S for it
            await _chat(manager, "tiny")
        # a model that finishes within the wait is unloaded, not a reason to refuse: as when a
        # client sends its next request before the worker has handed the last one back
        asyncio.get_running_loop().call_later(0.05, manager._job_finished, twin)
        assert isinstance((await _chat(manager, "tiny"))[-1], Done)
        assert list(manager.runners) == [TINY]

    asyncio.run(main())
    manager.close()
    store.remove("tiny-twin")


def test_a_requests_num_ctx_on_the_cpu_is_planned_exactly_or_refused_with_the_numbers(store: Store) -> None:
    """On a RAM budget that holds the model with KV for 1000 tokens: a request's own num_ctx of
    1000 runs with exactly that context, one of 1500 is a 400 naming the most that fits (it was
    lowered to that in silence), before and after the model is loaded."""
    from runtime.server.protocol import BadRequest

    probe = ModelManager(store)
    base = probe._plan(open_model(store, "tiny"), 1, None).ram_needed_bytes  # the model, KV for one token
    kv_per_token = probe._plan(open_model(store, "tiny"), 2, None).ram_needed_bytes - base
    manager = ModelManager(store, ram_budget_bytes=base + 999 * kv_per_token, keep_alive_s=-1)

    async def main() -> None:
        def options(num_ctx: int) -> dict[str, Any]:
            return {"num_predict": 2, "num_ctx": num_ctx}

        request = ChatRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], options=options(1500))
        with pytest.raises(BadRequest, match=r"KV for 1500 tokens .* at most 1000 tokens; a smaller num_ctx"):
            [event async for event in manager.chat(request)]
        assert not manager.runners
        request = ChatRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], options=options(1000))
        assert isinstance([event async for event in manager.chat(request)][-1], Done)
        (runner,) = manager.runners.values()
        assert runner.plan.context_length == runner.session.context_length == 1000
        request = ChatRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], options=options(1500))
        with pytest.raises(BadRequest, match="at most 1000 tokens"):  # loaded: planned again, refused
            [event async for event in manager.chat(request)]

    asyncio.run(main())
    manager.close()
