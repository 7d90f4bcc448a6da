"""`ft run` end to end on the built-in tiny model, and the engine's stopping and reuse rules."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ftpull.cli import _run
from registry import Store
from runtime.engine import EmptyPromptError, Session
from runtime.loading.registered import open_model
from runtime.loading.runnable import load
from runtime.models import ContextOverflowError
from runtime.text.sampling import SamplingParams
from runtime.text.tokenizer import Tokenizer
from tests.clirun import ft


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ft_home")
    os.environ["FT_HOME"] = str(root)
    try:
        _run(["pull", "tiny"])
    except SystemExit as e:
        assert not e.code
    return root


@pytest.fixture(scope="module")
def tiny(home: Path):
    store = Store(home)
    return load(store, "tiny"), Tokenizer.from_model(open_model(store, "tiny"))




def test_one_prompt_streams_an_answer(home: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("FT_HOME", str(home))
    code, out, err = ft(capsys, "run", "tiny", "Hello there", "--seed", "3", "--num-predict", "12", "--verbose")
    assert code == 0 and out.strip()
    assert "eval rate:" in err and "prompt eval rate:" in err and "load duration:" in err
    # a stored model is run without a word about it, as `ollama run` does (it said "is up to date" every run)
    assert "up to date" not in err
    # same seed, same answer
    assert ft(capsys, "run", "tiny", "Hello there", "--seed", "3", "--num-predict", "12")[1] == out
    assert "tiny:latest is up to date" in ft(capsys, "pull", "tiny")[2]  # (ft pull still says so)


def test_prompt_from_stdin_and_repl(home: Path) -> None:
    env = {**os.environ, "FT_HOME": str(home)}
    cmd = [sys.executable, "-m", "ftpull", "run", "tiny", "--num-predict", "8", "--seed", "1"]
    piped = subprocess.run(cmd + ["--verbose"], input="Why is the sky blue?", env=env, capture_output=True, text=True,
                           timeout=120)
    assert piped.returncode == 0 and piped.stdout.strip() and "eval count:           8 token(s)" in piped.stderr


def test_piped_stdin_goes_before_a_prompt_and_a_silent_pipe_is_not_waited_for(home: Path) -> None:
    """`cat file | ft run MODEL "Summarize:"` answers the file and the prompt, as Ollama does (the
    piped text was dropped); an open pipe that sends nothing (a CI runner's stdin) does not hang it."""
    env = {**os.environ, "FT_HOME": str(home)}
    cmd = [sys.executable, "-m", "ftpull", "run", "tiny", "Summarize:", "--num-predict", "2", "--verbose", "--local"]

    def prompt_tokens(stderr: str) -> int:
        line = next(x for x in stderr.splitlines() if x.startswith("prompt eval count:"))
        return int(line.split(":")[1].split()[0])

    alone = subprocess.run(cmd, stdin=subprocess.DEVNULL, env=env, capture_output=True, text=True, timeout=120)
    piped = subprocess.run(cmd, input="The sky is blue. " * 40, env=env, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0 and piped.returncode == 0, piped.stderr
    assert prompt_tokens(piped.stderr) > prompt_tokens(alone.stderr) + 40
    silent = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert silent.wait(timeout=120) == 0  # its stdin open and silent all along
    finally:
        silent.stdin.close()
        if silent.poll() is None:
            silent.kill()


def test_repl_commands(tiny, monkeypatch, capsys) -> None:
    from ftpull.run import Chat, repl

    loaded, tokenizer = tiny
    chat = Chat(Session(loaded.model, tokenizer, 512), tokenizer, {"num_predict": 6, "seed": 0})
    script = '\n'.join([
        "/set parameter temperature 0", "/set parameter top_k banana", "/show parameters",
        '"""first line', 'second line"""', "another question", "/clear", "/nonsense", "/bye", "never read",
    ]) + "\n"
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(script))
    repl(chat, verbose=False, load_seconds=0.0)
    out = capsys.readouterr().out
    assert "Set parameter 'temperature' to '0'" in out
    assert "Error:" in out and "top_k" in out  # invalid value refused, the REPL goes on
    assert "temperature     0" in out
    assert "Cleared session context" in out and "Unknown command '/nonsense'" in out
    assert chat.messages == []  # /clear forgot the two exchanges
    assert chat.options["temperature"] == 0


def test_ctrl_c_stops_an_answer_or_a_prompt_and_the_repl_goes_on(tiny, monkeypatch, capsys) -> None:
    """As in Ollama: Ctrl-C during an answer stops it (its turn is not kept, the state starts
    over), at the prompt gives a new prompt; a \"\"\" block is a message even when it starts with "/"."""
    from ftpull import run as run_mod
    from ftpull.run import Chat, repl

    loaded, tokenizer = tiny
    chat = Chat(Session(loaded.model, tokenizer, 512), tokenizer, {"num_predict": 4, "seed": 0})
    real_ask, asked = chat.ask, []

    def ask(text, on_text):
        asked.append(text)
        if len(asked) == 1:
            on_text("partial")
            raise KeyboardInterrupt
        return real_ask(text, on_text)

    monkeypatch.setattr(chat, "ask", ask)
    real_read, reads = run_mod.read_message, []

    def read(lines, prompt):
        reads.append(1)
        if len(reads) == 2:
            raise KeyboardInterrupt
        return real_read(lines, prompt)

    monkeypatch.setattr(run_mod, "read_message", read)
    script = '\n'.join(["first question", "second question", '"""/bye is not a command here', 'in a block"""',
                         "/bye"]) + "\n"
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(script))
    repl(chat, verbose=False, load_seconds=0.0)
    out = capsys.readouterr().out
    assert "partial\n(stopped)" in out and "Use Ctrl-D or /bye to exit." in out
    assert asked == ["first question", "second question", "/bye is not a command here\nin a block"]
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == asked[1:]  # the stopped turn is not kept


