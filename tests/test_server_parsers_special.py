"""A family's tool-call markers that its tokenizer holds as special tokens (DeepSeek's, GLM's
argument tags) reach the parser: the server decodes a parsed family's output with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.engine import Session
from runtime.server.parsers import ToolCallEvent, make_parser, syntax_for
from runtime.text.sampling import SamplingParams
from runtime.text.tokenizer import Tokenizer
from tests.test_tokenizer import make_model_dir

CALLS = {
    "deepseek_v3": "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                   "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "glm": "Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
}
FAMILIES = {"deepseek_v3": "deepseek_v3", "glm": "glm_moe_dsa"}


class Scripted:
    """A model that writes `script`, token after token, then the tokenizer's end of text."""

    def __init__(self, script: list[int], vocab: int, eos: int) -> None:
        self.script, self.vocab, self.eos, self.at = script, vocab, eos, 0

    def new_state(self, max_tokens: int) -> Any:
        return None

    def reset_state(self, state: Any) -> Any:
        return state

    def forward(self, input_ids: Any, state: Any, last_only: bool = False) -> torch.Tensor:
        token = self.script[self.at] if self.at < len(self.script) else self.eos
        self.at += 1
        logits = torch.full((1, self.vocab), -1e9)
        logits[0, token] = 0.0
        return logits


@pytest.mark.parametrize("layout", list(CALLS))
def test_tool_markers_held_as_special_tokens_reach_the_parser(tmp_path: Path, layout: str) -> None:
    tokenizer = Tokenizer.from_files(make_model_dir(tmp_path, layout))
    script = tokenizer.encode(CALLS[layout])
    family = FAMILIES[layout]
    assert syntax_for(family) is not None
    eos = next(iter(tokenizer.eos_token_ids))
    vocab = max(max(script), eos) + 1
    events = []
    parser = make_parser(family, True)
    session = Session(Scripted(script, vocab, eos), tokenizer, 4096)  # type: ignore[arg-type]
    session.generate(tokenizer.encode("hi"), SamplingParams(temperature=0), lambda t: events.extend(parser.feed(t)),
                     keep_special_tokens=True)
    events += parser.finish()
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
