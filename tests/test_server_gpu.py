"""`ft serve --device gpu`: models load into the hybrid runtime, and /api/ft/vram (`ft vram`)
changes a loaded model's VRAM budget between tokens.

The hybrid runtime runs here on CPU tensors (gpu_options device="cpu", as the executor's CPU
tests run it) under a planner that sees an emulated 8 GiB GPU; the real `ollama` client talks
to a live server on loopback."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import ollama
import pytest

from ftpull.pull import pull
from registry import Store
from runtime.planner.resources import GPU, Machine
from tests.test_server_util import LiveServer

GiB = 1 << 30
ASK = [{"role": "user", "content": "Hello"}]
GREEDY = {"num_predict": 8, "temperature": 0}


def emulated_gpu_machine() -> Machine:
    return Machine(ram_total_bytes=16 * GiB, ram_available_bytes=16 * GiB, num_physical_cores=2,
                   gpu=GPU("emulated", 8 * GiB, 8 * GiB))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    store = Store(tmp_path_factory.mktemp("ft_home"))
    pull("tiny", store)
    return store


@pytest.fixture(scope="module")
def gpu_server(store: Store) -> Iterator[LiveServer]:
    with LiveServer(store, device="gpu", gpu_mode="offload", machine=emulated_gpu_machine,
                    gpu_options={"device": "cpu"}) as server:
        yield server


def test_the_gpu_runtime_answers_like_the_cpu_one(store: Store, gpu_server: LiveServer) -> None:
    on_gpu = ollama.Client(host=gpu_server.url).chat(model="tiny", messages=ASK, options=GREEDY)
    with LiveServer(store) as cpu_server:
        on_cpu = ollama.Client(host=cpu_server.url).chat(model="tiny", messages=ASK, options=GREEDY)
    assert on_gpu.message.content == on_cpu.message.content and on_gpu.eval_count == on_cpu.eval_count
    ps = httpx.get(gpu_server.url + "/api/ps").json()["models"][0]
    assert ps["ft"]["device"] == "gpu" and ps["ft"]["expert_cache_bytes"] > 0 and ps["size_vram"] > 0


def test_vram_budget_changes_between_tokens(gpu_server: LiveServer) -> None:
    client = ollama.Client(host=gpu_server.url)
    client.chat(model="tiny", messages=ASK, options=GREEDY)
    (runner,) = gpu_server.manager.runners.values()
    experts = runner.loaded.experts
    cache, governor = experts.cache, experts.elastic
    before = cache.num_slots
    gib = (governor.other_bytes + (before - 3) * cache.slot_bytes) / GiB
    reply = httpx.post(gpu_server.url + "/api/ft/vram", json={"model": "tiny", "vram_gib": gib})
    assert reply.status_code == 200, reply.text
    assert reply.json()["cache_slots"] == before - 3 and reply.json()["model"] == "tiny:latest"
    assert cache.num_slots == before  # applied at the next token, not now
    answer = client.chat(model="tiny", messages=ASK, options=GREEDY)
    assert answer.eval_count > 0 and experts.cache.num_slots == before - 3
    ps = httpx.get(gpu_server.url + "/api/ps").json()["models"][0]["ft"]
    assert ps["expert_cache_bytes"] == (before - 3) * cache.slot_bytes


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"model": "tiny", "vram_gib": 1e-6}, 400, "fewer than one token's experts"),
    ({"model": "tiny", "vram_gib": -2}, 400, "more than 0 and at most 1048576 GiB, not -2 GiB"),
    ({"model": "tiny", "vram_gib": float("inf")}, 400, "a number of GiB, not inf"),
    ({"model": "tiny", "vram_gib": float("nan")}, 400, "a number of GiB, not nan"),
    ({"model": "tiny", "vram_gib": 1e300}, 400, "at most 1048576 GiB"),
    ({"model": "tiny", "vram_gib": True}, 400, "vram_gib"),
    ({"model": "tiny", "vram_gib": "8"}, 400, "vram_gib"),
    ({"model": "nope", "vram_gib": 4}, 404, "not found"),
    ({"model": "tiny"}, 400, "vram_gib"),
])
def test_bad_vram_requests_are_refused_with_the_reason(gpu_server: LiveServer, body: dict, status: int,
                                                       words: str) -> None:
    ollama.Client(host=gpu_server.url).chat(model="tiny", messages=ASK, options={"num_predict": 1})
    reply = httpx.post(gpu_server.url + "/api/ft/vram", content=json.dumps(body),  # (Infinity and NaN as Python writes them)
                       headers={"content-type": "application/json"})
    assert reply.status_code == status and words in reply.text, reply.text


def test_a_cache_below_one_token_is_refused_with_its_numbers_not_as_a_damaged_model(store: Store) -> None:
    with LiveServer(store, device="gpu", gpu_mode="offload", machine=emulated_gpu_machine,
                    gpu_options={"device": "cpu", "cache_slots": 3}) as server:
        reply = httpx.post(server.url + "/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
    assert reply.status_code == 400 and "fewer than one token's experts" in reply.text, reply.text
    assert "ft verify" not in reply.text


def test_a_gpu_model_runs_a_smaller_num_ctx_in_its_kv_and_reloads_for_a_larger_one(store: Store) -> None:
    """Its KV cache was sized at load, and the expert cache took the VRAM left: a request with a
    smaller num_ctx runs within it (planning again saw that VRAM as taken, and answered 507), one
    with a larger num_ctx than the load planned for reloads the model for it, as Ollama does."""
    with LiveServer(store, device="gpu", gpu_mode="offload", machine=emulated_gpu_machine,
                    gpu_options={"device": "cpu"}) as server:
        client = ollama.Client(host=server.url)

        def ask(num_ctx: int) -> object:
            client.chat(model="tiny", messages=ASK, options={**GREEDY, "num_ctx": num_ctx})
            (runner,) = server.manager.runners.values()
            return runner

        first = ask(1024)
        assert first.session.context_length == 1024
        assert ask(512) is first  # within the loaded KV
        grown = ask(2048)
        assert grown is not first and grown.session.context_length == 2048
        assert server.wait_for(lambda: first.loaded is None)  # released (once its last request was counted done)
        assert ask(1024) is grown and ask(4096) is grown  # (4096: clamped to the model's 2048, which it has)


def test_a_requests_num_ctx_is_planned_exactly_or_refused_with_the_numbers(store: Store) -> None:
    """A request's own num_ctx on a GPU whose VRAM holds KV for 1000 tokens beside the dense
    weights and workspace: 1000 runs as asked (the expert cache below one token's experts, its
    misses served by the CPU and what slots a smaller prompt chunk frees), 1500 is a 400 naming what it needs and the most that fits, not a context cut in
    silence; the model loaded stays loaded for it."""
    from runtime.loading.registered import open_model
    from runtime.planner.plan import ModelFootprint, PlanOverrides, plan

    with open_model(store, "tiny").open_ftw() as reader:
        footprint = ModelFootprint.from_index(reader.index, name="tiny:latest")
    sized = plan(footprint, emulated_gpu_machine(), PlanOverrides(num_ctx=1000, device="gpu"))
    vram = sized.dense_bytes + sized.workspace_bytes + sized.kv_bytes

    def tight() -> Machine:
        return Machine(ram_total_bytes=16 * GiB, ram_available_bytes=16 * GiB, num_physical_cores=2,
                       gpu=GPU("small", 8 * GiB, vram))

    with LiveServer(store, device="gpu", gpu_mode="auto", machine=tight, gpu_options={"device": "cpu"}) as server:
        def ask(num_ctx: int) -> httpx.Response:
            return httpx.post(server.url + "/api/chat", json={"model": "tiny", "messages": ASK, "stream": False,
                                                               "options": {**GREEDY, "num_ctx": num_ctx}}, timeout=60)

        for _ in range(2):  # not loaded, then loaded for 1000 tokens: refused before it is unloaded
            reply = ask(1500)
            text = " ".join(reply.text.split())
            assert reply.status_code == 400 and "KV for num_ctx 1500 tokens" in text, reply.text
            assert "enough for at most 1000 tokens" in text and "a smaller num_ctx (at most 1000)" in text
            assert ask(1000).status_code == 200
            (runner,) = server.manager.runners.values()
            assert runner.plan.context_length == runner.session.context_length == 1000
            # below one token's experts: the slots a smaller prompt chunk frees (plan._prefill_chunk), or none
            slots, top_k = runner.plan.cache_slots, footprint.num_experts_per_tok
            assert slots < footprint.min_cache_slots
            assert runner.loaded.experts.mode == ("auto" if slots >= top_k else "cpu")
        assert ask(1500).status_code == 400 and server.manager.runners[runner.key] is runner


def test_a_cpu_server_says_vram_needs_the_gpu_runtime(store: Store) -> None:
    with LiveServer(store) as server:
        ollama.Client(host=server.url).chat(model="tiny", messages=ASK, options={"num_predict": 1})
        reply = httpx.post(server.url + "/api/ft/vram", json={"model": "tiny", "vram_gib": 4})
    assert reply.status_code == 400 and "ft serve --device gpu" in reply.text


def test_ft_vram_through_the_cli(gpu_server: LiveServer, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.clirun import ft

    monkeypatch.setenv("FT_HOST", gpu_server.url)
    ollama.Client(host=gpu_server.url).chat(model="tiny", messages=ASK, options={"num_predict": 1})
    (runner,) = gpu_server.manager.runners.values()
    cache, governor = runner.loaded.experts.cache, runner.loaded.experts.elastic
    gib = (governor.other_bytes + (cache.num_slots - 1) * cache.slot_bytes) / GiB
    code, out, _ = ft(capsys, "vram", "tiny", repr(gib))
    assert code == 0 and f"expert cache {cache.num_slots - 1} slots" in out and "from the next token" in out
    code, _, err = ft(capsys, "vram", "tiny", "0.000001")
    assert code == 1 and "fewer than one token's experts" in err
    for bad in ("inf", "nan", "-3", "lots"):
        code, _, err = ft(capsys, "vram", "tiny", "--", bad)
        assert code == 2 and "Invalid value for 'GIB'" in err and ("GiB" in err), (bad, err)


def test_unloading_releases_the_gpu_runtime(store: Store) -> None:
    """keep_alive 0: once the answer is done the model is unloaded, its CPU worker stopped and its
    weights dropped (VRAM and pinned host memory go back now, not at some later collection)."""
    with LiveServer(store, device="gpu", gpu_mode="auto", machine=emulated_gpu_machine,
                    gpu_options={"device": "cpu", "split": lambda misses, nbytes: misses // 2}) as server:
        client = ollama.Client(host=server.url)
        client.chat(model="tiny", messages=ASK, options={"num_predict": 2})
        (runner,) = server.manager.runners.values()
        experts = runner.loaded.experts
        client.chat(model="tiny", messages=ASK, options={"num_predict": 2}, keep_alive=0)
        deadline = time.monotonic() + 10
        # (the unload forgets the runner first, then releases it: wait for both)
        while (server.manager.runners or runner.loaded is not None) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not server.manager.runners and runner.loaded is None
        assert experts.cpu_share._pool._shutdown  # the CPU worker is stopped


def test_gpu_models_take_the_gpu_one_at_a_time(store: Store, gpu_server: LiveServer) -> None:
    """A second GPU-runtime model unloads the idle first one (each one's cache fills the VRAM its
    budget leaves), and gets its cache sized after that unload."""
    store.copy("tiny", "tiny-copy")
    client = ollama.Client(host=gpu_server.url)
    client.chat(model="tiny", messages=ASK, options={"num_predict": 1})
    client.chat(model="tiny-copy", messages=ASK, options={"num_predict": 1})
    names = [r.registered.name.display for r in gpu_server.manager.runners.values()]
    assert names == ["tiny-copy:latest"]
    client.chat(model="tiny", messages=ASK, options={"num_predict": 1})
    assert [r.registered.name.display for r in gpu_server.manager.runners.values()] == ["tiny:latest"]


def test_a_model_waiting_for_the_gpu_is_not_starved_by_the_other_models_traffic(store: Store) -> None:
    """While a load waits for the GPU model in use to finish, that model's new requests queue
    behind the load (before, they kept joining it, and the load waited as long as it had traffic)."""
    store.copy("tiny", "tiny-other")
    with LiveServer(store, device="gpu", gpu_mode="offload", machine=emulated_gpu_machine,
                    gpu_options={"device": "cpu"}) as server:
        ollama.Client(host=server.url).chat(model="tiny", messages=ASK, options={"num_predict": 1})
        stop_at = time.monotonic() + 10

        def keep_asking() -> None:
            with httpx.Client(timeout=60) as client:
                while time.monotonic() < stop_at:
                    client.post(server.url + "/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False,
                                                                    "options": {"num_predict": 40, "temperature": 0}})

        busy = [threading.Thread(target=keep_asking) for _ in range(2)]
        for thread in busy:
            thread.start()
        time.sleep(0.5)
        reply = httpx.post(server.url + "/api/generate", json={"model": "tiny-other", "prompt": "hi", "stream": False,
                                                                "options": {"num_predict": 2}}, timeout=60)
        answered_at = time.monotonic()
        for thread in busy:
            thread.join()
    assert reply.status_code == 200 and answered_at < stop_at - 2, stop_at - answered_at


@pytest.mark.parametrize("gpu", [True, False])
def test_device_auto_puts_each_model_where_its_plan_does(store: Store, gpu: bool) -> None:
    """`ft serve` (device auto, the default): the hybrid runtime when the machine has a GPU the
    plan fits, the CPU runtime otherwise; the same greedy answer either way."""
    def machine() -> Machine:
        m = emulated_gpu_machine()
        return m if gpu else Machine(m.ram_total_bytes, m.ram_available_bytes, m.num_physical_cores, gpu=None)

    with LiveServer(store, device="auto", gpu_mode="offload", machine=machine, gpu_options={"device": "cpu"}) as server:
        reply = ollama.Client(host=server.url).chat(model="tiny", messages=ASK, options=GREEDY)
        ps = httpx.get(server.url + "/api/ps").json()["models"][0]
        (runner,) = server.manager.runners.values()
        assert ps["ft"]["device"] == ("gpu" if gpu else "cpu")
        assert (getattr(runner.loaded.experts, "elastic", None) is not None) == gpu
    with LiveServer(store) as cpu_server:
        on_cpu = ollama.Client(host=cpu_server.url).chat(model="tiny", messages=ASK, options=GREEDY)
    assert reply.message.content == on_cpu.message.content