def test_a_message_that_does_not_fit_leaves_the_chat_going(tiny, monkeypatch, capsys) -> None:
    """A message past the context is refused with the reason; the conversation is as it was, and
    the next message is answered (the REPL used to exit, losing the conversation)."""
    from ftpull.run import Chat, repl

    loaded, tokenizer = tiny
    chat = Chat(Session(loaded.model, tokenizer, 64), tokenizer, {"num_predict": 3, "seed": 0})
    script = "\n".join(["hello", " ".join(str(n) for n in range(100)), "again", "/bye"]) + "\n"
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(script))
    repl(chat, verbose=False, load_seconds=0.0)
    out = capsys.readouterr().out
    assert "Error: the prompt is" in out and "the context is 64" in out and "/clear to start over" in out
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == ["hello", "again"]


def test_a_server_refusing_a_message_leaves_the_chat_going(monkeypatch, capsys) -> None:
    """The same through `ft serve`: its 400 before any output is a refused turn; other errors still end the chat."""
    from ftpull.run import repl
    from ftpull.serve import RemoteChat, ServerReplyError

    class Refusing:
        status = 400

        def stream(self, path, body):
            if body["messages"][-1]["content"] == "too long":
                raise ServerReplyError(self.status, "the prompt is 99 tokens, the context is 64; shorten it or raise num_ctx")
            yield {"message": {"content": "ok"}}
            yield {"done": True, "done_reason": "stop", "eval_count": 1}

    client = Refusing()
    chat = RemoteChat(client, "tiny", {})
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO("too long\nshort\n/bye\n"))
    repl(chat, verbose=False, load_seconds=0.0)
    out = capsys.readouterr().out
    assert "Error: the prompt is 99 tokens" in out and "ok" in out
    assert [m["content"] for m in chat.messages] == ["short", "ok"]
    client.status = 500
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO("too long\n"))
    with pytest.raises(ServerReplyError):
        repl(chat, verbose=False, load_seconds=0.0)


def test_ft_run_loads_what_a_path_pulled(home: Path, tmp_path: Path, capsys) -> None:
    """`ft run ./checkpoint` pulls it under a model name, then loads that name (it loaded the path's
    text, which is no model name, and failed after the pull)."""
    from ftpull import tiny
    from tests.clirun import ft

    src = tiny.build_tiny_checkpoint(tmp_path / "My_Ckpt")  # (with a tokenizer)
    code, out, err = ft(capsys, "run", "--local", str(src), "Hello", "--num-predict", "2")
    assert code == 0 and out.strip(), err


def test_a_modelfiles_context_bounds_ft_run(home: Path, tmp_path: Path, capsys) -> None:
    """CONTEXT in a Modelfile is the most context the model gets: ft show and ft fit said 64,
    and ft run planned from the model's own 2048."""
    from tests.clirun import ft

    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM builtin://tiny\nFAMILY qwen3_moe\nTEMPLATE checkpoint\nCONTEXT 64\n")
    assert ft(capsys, "create", "tiny-ctx64", "-f", str(modelfile))[0] == 0
    code, _, err = ft(capsys, "run", "--local", "tiny-ctx64", " ".join(str(n) for n in range(150)), "--num-predict", "2")
    assert code == 1 and "the context is 64" in err, err


def test_history_is_kept_and_prefix_reused(tiny) -> None:
    from ftpull.run import Chat

    loaded, tokenizer = tiny
    chat = Chat(Session(loaded.model, tokenizer, 1024), tokenizer, {"num_predict": 5, "temperature": 0})
    first = chat.ask("What is two plus two?", lambda s: None)
    second = chat.ask("And three plus three?", lambda s: None)
    assert [m["role"] for m in chat.messages] == ["user", "assistant", "user", "assistant"]
    assert first.stats.cached_tokens == 0
    assert second.stats.cached_tokens > first.stats.prompt_tokens  # the first turn was not recomputed


