"""A config's per-layer kinds (`layer_types`: which attention each layer runs), read and checked
once for the families that have them."""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..config import ModelConfig, UnsupportedFamilyError

SLIDING_OR_FULL = frozenset({"sliding_attention", "full_attention"})


def layer_types(config: ModelConfig, family: str, default: Callable[[int], str],
                kinds: Collection[str] = SLIDING_OR_FULL) -> list[str]:
    """The config's `layer_types`, else `default(i)` for each layer i (the family's config class's
    schedule); refused unless there is one a layer, each one of `kinds`."""
    n = config.num_layers
    types = config.get("layer_types") or [default(i) for i in range(n)]
    if len(types) != n or set(types) - set(kinds):
        raise UnsupportedFamilyError(f"unsupported {family} layer_types {types!r} for {n} layers")
    return list(types)
