"""benchmarks/agent_replay.py on the tiny model through `ft serve` and the real anthropic client:
coding-agent sessions reuse their prompts (side requests and a rewritten tool call included), two
sessions at once both progress, every request is answered. Reuse and fairness, not speed."""

from __future__ import annotations

import pytest

from benchmarks.agent_replay import Workload, replay
from tests.test_server_util import LiveServer, pulled_home

SMALL = Workload(system_words=150, turns=6, result_words=40, side_every=2, edit_at=4, max_tokens=6)


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    store = pulled_home(tmp_path_factory.mktemp("agent-home"))
    with LiveServer(store) as server:
        return replay(server.url, "tiny", SMALL, sessions=2, timeout_s=120)


def test_every_request_is_answered_and_counted(result) -> None:
    requests = result["requests"]
    sides = SMALL.turns // SMALL.side_every
    assert len(requests) == 1 + 2 * (SMALL.turns + sides)
    assert all(r["output_tokens"] >= 1 and r["input_tokens"] + r["cached_tokens"] > 0 for r in requests)
    for session in (0, 1):  # each session's turns in order, one request each
        assert [r["turn"] for r in requests if r["session"] == session and r["kind"] != "side"] == \
            list(range(SMALL.turns))


def test_the_sessions_prompts_come_from_the_cache(result) -> None:
    """After a session's first turn every turn finds the history up to the reply it generated last
    (the side requests, with their own system prompt, in sessions of their own beside it); the
    rewritten tool call keeps everything before it."""
    summary = result["summary"]
    assert summary["cached_share"] > 0.6
    for session in (0, 1):
        turns = [r for r in result["requests"] if r["session"] == session and r["kind"] != "side"]
        for before, turn in zip(turns, turns[1:], strict=False):
            prompt = turn["input_tokens"] + turn["cached_tokens"]
            if turn["kind"] == "edit":
                assert 0 < turn["cached_tokens"] < before["input_tokens"] + before["cached_tokens"]
            else:
                assert turn["cached_tokens"] >= before["input_tokens"] + before["cached_tokens"], turn
                assert turn["cached_tokens"] > 0.7 * prompt


def test_two_sessions_run_side_by_side(result) -> None:
    """The second session's turns do not wait for the first session to end: the two sessions'
    requests overlap in time (one generation at a time, a session's whole run would come first)."""
    spans = {s: [(r["started_s"], r["started_s"] + r["total_s"]) for r in result["requests"] if r["session"] == s]
             for s in (0, 1)}
    first_end = {s: max(end for _, end in spans[s]) for s in (0, 1)}
    first_start = {s: min(start for start, _ in spans[s]) for s in (0, 1)}
    assert first_start[1] < first_end[0] and first_start[0] < first_end[1]
    overlapping = sum(1 for a0, a1 in spans[0] for b0, b1 in spans[1] if a0 < b1 and b0 < a1)
    assert overlapping >= SMALL.turns // 2
    assert result["summary"]["ttft_worst_s"] is not None
