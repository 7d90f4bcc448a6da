"""`ft serve`, `ft ps`, `ft stop` and `ft run` against a live server (a real `ft serve` process)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from tests.clirun import ft
from tests.test_server_util import free_port, pulled_home

KEY = "cli-test-key"




@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`python -m ftpull serve` on a free port, with an API key, over a store holding tiny."""
    home = tmp_path_factory.mktemp("ft_home")
    pulled_home(home)
    host = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "FT_HOME": str(home), "FT_HOST": host, "FT_API_KEY": KEY, "FT_KEEP_ALIVE": "-1"}
    process = subprocess.Popen([sys.executable, "-m", "ftpull", "serve"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://{host}/", timeout=1).text == "Ollama is running":
                break
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"ft serve did not start:\n{process.stdout.read() if process.stdout else ''}")
        time.sleep(0.1)
    try:
        yield host, home
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: a clean shutdown
        try:
            assert process.wait(timeout=20) == 0
            said = process.stdout.read() if process.stdout else ""
            where = "models run on the CPU" if not torch.cuda.is_available() else "where their plan fits"
            assert f"ft serve: listening on http://{host}; {where}" in said, said
        finally:
            if process.poll() is None:
                process.kill()


@pytest.fixture
def env(served: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> str:
    host, home = served
    monkeypatch.setenv("FT_HOST", host)
    monkeypatch.setenv("FT_API_KEY", KEY)
    monkeypatch.setenv("FT_HOME", str(home))
    return host


def test_the_server_wants_its_key(env: str) -> None:
    assert httpx.get(f"http://{env}/api/tags").status_code == 401
    assert httpx.get(f"http://{env}/api/tags", headers={"Authorization": f"Bearer {KEY}"}).json()["models"]


def test_run_ps_stop(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ft(capsys, "ps")
    assert code == 0 and out.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "KV", "CACHE", "UNTIL"]
    code, out, err = ft(capsys, "run", "tiny", "Hello there", "--num-predict", "8", "--seed", "3", "--verbose")
    assert code == 0 and out.strip(), err
    assert "eval count:           8 token(s)" in err and "load duration:" in err
    assert "up to date" not in err  # (a model the server has is run without a word about it, as `ollama run` does)
    code, out, _ = ft(capsys, "ps")  # the server loaded it, not this process
    assert code == 0 and "tiny:latest" in out and "100% CPU" in out and "Forever" in out
    # same seed, same answer, in-process or through the server
    code, local, _ = ft(capsys, "run", "tiny", "Hello there", "--num-predict", "8", "--seed", "3", "--local")
    assert code == 0 and local == out_of_run(capsys)
    code, _, _ = ft(capsys, "stop", "tiny")
    assert code == 0
    deadline = time.monotonic() + 5
    while "tiny" in ft(capsys, "ps")[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "tiny" not in ft(capsys, "ps")[1]
    code, _, err = ft(capsys, "stop", "tiny")
    assert code == 1 and "not running" in err


def test_rm_unloads_the_model_from_the_server_first(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`ft rm` of a model the server holds frees it there too (it stayed loaded until its keep-alive,
    forever here); the server's other models stay."""
    assert ft(capsys, "cp", "tiny", "spare")[0] == 0
    for name in ("spare", "tiny"):
        assert ft(capsys, "run", name, "Hi", "--num-predict", "2")[0] == 0
    assert "spare:latest" in ft(capsys, "ps")[1]
    code, out, _ = ft(capsys, "rm", "spare")
    assert code == 0 and "deleted 'spare'" in out
    deadline = time.monotonic() + 5
    while "spare" in ft(capsys, "ps")[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    ps = ft(capsys, "ps")[1]
    assert "spare" not in ps and "tiny:latest" in ps


def out_of_run(capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = ft(capsys, "run", "tiny", "Hello there", "--num-predict", "8", "--seed", "3")
    assert code == 0, err
    return out


def test_repl_through_the_server(env: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from ftpull.run import repl
    from ftpull.serve import Client, RemoteChat

    chat = RemoteChat(Client(), "tiny", {"num_predict": 5})
    script = "/set parameter temperature 0\nfirst question\n/set parameter top_k banana\nsecond question\n/clear\n/bye\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    repl(chat, verbose=True, load_seconds=0.0)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert "Set parameter 'temperature' to '0'" in out and "Error:" in out and "Cleared session context" in out
    assert err.count("eval count:           5 token(s)") == 2 and chat.messages == []


def test_show_parameters_through_the_server_is_what_a_local_chat_shows(env: str, capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's defaults with the chat's settings over them, either way (through the server it
    showed only the settings)."""
    from ftpull.run import handle_command
    from ftpull.serve import Client, RemoteChat
    from registry import Store
    from runtime.loading.registered import open_model

    defaults = {k: v for k, v in open_model(Store.default(), "tiny").config["parameters"].items() if k != "num_ctx"}
    assert defaults  # (tiny's recipe has some)
    chat = RemoteChat(Client(), "tiny", {"num_predict": 5, "temperature": 0})
    shown = chat.shown_parameters()
    assert {k: v for k, v in shown.items() if k != "num_ctx"} == {**defaults, "num_predict": 5, "temperature": 0}
    said: list[str] = []
    handle_command(chat, "/show parameters", said.append)  # type: ignore[arg-type]
    assert "num_predict     5" in said[0] and all(k in said[0] for k in defaults)


def test_load_through_the_server_switches_the_chat_to_a_model_it_loads(env: str, capsys: pytest.CaptureFixture[str]
                                                                        ) -> None:
    """/load in a REPL through `ft serve`: the server loads the other model, the conversation
    and /set system go, /set parameters stay, the model's MESSAGEs are shown (the server starts
    its conversations with them); a model the server does not have is an error and the chat
    stays on its model."""
    from ftpull.run import handle_command
    from ftpull.serve import Client, RemoteChat

    modelfile = Path(os.environ["FT_HOME"]) / "greeter.Modelfile"
    modelfile.write_text('FROM tiny\nMESSAGE user "who are you?"\nMESSAGE assistant "a greeter"\n')
    assert ft(capsys, "create", "greeter", "-f", str(modelfile))[0] == 0
    chat = RemoteChat(Client(), "tiny", {"num_predict": 3, "temperature": 0})
    chat.system, chat.messages = "be terse", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    said: list[str] = []
    handle_command(chat, "/load greeter", said.append)  # type: ignore[arg-type]
    assert said[-1] == "Loaded model 'greeter:latest'\n>>> who are you?\na greeter\n", said
    assert chat.model == "greeter:latest" and chat.system is None and chat.messages == []
    assert chat.options == {"num_predict": 3, "temperature": 0}
    assert "greeter:latest" in ft(capsys, "ps")[1]
    answer = chat.ask("hello", lambda s: None)  # through the server
    assert answer.text and answer.stats.eval_tokens == 3
    handle_command(chat, "/load no-such-model", said.append)  # type: ignore[arg-type]
    assert said[-1].startswith("Error: the server could not load no-such-model:") and chat.model == "greeter:latest"


def test_save_through_the_server_stores_the_chat_there(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """/save in a REPL through `ft serve`: the server stores the chat as a model FROM the one it
    runs (system prompt, /set parameters, the messages so far), as a local /save would."""
    from ftpull.run import handle_command
    from ftpull.serve import Client, RemoteChat

    chat = RemoteChat(Client(), "tiny", {"num_predict": 3, "temperature": 0.5, "num_thread": 2})
    chat.system, chat.messages = "be terse", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    said: list[str] = []
    handle_command(chat, "/save kept-chat", said.append)  # type: ignore[arg-type]
    assert said[-1] == "Created new model 'kept-chat:latest'", said
    code, out, _ = ft(capsys, "show", "kept-chat", "--modelfile")
    assert code == 0 and 'SYSTEM "be terse"' in out and "PARAMETER temperature 0.5" in out
    assert 'MESSAGE user "hi"\nMESSAGE assistant "yo"' in out and "num_thread" not in out  # (a load option)
    assert ft(capsys, "rm", "kept-chat")[0] == 0


def test_no_server(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FT_HOST", f"127.0.0.1:{free_port()}")
    for command in (["ps"], ["stop", "tiny"], ["vram", "tiny", "6"]):
        code, _, err = ft(capsys, *command)
        assert code == 1 and "no ft server is running" in err and "ft serve" in err
    monkeypatch.setenv("FT_HOST", "localhost:http")
    code, _, err = ft(capsys, "serve")
    assert code == 2 and "port" in err


def test_serve_on_the_gpu_without_one_is_refused(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("runtime.planner.resources.probe_gpu", lambda: None)
    code, _, err = ft(capsys, "serve", "--device", "gpu")
    assert code == 1 and "--device gpu needs a CUDA GPU" in err and "--device cpu" in err


def test_serve_says_a_vram_budget_does_nothing_without_a_gpu(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`ft serve --vram-gib 4` on a machine without a GPU took the budget without a word (ft run
    and ft fit say it does nothing). A taken port ends the command after the note."""
    import socket

    monkeypatch.setattr("runtime.planner.resources.probe_gpu", lambda: None)
    monkeypatch.setenv("FT_HOME", str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        code, _, err = ft(capsys, "serve", "--vram-gib", "4", "--port", str(taken.getsockname()[1]))
    assert code == 1 and "note: --vram-gib 4 has no effect: no GPU was found, so models run on the CPU" in err, err


def test_run_through_a_server_says_its_load_options_stay_here(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`ft run M --vram-gib 4` with an `ft serve` running went to the server without the budget,
    and without a word."""
    from ftpull import cli, client

    monkeypatch.setattr(client.Client, "running", lambda self: True)
    monkeypatch.setattr(cli, "_run_on_server", lambda *a: None)
    code, _, err = ft(capsys, "run", "tiny", "hi", "--vram-gib", "4")
    assert code == 0 and "--vram-gib and --mode apply to a model this process loads" in err
    assert "`ft vram tiny GIB`" in err and "--local" in err
    assert "--vram-gib" not in ft(capsys, "run", "tiny", "hi")[2]


def test_serve_on_a_taken_port_says_so_before_listening(tmp_path: Path) -> None:
    """A busy port is an error that names it and the fix, with no "listening on" said before it."""
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        env = {**os.environ, "FT_HOME": str(tmp_path / "home"), "FT_HOST": f"127.0.0.1:{port}"}
        done = subprocess.run([sys.executable, "-m", "ftpull", "serve"], env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        taken.close()
    assert done.returncode == 1 and "listening on" not in done.stderr, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "FT_HOST=host:port" in done.stderr


def test_a_401_says_to_set_ft_api_key(served: tuple[str, Path], monkeypatch) -> None:
    from ftpull.serve import Client, ServerReplyError

    host, _ = served
    for key, words in ((None, "set FT_API_KEY to the key"), ("wrong", "FT_API_KEY is not the key")):
        monkeypatch.delenv("FT_API_KEY", raising=False)
        with pytest.raises(ServerReplyError) as e:
            Client(f"http://{host}", api_key=key).get("/api/tags")
        assert e.value.status == 401 and words in str(e.value), str(e.value)
