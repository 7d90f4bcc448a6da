"""The REPL's /load and /save (as Ollama's), and the Modelfile MESSAGE instruction they rely on."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftpull.modelfile import ModelfileError, parse_modelfile
from ftpull.repl_models import ModelLoader
from ftpull.run import HELP, handle_command, load_for_chat, repl
from registry import Store
from runtime.loading.registered import MEDIA_FTW_SHARD, open_model
from runtime.planner.placement import FitError
from tests.clirun import ft


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("ft_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FT_HOME", str(root))
        from ftpull.cli import _run

        try:
            _run(["pull", "tiny"])
        except SystemExit as e:
            assert not e.code
        yield root


def _chat(home: Path):
    return load_for_chat(Store(home), "tiny", dtype=None, num_ctx=None, overrides={"num_predict": 4, "seed": 0},
                         device="cpu")[1]


def _repl(chat, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *lines: str) -> str:
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join([*lines, "/bye"]) + "\n"))
    repl(chat, verbose=False, load_seconds=0.0)
    return capsys.readouterr().out


def test_modelfile_message_lines_parse_and_write_back() -> None:
    text = ('FROM hf://org/model\nFAMILY qwen3_moe\nMESSAGE user Is the sky "blue"? # asked\n'
            'MESSAGE assistant """Yes.\nMostly."""\nTAG other\nMESSAGE system "Be brief."\n')
    modelfile = parse_modelfile(text, name="m")
    assert modelfile.default.messages == (("user", 'Is the sky "blue"? # asked'), ("assistant", "Yes.\nMostly."))
    assert modelfile.tags["other"].messages == (("system", "Be brief."),)  # a TAG's MESSAGEs replace the list
    assert parse_modelfile(modelfile.to_text(), name="m") == modelfile
    with pytest.raises(ModelfileError, match="MESSAGE role 'robot' is not one of system, user, assistant"):
        parse_modelfile("FROM hf://o/m\nFAMILY qwen3_moe\nMESSAGE robot hi\n", name="m")
    with pytest.raises(ModelfileError, match="expected MESSAGE <role> <text>"):
        parse_modelfile("FROM hf://o/m\nFAMILY qwen3_moe\nMESSAGE user\n", name="m")


def test_help_lists_load_and_save() -> None:
    assert "/load MODEL" in HELP and "/save MODEL" in HELP


def test_save_keeps_the_chat_as_a_model_that_shares_the_weights(home: Path, monkeypatch, capsys) -> None:
    chat = _chat(home)
    out = _repl(chat, monkeypatch, capsys, "/set system You answer tersely.", "/set parameter temperature 0",
                "hello there", "/save", "/save bad!name", "/save my-chat")
    assert "Usage:\n  /save <model>" in out
    assert "Error: invalid model name" in out
    assert "Created new model 'my-chat:latest'" in out
    store = Store(home)
    saved, tiny = open_model(store, "my-chat"), open_model(store, "tiny")
    shards = [d.digest for d in tiny.manifest.layers if d.media_type == MEDIA_FTW_SHARD]
    assert shards and [d.digest for d in saved.manifest.layers if d.media_type == MEDIA_FTW_SHARD] == shards
    modelfile = saved.text("Modelfile")
    assert 'SYSTEM "You answer tersely."' in modelfile and "PARAMETER temperature 0" in modelfile
    assert 'MESSAGE user "hello there"' in modelfile and "MESSAGE assistant" in modelfile
    assert saved.config["messages"] == chat.messages and saved.config["variant_of"] == "tiny:latest"

    # `ft run my-chat` starts with the saved conversation: the same prompt reads more tokens
    def prompt_tokens(name: str) -> int:
        code, _, err = ft(capsys, "run", name, "and again?", "--num-predict", "2", "--verbose", "--local")
        assert code == 0, err
        line = next(x for x in err.splitlines() if x.startswith("prompt eval count:"))
        return int(line.split(":")[1].split()[0])

    assert prompt_tokens("my-chat") > prompt_tokens("tiny") + 4


def test_load_switches_model_keeps_parameters_and_starts_with_its_messages(home: Path, monkeypatch, capsys) -> None:
    chat = _chat(home)
    _repl(chat, monkeypatch, capsys, "/set parameter top_k 3", "hi", "/save greeter")
    chat = _chat(home)
    out = _repl(chat, monkeypatch, capsys, "/set parameter temperature 0.5", "/set system Other rules.", "a question",
                "/load", "/load tiyn", "/load no-such-model", "/load greeter")
    assert "Usage:\n  /load <model>" in out
    assert "did you mean 'tiny:latest'?" in out  # the misspelling is told its likely meaning
    assert "model 'no-such-model:latest' not found" in out
    assert "Loading model 'greeter'" in out and "Loaded model 'greeter:latest'" in out and ">>> hi" in out
    assert chat.model_name == "greeter:latest"
    assert [m["content"] for m in chat.messages][:1] == ["hi"] and len(chat.messages) == 2  # its own, not ours
    assert chat.system is None  # /set system went with the old conversation (greeter has none)
    assert chat.options["temperature"] == 0.5 and chat.options["top_k"] == 3  # ours kept, greeter's own applied
    handle_command(chat, "/clear", lambda s: None)
    assert len(chat.messages) == 2  # the model's own MESSAGEs stay, as Ollama keeps them


def test_a_load_that_fails_loads_the_previous_model_again(home: Path) -> None:
    chat = _chat(home)
    real = chat.loader

    def load(name: str, overrides: dict):
        if name == "my-other:latest":
            raise FitError("my-other does not fit this machine")
        return real.load(name, overrides)

    handle_command(chat, "/save my-other", lambda s: None)
    chat.loader = ModelLoader(real.store, load)
    said: list[str] = []
    assert handle_command(chat, "/load my-other", said.append)
    assert said[-1] == "Error: my-other does not fit this machine"
    assert chat.model_name == "tiny:latest" and chat.session is not None


def test_a_server_puts_the_models_messages_after_its_system_prompt() -> None:
    from types import SimpleNamespace

    from runtime.server.prompts import with_system

    saved = SimpleNamespace(config={"system": "Be brief.", "messages": [{"role": "user", "content": "hi"},
                                                                         {"role": "assistant", "content": "hello"}]})
    asked = [{"role": "user", "content": "and now?"}]
    assert [m["content"] for m in with_system(saved, asked)] == ["Be brief.", "hi", "hello", "and now?"]  # type: ignore[arg-type]
