"""DecoderModel.decode_batch: one decode step for several sequences in one pass gives what each
sequence's own one-token forward gives (tiny models of several families: GQA attention with
experts, a linear-attention hybrid whose mixers keep recurrent state, MLA), and leaves each
state where its own step would; a full context is refused with every state unchanged. And the
server's batching of concurrent generations' steps (runtime/server/batching.py): generations in
sessions of their own, on threads of their own, decode in batches and answer as they do alone."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.engine import Session
from runtime.loading.registered import open_model
from runtime.loading.runnable import load
from runtime.models import ContextOverflowError
from runtime.server.batching import DecodeBatcher, _Step, pass_thread
from runtime.server.scheduler import CancellableModel, GenerationCancelled, Job
from runtime.text.sampling import SamplingParams
from runtime.text.tokenizer import Tokenizer
from tests.checkpoints import save_checkpoint
from tests.parity import convert_and_load
from tests.test_server_util import pulled_home

FAMILIES = ["qwen3_moe", "qwen3_5_moe", "deepseek_v3"]


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (5, 11, 2)]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batched_step_is_each_sequences_own_step(family: str, tmp_path: Path) -> None:
    loaded = convert_and_load(save_checkpoint(family, tmp_path / "hf", seed=2), tmp_path / "store")
    model, vocab = loaded.model, loaded.config.vocab_size
    prompts = _prompts(vocab)
    alone = [model.new_state(32) for _ in prompts]
    together = [model.new_state(32) for _ in prompts]
    for p, a, b in zip(prompts, alone, together, strict=True):
        model.forward(torch.tensor(p), a)
        model.forward(torch.tensor(p), b)
    tokens = [p[-1] for p in prompts]
    for _ in range(6):  # steps over caches of different lengths, each continuing its own sequence
        want = torch.cat([model.forward(torch.tensor([t]), s) for t, s in zip(tokens, alone, strict=True)])
        got = model.decode_batch(torch.tensor(tokens), together)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert [s.length for s in together] == [s.length for s in alone]
        tokens = want.argmax(-1).tolist()


def test_a_full_context_is_refused_with_no_state_changed(tmp_path: Path) -> None:
    loaded = convert_and_load(save_checkpoint("qwen3_moe", tmp_path / "hf", seed=2), tmp_path / "store")
    model = loaded.model
    roomy, full = model.new_state(16), model.new_state(4)
    model.forward(torch.tensor([1, 2, 3]), roomy)
    model.forward(torch.tensor([1, 2, 3, 4]), full)
    with pytest.raises(ContextOverflowError, match="do not fit the context of 4"):
        model.decode_batch(torch.tensor([5, 6]), [roomy, full])
    assert (roomy.length, full.length) == (3, 4)
    with pytest.raises(ValueError, match="distinct states"):
        model.decode_batch(torch.tensor([5, 6]), [roomy, roomy])


class Paced:
    """The model, each pass at least `delay_s` (so a generation's next step is pending before
    another's pass ends, as at a real model's speed), counting the rows of its batched passes."""

    def __init__(self, model: Any, delay_s: float) -> None:
        self.model, self.delay_s, self.batch_rows = model, delay_s, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def forward(self, input_ids: torch.Tensor, state: Any, last_only: bool = False) -> torch.Tensor:
        time.sleep(self.delay_s)
        return self.model.forward(input_ids, state, last_only)

    def decode_batch(self, input_ids: torch.Tensor, states: list[Any]) -> torch.Tensor:
        time.sleep(self.delay_s)
        self.batch_rows.append(len(states))
        return self.model.decode_batch(input_ids, states)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Tokenizer]:
    store = pulled_home(tmp_path_factory.mktemp("ft_home"))
    return load(store, "tiny", torch.float32), Tokenizer.from_model(open_model(store, "tiny"))


PROMPTS = [[5, 9, 14, 3], [7, 7, 2, 30, 11, 4], [12, 1, 8]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def _alone(loaded: Any, tokenizer: Tokenizer) -> list[list[int]]:
    return [Session(loaded.model, tokenizer, 64).generate(p, GREEDY).tokens for p in PROMPTS]


def test_concurrent_generations_decode_in_batches_and_answer_as_alone(tiny) -> None:
    loaded, tokenizer = tiny
    want = _alone(loaded, tokenizer)
    paced, batcher = Paced(loaded.model, 0.005), DecodeBatcher()
    model = CancellableModel(paced, batcher=batcher, passes=pass_thread())  # (as a CPU model's runner makes it)
    got: dict[int, list[int]] = {}

    def generate(i: int) -> None:
        got[i] = Session(model, tokenizer, 64).generate(PROMPTS[i], GREEDY).tokens  # type: ignore[arg-type]

    threads = [threading.Thread(target=generate, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    model.close()
    assert [got.get(i) for i in range(len(PROMPTS))] == want
    assert batcher.passes > 0 and max(paced.batch_rows) >= 2, "no two generations' steps ran together"
    assert batcher.batched_steps == sum(paced.batch_rows)
    # once in step they stay so: most decode steps ran with company (the first ones may not, nor the
    # last of a generation that runs longer than the others)
    assert batcher.batched_steps >= 0.5 * sum(len(t) for t in want)


def test_every_pass_runs_on_the_wrappers_one_thread(tiny) -> None:
    """pass_thread: prompt slices and decode steps of generations on several threads all run on the
    wrapper's one thread (one OpenMP team), with the torch thread count of the thread that made it."""
    loaded, tokenizer = tiny
    seen: set[str] = set()

    class Where(Paced):
        def forward(self, input_ids: torch.Tensor, state: Any, last_only: bool = False) -> torch.Tensor:
            seen.add(threading.current_thread().name)
            assert torch.get_num_threads() == threads
            return self.model.forward(input_ids, state, last_only)

        def decode_batch(self, input_ids: torch.Tensor, states: list[Any]) -> torch.Tensor:
            seen.add(threading.current_thread().name)
            return self.model.decode_batch(input_ids, states)

    threads = torch.get_num_threads()
    model = CancellableModel(Where(loaded.model, 0.0), batcher=DecodeBatcher(), passes=pass_thread())
    workers = [threading.Thread(target=lambda p=p: Session(model, tokenizer, 64).generate(p, GREEDY))  # type: ignore[arg-type]
               for p in PROMPTS]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    model.close()
    assert len(seen) == 1 and next(iter(seen)).startswith("ft-passes")


def test_a_cancelled_generations_step_leaves_the_batch_and_the_others_go_on(tiny) -> None:
    """A step whose job was cancelled while it waited is not run (its state stays where it was)
    and raises GenerationCancelled in its own generation; the batch runs the others' steps."""
    loaded, _ = tiny
    batcher = DecodeBatcher()
    model = CancellableModel(loaded.model, batcher=batcher)
    states = [loaded.model.new_state(32) for _ in range(2)]
    for p, state in zip(PROMPTS, states, strict=False):
        loaded.model.forward(torch.tensor(p), state)
    loop = asyncio.new_event_loop()
    try:
        gone = Job(loop, ticket=None)  # type: ignore[arg-type]
        gone.cancelled.set()
        waiting = _Step(torch.tensor([3]), states[1], gone)
        batcher._pending.append(waiting)  # (the cancelled generation's step, pending behind this one's turn)
        logits = model.forward(torch.tensor([4]), states[0])
    finally:
        loop.close()
    assert logits.shape == (1, loaded.config.vocab_size)
    assert (states[0].length, states[1].length) == (len(PROMPTS[0]) + 1, len(PROMPTS[1]))
    with pytest.raises(GenerationCancelled):
        waiting.result()
