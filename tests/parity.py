"""Helpers to compare our runtime against transformers on the same weights (float32)."""

from __future__ import annotations

from pathlib import Path

import torch

from ftpull.pull import pull
from registry import Store
from runtime.loading.runnable import LoadedModel, load


def convert_and_load(src: Path, store_root: Path) -> LoadedModel:
    """Pull a local checkpoint through ft's own pull path, then load it with the runtime."""
    store = Store(store_root)
    result = pull(str(src), store)
    return load(store, str(result.name), torch.float32)


def rel_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def our_logits(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    state = loaded.model.new_state(len(ids) + 64)
    return loaded.model.forward(torch.tensor(ids), state)


def our_greedy(loaded: LoadedModel, ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decode with the KV cache: prefill, then one token at a time."""
    state = loaded.model.new_state(len(ids) + steps + 1)
    logits = loaded.model.forward(torch.tensor(ids), state)[-1]
    out, step_logits = [], []
    for _ in range(steps):
        token = int(torch.argmax(logits))
        out.append(token)
        step_logits.append(logits)
        logits = loaded.model.forward(torch.tensor([token]), state)[-1]
    return out, step_logits


def hf_greedy(model, ids: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


def assert_parity(ours: LoadedModel, ref, prompt: list[int], steps: int, tolerance: float = 1e-4) -> None:
    """Prefill logits match transformers, greedy decode with the KV cache gives the same `steps`
    tokens, and every cached decode step equals recomputing the whole sequence."""
    assert rel_error(our_logits(ours, prompt), hf_logits(ref, prompt)) < tolerance
    tokens, step_logits = our_greedy(ours, prompt, steps)
    assert tokens == hf_greedy(ref, prompt, steps)
    full = our_logits(ours, prompt + tokens[:-1])
    for i, logits in enumerate(step_logits):
        assert rel_error(logits, full[len(prompt) - 1 + i]) < tolerance
