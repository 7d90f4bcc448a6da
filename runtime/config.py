"""ModelConfig: the sizes a model family needs, made once from the FTW index (frozen)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ftw import Index


class UnsupportedFamilyError(ValueError):
    """The runtime has no implementation of this family, or of a feature its config turns on."""


class ContextOverflowError(ValueError):
    """More tokens than the decode state was sized for (here, torch-free, for the CLI to catch)."""


@dataclass(frozen=True)
class ModelConfig:
    """Normalized sizes (docs/FTW.md "Normalized config") plus the source config for the rest.

    Family files read their own extra keys (e.g. `kv_lora_rank`) from `source` through `get`,
    so a family that differs in a few fields needs no new field here.
    """

    family: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    moe_layers: tuple[int, ...]
    context_length: int
    tie_word_embeddings: bool
    source: Mapping[str, Any] = field(default_factory=dict)  # the text model's config.json

    @staticmethod
    def from_index(index: Index) -> ModelConfig:
        c = index.config
        source = index.source_config
        text = source.get("text_config") if isinstance(source.get("text_config"), dict) else source
        return ModelConfig(
            family=index.family,
            num_layers=int(c["num_layers"]),
            hidden_size=int(c["hidden_size"]),
            vocab_size=int(c["vocab_size"]),
            num_attention_heads=int(c["num_attention_heads"]),
            num_key_value_heads=int(c["num_key_value_heads"]),
            head_dim=int(c["head_dim"]),
            num_experts=int(c["num_experts"]),
            num_experts_per_tok=int(c["num_experts_per_tok"]),
            moe_intermediate_size=int(c["moe_intermediate_size"]),
            moe_layers=tuple(int(i) for i in c["moe_layers"]),
            context_length=int(c.get("context_length") or 0),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            source=MappingProxyType(dict(text)),
        )

    def get(self, key: str, default: Any = None) -> Any:
        """A key of the source config (None/absent -> `default`)."""
        return config_value(self.source, key, default)

    @property
    def rms_norm_eps(self) -> float:
        """`rms_norm_eps`, else `norm_eps` (LFM2's name for it)."""
        return float(self.get("rms_norm_eps", self.get("norm_eps", 1e-6)))

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """transformers 5's `rope_parameters`, or the older `rope_theta` + `rope_scaling` pair."""
        params = dict(self.get("rope_parameters", {}) or {})
        scaling = self.get("rope_scaling", {}) or {}
        for key, value in scaling.items():
            params.setdefault(key, value)
        params.setdefault("rope_theta", float(self.get("rope_theta", 10000.0)))
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params["type"]
        params.setdefault("rope_type", "default")
        return params


def config_value(c: ModelConfig | Mapping[str, Any], key: str, default: Any = None) -> Any:
    """`key` of a model's config (a ModelConfig's source, or a config.json as a dict), `default`
    where it is absent or null (transformers writes unset sizes as null)."""
    value = c.get(key)
    return default if value is None else value
