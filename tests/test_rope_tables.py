"""RotaryEmbedding's tables within a forward pass (runtime/layers/rope.py): computed once for all
layers of a pass, never reused across passes, threads or positions tensors."""

from __future__ import annotations

import threading

import torch

from runtime.layers import rope
from runtime.layers.rope import RotaryEmbedding, forward_begins

PARAMS = {"rope_theta": 10000.0}


def test_a_pass_reuses_its_tables_for_the_same_positions_only() -> None:
    emb = RotaryEmbedding(16, PARAMS, 128)
    positions = torch.arange(3, 7)
    forward_begins()
    first = emb(positions, torch.float32)
    assert emb(positions, torch.float32) is first  # another layer of the same pass
    assert emb(positions, torch.bfloat16) is not first  # another dtype
    assert emb(torch.arange(3, 7), torch.float32) is not first  # equal values, another tensor
    again = emb(positions, torch.float32)
    forward_begins()
    fresh = emb(positions, torch.float32)
    assert fresh is not again  # the next pass computes them again
    torch.testing.assert_close(fresh, again, rtol=0, atol=0)


def test_without_a_pass_or_on_another_thread_nothing_is_reused() -> None:
    emb = RotaryEmbedding(16, PARAMS, 128)
    positions = torch.arange(4)
    seen = []

    def other_thread() -> None:  # no pass begun on this thread
        seen.extend(emb(positions, torch.float32) for _ in range(2))

    forward_begins()
    mine = emb(positions, torch.float32)
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen[0] is not seen[1] and mine is not seen[0]
    assert emb(positions, torch.float32) is mine  # this thread's pass still holds its own


def test_a_models_forward_computes_the_tables_once(monkeypatch, tmp_path) -> None:
    """A tiny Qwen3-MoE checkpoint through ft's pull and load: every layer of a pass rotates with
    the same tables, the next pass (a decode step after the prompt) with new ones, and the
    logits are the ones the model gives with every layer computing its own."""
    from tests.checkpoints import save_checkpoint
    from tests.parity import convert_and_load

    model = convert_and_load(save_checkpoint("qwen3_moe", tmp_path / "hf", seed=1), tmp_path / "store").model
    calls: list[int] = []
    apply = rope.apply_rotary

    def recording(x, cos, sin):
        calls.append(id(cos))
        return apply(x, cos, sin)

    for block in model.blocks:  # (GQAAttention holds its rotary: apply_rotary, here recorded)
        monkeypatch.setattr(block.mixer, "rotary", recording)
    state = model.new_state(16)
    model.forward(torch.tensor([1, 2, 3]), state)
    prompt_calls, calls[:] = list(calls), []
    logits = model.forward(torch.tensor([4]), state)
    layers = len(model.blocks)
    assert len(prompt_calls) == len(calls) == 2 * layers  # queries and keys, each layer
    assert len(set(prompt_calls)) == 1 and len(set(calls)) == 1

    monkeypatch.setattr(rope, "forward_begins", lambda: None)  # no pass: every layer computes its own
    monkeypatch.setattr("runtime.models.base.forward_begins", lambda: None)
    rope._pass.__dict__.clear()
    fresh = model.new_state(16)
    model.forward(torch.tensor([1, 2, 3]), fresh)
    torch.testing.assert_close(model.forward(torch.tensor([4]), fresh), logits, rtol=0, atol=0)
