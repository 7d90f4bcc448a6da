"""A model with recurrent layers (Gated DeltaNet, KDA, lightning attention, short convolutions)
cannot take its state back by position, so a prompt that departs from what a session holds
recomputed everything: every agent turn whose template re-renders the reply before it (Qwen3's
drop the thinking) paid the whole system prompt again. A session now saves such a state where
each prompt's last token begins (host copies, DecoderModel.checkpoint) and is taken back to the
latest one within the common prefix. Oracle: a fresh session over the same prompt, to the
float32 rounding of a recurrence computed in other chunks (the state is the same, the order of
its sums not)."""

from __future__ import annotations

import pytest
import torch

from runtime import engine
from runtime.engine import SAVED_STATES, Session, ladder
from runtime.text.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


class _Ids:
    """A tokenizer a Session needs: no end-of-sequence token, ids as text."""

    eos_token_ids: frozenset[int] = frozenset()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


@pytest.fixture(scope="module", params=["qwen3_next", "lfm2_moe", "minimax", "kimi_linear", "jamba", "nemotron_h"])
def hybrid(request, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("transformers")
    from tests.checkpoints import save_checkpoint
    from tests.parity import convert_and_load

    root = tmp_path_factory.mktemp(request.param)
    loaded = convert_and_load(save_checkpoint(request.param, root / "hf", seed=3), root / "store")
    assert not loaded.model.rewinds  # (a recurrent family: the case this is for)
    return loaded.model


def _logits_after(model, prompt: list[int]) -> torch.Tensor:
    session = Session(model, _Ids(), 256)  # type: ignore[arg-type]
    return session._prefill(prompt, type("S", (), {})())


def test_a_departing_prompt_is_taken_back_to_the_saved_state(hybrid) -> None:
    session = Session(hybrid, _Ids(), 256)  # type: ignore[arg-type]
    first = list(range(5, 45))
    reply = session.generate(first, GREEDY)
    assert (reply.stats.cached_tokens, reply.stats.prompt_tokens) == (0, 40)
    assert [s.length for s in session.saved] == [39]  # where the prompt's last token begins
    turn = first + [7, 8, 9, 10]  # the reply re-rendered otherwise, then the next message
    again = session.generate(turn, GREEDY)
    assert (again.stats.cached_tokens, again.stats.prompt_tokens) == (39, 5)
    fresh = Session(hybrid, _Ids(), 256).generate(turn, GREEDY)  # type: ignore[arg-type]
    assert again.tokens == fresh.tokens
    torch.testing.assert_close(_logits_after(hybrid, turn), session._prefill(turn, type("S", (), {})()),
                               rtol=1e-4, atol=1e-4)
    retried = session.generate(turn, GREEDY)  # the same prompt again: back to its own saved state
    assert (retried.stats.cached_tokens, retried.stats.prompt_tokens) == (len(turn) - 1, 1)
    assert retried.tokens == fresh.tokens


def test_only_states_of_the_history_kept_are_kept(hybrid) -> None:
    """A departure before every saved state starts over; states saved past a take-back are dropped
    (they were of a history now gone); at most SAVED_STATES are kept."""
    session = Session(hybrid, _Ids(), 256)  # type: ignore[arg-type]
    prompt = list(range(5, 25))
    for extra in range(SAVED_STATES + 2):  # a conversation growing turn by turn
        prompt = prompt + [50 + extra, 60 + extra]
        session.generate(prompt, GREEDY)
    lengths = [s.length for s in session.saved]
    assert len(lengths) == SAVED_STATES and lengths == sorted(lengths) and lengths[-1] == len(prompt) - 1
    back = prompt[: lengths[0] + 1] + [3]  # departs right after the older saved state
    out = session.generate(back, GREEDY)
    assert out.stats.cached_tokens == lengths[0] and [s.length for s in session.saved] == [lengths[0], len(back) - 1]
    other = session.generate([9, 9, 9, 9], GREEDY)  # departs at once: nothing to keep
    assert other.stats.cached_tokens == 0 and [s.length for s in session.saved] == [3]


def test_the_saved_states_thin_out_the_further_back_they_lie() -> None:
    """`ladder`: the newest kept; each state kept further back lies at least as far from the next
    as the one after it does; states the first message's end (`floor`) already covers go first."""
    kept = ladder(list(range(100, 2100, 100)), 6)
    assert len(kept) == 6 and kept[-1] == 2000 and kept == sorted(kept)
    gaps = [b - a for a, b in zip(kept, kept[1:], strict=False)]
    assert gaps == sorted(gaps, reverse=True) and gaps[0] > gaps[-1]
    assert min(ladder(list(range(100, 2100, 100)), 6, floor=500)) > min(kept)
    assert ladder([10, 20, 30], 8) == [10, 20, 30] and ladder([30], 1) == [30]


def test_a_departure_turns_back_resumes_near_it(hybrid) -> None:
    """An agent's loop of many turns, then a prompt that departs several turns back (Qwen3's
    template drops the thinking of every reply since the last user message): it resumes from a
    saved state within about as many tokens again as it lies back, not from the start, and
    decodes as a fresh session over the same prompt does."""
    session = Session(hybrid, _Ids(), 512)  # type: ignore[arg-type]
    prompt = list(range(5, 25))
    turns = []
    for turn in range(SAVED_STATES + 6):  # each turn: the reply and a tool result, 12 tokens
        prompt = prompt + [100 + turn] * 6 + [60 + turn] * 6
        turns.append(len(prompt))
        session.generate(prompt, GREEDY)
    depart = turns[-6] + 3  # six turns back
    edited = prompt[:depart] + [7, 7, 7]
    back = len(prompt) - depart
    out = session.generate(edited, GREEDY)
    assert depart - 2 * back <= out.stats.cached_tokens <= depart
    fresh = Session(hybrid, _Ids(), 512).generate(edited, GREEDY)  # type: ignore[arg-type]
    assert out.tokens == fresh.tokens


def test_an_edit_inside_one_long_prompt_resumes_from_a_slice_saved_before_it(hybrid, monkeypatch) -> None:
    """A prompt fed in slices (the server's prefill_slice) saves the state at the end of a slice
    SAVE_EVERY_TOKENS or more past the last one saved: an edit inside one long message resumes
    from the slice before it and decodes as a fresh session does."""
    monkeypatch.setattr(engine, "SAVE_EVERY_TOKENS", 32)
    session = Session(hybrid, _Ids(), 512, prefill_slice=16)  # type: ignore[arg-type]
    prompt = [5 + i % 40 for i in range(150)]
    session.generate(prompt, GREEDY)
    assert [s.length for s in session.saved] == [32, 64, 96, 128, 149]
    edited = prompt[:100] + [7, 7, 7]
    out = session.generate(edited, GREEDY)
    assert out.stats.cached_tokens == 96
    fresh = Session(hybrid, _Ids(), 512).generate(edited, GREEDY)  # type: ignore[arg-type]
    assert out.tokens == fresh.tokens


def test_a_model_whose_recurrent_cache_cannot_be_saved_starts_over() -> None:
    """DeepSeek-V4's compressed KV has no host copy: its prompts recompute on departing, as before."""
    from runtime.models.base import DecoderModel

    class Cache:  # a recurrent cache without checkpoint()
        length = 0

    class Mixer:
        recurrent = True

    model = DecoderModel.__new__(DecoderModel)
    model.blocks = [type("Block", (), {"mixer": Mixer()})()]
    state = type("State", (), {"caches": [Cache()], "length": 5})()
    assert model.checkpoint(state) is None  # type: ignore[arg-type]


class _Turns(_Ids):
    """... whose end-of-turn token is 3 (a chat template's <|im_end|>)."""

    eos_token_ids: frozenset[int] = frozenset({3})


def test_an_edit_after_the_first_message_starts_from_its_end(hybrid) -> None:
    """The state is also saved where the prompt's first message ends (its first end-of-turn token:
    the system prompt and tools, 64 tokens or more), so an edit anywhere after it recomputes from
    there, not from 0; a short first message is not worth a pass of its own."""
    system, task, other = list(range(10, 80)) + [3], list(range(90, 100)), list(range(110, 115))
    session = Session(hybrid, _Turns(), 256)  # type: ignore[arg-type]
    session.generate(system + task, GREEDY)
    assert session.anchored is not None and session.anchored.length == len(system)
    edited = session.generate(system + other, GREEDY)  # departs inside the first prompt, after the system
    assert (edited.stats.cached_tokens, edited.stats.prompt_tokens) == (len(system), len(other))
    fresh = Session(hybrid, _Turns(), 256).generate(system + other, GREEDY)  # type: ignore[arg-type]
    assert edited.tokens == fresh.tokens
    assert session.generate([9, 9, 9], GREEDY).stats.cached_tokens == 0 and session.anchored is None
    short = Session(hybrid, _Turns(), 256)  # type: ignore[arg-type]
    short.generate(list(range(10, 20)) + [3] + task, GREEDY)
    assert short.anchored is None


def test_another_conversation_starts_from_the_saved_end_of_the_shared_system_prompt(hybrid) -> None:
    """Session.take_prefix for a recurrent model: the positional caches copied, the recurrent ones
    put back from the other session's state saved where the shared first message ends."""
    system = list(range(10, 80)) + [3]
    main = Session(hybrid, _Turns(), 256)  # type: ignore[arg-type]
    main.generate(system + list(range(90, 100)), GREEDY)
    held = list(main.tokens)
    sub = Session(hybrid, _Turns(), 256)  # type: ignore[arg-type]
    assert not sub.take_prefix(main, len(system) + 2)  # no state saved there
    assert sub.take_prefix(main, len(system))
    reply = sub.generate(system + [110, 111, 112], GREEDY)
    assert (reply.stats.cached_tokens, reply.stats.prompt_tokens) == (len(system), 3)
    fresh = Session(hybrid, _Turns(), 256).generate(system + [110, 111, 112], GREEDY)  # type: ignore[arg-type]
    assert reply.tokens == fresh.tokens
    assert main.tokens == held and main.generate(held + [4], GREEDY).stats.cached_tokens == len(held)


def test_a_stored_conversation_resumes_only_where_a_state_was_saved(hybrid) -> None:
    """Session.park_into a block store (prefix_blocks.py) for a recurrent model: each saved state
    (where the first message ends, where the last prompt's last token begins) is stored on the
    block that ends there; another conversation with the same first message resumes from its end,
    the conversation itself from its latest, both as if computed whole."""
    from runtime.models.prefix_blocks import BlockStore

    system = list(range(10, 80)) + [3]
    prompt = system + list(range(90, 100))
    session = Session(hybrid, _Turns(), 256)  # type: ignore[arg-type]
    session.generate(prompt, GREEDY)
    blocks = BlockStore(block_tokens=32)
    assert session.park_into(blocks)
    assert sorted(b.end for b in blocks.blocks.values() if b.saved is not None) == [len(system), len(prompt) - 1]
    for turn, resumed in ((system + [110, 111, 112], len(system)), (prompt + [5, 6, 7], len(prompt) - 1)):
        found = blocks.lookup(turn, rewinds=False)
        assert found is not None and found.length == resumed and found.saved.length == resumed
        other = Session(hybrid, _Turns(), 256)  # type: ignore[arg-type]
        assert other.unpark_blocks(found)
        reply = other.generate(turn, GREEDY)
        assert reply.stats.cached_tokens == resumed
        assert reply.tokens == Session(hybrid, _Turns(), 256).generate(turn, GREEDY).tokens  # type: ignore[arg-type]
    assert blocks.lookup(system[:40] + [1, 2], rewinds=False) is None  # no state saved within 40
