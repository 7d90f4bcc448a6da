"""Model families: one module per family, each with `build(config, weights, executor, dtype)`.

Families are looked up by the FTW index's `family` and imported lazily.
"""

from __future__ import annotations

import importlib

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..loading.read_ftw import ModelWeights
from .base import ContextOverflowError, DecoderModel, DecodeState

FAMILY_MODULES = {
    "qwen3_moe": "qwen3_moe",
    "mixtral": "mixtral",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v4": "deepseek_v4",
    "deepseek_v2": "deepseek_v2",
    "glm_moe_dsa": "glm_moe_dsa",
    "deepseek_v32": "deepseek_v32",
    "glm4_moe": "glm4_moe",
    "glm4_moe_lite": "glm4_moe_lite",
    "llama4": "llama4",
    "dots1": "dots1",
    "solar_open": "solar_open",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_next": "qwen3_next",
    "qwen4_exp": "qwen4_exp",
    "qwen2_moe": "qwen2_moe",
    "olmoe": "olmoe",
    "minimax_m2": "minimax_m2",
    "minimax": "minimax",
    "phimoe": "phimoe",
    "dbrx": "dbrx",
    "flex_olmo": "flex_olmo",
    "ernie4_5_moe": "ernie4_5_moe",
    "hunyuan_v1_moe": "hunyuan_v1_moe",
    "exaone_moe": "exaone_moe",
    "granitemoe": "granitemoe",
    "granitemoeshared": "granitemoe",  # (the same block with a shared MLP: granitemoe.py)
    "granitemoe_swa": "granitemoe_swa",
    "granitemoehybrid": "granitemoehybrid",
    "jamba": "jamba",
    "jetmoe": "jetmoe",
    "gpt_oss": "gpt_oss",
    "cohere2_moe": "cohere2_moe",
    "afmoe": "afmoe",
    "lfm2_moe": "lfm2_moe",
    "mimo_v2_flash": "mimo_v2_flash",
    "laguna": "laguna",
    "kimi_linear": "kimi_linear",
    "bailing_hybrid": "bailing_hybrid",
    "sarvam_moe": "sarvam_moe",
    "minicpm5_moe": "minicpm5_moe",
    "axk1": "axk1",
    "hy_v3": "hy_v3",
    "hy_v4": "hy_v4",
    "mellum": "mellum",
    "flint": "flint",
    "doge": "doge",
    "zaya": "zaya",
    "lara_mini": "lara_mini",
    "kolibri1": "kolibri1",
    "axk2": "axk2",
    "beam": "beam",
    "ergo": "ergo",
    "longcat_flash": "longcat_flash",
    "mistral4": "mistral4",
    "gemma4_text": "gemma4",
    "nemotron_h": "nemotron_h",
}


def _family_module(family: str):
    module_name = FAMILY_MODULES.get(family)
    if module_name is None:
        raise UnsupportedFamilyError(
            f"the runtime cannot run family {family!r} yet; it runs: {', '.join(sorted(FAMILY_MODULES))}"
        )
    try:
        return importlib.import_module(f"{__name__}.{module_name}")
    except ModuleNotFoundError as e:
        raise UnsupportedFamilyError(f"family {family!r} is not implemented yet ({e.name})") from None


def keep_float32(family: str) -> tuple[str, ...]:
    """Tensor-name suffixes a family keeps in float32 at any compute dtype (routing inputs that
    transformers keeps in float32: rounding them can flip expert choices)."""
    return tuple(getattr(_family_module(family), "KEEP_FLOAT32", ()))


def build_model(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    return _family_module(config.family).build(config, weights, executor, dtype)


__all__ = ["ContextOverflowError", "DecodeState", "DecoderModel", "UnsupportedFamilyError", "build_model", "keep_float32"]
