"""The family table of docs/FAMILIES.md, made from the registries: the runtime's families
(`FAMILY_MODULES`), the converter's model types (`ftw.families`) and GGUF architectures
(`ftw.gguf_source`), with each family's attention and routing in words (`KINDS`, which a test
keeps complete). `python -m runtime.models.catalog` prints the table; tests/test_family_table.py
checks that docs/FAMILIES.md is what it prints.
"""

from __future__ import annotations

from ftw.families import FAMILIES
from ftw.gguf_source import ARCHITECTURES

from . import FAMILY_MODULES

# family -> (attention, routing), as its module computes them
KINDS: dict[str, tuple[str, str]] = {
    "afmoe": ("sliding-window rope layers and global NoPE layers, QK norm, gated output, sandwich norms",
              "sigmoid + bias, renormalized and scaled, shared experts"),
    "axk1": ("MLA (latent KV)", "sigmoid + bias, group-limited top-k, shared experts, the MoE output RMSNormed"),
    "axk2": ("MLA with a sparse-attention indexer (DSA) on every layer, the query gating the output, gated norms",
             "sigmoid + bias, top-k (group-limited where grouped), shared experts"),
    "bailing_hybrid": ("Kimi Delta Attention layers and head-gated MLA layers",
                       "sigmoid + bias, group-limited top-k, shared experts"),
    "beam": ("sliding-window rope layers and global NoPE layers with a log-length query scale, QK norm, "
             "gated output (a bias a head), sandwich norms, depth-scaled residual",
             "sigmoid + bias, group-limited top-k, scaled after the sum, dense layers"),
    "cohere2_moe": ("parallel blocks: sliding-window rope layers and global NoPE layers, LayerNorm",
                    "softmax or sigmoid over the top-k logits, shared experts summed or averaged"),
    "dbrx": ("GQA, fused Wqkv clipped, LayerNorm", "softmax top-k, p-norm renormalized"),
    "deepseek_v2": ("MLA (latent KV)", "softmax greedy or group-limited, shared experts"),
    "deepseek_v3": ("MLA (latent KV)", "sigmoid + bias, group-limited top-k, shared experts"),
    "deepseek_v32": ("MLA with a sparse-attention indexer (DSA) on every layer",
                     "sigmoid + bias, group-limited top-k, shared experts"),
    "deepseek_v4": ("sliding window + compressed KV (CSA with an indexer, HCA), sinks, grouped output, "
                    "hyper-connections", "sqrt-softplus + bias or hashed by token, shared expert, clamped SwiGLU"),
    "doge": ("GQA, QK norm, a learned bias a key from its value with top-k key selection (dynamic mask), learned "
             "residual scales", "product-key top-k of one-neuron silu experts, softmax, beside a dense MLP"),
    "dots1": ("GQA, QK norm", "sigmoid + bias, group-limited top-k, shared experts"),
    "ernie4_5_moe": ("GQA, interleaved rope", "softmax + correction bias, shared experts, dense layers"),
    "ergo": ("sliding-window rope layers and global NoPE layers, fused QKV, QK norm, sandwich norms, learned "
             "residual gates", "sigmoid + bias, renormalized and scaled, each expert's output RMSNormed, a normed "
             "shared expert, relu2"),
    "exaone_moe": ("sliding-window rope layers and global NoPE layers", "sigmoid + bias, shared experts"),
    "flint": ("sliding-window rope layers and global NoPE layers, sinks on every layer, QK norm",
              "sigmoid top-k renormalized, an ungated shared expert, dense layers"),
    "flex_olmo": ("GQA, QK norm, post-norm blocks", "softmax top-k"),
    "glm4_moe": ("GQA, partial rope, QK norm optional", "sigmoid + bias, group-limited top-k, shared experts"),
    "glm4_moe_lite": ("MLA (latent KV)", "sigmoid + bias, group-limited top-k, shared experts"),
    "glm_moe_dsa": ("MLA with a sparse-attention indexer (DSA)", "sigmoid + bias, shared experts"),
    "gemma4_text": ("sliding-window and full GQA layers (wider, values from the keys' projection), proportional rope, "
                    "QK and V norms, sandwich norms, logit softcapping",
                    "softmax top-k renormalized, per-expert scales, beside a dense MLP, GeGLU experts"),
    "gpt_oss": ("sliding-window and full GQA layers, attention sinks, biases",
                "softmax over the top-k logits (router bias), experts with biases and clamped SwiGLU"),
    "granitemoe": ("GQA, Granite's multipliers", "softmax over the top-k logits"),
    "granitemoe_swa": ("sliding-window and full GQA layers, sinks on every layer, a rope base a layer or NoPE, "
                       "Granite's multipliers", "softmax over the top-k logits, a shared MLP where sized"),
    "granitemoehybrid": ("Mamba2 (selective state space) layers and GQA layers, NoPE or rope, Granite's multipliers",
                         "softmax over the top-k logits, a shared MLP"),
    "granitemoeshared": ("GQA, Granite's multipliers", "softmax over the top-k logits, a shared MLP"),
    "hunyuan_v1_moe": ("GQA, QK norm after rope, NTK-alpha rope", "softmax top-k renormalized, a shared MLP"),
    "nemotron_h": ("Mamba2 (selective state space) layers and NoPE GQA layers, one mixer or FFN a layer",
                   "sigmoid + bias, group-limited top-k, a shared MLP, relu2 experts (not gated), dense MLP layers"),
    "jamba": ("Mamba (selective state space) layers and NoPE GQA layers", "softmax top-k, dense MLP layers between"),
    "hy_v3": ("GQA, QK norm", "sigmoid + bias, renormalized and scaled, shared experts"),
    "hy_v4": ("MLA with a sparse-attention indexer (DSA), shared by later layers, sinks, gated output, "
              "hyper-connections", "sigmoid + bias, renormalized and scaled, shared experts, clamped SwiGLU, dense layers"),
    "jetmoe": ("mixture of attention heads (attention experts)", "softmax over the top-k logits"),
    "kimi_linear": ("Kimi Delta Attention (per-channel decay) and NoPE MLA layers",
                    "sigmoid + bias, group-limited top-k, shared experts"),
    "kolibri1": ("sliding-window rope layers and global NoPE layers, QK norm, sandwich norms",
                 "sigmoid of the top-k logits chosen with a bias, shared experts"),
    "laguna": ("sliding-window and full GQA layers, QK norm, partial rope, softplus output gate, heads per layer",
               "sigmoid + bias (soft-capped logits), renormalized, shared experts"),
    "lara_mini": ("Gated DeltaNet layers, sliding-window rope and global NoPE attention layers, QK norm",
                  "softmax top-k renormalized, an ungated shared expert"),
    "lfm2_moe": ("gated short-convolution layers and GQA layers, QK norm", "sigmoid + bias, renormalized"),
    "longcat_flash": ("two MLA sublayers a layer (scaled latents), two dense MLPs",
                      "softmax + bias over real and identity (zero) experts, scaled, a shortcut MoE"),
    "llama4": ("chunked rope layers and global NoPE layers, QK L2 norm", "sigmoid top-1 on the input, shared expert"),
    "mellum": ("sliding-window and full GQA layers, QK norm, a rope a layer kind", "softmax top-k renormalized"),
    "mimo_v2_flash": ("sliding-window layers with sinks and twice the KV heads, full layers, partial rope, "
                      "narrower values", "sigmoid + bias, group-limited top-k"),
    "minicpm5_moe": ("GQA, output gated per head", "sigmoid + bias, group-limited top-k, shared experts"),
    "minimax": ("lightning attention (linear, decayed) and GQA layers, normed residuals",
                "softmax top-k renormalized"),
    "minimax_m2": ("GQA, partial rope, QK norm", "sigmoid + correction bias"),
    "mistral4": ("MLA (latent KV), YaRN, Llama 4 query temperature",
                 "softmax, group-limited top-k renormalized, shared experts"),
    "mixtral": ("GQA", "softmax top-k renormalized"),
    "olmoe": ("GQA, QK norm over the whole projection", "softmax top-k"),
    "phimoe": ("GQA, long rope, LayerNorm with biases", "sparsemixer top-2"),
    "qwen2_moe": ("GQA", "softmax top-k, a gated shared expert"),
    "qwen3_5_moe": ("Gated DeltaNet and gated attention layers", "softmax top-k, a gated shared expert"),
    "qwen3_moe": ("GQA, QK norm", "softmax top-k renormalized"),
    "qwen3_next": ("Gated DeltaNet and gated attention layers", "softmax top-k, a gated shared expert"),
    "qwen4_exp": ("Gated DeltaNet and gated attention layers with block-selecting indexers (QSA), gated "
                  "hyper-connections", "softmax top-k, a gated shared expert"),
    "sarvam_moe": ("GQA, QK norm, fused QKV", "sigmoid + bias, group-limited top-k, shared experts"),
    "solar_open": ("GQA", "sigmoid + bias, group-limited top-k, shared experts"),
    "zaya": ("compressed convolutional attention (q/k through short causal convolutions, values half from the "
             "token before), full and sliding-window layers, partial rope, residual scales with biases",
             "a router MLP with a state passed layer to layer, top-1 + balancing bias, a skip expert")
}

