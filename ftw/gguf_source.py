"""GGUF architectures ft converts: each one's Hugging Face identity, name tables and config builder.

The tensor names are in gguf_names.py and gguf_names_own.py, llama.cpp's other changes to the
tensors in gguf_undo.py, the config each file implies in gguf_config*.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import UnsupportedArchitectureError
from .gguf_config import (
    Meta,
    dbrx_config,
    dots1_config,
    ernie4_5_moe_config,
    glm4_moe_config,
    gpt_oss_config,
    granite_moe_config,
    hunyuan_moe_config,
    minimax_m2_config,
    mixtral_config,
    olmoe_config,
    qwen2_moe_config,
    qwen3_moe_config,
    qwen3next_config,
    qwen35moe_config,
)
from .gguf_config_deepseek import deepseek4_config, deepseek32_config, hy_v4_config
from .gguf_config_gemma4 import gemma4_config
from .gguf_config_layered import (
    afmoe_config,
    exaone_moe_config,
    granitehybrid_config,
    hy_v3_config,
    jamba_config,
    lfm2moe_config,
    mellum_config,
    nemotron_h_moe_config,
)
from .gguf_config_layered_more import cohere2moe_config, granite_swa_config, laguna_config, minimax01_config
from .gguf_config_more import (
    bailingmoe2_config,
    deepseek2_or_mistral_config,
    glm_dsa_config,
    kimi_linear_config,
    llama4_config,
    mimo2_config,
    mistral4_config,
    phimoe_config,
)
from .gguf_file import GGUFModel
from .gguf_names import (
    AFMOE,
    BAILINGMOE2,
    BLOCK_ROWS,
    COHERE2MOE,
    DBRX,
    DEEPSEEK2,
    DEEPSEEK4,
    DEEPSEEK32,
    DOTS1,
    ERNIE,
    EXAONE_MOE,
    GEMMA4,
    GLM4,
    GLM_DSA,
    GLOBAL_ROWS,
    GPT_OSS,
    GRANITE,
    GRANITE_HYBRID,
    GRANITE_SWA,
    HUNYUAN,
    HY_V3,
    HY_V4,
    JAMBA,
    KIMI_LINEAR,
    LAGUNA,
    LAYER_PREFIX_GGUF,
    LAYER_PREFIX_HF,
    LFM2MOE,
    LLAMA,
    LLAMA4,
    MELLUM,
    MIMO2,
    MINIMAX01,
    MINIMAX_M2,
    MISTRAL4,
    NEMOTRON_H_MOE,
    OLMOE,
    PHIMOE,
    QWEN2,
    QWEN3,
    QWEN3NEXT,
    QWEN35,
    Row,
)
from .gguf_names_own import (
    AFMOE_BLOCK_ROWS,
    BAILINGMOE2_BLOCK_ROWS,
    DBRX_BLOCK_ROWS,
    DBRX_GLOBAL_ROWS,
    DEEPSEEK4_BLOCK_ROWS,
    DEEPSEEK4_GLOBAL_ROWS,
    GEMMA4_BLOCK_ROWS,
    JAMBA_BLOCK_ROWS,
    JAMBA_GLOBAL_ROWS,
    KIMI_LINEAR_BLOCK_ROWS,
    LFM2MOE_BLOCK_ROWS,
    LFM2MOE_GLOBAL_ROWS,
    LLAMA4_BLOCK_ROWS,
    LLAMA4_GLOBAL_ROWS,
    LLAMA4_LAYER_PREFIX_HF,
    NEMOTRON_H_MOE_BLOCK_ROWS,
    QWEN35_GLOBAL_ROWS,
)
from .gguf_undo import CONCAT_ROWS


@dataclass(frozen=True)
class GGUFArchitecture:
    """One `general.architecture` ft converts: its Hugging Face identity and how to rebuild its config."""

    name: str  # general.architecture
    model_type: str  # the Hugging Face model_type, which picks the FTW family
    hf_architecture: str
    build_config: Callable[[Meta, GGUFArchitecture], dict[str, Any]]
    permute_qk: bool = False  # llama.cpp permuted attn_q/attn_k rows; undone with hf_rows_of_llama_qk
    other_model_types: tuple[str, ...] = ()  # what build_config may make of a file instead (a variant)
    hf_layer_prefix: str = LAYER_PREFIX_HF  # where the HF checkpoint keeps layer N's tensors
    rows: tuple[tuple[Row, ...], tuple[Row, ...]] = (GLOBAL_ROWS, BLOCK_ROWS)  # (global, block) name tables

    def hf_config(self, model: GGUFModel) -> dict[str, Any]:
        return self.build_config(Meta(model, self.name), self)

    def tensor_names(self, num_layers: int, layer_types: list[str] | None = None) -> dict[str, str]:
        """GGUF name -> Hugging Face name for every plain (non-expert) tensor of this architecture; a row
        for one layer kind (`layer_types`, the config's) takes the kindless row's place on those layers."""
        global_rows, block_rows = self.rows
        names = {r.gguf: r.hf for r in global_rows if not r.archs or self.name in r.archs}
        rows = [r for r in block_rows if not r.archs or self.name in r.archs]
        for layer in range(num_layers):
            g, h = LAYER_PREFIX_GGUF.format(layer=layer), self.hf_layer_prefix.format(layer=layer)
            kind = layer_types[layer] if layer_types and layer < len(layer_types) else None
            names.update({g + r.gguf: h + r.hf for r in rows if not r.kind})
            names.update({g + r.gguf: h + r.hf for r in rows if r.kind and r.kind == kind})
        return names

    def concat_parts(self) -> dict[str, tuple[str, int]]:
        """GGUF block tensor name -> (the HF block tensor it is part of, its place in it)."""
        return {part: (c.hf, i) for c in CONCAT_ROWS if self.name in c.archs for i, part in enumerate(c.parts)}


ARCHITECTURES: dict[str, GGUFArchitecture] = {
    a.name: a
    for a in (
        GGUFArchitecture(QWEN3, "qwen3_moe", "Qwen3MoeForCausalLM", qwen3_moe_config),
        GGUFArchitecture(LLAMA, "mixtral", "MixtralForCausalLM", mixtral_config, permute_qk=True),
        GGUFArchitecture(DEEPSEEK2, "deepseek_v3", "DeepseekV3ForCausalLM", deepseek2_or_mistral_config,
                         other_model_types=("deepseek_v2", "mistral4", "glm4_moe_lite")),
        GGUFArchitecture(QWEN2, "qwen2_moe", "Qwen2MoeForCausalLM", qwen2_moe_config),
        GGUFArchitecture(OLMOE, "olmoe", "OlmoeForCausalLM", olmoe_config),
        GGUFArchitecture(GLM4, "glm4_moe", "Glm4MoeForCausalLM", glm4_moe_config, other_model_types=("solar_open",)),
        GGUFArchitecture(DOTS1, "dots1", "Dots1ForCausalLM", dots1_config),
        GGUFArchitecture(ERNIE, "ernie4_5_moe", "Ernie4_5_MoeForCausalLM", ernie4_5_moe_config),
        GGUFArchitecture(MINIMAX_M2, "minimax_m2", "MiniMaxM2ForCausalLM", minimax_m2_config),
        GGUFArchitecture(DBRX, "dbrx", "DbrxForCausalLM", dbrx_config, hf_layer_prefix="transformer.blocks.{layer}.",
                         rows=(DBRX_GLOBAL_ROWS, DBRX_BLOCK_ROWS)),
        GGUFArchitecture(GRANITE, "granitemoe", "GraniteMoeForCausalLM", granite_moe_config, permute_qk=True,
                         other_model_types=("granitemoeshared",)),
        GGUFArchitecture(GRANITE_HYBRID, "granitemoehybrid", "GraniteMoeHybridForCausalLM", granitehybrid_config,
                         permute_qk=True),
        GGUFArchitecture(GPT_OSS, "gpt_oss", "GptOssForCausalLM", gpt_oss_config),
        GGUFArchitecture(HUNYUAN, "hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM", hunyuan_moe_config),
        GGUFArchitecture(EXAONE_MOE, "exaone_moe", "ExaoneMoeForCausalLM", exaone_moe_config),
        GGUFArchitecture(LFM2MOE, "lfm2_moe", "Lfm2MoeForCausalLM", lfm2moe_config,
                         rows=(LFM2MOE_GLOBAL_ROWS, LFM2MOE_BLOCK_ROWS)),
        GGUFArchitecture(AFMOE, "afmoe", "AfmoeForCausalLM", afmoe_config, rows=(GLOBAL_ROWS, AFMOE_BLOCK_ROWS)),
        GGUFArchitecture(BAILINGMOE2, "sarvam_moe", "SarvamMoEForCausalLM", bailingmoe2_config,
                         rows=(GLOBAL_ROWS, BAILINGMOE2_BLOCK_ROWS)),
        GGUFArchitecture(PHIMOE, "phimoe", "PhiMoEForCausalLM", phimoe_config),
        GGUFArchitecture(LLAMA4, "llama4", "Llama4ForConditionalGeneration", llama4_config,
                         hf_layer_prefix=LLAMA4_LAYER_PREFIX_HF, rows=(LLAMA4_GLOBAL_ROWS, LLAMA4_BLOCK_ROWS)),
        GGUFArchitecture(MISTRAL4, "mistral4", "Mistral4ForCausalLM", mistral4_config),
        GGUFArchitecture(GLM_DSA, "glm_moe_dsa", "GlmMoeDsaForCausalLM", glm_dsa_config),
        GGUFArchitecture(MIMO2, "mimo_v2_flash", "MiMoV2FlashForCausalLM", mimo2_config),
        GGUFArchitecture(GEMMA4, "gemma4_text", "Gemma4ForCausalLM", gemma4_config, rows=(GLOBAL_ROWS, GEMMA4_BLOCK_ROWS)),
        GGUFArchitecture(JAMBA, "jamba", "JambaForCausalLM", jamba_config, rows=(JAMBA_GLOBAL_ROWS, JAMBA_BLOCK_ROWS)),
        GGUFArchitecture(NEMOTRON_H_MOE, "nemotron_h", "NemotronHForCausalLM", nemotron_h_moe_config, permute_qk=True,
                         rows=(GLOBAL_ROWS, NEMOTRON_H_MOE_BLOCK_ROWS)),
        GGUFArchitecture(KIMI_LINEAR, "kimi_linear", "KimiLinearForCausalLM", kimi_linear_config,
                         rows=(GLOBAL_ROWS, KIMI_LINEAR_BLOCK_ROWS)),
        GGUFArchitecture(QWEN3NEXT, "qwen3_next", "Qwen3NextForCausalLM", qwen3next_config),
        GGUFArchitecture(MELLUM, "mellum", "MellumForCausalLM", mellum_config),
        GGUFArchitecture(HY_V3, "hy_v3", "HYV3ForCausalLM", hy_v3_config),
        GGUFArchitecture(COHERE2MOE, "cohere2_moe", "Cohere2MoeForCausalLM", cohere2moe_config),
        GGUFArchitecture(LAGUNA, "laguna", "LagunaForCausalLM", laguna_config),
        GGUFArchitecture(MINIMAX01, "minimax", "MiniMaxForCausalLM", minimax01_config),
        GGUFArchitecture(GRANITE_SWA, "granitemoe_swa", "GraniteMoeSWAForCausalLM", granite_swa_config, permute_qk=True),
        GGUFArchitecture(DEEPSEEK32, "deepseek_v32", "DeepseekV32ForCausalLM", deepseek32_config),
        GGUFArchitecture(HY_V4, "hy_v4", "HYV4ForCausalLM", hy_v4_config),
        GGUFArchitecture(DEEPSEEK4, "deepseek_v4", "DeepseekV4ForCausalLM", deepseek4_config,
                         rows=(DEEPSEEK4_GLOBAL_ROWS, DEEPSEEK4_BLOCK_ROWS)),
        GGUFArchitecture(QWEN35, "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", qwen35moe_config,
                         hf_layer_prefix="model.language_model.layers.{layer}.", rows=(QWEN35_GLOBAL_ROWS, BLOCK_ROWS)),
    )
}


def architecture_for(model: GGUFModel) -> GGUFArchitecture:
    """The architecture of a GGUF model; unknown ones are refused with the supported list."""
    name = model.metadata.get("general.architecture")
    arch = ARCHITECTURES.get(name) if isinstance(name, str) else None
    if arch is None:
        raise UnsupportedArchitectureError(
            f"{model.path}: GGUF architecture {name!r} has no converter; supported GGUF architectures: "
            + ", ".join(f"{a.name} ({a.model_type})" for a in ARCHITECTURES.values())
        )
    return arch
