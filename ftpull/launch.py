"""`ft launch AGENT MODEL`: the configuration that points a coding agent at `ft serve`.

- **claude** (Claude Code) speaks Anthropic's Messages API, which `ft serve` answers at its root:
  the environment variables to set before `claude`. Its main model and the small fast model it
  uses for side requests (titles, summaries) are both the local one, so every request reuses
  the same loaded model and its prefix cache (runtime/server/session_pool.py).
- **opencode** speaks OpenAI's Chat Completions through its openai-compatible provider: an
  `opencode.json` (printed, or written to the current directory with --write).
- **codex** (OpenAI's Codex CLI) speaks only OpenAI's Responses API since 0.122 (`wire_api =
  "responses"`; "chat" was removed), which `ft serve` answers at /v1/responses: a provider "ft"
  and the model for ~/.codex/config.toml (printed: ft does not edit a file of the user's).

The server address is FT_HOST's (as `ft serve` and the CLI read it), the key FT_API_KEY's where
one is set (else a placeholder: the agents insist on one, a server without --api-key ignores it).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from .client import server_url

AGENTS = ("claude", "opencode", "codex")
PLACEHOLDER_KEY = "ft-local"  # any value: a server started without --api-key takes every key


class LaunchError(ValueError):
    """An agent ft cannot configure (yet), or a configuration file that is already there."""


def claude_environment(model: str, url: str, api_key: str | None) -> dict[str, str]:
    """Claude Code's variables: the Anthropic endpoint, its key, and the local model for every role."""
    return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": api_key or PLACEHOLDER_KEY, "ANTHROPIC_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def opencode_config(model: str, url: str, api_key: str | None) -> dict:
    """opencode.json: a provider "ft" over the OpenAI-compatible endpoint, its one model the default."""
    options: dict[str, str] = {"baseURL": url + "/v1"}
    if api_key:
        options["apiKey"] = api_key
    return {"$schema": "https://opencode.ai/config.json",
            "provider": {"ft": {"npm": "@ai-sdk/openai-compatible", "name": "ft (local)", "options": options,
                                "models": {model: {"name": model}}}},
            "model": f"ft/{model}"}


def codex_config(model: str, url: str, api_key: str | None) -> str:
    """config.toml lines: the model, and a provider over ft serve's Responses API (the key read from
    FT_API_KEY where the server has one: Codex refuses to start when a named variable is unset)."""
    lines = [f"model = {json.dumps(model)}", 'model_provider = "ft"', "", "[model_providers.ft]",
             'name = "ft (local)"', f"base_url = {json.dumps(url + '/v1')}", 'wire_api = "responses"']
    if api_key:
        lines.append('env_key = "FT_API_KEY"')
    return "\n".join(lines) + "\n"


def launch_text(agent: str, model: str, *, url: str | None = None, api_key: str | None = None,
                write_to: Path | None = None) -> str:
    """What `ft launch` prints for `agent` and `model` (a display name of a local model); with
    `write_to` (opencode) the configuration is written there first, never over an existing file."""
    url = (url or server_url()).rstrip("/")
    api_key = api_key if api_key is not None else os.environ.get("FT_API_KEY")
    if agent == "claude":
        lines = [f"export {k}={shlex.quote(v)}" for k, v in claude_environment(model, url, api_key).items()]
        return "\n".join(["# Claude Code against ft serve: run `ft serve` first, then these in your shell, then `claude`",
                          *lines])
    if agent == "opencode":
        text = json.dumps(opencode_config(model, url, api_key), indent=2) + "\n"
        if write_to is None:
            return "# opencode against ft serve: save as opencode.json in your project (or `ft launch opencode "\
                   f"{model} --write`), run `ft serve`, then `opencode`\n{text}"
        if write_to.exists():
            raise LaunchError(f"{write_to} exists; ft does not overwrite it. Merge this into it instead:\n{text}")
        write_to.write_text(text)
        return f"wrote {write_to}: run `ft serve`, then `opencode` in {write_to.parent}"
    if agent == "codex":
        return "# Codex against ft serve: add to ~/.codex/config.toml (model and model_provider at its top), run " \
               f"`ft serve`, then `codex`\n{codex_config(model, url, api_key)}"
    raise LaunchError(f"ft launch configures {', '.join(AGENTS)}, not {agent!r}")
