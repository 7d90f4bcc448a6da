"""`ft launch AGENT NAME`: the configuration that points a coding agent at `ft serve`, tested
against the server it describes with the real client of the agent's API (anthropic for Claude
Code, openai's Chat Completions for opencode's openai-compatible provider)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from ftpull.launch import LaunchError, launch_text
from tests.clirun import ft
from tests.test_server_util import LiveServer, pulled_home


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("launch-home")
    pulled_home(root)
    return root


def _exports(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            out[key] = shlex.split(value)[0]
    return out


def test_claude_code_environment_reaches_the_server_through_the_anthropic_client(home, capsys, monkeypatch) -> None:
    import anthropic

    monkeypatch.setenv("FT_HOME", str(home))
    with LiveServer(__import__("registry").Store(home)) as server:
        monkeypatch.setenv("FT_HOST", server.url)
        code, out, _ = ft(capsys, "launch", "claude", "tiny")
        assert code == 0
        env = _exports(out)
        assert env["ANTHROPIC_BASE_URL"] == server.url and env["ANTHROPIC_MODEL"] == "tiny:latest"
        assert env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "tiny:latest"  # side requests: the same loaded model
        client = anthropic.Anthropic(base_url=env["ANTHROPIC_BASE_URL"], auth_token=env["ANTHROPIC_AUTH_TOKEN"],
                                     max_retries=0, timeout=120)
        reply = client.messages.create(model=env["ANTHROPIC_MODEL"], max_tokens=4,
                                       messages=[{"role": "user", "content": "Hello"}])
        assert reply.usage.output_tokens > 0


def test_opencode_config_is_written_once_and_its_provider_answers(home, capsys, monkeypatch, tmp_path) -> None:
    import openai

    monkeypatch.setenv("FT_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    with LiveServer(__import__("registry").Store(home)) as server:
        monkeypatch.setenv("FT_HOST", server.url)
        code, out, _ = ft(capsys, "launch", "opencode", "tiny", "--write")
        assert code == 0 and "wrote" in out
        config = json.loads((tmp_path / "opencode.json").read_text())
        provider = config["provider"]["ft"]
        assert config["model"] == "ft/tiny:latest" and provider["npm"] == "@ai-sdk/openai-compatible"
        client = openai.OpenAI(base_url=provider["options"]["baseURL"], api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="tiny:latest", max_tokens=4,
                                               messages=[{"role": "user", "content": "Hello"}])
        assert reply.usage.completion_tokens > 0
        code, _, err = ft(capsys, "launch", "opencode", "tiny", "--write")  # never over an existing file
        assert code == 1 and "exists; ft does not overwrite it" in err


def test_codex_config_names_a_responses_provider_that_answers(home, capsys, monkeypatch) -> None:
    import openai
    import tomllib

    monkeypatch.setenv("FT_HOME", str(home))
    monkeypatch.delenv("FT_API_KEY", raising=False)
    with LiveServer(__import__("registry").Store(home)) as server:
        monkeypatch.setenv("FT_HOST", server.url)
        code, out, _ = ft(capsys, "launch", "codex", "tiny")
        assert code == 0
        config = tomllib.loads(out)
        provider = config["model_providers"][config["model_provider"]]
        assert provider["wire_api"] == "responses" and "env_key" not in provider
        client = openai.OpenAI(base_url=provider["base_url"], api_key="unused", max_retries=0, timeout=120)
        reply = client.responses.create(model=config["model"], input="Hello", max_output_tokens=4)
        assert reply.usage.output_tokens > 0
    assert 'env_key = "FT_API_KEY"' in launch_text("codex", "m:latest", url="http://h:1", api_key="secret")


def test_what_cannot_be_configured_is_refused_with_the_reason(home, capsys, monkeypatch) -> None:
    monkeypatch.setenv("FT_HOME", str(home))
    code, _, err = ft(capsys, "launch", "claude", "tinny")  # not a local model: the nearest names
    assert code == 1 and "tiny" in err
    with pytest.raises(LaunchError, match="not 'vim'"):
        launch_text("vim", "tiny:latest", url="http://127.0.0.1:1")
    assert "FT_API_KEY" not in launch_text("claude", "m:latest", url="http://h:1", api_key="secret")
    assert "ANTHROPIC_AUTH_TOKEN=secret" in launch_text("claude", "m:latest", url="http://h:1", api_key="secret")