def test_cached_generation_equals_fresh(tiny) -> None:
    loaded, tokenizer = tiny
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Count to five"}], add_generation_prompt=True)
    greedy = SamplingParams(temperature=0, max_tokens=16)
    fresh = Session(loaded.model, tokenizer, 256).generate(prompt, greedy)
    session = Session(loaded.model, tokenizer, 256)
    session.generate(prompt[:-3], SamplingParams(temperature=0, max_tokens=1))
    assert session.generate(prompt, greedy).tokens == fresh.tokens


def test_stop_conditions(tiny) -> None:
    loaded, tokenizer = tiny
    prompt = tokenizer.encode("Once upon a time")
    free = Session(loaded.model, tokenizer, 256).generate(prompt, SamplingParams(temperature=0, max_tokens=24))
    assert free.stop_reason == "length" and len(free.tokens) == 24
    assert free.stop_string is None
    middle = len(free.text) // 2
    cut = free.text[middle:][:3]
    if cut:
        # a longer stop string that starts earlier but completes later: the one that cut is reported
        longer = free.text[middle - 2:middle + 8]
        stopped = Session(loaded.model, tokenizer, 256).generate(prompt, SamplingParams(temperature=0, max_tokens=24,
                                                                                        stop=(longer, cut)))
        assert stopped.stop_reason == "stop" and cut not in stopped.text and stopped.stop_string == cut
        assert free.text.startswith(stopped.text)
    full = Session(loaded.model, tokenizer, len(prompt) + 5).generate(prompt, SamplingParams(temperature=0))
    assert full.stop_reason == "context" and len(full.tokens) == 5


def test_bad_input(tiny, home: Path, capsys, monkeypatch) -> None:
    loaded, tokenizer = tiny
    with pytest.raises(EmptyPromptError):
        Session(loaded.model, tokenizer, 64).generate([], SamplingParams())
    with pytest.raises(ContextOverflowError, match="the prompt is 100 tokens, the context is 64"):
        Session(loaded.model, tokenizer, 64).generate([5] * 100, SamplingParams())
    monkeypatch.setenv("FT_HOME", str(home))
    code, _, err = ft(capsys, "run", "tiny", "hi", "--temperature", "-1")
    assert code == 1 and "temperature" in err
    code, _, err = ft(capsys, "run", "tiny", "x " * 3000, "--num-ctx", "64")
    assert code == 1 and "context" in err


def test_corrupted_model_names_the_file(tmp_path: Path, capsys, monkeypatch) -> None:
    """A shard cut short names its file: `ft run` of a name a recipe makes pulls it again first;
    a copy (no recipe) fails at load with the way out."""
    monkeypatch.setenv("FT_HOME", str(tmp_path))
    ft(capsys, "pull", "tiny")
    store = Store(tmp_path)
    shard = next(d for d in store.read_manifest("tiny").layers if d.title == "model-00001.ftw")
    path = store.blob_path(shard.digest)
    path.chmod(0o644)
    os.truncate(path, path.stat().st_size - 8192)
    code, out, err = ft(capsys, "run", "tiny", "hello", "--num-predict", "2", "--local")
    assert code == 0 and out.strip() and "model-00001.ftw is missing or damaged; pulling it again" in err
    ft(capsys, "cp", "tiny", "mine")
    path.chmod(0o644)
    os.truncate(path, path.stat().st_size - 8192)
    code, _, err = ft(capsys, "run", "mine", "hello", "--local")
    assert code == 1 and "model-00001.ftw" in err and "ft rm mine:latest" in err


def test_greedy_matches_transformers_on_tiny(home: Path, tiny) -> None:
    """The built-in model through `ft pull` + runtime equals transformers on its source checkpoint."""
    from transformers import AutoModelForCausalLM

    from ftpull.tiny import build_tiny_checkpoint

    src = build_tiny_checkpoint(home / "tiny-src")
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    loaded, tokenizer = tiny
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
    ours = Session(loaded.model, tokenizer, 256).generate(prompt, SamplingParams(temperature=0, max_tokens=20))
    with torch.no_grad():
        theirs = ref.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                              eos_token_id=sorted(tokenizer.eos_token_ids), pad_token_id=0)[0, len(prompt):].tolist()
    eos = set(tokenizer.eos_token_ids)
    assert ours.tokens == [t for t in theirs if t not in eos][: len(ours.tokens)]


