"""Whether a family's runtime module finds every tensor it reads: a build over shape-only tensors.

A family says which tensors it needs only by reading them (`weights.get` in runtime/models/*.py);
no table repeats that. Building the model over `meta` tensors of the stored shapes (no bytes, no
arithmetic) asks the family itself, in milliseconds, so a model lacking one is refused before a
pull writes it and before a load reads gigabytes, by name, not with a traceback at `ft run`.
ftw/check_tensors.py checks the shapes every family shares; this adds what only a family knows.
`check_family_tensors` is an `ftw.check_tensors.FamilyCheck`: `ft pull` passes it to the converters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ftw.check_tensors import Shape, TensorProblem
from ftw.errors import CorruptIndexError
from ftw.format import Index

from ..config import ModelConfig, UnsupportedFamilyError
from ..models import build_model
from .read_ftw import MissingWeightError, ModelWeights


class _NoExperts:
    """The executor of a build that is never run."""

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a shape-only model is built, never run")


def check_family_tensors(family: str, config: Mapping[str, Any], source_config: Mapping[str, Any],
                         dense: Mapping[str, Shape]) -> None:
    """TensorProblem naming the first tensor `family`'s runtime reads and `dense` lacks, or one it
    cannot build with (a shape its build reshapes by the config); a feature the runtime does not
    run yet is left to `ft run` to name (UnsupportedFamilyError), as without this check."""
    index = Index(family=family, config=dict(config), source_config=dict(source_config), tensors=(), banks=(),
                  shards=())
    model_config = ModelConfig.from_index(index)
    weights = ModelWeights(model_config, {name: torch.empty(shape, device="meta") for name, shape in dense.items()}, {})
    try:
        build_model(model_config, weights, _NoExperts(), torch.float32)
    except UnsupportedFamilyError:
        return
    except MissingWeightError as e:
        raise TensorProblem(f"{str(e).split(';')[0]}, which the {family} runtime reads") from None
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as e:  # (a build's reshape of a wrong shape)
        raise TensorProblem(f"the {family} runtime cannot build the model over these tensors ({e})") from None


def check_registered_index(index: Index, unusable: Callable[[str], str]) -> None:
    """`check_family_tensors` over a stored index; CorruptIndexError(`unusable(problem)`) if it fails."""
    dense = {t.name: t.shape for t in index.tensors if not t.name.endswith("_scale_inv")}
    try:
        check_family_tensors(index.family, index.config, index.source_config, dense)
    except TensorProblem as e:
        raise CorruptIndexError(unusable(str(e))) from None