# where a family does not run on both the CPU and the GPU (none now: Gemma 4's GELU-gated experts
# were the last, until the slot kernel computed them)
RUNS_ON: dict[str, str] = {}

HEADER = ("family", "HF model_type", "GGUF architecture", "attention", "routing", "runs on", "tested how")


def rows() -> list[tuple[str, ...]]:
    """One row a family the runtime runs, by name."""
    gguf: dict[str, list[str]] = {}
    for arch, spec in ARCHITECTURES.items():
        for model_type in (spec.model_type, *spec.other_model_types):
            gguf.setdefault(model_type, []).append(arch)
    out = []
    for family in sorted(FAMILY_MODULES):
        attention, routing = KINDS[family]
        types = FAMILIES[family].model_types + FAMILIES[family].wrapper_model_types  # (mistral3: Mistral Small 4's)
        archs = list(dict.fromkeys(a for t in types for a in gguf.get(t, [])))  # (Qwen3.5's file is its text model's)
        tested = "parity with transformers" + (", HF -> GGUF -> FTW round trip" if archs else "")
        out.append((family, ", ".join(types), ", ".join(archs) or "-", attention, routing, RUNS_ON.get(family, "CPU and GPU (hybrid)"), tested))
    return out


def markdown() -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "| " + " | ".join("---" for _ in HEADER) + " |"]
    lines += ["| " + " | ".join(f"`{c}`" if i < 2 and c != "-" else c for i, c in enumerate(row)) + " |"
              for row in rows()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