def test_gpu_device_without_cuda_is_refused_plainly(home: Path, capsys, monkeypatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("FT_HOME", str(home))
    code, _, err = ft(capsys, "run", "tiny", "hi", "--device", "gpu")
    assert code == 1 and "--device gpu needs a CUDA GPU" in err and "--device cpu" in err


def test_device_auto_takes_the_cpu_when_the_gpu_cannot_hold_the_plan(home: Path, monkeypatch, caplog) -> None:
    """`ft run` (device auto, the default) on a machine whose GPU is too small for the model's dense
    weights and KV: the CPU runtime, with the planner's reason in a warning."""
    from ftpull import run as run_mod
    from runtime.planner.resources import GPU, Machine

    small_gpu = Machine(ram_total_bytes=16 << 30, ram_available_bytes=16 << 30, num_physical_cores=2,
                        gpu=GPU("tiny card", 1 << 20, 1 << 20))
    monkeypatch.setattr(run_mod.Machine, "probe", staticmethod(lambda: small_gpu))
    loaded, chat, _ = run_mod.load_for_chat(Store(home), "tiny", dtype=None, num_ctx=256, overrides={})
    assert getattr(loaded.experts, "elastic", None) is None  # the CPU runtime: no VRAM budget
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(m == "running tiny:latest on the CPU: the dense weights do not fit in VRAM" for m in warned)
    assert chat.ask("Hello", lambda s: None).tokens


@pytest.mark.parametrize("host_embedding", [False, True])
def test_queued_decode_gives_the_plain_loops_answers(tiny, host_embedding: bool) -> None:
    """The engine's queued loop (each step queued before its token is known, as on the GPU),
    through DeviceModel's queue path, here on the CPU where no step is captured (each queued step
    runs when started): the plain loop's tokens and stop reasons for every way a generation ends,
    the state counting exactly the tokens it holds afterwards (a step queued for a token that did
    not come is taken back), so a cached continuation equals a fresh one. With the token
    embeddings in host memory too, as the GPU path keeps them (the host writes each step's row)."""
    from runtime.gpu.device_model import DeviceModel
    from tests.test_gpu_executor import hybrid, make_banks

    loaded, tokenizer = tiny
    ex = hybrid(make_banks(), "offload", slots=20)
    ex.graphs = object()  # as on CUDA: the step path is taken (begin_step answers None on the CPU)
    queued = DeviceModel(loaded.model, "cpu", ex.steps, host_embedding=host_embedding)
    assert queued.can_queue and (queued.embedding is not None) == host_embedding
    prompt = tokenizer.encode("Once upon a time")
    free = SamplingParams(temperature=0, max_tokens=24)
    plain = Session(loaded.model, tokenizer, 256).generate(prompt, free)
    session = Session(queued, tokenizer, 256)
    assert session.generate(prompt, free).tokens == plain.tokens
    assert session.state.length == len(session.tokens) == len(prompt) + len(plain.tokens)
    cut = plain.text[len(plain.text) // 2:][:3]
    for params, ctx in ((SamplingParams(temperature=0, max_tokens=24, stop=(cut,)), 256),
                        (SamplingParams(temperature=0), len(prompt) + 5),
                        (SamplingParams(temperature=0.8, seed=4, max_tokens=10), 256),
                        (SamplingParams(temperature=0.9, seed=5, max_tokens=12, repeat_penalty=1.3,
                                        presence_penalty=0.2), 256),  # the best logits only, penalised
                        (SamplingParams(temperature=0.9, seed=6, max_tokens=8, top_k=0), 256)):  # the whole row
        want = Session(loaded.model, tokenizer, ctx).generate(prompt, params)
        got = Session(queued, tokenizer, ctx)
        answer = got.generate(prompt, params)
        assert (answer.tokens, answer.stop_reason) == (want.tokens, want.stop_reason)
        assert got.state.length == len(got.tokens)
    longer = prompt + plain.tokens[:4]
    assert session.generate(longer, free).tokens == Session(loaded.model, tokenizer, 256).generate(longer, free).tokens
    assert ex.steps.first_calls == 0  # nothing captured on the CPU


def test_ft_serve_queues_decode_steps_where_one_generation_runs_at_a_time(tiny) -> None:
    """ft serve's model wrapper (scheduler.CancellableModel) lets a generation queue its decode
    steps as ft run does, only where its one session runs one generation at a time: the plain
    loop's tokens; a job cancelled mid-answer stops at its next queued step, and the session,
    trimmed to what its state holds as the runner trims it, continues as a fresh one would."""
    import threading
    from types import SimpleNamespace

    from runtime.gpu.device_model import DeviceModel
    from runtime.server.scheduler import CancellableModel, GenerationCancelled
    from tests.test_gpu_executor import hybrid, make_banks

    loaded, tokenizer = tiny
    ex = hybrid(make_banks(), "offload", slots=20)
    ex.graphs = object()  # (the step path, as in test_queued_decode_gives_the_plain_loops_answers)
    queued = DeviceModel(loaded.model, "cpu", ex.steps)
    assert not CancellableModel(queued).can_queue  # several sessions: generations take turns step by step
    assert not CancellableModel(loaded.model, queue_ahead=True).can_queue  # a model that cannot queue
    served = CancellableModel(queued, queue_ahead=True)
    assert served.can_queue
    prompt = tokenizer.encode("Once upon a time")
    free = SamplingParams(temperature=0, max_tokens=24)
    plain = Session(loaded.model, tokenizer, 256).generate(prompt, free)
    session = Session(served, tokenizer, 256)
    assert session.generate(prompt, free).tokens == plain.tokens
    assert session.state.length == len(session.tokens)

    job = SimpleNamespace(cancelled=threading.Event())
    served.running(job)
    seen = []

    def cancel_after_three(text: str) -> None:
        seen.append(text)
        if len(seen) == 3:
            job.cancelled.set()

    session = Session(served, tokenizer, 256)
    with pytest.raises(GenerationCancelled):
        session.generate(prompt, free, cancel_after_three)
    served.running(None)
    session.tokens = session.tokens[: session.state.length]  # (runner.py, on GenerationCancelled)
    assert len(prompt) < session.state.length < len(prompt) + len(plain.tokens)
    assert session.tokens == prompt + plain.tokens[: session.state.length - len(prompt)]
    longer = prompt + plain.tokens[:6]
    assert session.generate(longer, free).tokens == Session(loaded.model, tokenizer, 256).generate(longer, free).tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_queued_decode_gives_the_cpu_backends_answers(home: Path, tiny) -> None:
    """On the GPU the engine queues each step (a captured step graph, held by the doorbell) while
    the one before runs: the CPU backend's greedy answers for each way a generation ends, and a
    session's cached continuation as a fresh one."""
    reference, tokenizer = tiny
    loaded = load(Store(home), "tiny", torch.float32, backend="gpu", device="cuda", mode="offload")
    assert loaded.model.can_queue
    prompt = tokenizer.encode("Once upon a time")
    free = SamplingParams(temperature=0, max_tokens=24)
    plain = Session(reference.model, tokenizer, 256).generate(prompt, free)
    cut = plain.text[len(plain.text) // 2:][:3]
    session = Session(loaded.model, tokenizer, 256)
    for params, ctx in ((free, 256), (SamplingParams(temperature=0, max_tokens=24, stop=(cut,)), 256),
                        (SamplingParams(temperature=0), len(prompt) + 5)):
        want = Session(reference.model, tokenizer, ctx).generate(prompt, params)
        got = (session if ctx == 256 else Session(loaded.model, tokenizer, ctx)).generate(prompt, params)
        assert (got.tokens, got.stop_reason) == (want.tokens, want.stop_reason)
    longer = prompt + plain.tokens[:4]
    assert session.generate(longer, free).tokens == Session(reference.model, tokenizer, 256).generate(longer, free).tokens
    steps = loaded.experts.steps
    assert steps.replays > 20 and steps.doorbell is not None and steps.doorbell.count > 20, (steps.replays,)
    loaded.experts.close()


def test_show_parameters_through_a_server_that_went_away_leaves_the_chat_going() -> None:
    from ftpull.run import handle_command
    from ftpull.serve import NoServer, RemoteChat

    class Gone:
        def post(self, path, body):
            raise NoServer("no ft server is running")

    chat = RemoteChat(Gone(), "tiny", {"temperature": 0})
    said: list[str] = []
    assert handle_command(chat, "/show parameters", said.append)  # type: ignore[arg-type]
    assert said == ["temperature     0"]


def test_an_explicit_num_ctx_is_planned_exactly_or_refused_with_the_numbers(home: Path, capsys, monkeypatch,
                                                                             caplog) -> None:
    """`ft run --num-ctx N` (the user's) is the context, or the load fails naming what it needs,
    what is left and the most that fits (it was cut to what the KV budget allowed, in silence);
    above the model's own context it is lowered to it, with a warning."""
    from ftpull import run as run_mod
    from runtime.planner.plan import FitError, ModelFootprint, PlanOverrides, plan
    from runtime.planner.resources import GPU, Machine

    monkeypatch.setenv("FT_HOME", str(home))
    store = Store(home)
    with open_model(store, "tiny").open_ftw() as reader:
        footprint = ModelFootprint.from_index(reader.index, name="tiny:latest")
    roomy = Machine(ram_total_bytes=64 << 30, ram_available_bytes=64 << 30, num_physical_cores=2,
                    gpu=GPU("emulated", 8 << 30, 8 << 30))
    sized = plan(footprint, roomy, PlanOverrides(num_ctx=1000, device="gpu"))
    tight = Machine(ram_total_bytes=64 << 30, ram_available_bytes=64 << 30, num_physical_cores=2,
                    gpu=GPU("small card", 1 << 30, sized.dense_bytes + sized.workspace_bytes + sized.kv_bytes))
    monkeypatch.setattr(run_mod.Machine, "probe", staticmethod(lambda: tight))
    code, _, err = ft(capsys, "run", "--local", "tiny", "hi", "--num-ctx", "1500")
    text = " ".join(err.split())
    assert code == 1 and "KV for num_ctx 1500 tokens" in text and "enough for at most 1000 tokens" in text, err
    assert "a smaller num_ctx (at most 1000)" in text and "--vram-gib" in text and "--device cpu" in text
    with pytest.raises(FitError):
        run_mod.load_for_chat(store, "tiny", dtype=None, num_ctx=1500, overrides={})
    soft = plan(footprint, tight, PlanOverrides(default_num_ctx=1500))  # a recipe's: no refusal, the CPU's RAM holds it
    assert soft.device == "cpu" and soft.context_length == 1500

    cpu_box = Machine(ram_total_bytes=16 << 30, ram_available_bytes=16 << 30, num_physical_cores=2)
    monkeypatch.setattr(run_mod.Machine, "probe", staticmethod(lambda: cpu_box))
    _, chat, _ = run_mod.load_for_chat(store, "tiny", dtype=None, num_ctx=300, overrides={})
    assert chat.session.context_length == 300 and chat.shown_parameters()["num_ctx"] == 300
    with caplog.at_level(logging.WARNING, logger="ftpull.run"):
        _, chat, _ = run_mod.load_for_chat(store, "tiny", dtype=None, num_ctx=99999, overrides={})
    assert chat.session.context_length == 2048
    assert "num_ctx 99999 is above the model's context of 2048: clamped to it" in caplog.text


def test_set_parameter_num_ctx_plans_the_context_or_says_why_not(home: Path, monkeypatch) -> None:
    """/set parameter num_ctx in a local chat makes the conversation's context that (the next
    message reads it again), or says why not with the numbers; through a server, the server plans
    it with the next message. A load option in the options never stops the sampling ones."""
    from ftpull import run as run_mod
    from ftpull.run import handle_command
    from ftpull.serve import RemoteChat
    from runtime.planner.plan import ModelFootprint, PlanOverrides, plan
    from runtime.planner.resources import Machine

    store = Store(home)
    with open_model(store, "tiny").open_ftw() as reader:
        footprint = ModelFootprint.from_index(reader.index, name="tiny:latest")
    roomy = Machine(ram_total_bytes=64 << 30, ram_available_bytes=64 << 30, num_physical_cores=2)
    holds_1000 = plan(footprint, roomy, PlanOverrides(num_ctx=1000)).ram_needed_bytes  # RAM for 1000 tokens of KV
    machine = Machine(ram_total_bytes=holds_1000, ram_available_bytes=holds_1000, num_physical_cores=2)
    monkeypatch.setattr(run_mod.Machine, "probe", staticmethod(lambda: machine))
    _, chat, _ = run_mod.load_for_chat(store, "tiny", dtype=None, num_ctx=256,
                                       overrides={"num_predict": 2, "temperature": 0})
    said: list[str] = []
    handle_command(chat, "/set parameter num_ctx 512", said.append)
    assert said[-1].startswith("Set parameter 'num_ctx' to '512'") and chat.session.context_length == 512
    assert chat.ask("Hello", lambda s: None).tokens and chat.shown_parameters()["num_ctx"] == 512
    handle_command(chat, "/set parameter num_ctx 2000", said.append)
    assert said[-1].startswith("Error: tiny:latest does not fit") and "at most 1000 tokens" in said[-1], said[-1]
    assert chat.session.context_length == 512  # as it was
    handle_command(chat, "/set parameter num_ctx lots", said.append)
    assert said[-1] == "Error: num_ctx is a number of tokens, at least 1, not 'lots'"
    handle_command(chat, "/set parameter temperature 0.5", said.append)
    assert said[-1] == "Set parameter 'temperature' to '0.5'"

    remote = RemoteChat(object(), "tiny", {"num_ctx": 4096})  # (ft run --num-ctx through a server)
    handle_command(remote, "/set parameter temperature 0", said.append)  # type: ignore[arg-type]
    assert said[-1] == "Set parameter 'temperature' to '0'"
    handle_command(remote, "/set parameter num_ctx 8192", said.append)  # type: ignore[arg-type]
    assert said[-1] == "Set parameter 'num_ctx' to '8192'" and remote.options == {"num_ctx": 8192, "temperature": 0}


def test_set_parameter_num_ctx_on_the_gpu_stays_within_the_kv_its_load_sized(tiny) -> None:
    """On the GPU the KV cache was sized at load beside the expert cache: a smaller context runs
    in it, a larger one (that the budget would hold with a new load) is refused with the way."""
    from dataclasses import replace

    from ftpull.run import Chat, handle_command
    from runtime.planner.plan import ModelFootprint, PlanOverrides, plan
    from runtime.planner.resources import GPU, Machine

    loaded, tokenizer = tiny
    with loaded.registered.open_ftw() as reader:
        footprint = ModelFootprint.from_index(reader.index, name="tiny:latest")
    machine = Machine(ram_total_bytes=16 << 30, ram_available_bytes=16 << 30, num_physical_cores=2,
                      gpu=GPU("emulated", 8 << 30, 8 << 30))
    wanted = PlanOverrides(num_ctx=256, device="gpu")
    fit = plan(footprint, machine, wanted)
    chat = Chat(Session(loaded.model, tokenizer, 256), tokenizer, {"num_predict": 2}, fit=fit,
                replan=lambda n: plan(footprint, machine, replace(wanted, num_ctx=n)), num_ctx=256)
    said: list[str] = []
    handle_command(chat, "/set parameter num_ctx 128", said.append)
    assert said[-1].startswith("Set parameter 'num_ctx' to '128'") and chat.session.context_length == 128
    handle_command(chat, "/set parameter num_ctx 1024", said.append)
    assert said[-1] == ("Error: this model was loaded on the GPU with KV for 256 tokens beside its expert cache; "
                        "num_ctx 1024 needs a new load: ft run tiny:latest --num-ctx 1024")
    assert chat.session.context_length == 128 and chat.num_ctx == 128


def test_the_cpu_kernel_is_made_at_load_not_in_the_first_prompt(home: Path, monkeypatch) -> None:
    """The first run's ~8 s compile of the CPU kernel showed as `prompt eval duration: 8.080s
    (1.36 tokens/s)`: it is made while loading now, so the prompt's rate is the prompt's."""
    from runtime.loading import runnable

    made = []
    real = runnable.native_kernel
    monkeypatch.setattr(runnable, "native_kernel", lambda: made.append("load") or real())
    runnable.load(Store(home), "tiny")
    assert made == ["load"]


def test_ctrl_c_while_a_stored_model_loads_promises_no_download(home: Path, capsys, monkeypatch) -> None:
    """Ctrl-C during `ft run`'s load said "a download resumes where it stopped" (its hint for the
    pull): the model is stored by then, and the message says so."""
    from ftpull import run as run_mod

    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setenv("FT_HOME", str(home))
    monkeypatch.setattr(run_mod, "load_for_chat", interrupted)
    code, _, err = ft(capsys, "run", "tiny", "hi", "--local")
    assert code == 130 and "resumes" not in err and "interrupted (the model is stored" in err, err


def test_ctrl_c_during_a_one_shot_answer_says_it_stopped(home: Path, capsys, monkeypatch) -> None:
    """Ctrl-C during `ft run M PROMPT`'s answer said "a download resumes where it stopped"."""
    from ftpull import run as run_mod

    def interrupted(self: object, text: str, on_text) -> None:
        on_text("partial")
        raise KeyboardInterrupt

    monkeypatch.setenv("FT_HOME", str(home))
    monkeypatch.setattr(run_mod.Chat, "ask", interrupted)
    code, out, err = ft(capsys, "run", "tiny", "hi", "--local")
    assert code == 130 and out == "partial" and err == "\n(stopped)\n", err


def test_a_first_use_kernel_build_is_said_on_stderr(home: Path, tmp_path: Path) -> None:
    """The CPU kernel's compile at a machine's first load (~8 s) was silent without -v: `ft run`
    says it on stderr now. (A stand-in compiler that builds nothing: the run goes on, on torch.)"""
    cxx = tmp_path / "cxx"
    cxx.write_text("#!/bin/sh\n[ \"$1\" = -dumpfullversion ] && echo 1; exit 0\n")
    cxx.chmod(0o755)
    env = {**os.environ, "FT_HOME": str(home), "CXX": str(cxx), "FT_KERNEL_CACHE": str(tmp_path / "kernels")}
    done = subprocess.run([sys.executable, "-m", "ftpull", "run", "tiny", "hi", "--num-predict", "2", "--local"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "compiling the CPU expert kernel for this CPU (once; kept in" in done.stderr, done.stderr
    assert "CPU expert kernel unavailable" in done.stderr  # (the stand-in's; said once, not twice)
    assert done.stderr.count("compiling the CPU expert kernel") == 1


def test_repl_shows_the_models_sections_and_sets_verbose_as_ollama_does(home: Path, monkeypatch, capsys) -> None:
    """/show info, modelfile, system, template, license and parameters (the context it runs with
    among them), /set verbose and /set quiet, through a chat `ft run` loaded."""
    from ftpull.run import load_for_chat, repl

    _, chat, _ = load_for_chat(Store(home), "tiny", dtype=None, num_ctx=None, overrides={"num_predict": 3, "seed": 0},
                               device="cpu")
    script = "\n".join(["/show info", "/show modelfile", "/show template", "/show license", "/show system",
                        "/set system You answer in rhymes.", "/show system", "/show parameters", "/set verbose",
                        "hello", "/set quiet", "hello again", "/bye"]) + "\n"
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(script))
    repl(chat, verbose=False, load_seconds=0.0)
    out, err = capsys.readouterr()
    assert "architecture" in out and "qwen3_moe" in out and "FROM " in out  # info, then the Modelfile
    assert "No system message was specified for this model." in out and "You answer in rhymes." in out
    assert "{%" in out or "{{" in out  # the chat template
    assert f"num_ctx         {chat.session.context_length}" in out
    assert "Set 'verbose' mode." in out and "Set 'quiet' mode." in out
    assert err.count("eval rate:") == 2  # prompt and eval rate of the one answer asked in verbose mode


def test_repl_shows_a_servers_sections_and_says_when_it_cannot() -> None:
    from ftpull.run import handle_command
    from ftpull.serve import NoServer, RemoteChat

    class Server:
        gone = False

        def post(self, path, body):
            if self.gone:
                raise NoServer("no ft server is running")
            return {"modelfile": "FROM tiny\n", "template": "{{ messages }}", "license": "MIT", "system": "Be brief.",
                    "details": {"parameter_size": "1.2M", "quantization_level": "F32"},
                    "model_info": {"general.architecture": "qwen3_moe", "qwen3_moe.context_length": 2048}}

    server = Server()
    chat = RemoteChat(server, "tiny", {})
    said: list[str] = []
    for section in ("info", "modelfile", "template", "license", "system"):
        assert handle_command(chat, f"/show {section}", said.append)  # type: ignore[arg-type]
    assert "qwen3_moe" in said[0] and "context length      2048" in said[0]
    assert said[1:] == ["FROM tiny", "{{ messages }}", "MIT", "Be brief."]
    server.gone = True
    assert handle_command(chat, "/show license", said.append)  # type: ignore[arg-type]
    assert said[-1].startswith("Error: the server could not show tiny")


def test_the_terminal_repl_edits_lines_and_keeps_a_history(home: Path, tmp_path: Path) -> None:
    """On a terminal (a pty here) the arrow keys move in the line and through the history, as in
    Ollama's REPL, instead of reaching the model as escape codes; the history is kept in
    $FT_HOME/history for the next run."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # the child: ft run on the terminal
        os.environ["FT_HOME"] = str(home)
        os.execv(sys.executable, [sys.executable, "-m", "ftpull", "run", "tiny", "--local", "--num-predict", "2"])
    seen = b""

    def until(marker: bytes, timeout: float = 120.0) -> None:
        nonlocal seen
        while marker not in seen:
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready, f"no {marker!r} after {timeout} s; the terminal showed {seen[-500:]!r}"
            seen += os.read(fd, 4096)

    try:
        until(b">>> ")
        os.write(fd, b"/set system xyz\r")
        until(b"Set system message.")
        # a line edited: typed "/show systm", Left once, "e" inserted -> "/show system"
        os.write(fd, b"/show systm\x1b[De\r")
        until(b"\r\nxyz\r\n")  # its answer, a line of its own (the echo of the /set line ends in "system xyz")
        os.write(fd, b"/set system abc\r")
        until(b"Set system message.\r\n>>> ")
        os.write(fd, b"\x1b[A\x1b[A\r")  # Up twice: "/show system" again, from the history
        until(b"\r\nabc\r\n")
        os.write(fd, b"/bye\r")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(fd)
    history = (home / "history").read_text()
    assert "/show system" in history and "/set system abc" in history


def test_a_vram_budget_without_a_gpu_is_said_to_do_nothing(home: Path, caplog) -> None:
    from ftpull.run import load_for_chat
    from runtime.planner.resources import Machine

    if Machine.probe().gpu is not None:
        pytest.skip("this machine has a GPU")
    with caplog.at_level(logging.WARNING, logger="ftpull.run"):
        load_for_chat(Store(home), "tiny", dtype=None, num_ctx=None, overrides={}, vram_gib=4.0)
    assert "--vram-gib 4 has no effect: no GPU was found" in caplog.text


def test_a_blank_prompt_at_a_terminal_opens_the_repl_as_an_empty_one_does(tiny, monkeypatch, capsys) -> None:
    """`ft run M ""` opened the REPL and `ft run M "   "` was an error; both open it now (piped
    blank input is still refused: there is nobody to chat with)."""
    import io

    import click

    from ftpull.cli import _answer_or_chat
    from ftpull.run import Chat

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    loaded, tokenizer = tiny
    chat = Chat(Session(loaded.model, tokenizer, 512), tokenizer, {"num_predict": 2, "seed": 0})
    for blank in ("", "   "):
        monkeypatch.setattr(sys, "stdin", Terminal("/bye\n"))
        _answer_or_chat(chat, blank, False, 0.0)
        assert ">>> " in capsys.readouterr().out, repr(blank)
    monkeypatch.setattr(sys, "stdin", io.StringIO("  \n"))
    with pytest.raises(click.UsageError, match="the prompt is empty"):
        _answer_or_chat(chat, "", False, 0.0)
