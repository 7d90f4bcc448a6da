"""runtime.text.sampling: parameter validation, option names, and each filter's effect on crafted logits."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch

from runtime.text.sampling import (
    InvalidParameterError,
    Sampler,
    SamplingParams,
    apply_penalties,
    min_p_filter,
    top_k_sorted,
    top_p_filter,
)

PROBS = [0.5, 0.3, 0.15, 0.05]  # token i has probability PROBS[i]


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs], dtype=torch.float32)


def draws(params: SamplingParams, logits: torch.Tensor, n: int = 2000, history: list[int] | None = None) -> Counter:
    sampler = Sampler(params)
    return Counter(sampler.sample(logits, history or []) for _ in range(n))


# --- parameters -------------------------------------------------------------------------------

def test_defaults_are_ollamas() -> None:
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.repeat_last_n) == (0.8, 40, 0.9, 0.0, 1.0, 64)
    assert p.seed is None and p.max_tokens is None and p.stop == ()


@pytest.mark.parametrize(("name", "value", "range_text"), [
    ("temperature", -0.1, ">= 0"),
    ("temperature", "hot", ">= 0"),
    ("temperature", float("nan"), ">= 0"),
    ("temperature", True, ">= 0"),
    ("top_p", 0.0, "(0, 1]"),
    ("top_p", 1.5, "(0, 1]"),
    ("top_k", -2, ">= 0"),
    ("top_k", 2.5, ">= 0"),
    ("min_p", -0.1, "[0, 1]"),
    ("min_p", 1.1, "[0, 1]"),
    ("repeat_penalty", 0.0, "> 0"),
    ("repeat_penalty", -1.0, "> 0"),
    ("repeat_last_n", -2, ">= -1"),
    ("presence_penalty", 3.0, "[-2, 2]"),
    ("frequency_penalty", "1", "[-2, 2]"),
    ("seed", -(2**63) - 1, "[0, "),
    ("seed", 2**64, "[0, "),
    ("seed", "42", "[0, "),
    ("max_tokens", 0, ">= 1"),
    ("max_tokens", -2, ">= 1"),
    ("max_tokens", 1.5, ">= 1"),
    ("stop", [""], "non-empty string"),
    ("stop", [1], "non-empty string"),
    ("stop", 5, "non-empty string"),
])
def test_invalid_parameters_name_the_parameter_and_range(name: str, value, range_text: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        SamplingParams(**{name: value})
    assert info.value.name == name
    assert f"invalid {name}=" in str(info.value) and range_text in str(info.value)
    assert isinstance(info.value, ValueError)


def test_normalisation() -> None:
    p = SamplingParams(temperature=1, top_k=40.0, seed=-1, max_tokens=-1, stop="</s>")
    assert p.temperature == 1.0 and isinstance(p.temperature, float) and p.top_k == 40 and isinstance(p.top_k, int)
    assert p.seed is None and p.max_tokens is None and p.stop == ("</s>",)
    assert SamplingParams(seed=-12345).seed is None and SamplingParams(seed=0).seed == 0
    assert SamplingParams(stop=["a", "b", "a"]).stop == ("a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 2.0  # type: ignore[misc]


def test_from_options_accepts_ollama_and_openai_names() -> None:
    ollama = SamplingParams.from_options({"num_predict": 128, "top_k": 20, "top_p": 0.95, "min_p": 0.05,
                                          "repeat_penalty": 1.1, "repeat_last_n": 32, "seed": 7,
                                          "temperature": 0.6, "stop": ["<|im_end|>"]})
    assert ollama == SamplingParams(temperature=0.6, top_k=20, top_p=0.95, min_p=0.05, repeat_penalty=1.1,
                                    repeat_last_n=32, seed=7, max_tokens=128, stop=("<|im_end|>",))
    openai = SamplingParams.from_options({"max_completion_tokens": 64, "presence_penalty": 0.5,
                                          "frequency_penalty": 0.25, "stop": "END", "seed": None})
    assert (openai.max_tokens, openai.presence_penalty, openai.frequency_penalty, openai.stop) == (64, 0.5, 0.25, ("END",))
    assert SamplingParams.from_options({"num_predict": -1}).max_tokens is None
    assert SamplingParams.from_options({"num_predict": -2}).max_tokens is None  # Ollama: fill the context
    base = SamplingParams(temperature=0.1, top_k=5)
    assert SamplingParams.from_options({"top_k": 9}, defaults=base) == SamplingParams(temperature=0.1, top_k=9)
    assert SamplingParams.from_options(None) == SamplingParams()


def test_from_options_refuses_unknown_and_conflicting_names() -> None:
    with pytest.raises(InvalidParameterError, match="unknown sampling option.*num_predict") as info:
        SamplingParams.from_options({"mirostat": 2})
    assert info.value.name == "mirostat"
    with pytest.raises(InvalidParameterError, match="conflicts"):
        SamplingParams.from_options({"num_predict": 10, "max_tokens": 20})
    with pytest.raises(InvalidParameterError, match="invalid num_predict=0") as info:
        SamplingParams.from_options({"num_predict": 0})
    assert info.value.name == "num_predict"  # named as the caller spelled it


# --- sampler ----------------------------------------------------------------------------------

def test_greedy_is_argmax_with_ties_to_the_lowest_id() -> None:
    sampler = Sampler(SamplingParams(temperature=0))
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(1000, generator=generator)
        assert sampler.sample(logits) == int(torch.argmax(logits))
    assert sampler.sample(torch.tensor([1.0, 3.0, 0.0, 3.0, 3.0])) == 1
    assert sampler.sample(torch.tensor([1.0, 3.0, 0.0, 3.0], dtype=torch.bfloat16)) == 1


def test_same_seed_same_tokens() -> None:
    generator = torch.Generator().manual_seed(1)
    steps = [torch.randn(500, generator=generator) for _ in range(64)]
    params = SamplingParams(seed=1234, temperature=1.2, top_k=0, top_p=1.0)

    def run(p: SamplingParams) -> list[int]:
        sampler = Sampler(p)
        history: list[int] = []
        for logits in steps:
            history.append(sampler.sample(logits, history))
        return history

    assert run(params) == run(params)
    assert run(params) != run(SamplingParams(seed=4321, temperature=1.2, top_k=0, top_p=1.0))
    assert Sampler(SamplingParams()).seed != Sampler(SamplingParams()).seed  # no seed: a fresh one


def test_unfiltered_sampling_follows_the_distribution() -> None:
    counts = draws(SamplingParams(seed=0, temperature=1.0, top_k=0, top_p=1.0), logits_of(PROBS), n=20000)
    for token, p in enumerate(PROBS):
        assert abs(counts[token] / 20000 - p) < 0.015


def test_top_k() -> None:
    assert set(draws(SamplingParams(seed=0, temperature=5.0, top_k=1, top_p=1.0), logits_of(PROBS))) == {0}
    assert set(draws(SamplingParams(seed=0, temperature=5.0, top_k=2, top_p=1.0), logits_of(PROBS))) == {0, 1}
    ids, values = top_k_sorted(torch.tensor([1.0, 5.0, 5.0, 3.0, 5.0]), 2)
    assert ids.tolist() == [1, 2] and values.tolist() == [5.0, 5.0]  # equal logits: lower ids first
    ids, _ = top_k_sorted(torch.tensor([1.0, 5.0, 5.0, 3.0]), 0)
    assert ids.tolist() == [1, 2, 3, 0]


def test_top_p() -> None:
    values = logits_of(PROBS)  # already best first
    assert top_p_filter(values, 0.45).numel() == 1
    assert top_p_filter(values, 0.79).numel() == 2
    assert top_p_filter(values, 0.81).numel() == 3
    assert top_p_filter(values, 1.0).numel() == 4
    # applied to the untempered distribution: a hot temperature does not bring token 2 back
    counts = draws(SamplingParams(seed=0, temperature=100.0, top_k=0, top_p=0.79), logits_of(PROBS))
    assert set(counts) == {0, 1} and abs(counts[0] / 2000 - 0.5) < 0.05  # flattened by the temperature


def test_min_p() -> None:
    values = logits_of(PROBS)
    assert min_p_filter(values, 0.5).numel() == 2  # p >= 0.25
    assert min_p_filter(values, 0.29).numel() == 3  # p >= 0.145
    assert min_p_filter(values, 1.0).numel() == 1
    assert min_p_filter(values, 0.0).numel() == 4
    counts = draws(SamplingParams(seed=0, temperature=1.0, top_k=0, top_p=1.0, min_p=0.5), logits_of(PROBS))
    assert set(counts) == {0, 1}


def test_temperature_sharpens_and_flattens() -> None:
    logits = logits_of(PROBS)
    cold = draws(SamplingParams(seed=0, temperature=0.25, top_k=0, top_p=1.0), logits)
    hot = draws(SamplingParams(seed=0, temperature=4.0, top_k=0, top_p=1.0), logits)
    assert cold[0] / 2000 > 0.85 and 0.3 < hot[0] / 2000 < 0.4  # 0.5^4 and 0.5^0.25, normalised
    assert hot[3] > cold[3]


@pytest.mark.parametrize("temperature", [1e-40, 1e-320, 1e39, 1e300])
def test_a_temperature_near_zero_or_huge_still_draws(temperature: float) -> None:
    """Any finite temperature >= 0 is allowed: scaled from the best logit in float64, one near 0
    draws among the tied best only, a huge one evenly among the kept (a -inf logit stays out)."""
    logits = torch.tensor([1.0, 3.0, -math.inf, 2.5, 3.0])
    counts = draws(SamplingParams(seed=0, temperature=temperature, top_k=0, top_p=1.0), logits)
    assert set(counts) == ({1, 4} if temperature < 1 else {0, 1, 3, 4})


def test_filters_compose_in_llama_cpp_order() -> None:
    # top-k keeps 3, top-p over those (renormalised: .5/.95, .3/.95, ...) keeps 2, min-p keeps both
    counts = draws(SamplingParams(seed=0, temperature=1.0, top_k=3, top_p=0.8, min_p=0.1), logits_of(PROBS))
    assert set(counts) == {0, 1}


def test_repetition_penalty_llama_cpp_semantics() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 0.0, 4.0])
    apply_penalties(logits, [0, 1, 0, 3], SamplingParams(repeat_penalty=2.0))
    assert logits.tolist() == [1.0, -4.0, 1.0, 0.0, 4.0]  # positive divided, negative multiplied, once per token
    logits = torch.tensor([2.0, -2.0, 1.0, 0.0, 4.0])
    apply_penalties(logits, [0, 1, 4], SamplingParams(repeat_penalty=2.0, repeat_last_n=2))
    assert logits.tolist() == [2.0, -4.0, 1.0, 0.0, 2.0]  # only the last two tokens count
    logits = torch.tensor([2.0, -2.0])
    apply_penalties(logits, [0, 1], SamplingParams(repeat_penalty=2.0, repeat_last_n=0))
    assert logits.tolist() == [2.0, -2.0]  # 0 = off
    logits = torch.tensor([2.0, -2.0, 1.0])
    apply_penalties(logits, [0] * 100 + [1], SamplingParams(repeat_penalty=2.0, repeat_last_n=-1))
    assert logits.tolist() == [1.0, -4.0, 1.0]  # -1 = all of the history
    logits = torch.tensor([2.0, 2.0, 2.0])
    apply_penalties(logits, torch.tensor([0, 0, 1, 7, -1]),
                    SamplingParams(frequency_penalty=0.5, presence_penalty=0.25))
    assert logits.tolist() == [0.75, 1.25, 2.0]  # count * frequency + presence; unknown ids ignored
    # in the sampler, before greedy selection
    sampler = Sampler(SamplingParams(temperature=0, repeat_penalty=1.5))
    assert sampler.sample(torch.tensor([3.0, 2.5, 0.0]), [0]) == 1
    assert sampler.sample(torch.tensor([3.0, 2.5, 0.0]), [2]) == 0


def test_sampler_input_checks() -> None:
    sampler = Sampler(SamplingParams(seed=0))
    with pytest.raises(ValueError, match="shape"):
        sampler.sample(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="NaN"):
        sampler.sample(torch.tensor([0.0, float("nan")]))
    logits = torch.tensor([0.0, 1.0, 2.0])
    sampler.sample(logits, [2])
    assert logits.tolist() == [0.0, 1.0, 2.0]  # the caller's logits are not modified
    masked = torch.tensor([float("-inf"), 0.0, float("-inf")])
    assert {Sampler(SamplingParams(seed=s)).sample(masked) for s in range(20)} == {1}


# --- the best logits only (runtime/text/top_logits.py) ---------------------------------------------

def test_candidates_needed_counts_the_tokens_the_penalties_touch() -> None:
    def needed(history: list[int] | None = None, **kw) -> int | None:
        return Sampler(SamplingParams(**kw)).candidates_needed(history or [])

    assert needed(temperature=0) == 1
    assert needed(top_k=40) == 40
    assert needed(top_k=0) is None  # sampling from the whole vocabulary
    assert needed(temperature=0, top_k=0) == 1  # greedy ignores top_k
    assert needed([5, 5, 6, 9], top_k=3, repeat_penalty=1.1) == 3 + 3  # distinct tokens in the window
    assert needed([5, 6, 9, 9], top_k=3, repeat_penalty=1.1, repeat_last_n=2) == 3 + 1
    assert needed([5, 6, 9], top_k=3, frequency_penalty=0.5, repeat_last_n=-1) == 3 + 3
    assert needed([5, 6, 9], top_k=3, repeat_penalty=1.1, repeat_last_n=0) == 3
    for raising in ({"repeat_penalty": 0.9}, {"presence_penalty": -0.5}, {"frequency_penalty": -0.1}):
        assert needed([5], top_k=3, **raising) is None  # a penalty that can raise a logit
        assert needed([5], top_k=3, repeat_last_n=0, **raising) == 3  # ... over a window of no tokens
    assert needed(list(range(5000)), top_k=3, repeat_penalty=1.1, repeat_last_n=-1) is None  # too many


PARAM_SETS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0, repeat_penalty=1.3, repeat_last_n=8),
    SamplingParams(temperature=0.7, top_k=1),
    SamplingParams(temperature=0.7, top_k=5, top_p=1.0),
    SamplingParams(temperature=1.3, top_k=40, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=0.8, top_k=20, repeat_penalty=1.2, frequency_penalty=0.4, presence_penalty=0.3),
    SamplingParams(temperature=1.0, top_k=7, presence_penalty=1.5, repeat_last_n=-1),
]


@pytest.mark.parametrize("params", PARAM_SETS, ids=range(len(PARAM_SETS)))
def test_the_best_logits_give_the_whole_rows_tokens(params: SamplingParams) -> None:
    """A sampler given only the candidates top_logits takes draws the same tokens, step after
    step from the same seed, as one given the whole rows: with penalties over the history, and
    with logits on a coarse grid, so ties at the candidates' boundary are common (those steps
    read the whole row; some must, and some must not)."""
    from runtime.text.top_logits import candidates_to_take, top_logits

    gen = torch.Generator().manual_seed(7)
    vocab, steps = 300, 60
    # logits on a grid of 0.5, and every third row zeros but for 0-2 ones (all the candidates tie)
    rows = [torch.round(torch.randn(vocab, generator=gen) * 4) / 2 for _ in range(steps)]
    for i in range(0, steps, 3):
        rows[i] = torch.zeros(vocab).index_fill_(0, torch.randint(0, vocab, ((i // 3) % 3,), generator=gen), 1.0)
    whole, best = Sampler(dataclasses.replace(params, seed=11)), Sampler(dataclasses.replace(params, seed=11))
    history, reads = [int(t) for t in torch.randint(0, vocab, (20,), generator=gen)], []
    for row in rows:
        want = whole.sample(row, history)
        count = candidates_to_take(best.candidates_needed(history), vocab)
        top = top_logits(row, count)
        top = dataclasses.replace(top, full=lambda top=top: reads.append(1) or top.full())
        assert best.sample(top, history) == want
        history.append(want)
    assert 0 < len(reads) < steps  # both ways of a step were taken


def test_the_best_logits_of_a_small_vocabulary_are_all_of_it() -> None:
    """Fewer tokens than candidates: all of them, sampled as the whole row."""
    from runtime.text.top_logits import top_logits

    row = torch.tensor([1.0, 3.0, 3.0, -1.0])
    top = top_logits(row, 64)
    assert top.values.numel() == 4 and top.deciding(2) == 4
    assert Sampler(SamplingParams(temperature=0)).sample(top) == 1  # ties to the lowest id, as the row


def test_the_best_logits_refuse_a_row_with_nan() -> None:
    from runtime.text.top_logits import top_logits

    row = torch.zeros(200)
    row[150] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        Sampler(SamplingParams(temperature=0)).sample(top_logits(row, 64))
