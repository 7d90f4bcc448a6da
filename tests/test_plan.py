"""The fit planner on real model shapes and real machines, as plain numbers; then `ft fit` end to end.

Expected values are worked out here from the shapes (config.json numbers, FTW record layout), not by
calling the planner twice. GiB/MiB are binary.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ftpull.preflight import Footprint, Resources, check_fit, footprint
from ftw import convert_checkpoint
from ftw.families import FAMILIES
from ftw.safetensors_source import SafetensorsCheckpoint
from registry import Store
from runtime.loading.registered import open_model
from runtime.planner import resources
from runtime.planner.footprint import GROUPED_EXPERT_DTYPES, grouped_records, held_dense_bytes
from runtime.planner.plan import (
    DEFAULT_NUM_CTX,
    GPU_RESERVE_BYTES,
    MIN_CONTEXT_TOKENS,
    PREFILL_CHUNK_TOKENS,
    RAM_RESERVE_BYTES,
    FitError,
    KVLayout,
    ModelFootprint,
    PlanOverrides,
    kv_layout,
    plan,
    size,
)
from runtime.planner.resources import GPU, Machine
from tests.checkpoints import save_checkpoint, to_fp8, to_mxfp4
from tests.clirun import ft

GiB, MiB = 1 << 30, 1 << 20

# -- machines ---------------------------------------------------------------------------------------
LAPTOP_4060 = Machine(ram_total_bytes=32 * GiB, ram_available_bytes=28 * GiB, num_physical_cores=6,
                      gpu=GPU("NVIDIA GeForce RTX 4060 Laptop GPU", 8 * GiB, 8 * GiB - 400 * MiB))
DESKTOP_5090 = Machine(ram_total_bytes=64 * GiB, ram_available_bytes=60 * GiB, num_physical_cores=16,
                       gpu=GPU("NVIDIA GeForce RTX 5090", 32 * GiB, 32 * GiB - 512 * MiB))
WORKSTATION_5090 = replace(DESKTOP_5090, ram_total_bytes=1024 * GiB, ram_available_bytes=1000 * GiB)
CPU_BOX = Machine(ram_total_bytes=24 * GiB, ram_available_bytes=22 * GiB, num_physical_cores=8)
SMALL_LAPTOP = Machine(ram_total_bytes=16 * GiB, ram_available_bytes=12 * GiB, num_physical_cores=4,
                       gpu=GPU("NVIDIA GeForce GTX 1650", 4 * GiB, 4 * GiB - 300 * MiB))

# -- Qwen3-30B-A3B (qwen3_moe): its config.json and a complete tensor table -------------------------
QWEN3_30B = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
             "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "vocab_size": 151936,
             "max_position_embeddings": 40960, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "tie_word_embeddings": False, "rope_theta": 1000000.0}


def qwen3_30b_tensors(dtype: str = "bf16", itemsize: int = 2) -> dict[str, tuple[str, int]]:
    t = {"model.embed_tokens.weight": (dtype, 151936 * 2048 * itemsize), "lm_head.weight": (dtype, 151936 * 2048 * itemsize),
         "model.norm.weight": (dtype, 2048 * itemsize)}
    for i in range(48):
        p = f"model.layers.{i}."
        for name, n in (("self_attn.q_proj", 4096 * 2048), ("self_attn.k_proj", 512 * 2048), ("self_attn.v_proj", 512 * 2048),
                        ("self_attn.o_proj", 2048 * 4096), ("self_attn.q_norm", 128), ("self_attn.k_norm", 128),
                        ("input_layernorm", 2048), ("post_attention_layernorm", 2048), ("mlp.gate", 128 * 2048)):
            t[f"{p}{name}.weight"] = (dtype, n * itemsize)
        for e in range(128):
            for proj, n in (("gate_proj", 768 * 2048), ("up_proj", 768 * 2048), ("down_proj", 2048 * 768)):
                t[f"{p}mlp.experts.{e}.{proj}.weight"] = (dtype, n * itemsize)
    return t


# by hand: per layer q 4096x2048 + k, v 512x2048 + o 2048x4096 + norms 2x128 + 2x2048 + router 128x2048
QWEN3_30B_DENSE = 2 * 151936 * 2048 * 2 + 2048 * 2 + 48 * (2 * 4096 * 2048 + 2 * 512 * 2048 + 256 + 4096 + 128 * 2048) * 2
QWEN3_30B_EMBED = 151936 * 2048 * 2  # the token embeddings: in host RAM on the GPU path (the head stays on the GPU)
QWEN3_30B_STRIDE = 3 * 768 * 2048 * 2  # w13 [1536, 2048] + w2 [2048, 768] bf16 = 9 MiB, already 4096-aligned
QWEN3_30B_KV = 2 * 48 * 4 * 128 * 2  # GQA, bf16: 96 KiB per token
# a prompt chunk's token at its layer's peak (footprint._activation_bytes_per_token): attention's, the larger here
QWEN3_30B_ACT = 4 * (max(2 * 2048 + 5 * 32 * 128 + 3 * 4 * 128, 3 * 2048 + 2 * 128 + 16 * 8 + 2 * (2 * 2048 + 4 * 768)) + 2 * 128)
QWEN3_30B_WORKSPACE = GPU_RESERVE_BYTES + PREFILL_CHUNK_TOKENS * QWEN3_30B_ACT


@pytest.fixture(scope="module")
def qwen3_30b() -> ModelFootprint:
    return ModelFootprint.from_checkpoint(QWEN3_30B, qwen3_30b_tensors(), name="qwen3-30b-a3b")


def test_qwen3_30b_footprint_from_the_tensor_table(qwen3_30b: ModelFootprint) -> None:
    assert QWEN3_30B_STRIDE == 9 * MiB
    assert qwen3_30b.expert_stride_bytes == QWEN3_30B_STRIDE
    assert qwen3_30b.expert_pool_bytes == 48 * 128 * 9 * MiB == 54 * GiB
    assert qwen3_30b.dense_bytes == QWEN3_30B_DENSE == 3_082_186_752
    assert qwen3_30b.embedding_bytes == QWEN3_30B_EMBED  # (not tied: lm_head.weight is its own)
    tied = ModelFootprint.from_checkpoint({**QWEN3_30B, "tie_word_embeddings": True}, qwen3_30b_tensors())
    assert tied.embedding_bytes == 0 and tied.dense_bytes == QWEN3_30B_DENSE
    assert (qwen3_30b.num_moe_layers, qwen3_30b.num_experts, qwen3_30b.num_experts_per_tok) == (48, 128, 8)
    assert qwen3_30b.min_cache_slots == 384 and qwen3_30b.num_expert_records == 6144
    assert qwen3_30b.kv.bytes_per_token == QWEN3_30B_KV == 96 * 1024 and qwen3_30b.kv.state_bytes == 0
    assert qwen3_30b.context_length == 40960 and qwen3_30b.activation_bytes_per_token == QWEN3_30B_ACT
    f32 = ModelFootprint.from_checkpoint(QWEN3_30B, qwen3_30b_tensors(), target_dtype="f32")
    assert f32.expert_stride_bytes == 2 * QWEN3_30B_STRIDE and f32.kv.bytes_per_token == 2 * QWEN3_30B_KV


def test_qwen3_30b_bf16_does_not_fit_a_32_gib_laptop(qwen3_30b: ModelFootprint) -> None:
    with pytest.raises(FitError) as err:
        plan(qwen3_30b, LAPTOP_4060, PlanOverrides())
    (ram,) = err.value.problems
    assert (ram.resource, ram.needed, ram.available) == ("RAM", 54 * GiB + QWEN3_30B_EMBED + RAM_RESERVE_BYTES, 32 * GiB)
    message = str(err.value)
    assert ("RAM: needs 56.6 GiB (experts 54.0 GiB + token embeddings 593.5 MiB + 2.0 GiB reserve), the machine has "
            "32.0 GiB") in message
    assert ":fp8" in message and "more RAM" in message and "--force" in message
    forced = plan(qwen3_30b, LAPTOP_4060, PlanOverrides(force=True))
    assert not forced.fits and forced.pinned_bytes == 30 * GiB - QWEN3_30B_EMBED  # all the RAM but the reserve
    assert any("29.4 GiB of the 54.0 GiB expert pool can be pinned" in w for w in forced.warnings)


def test_qwen3_30b_bf16_on_a_5090(qwen3_30b: ModelFootprint) -> None:
    p = plan(qwen3_30b, DESKTOP_5090, PlanOverrides())
    vram = 32 * GiB - 512 * MiB
    left = vram - (QWEN3_30B_DENSE - QWEN3_30B_EMBED) - QWEN3_30B_WORKSPACE
    assert p.device == "gpu" and p.fits and not p.warnings
    assert p.ram_needed_bytes == 56 * GiB + QWEN3_30B_EMBED and p.pinned_bytes == 54 * GiB
    assert (p.dense_bytes, p.embedding_bytes) == (QWEN3_30B_DENSE - QWEN3_30B_EMBED, QWEN3_30B_EMBED)
    assert dict(p.describe())["dense weights"] == "2.3 GiB on the GPU, token embeddings 593.5 MiB in RAM"
    assert p.context_length == DEFAULT_NUM_CTX == 32768  # min(model 40960, default)
    assert p.kv_bytes == 32768 * QWEN3_30B_KV == 3 * GiB
    bank = 128 * 9 * MiB  # a prefill buffer holds one layer's 128 experts
    assert p.prefill_buffers == 2 and p.prefill_buffer_bytes == 2 * bank
    # the buffers are slots the cache lends while a prompt streams: all the room is cache
    slots = (left - 3 * GiB) // (9 * MiB)  # (the embeddings' 593.5 MiB buy 66 slots)
    assert p.cache_slots == slots and p.vram_needed_bytes <= vram
    assert f"{p.cache_fraction:.3f}" == f"{slots / 6144:.3f}"  # ~43% of the experts
    assert p.max_kv_tokens == (left - 384 * 9 * MiB) // QWEN3_30B_KV
    assert p.num_threads == 15  # 16 physical cores, one feeds the GPU
    assert p.vram_needed_bytes == QWEN3_30B_DENSE - QWEN3_30B_EMBED + QWEN3_30B_WORKSPACE + 3 * GiB + slots * 9 * MiB  # the buffers: lent slots


def test_benchmark_cap_of_8_gib_trades_context_for_one_tokens_experts(qwen3_30b: ModelFootprint) -> None:
    """A default context gives way to one token's experts (with a note); the user's num_ctx is
    planned as asked, the cache taking what is left, below one token's experts too."""
    left = 8 * GiB - (QWEN3_30B_DENSE - QWEN3_30B_EMBED) - QWEN3_30B_WORKSPACE
    fits_kv = (left - 384 * 9 * MiB) // QWEN3_30B_KV  # the cache keeps one token's experts
    assert 4096 < fits_kv < 32768
    p = plan(qwen3_30b, DESKTOP_5090, PlanOverrides(vram_budget_bytes=8 * GiB))
    assert p.vram_budget_bytes == 8 * GiB and p.context_length == fits_kv and p.cache_slots == 384
    assert any(f"planned {fits_kv} tokens" in n for n in p.notes) and not p.warnings
    recipe = plan(qwen3_30b, DESKTOP_5090, PlanOverrides(vram_budget_bytes=8 * GiB, default_num_ctx=32768))
    assert recipe.context_length == fits_kv and any("context 32768 does not fit" in n for n in recipe.notes)
    asked = plan(qwen3_30b, DESKTOP_5090, PlanOverrides(vram_budget_bytes=8 * GiB, num_ctx=32768))
    slots = (left - 3 * GiB) // (9 * MiB)
    assert asked.context_length == 32768 and asked.kv_bytes == 3 * GiB and not asked.warnings
    assert asked.cache_slots == slots < 384 and asked.prefill_buffers == 0
    assert any(f"holds {slots} slots, fewer than one token's experts" in n and "streamed through its slots" in n
               for n in asked.notes)
    short = plan(qwen3_30b, DESKTOP_5090, PlanOverrides(vram_budget_bytes=8 * GiB, num_ctx=4096))
    # room to lend one prefill buffer (128 slots) beside one token's experts, not two
    assert short.context_length == 4096 and short.prefill_buffers == 1
    assert 384 + 128 <= short.cache_slots == (left - 4096 * QWEN3_30B_KV) // (9 * MiB) < 384 + 2 * 128


# -- Qwen3.6-35B-A3B (qwen3_5_moe): hybrid Gated DeltaNet + full attention every 4th layer -----------
QWEN36_TEXT = {"model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
               "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
               "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
               "full_attention_interval": 4, "num_experts": 256, "num_experts_per_tok": 8,
               "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}
QWEN36_KV = 2 * 10 * 2 * 256 * 2  # only the 10 full-attention layers: 20 KiB per token
# per linear layer: recurrent state 32 v-heads x 128 x 128 f32 + conv window 3 x (2 x 16 x 128 + 32 x 128) bf16
QWEN36_STATE = 30 * (32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 2)
QWEN36_ACT = 4 * (4 * 2048 + (16 + 2 * 2) * 256 + 256 + 3 * 8 * 512)
# FP8 record: w13 [1024, 2048] + w2 [2048, 512] fp8, then three [4, 16]/[16, 4] f32 block-scale parts
QWEN36_FP8_STRIDE = 3149824  # 3145728 + 3 x 256 = 3146496, rounded up to 4096
QWEN36_Q4_STRIDE = 1024 * 2048 // 256 * 144 + 2048 * 512 // 256 * 144  # Q4_K w13 + w2 = 1728 KiB


def qwen36(stride: int, dense: int, name: str) -> ModelFootprint:
    return ModelFootprint(name=name, source="ftw", family="qwen3_5_moe", dtype="q4_k", dense_bytes=dense,
                          expert_pool_bytes=40 * 256 * stride, expert_stride_bytes=stride, num_moe_layers=40,
                          num_experts=256, num_experts_per_tok=8, kv=kv_layout("qwen3_5_moe", QWEN36_TEXT, 2),
                          context_length=262144, activation_bytes_per_token=QWEN36_ACT)


def test_hybrid_kv_counts_full_attention_layers_and_a_fixed_state() -> None:
    kv = kv_layout("qwen3_5_moe", QWEN36_TEXT, 2)
    assert (kv.kind, kv.bytes_per_token, kv.state_bytes) == ("hybrid", QWEN36_KV, QWEN36_STATE)
    assert QWEN36_STATE == 30 * 2146304  # ~61.4 MiB whatever the context
    listed = {**QWEN36_TEXT, "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 36}
    assert kv_layout("qwen3_5_moe", listed, 2).bytes_per_token == 2 * 1 * 2 * 256 * 2


def test_qwen36_fp8_misses_a_32_gib_laptop_by_40_mb() -> None:
    fp = qwen36(QWEN36_FP8_STRIDE, dense=int(3.2 * GiB), name="qwen3.6-35b:fp8")
    with pytest.raises(FitError) as err:
        plan(fp, LAPTOP_4060, PlanOverrides())
    (ram,) = err.value.problems
    assert ram.needed == 40 * 256 * 3149824 + RAM_RESERVE_BYTES == 34_401_681_408 and ram.available == 32 * GiB


def test_qwen36_q4_on_the_4060_laptop() -> None:
    dense = int(1.75 * GiB)  # Q4_K_M-sized embeddings, attention, DeltaNet and shared experts
    fp = qwen36(QWEN36_Q4_STRIDE, dense=dense, name="qwen3.6-35b:q4_k_m")
    p = plan(fp, LAPTOP_4060, PlanOverrides())
    workspace = GPU_RESERVE_BYTES + PREFILL_CHUNK_TOKENS * QWEN36_ACT
    left = 8 * GiB - 400 * MiB - dense - workspace
    kv = 32768 * QWEN36_KV + QWEN36_STATE
    assert p.device == "gpu" and p.fits and p.context_length == 32768 and p.kv_bytes == kv
    bank = 256 * QWEN36_Q4_STRIDE  # a prefill buffer holds one layer's 256 experts
    assert p.prefill_buffers == 2 and p.prefill_buffer_bytes == 2 * bank
    assert p.cache_slots == (left - kv) // QWEN36_Q4_STRIDE == 2920 and p.num_expert_records == 10240  # buffers lent
    assert p.min_cache_slots == 320 and p.ram_needed_bytes == 40 * 256 * QWEN36_Q4_STRIDE + RAM_RESERVE_BYTES
    assert p.num_threads == 5  # 6 cores, one feeds the GPU
    assert plan(fp, LAPTOP_4060, PlanOverrides(num_threads=6)).num_threads == 6
    many = plan(fp, LAPTOP_4060, PlanOverrides(num_threads=12))
    assert many.num_threads == 12 and any("12 threads on 6 physical cores" in w for w in many.warnings)


# -- GLM-5 (glm_moe_dsa): MLA + DSA indexer keys ------------------------------------------------------
GLM5 = {"model_type": "glm_moe_dsa", "hidden_size": 6144, "num_hidden_layers": 78, "num_attention_heads": 64,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192, "index_head_dim": 128,
        "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "first_k_dense_replace": 3}
GLM5_KV = 78 * (512 + 64) * 2 + 78 * 128 * 2  # latent + rope key, plus every layer's indexer key
GLM5_STRIDE = 37761024  # w13 [4096, 6144] + w2 [6144, 2048] fp8 + 3 x 3072 B of scales = 37757952, to 4096


def test_mla_kv_caches_the_latent_and_rope_key() -> None:
    assert kv_layout("glm_moe_dsa", GLM5, 2).bytes_per_token == GLM5_KV == 109824
    shared = {**GLM5, "indexer_types": ["full", "shared"] * 39}  # IndexShare: half the layers reuse keys
    assert kv_layout("glm_moe_dsa", shared, 2).bytes_per_token == 78 * 576 * 2 + 39 * 128 * 2
    dsv3 = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 128}
    assert kv_layout("deepseek_v3", dsv3, 2) == KVLayout("mla", 61 * 576 * 2, 0, "MLA: 61 layers x (512 + 64) x 2 B")


def glm5_fp8() -> ModelFootprint:
    return ModelFootprint(name="glm-5:fp8", source="ftw", family="glm_moe_dsa", dtype="f8_e4m3",
                          dense_bytes=int(19.5 * GiB), expert_pool_bytes=75 * 256 * GLM5_STRIDE,
                          expert_stride_bytes=GLM5_STRIDE, num_moe_layers=75, num_experts=256, num_experts_per_tok=8,
                          kv=kv_layout("glm_moe_dsa", GLM5, 2), context_length=202752,
                          activation_bytes_per_token=4 * (4 * 6144 + 192 * 64 + 256 + 3 * 8 * 2048))


def test_glm5_on_a_5090_cannot_hold_one_tokens_experts() -> None:
    """Its cache below one token's experts is still a plan, on the GPU: the misses are split
    between PCIe, through its slots, and the CPU."""
    fp = glm5_fp8()
    with pytest.raises(FitError, match="RAM: needs"):  # 675 GiB of experts in 64 GiB
        plan(fp, DESKTOP_5090, PlanOverrides())
    p = plan(fp, WORKSTATION_5090, PlanOverrides())
    workspace = GPU_RESERVE_BYTES + PREFILL_CHUNK_TOKENS * fp.activation_bytes_per_token
    left = 32 * GiB - 512 * MiB - int(19.5 * GiB) - workspace
    assert left < 600 * GLM5_STRIDE  # one token's experts (75 x top-8 = 600 slots) need 21.1 GiB
    assert p.fits and p.context_length == MIN_CONTEXT_TOKENS  # KV squeezed to the floor, cache still short
    assert p.cache_slots == (left - MIN_CONTEXT_TOKENS * GLM5_KV) // GLM5_STRIDE == 321
    assert any("holds 321 slots, fewer than one token's experts (75 MoE layers x top-8 = 600 slots of 36.0 MiB): "
               "each layer's misses are split between PCIe, streamed through its slots, and the CPU" in n
               for n in p.notes) and not p.warnings
    assert plan(fp, WORKSTATION_5090, PlanOverrides(device="gpu")) == p


# -- DeepSeek-V3 FP8 ---------------------------------------------------------------------------------
DSV3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "q_lora_rank": 1536, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "vocab_size": 129280, "max_position_embeddings": 163840}
DSV3_STRIDE = 44052480  # w13 [4096, 7168] + w2 [7168, 2048] fp8 = 44040192, + 3 x [16, 56] f32 scales, to 4096


def test_deepseek_v3_fp8_from_its_tensor_table() -> None:
    tensors = {"model.embed_tokens.weight": ("bf16", 129280 * 7168 * 2), "lm_head.weight": ("bf16", 129280 * 7168 * 2)}
    for layer in (*range(3, 61), 61):  # 58 MoE layers, then the MTP layer 61 that ft drops
        for e in range(256):
            for proj, n, scale in (("gate_proj", 2048 * 7168, 16 * 56), ("up_proj", 2048 * 7168, 16 * 56),
                                   ("down_proj", 7168 * 2048, 56 * 16)):
                tensors[f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"] = ("f8_e4m3", n)
                tensors[f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight_scale_inv"] = ("f32", 4 * scale)
    fp = ModelFootprint.from_checkpoint(DSV3, tensors, name="deepseek-v3")
    assert fp.expert_stride_bytes == DSV3_STRIDE and fp.num_moe_layers == 58
    assert fp.expert_pool_bytes == 58 * 256 * DSV3_STRIDE  # 609 GiB
    assert fp.dense_bytes == 2 * 129280 * 7168 * 2 and fp.dtype == "bf16"  # the embeddings': KV is bf16
    assert fp.kv.bytes_per_token == 61 * (512 + 64) * 2 and fp.context_length == 163840
    with pytest.raises(FitError) as err:
        plan(fp, DESKTOP_5090, PlanOverrides())
    (ram,) = err.value.problems
    assert fp.embedding_bytes == 129280 * 7168 * 2  # in RAM beside the experts on the GPU path
    assert ram.needed == 58 * 256 * DSV3_STRIDE + fp.embedding_bytes + RAM_RESERVE_BYTES and ram.available == 64 * GiB
    assert "609.2 GiB" in str(err.value) and err.value.plan is not None and not err.value.plan.fits


# -- CPU only ----------------------------------------------------------------------------------------
# Qwen3-30B-A3B Q4_K_M in FTW: experts w13 Q4_K [1536, 2048] + w2 Q6_K [2048, 768]
Q4KM_STRIDE = 1536 * 2048 // 256 * 144 + 2048 * 768 // 256 * 210  # 3059712 = 747 x 4096
Q4KM_DENSE = (151936 * 2048 // 256 * 144 + 151936 * 2048 // 256 * 210 + 2048 * 4  # embed Q4_K, head Q6_K, norm f32
              + 48 * (4096 * 2048 // 256 * 144 + 512 * 2048 // 256 * 144 + 512 * 2048 // 256 * 210
                      + 2048 * 4096 // 256 * 144 + 128 * 2048 * 4 + (2 * 2048 + 2 * 128) * 4))


def qwen3_30b_q4() -> ModelFootprint:
    return ModelFootprint(name="qwen3-30b-a3b:q4_k_m", source="ftw", family="qwen3_moe", dtype="q4_k",
                          dense_bytes=Q4KM_DENSE, expert_pool_bytes=6144 * Q4KM_STRIDE, expert_stride_bytes=Q4KM_STRIDE,
                          num_moe_layers=48, num_experts=128, num_experts_per_tok=8,
                          kv=KVLayout("gqa", QWEN3_30B_KV), context_length=40960,
                          activation_bytes_per_token=QWEN3_30B_ACT)


def test_cpu_only_box_holds_everything_in_ram() -> None:
    p = plan(qwen3_30b_q4(), CPU_BOX, PlanOverrides())
    fixed = 6144 * Q4KM_STRIDE + Q4KM_DENSE + PREFILL_CHUNK_TOKENS * QWEN3_30B_ACT + RAM_RESERVE_BYTES
    assert p.device == "cpu" and p.device_reason == "no GPU found" and p.fits
    assert p.cache_slots == 0 and p.pinned_bytes == 0 and p.vram_needed_bytes == 0
    assert p.max_kv_tokens == (24 * GiB - fixed) // QWEN3_30B_KV == 38303
    assert p.context_length == 32768 and p.ram_needed_bytes == fixed + 3 * GiB
    assert p.num_threads == 8  # no GPU to feed: every physical core
    recipe = plan(qwen3_30b_q4(), CPU_BOX, PlanOverrides(default_num_ctx=40960))  # a recipe's: lowered to fit
    assert recipe.context_length == p.max_kv_tokens and any("context 40960 does not fit" in n for n in recipe.notes)
    with pytest.raises(FitError) as err:  # the user's: planned exactly or refused
        plan(qwen3_30b_q4(), CPU_BOX, PlanOverrides(num_ctx=40960))
    (ram,) = err.value.problems
    assert ram.needed == fixed + 40960 * QWEN3_30B_KV and "KV for 40960 tokens 3.8 GiB" in str(ram)
    most = (24 * GiB - fixed) // QWEN3_30B_KV
    assert f"enough for at most {most} tokens; a smaller num_ctx (at most {most})" in str(ram)


def test_cpu_only_box_refuses_bf16_with_the_numbers(qwen3_30b: ModelFootprint) -> None:
    with pytest.raises(FitError) as err:
        plan(qwen3_30b, CPU_BOX, PlanOverrides())
    (ram,) = err.value.problems
    kv = 2048 * QWEN3_30B_KV  # squeezed to the floor and still short
    assert ram.needed == 54 * GiB + QWEN3_30B_DENSE + PREFILL_CHUNK_TOKENS * QWEN3_30B_ACT + RAM_RESERVE_BYTES + kv
    assert "no GPU found" in str(ram) and "the machine has 24.0 GiB" in str(ram)


def test_dense_weights_too_big_for_vram_fall_back_to_the_cpu() -> None:
    fp = qwen3_30b_q4()
    gpu_box = replace(CPU_BOX, gpu=GPU("small", 4 * GiB, 4 * GiB))
    p = plan(fp, gpu_box, PlanOverrides(vram_budget_bytes=1 * GiB))
    needed = Q4KM_DENSE + QWEN3_30B_WORKSPACE + 2048 * QWEN3_30B_KV
    assert needed > 1 * GiB and p.device == "cpu" and p.device_reason == "the dense weights do not fit in VRAM"
    assert any("running on the CPU" in n for n in p.notes)
    with pytest.raises(FitError) as err:
        plan(fp, gpu_box, PlanOverrides(vram_budget_bytes=1 * GiB, device="gpu"))
    assert err.value.problems[0].resource == "VRAM" and err.value.problems[0].needed == needed
    assert plan(fp, gpu_box, PlanOverrides(vram_budget_bytes=0)).device_reason == "VRAM budget 0"


def test_too_small_a_machine_is_refused_with_every_reason() -> None:
    fp = qwen36(QWEN36_Q4_STRIDE, dense=int(1.75 * GiB), name="qwen3.6-35b:q4_k_m")
    with pytest.raises(FitError) as err:
        plan(fp, SMALL_LAPTOP, PlanOverrides())
    (ram,) = err.value.problems  # the 3.7 GiB of VRAM would do
    assert ram.needed == 40 * 256 * QWEN36_Q4_STRIDE + RAM_RESERVE_BYTES and ram.available == 16 * GiB  # 18.9 of 16
    workspace = GPU_RESERVE_BYTES + PREFILL_CHUNK_TOKENS * QWEN36_ACT
    left = 4 * GiB - 300 * MiB - int(1.75 * GiB) - workspace - (32768 * QWEN36_KV + QWEN36_STATE)
    assert err.value.plan is not None and err.value.plan.cache_slots == left // QWEN36_Q4_STRIDE == 552
    with pytest.raises(FitError) as err:
        plan(fp, SMALL_LAPTOP, PlanOverrides(device="gpu", vram_budget_bytes=2 * GiB))
    short = {p.resource: p for p in err.value.problems}
    assert short["VRAM"].needed == int(1.75 * GiB) + workspace + 2048 * QWEN36_KV + QWEN36_STATE
    assert short["VRAM"].available == 2 * GiB and err.value.plan.cache_slots == 0
    assert set(short) == {"RAM", "VRAM"} and str(err.value).endswith("(--force runs it anyway)")


# -- against llama.cpp --n-cpu-moe: a Qwen3-30B-A3B-shaped qwen3moe of 16 layers, bf16 ----------------
QWEN3_16 = {**QWEN3_30B, "num_hidden_layers": 16}
QWEN3_16_KV = 2 * 16 * 4 * 128 * 2  # 32 KiB per token
# on the GPU: the head, the final norm and 16 layers (as QWEN3_30B_DENSE's); the embeddings stay in RAM
QWEN3_16_GPU_DENSE = 151936 * 2048 * 2 + 2048 * 2 + 16 * (2 * 4096 * 2048 + 2 * 512 * 2048 + 256 + 4096 + 128 * 2048) * 2
QWEN3_16_FIXED = QWEN3_16_GPU_DENSE + QWEN3_30B_WORKSPACE  # before KV and the cache
H200 = replace(WORKSTATION_5090, gpu=GPU("NVIDIA H200", 141 * GiB, 140 * GiB))


@pytest.fixture(scope="module")
def qwen3_16() -> ModelFootprint:
    tensors = {name: t for name, t in qwen3_30b_tensors().items()
               if not name.startswith("model.layers.") or int(name.split(".")[2]) < 16}
    return ModelFootprint.from_checkpoint(QWEN3_16, tensors, name="qwen3-16")


def test_at_llama_cpps_smallest_footprint_the_gpu_runs_with_every_expert_in_ram(qwen3_16: ModelFootprint) -> None:
    """llama.cpp -ngl 99 -ncmoe 16 (every expert in host RAM) peaked at 2,375 MiB for the whole
    process; ft refused it ("2.4 GiB of dense weights, workspace and KV before one cache slot", and
    under --device gpu the cache's floor of 128 slots). With the token embeddings in RAM, and a
    cache below one token's experts planned (its misses streamed through it beside the CPU), it
    plans the GPU there."""
    assert qwen3_16.dense_bytes - qwen3_16.embedding_bytes == QWEN3_16_GPU_DENSE and qwen3_16.min_cache_slots == 128
    for device in ("auto", "gpu"):
        p = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=2375 * MiB, num_ctx=4096, device=device))
        assert p.device == "gpu" and p.fits and p.context_length == 4096 and p.prefill_buffers == 0
        slots = (2375 * MiB - QWEN3_16_FIXED - 4096 * QWEN3_16_KV) // (9 * MiB)
        assert p.cache_slots == slots and 0 < slots < 128
        assert p.ram_needed_bytes == 16 * 128 * 9 * MiB + QWEN3_30B_EMBED + RAM_RESERVE_BYTES
        assert any(f"holds {slots} slots, fewer than one token's experts (16 MoE layers x top-8 = 128 slots" in n
                   and "streamed through its slots" in n for n in p.notes) and not p.warnings
    bare = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=QWEN3_16_FIXED + 4096 * QWEN3_16_KV, num_ctx=4096))
    assert bare.device == "gpu" and bare.fits and bare.cache_slots == 0  # not one slot: every expert on the CPU


def test_at_the_smallest_footprints_a_smaller_prompt_chunk_buys_a_layers_top_k(qwen3_16: ModelFootprint) -> None:
    """Where a 512-token prompt chunk's activations would leave the cache fewer slots than one
    layer's top-k (mode auto would then send every expert to the CPU, a prompt's too: the Q4_K_M
    race file's 0 slots at llama.cpp's -ncmoe 16 budget, pp512 0.51x), the plan halves the chunk
    until the slots it frees reach that, and says so; the runtime computes prompts in its chunks
    (build.py). Where no halving down to MIN_PREFILL_CHUNK_TOKENS would, the chunk stays whole."""
    from runtime.planner.plan import MIN_PREFILL_CHUNK_TOKENS

    stride, kv = 9 * MiB, 4096 * QWEN3_16_KV
    budget = QWEN3_16_FIXED + kv + 6 * stride  # whole chunks: 6 slots, under a layer's top-8
    p = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=budget, num_ctx=4096))
    assert p.prefill_chunk_tokens == 256 and p.workspace_bytes == GPU_RESERVE_BYTES + 256 * QWEN3_30B_ACT
    assert p.cache_slots == (6 * stride + 256 * QWEN3_30B_ACT) // stride == 8
    assert any("prompts run in chunks of 256 tokens (their experts 512 tokens at a time), not 512" in n
               for n in p.notes)
    assert dict(p.describe())["workspace"].endswith("prompts in chunks of 256 tokens (512 through the experts)")
    roomy = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=budget + 8 * stride, num_ctx=4096))
    assert roomy.prefill_chunk_tokens == 512 and roomy.cache_slots == 14  # a layer's top-k already
    least = MIN_PREFILL_CHUNK_TOKENS * QWEN3_30B_ACT
    hopeless = QWEN3_16_FIXED + kv - (PREFILL_CHUNK_TOKENS * QWEN3_30B_ACT - least) + 7 * stride - 1
    bare = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=hopeless, num_ctx=4096))
    assert bare.prefill_chunk_tokens == 512  # 128 tokens would leave 6 slots: every expert the CPU's anyway
    assert bare.cache_slots == (7 * stride - 1 - (PREFILL_CHUNK_TOKENS * QWEN3_30B_ACT - least)) // stride == 2


def test_an_explicit_num_ctx_is_planned_exactly_or_refused_with_the_numbers(qwen3_16: ModelFootprint) -> None:
    """`ft run --num-ctx 4608` at 3.5 GiB became 2,767 tokens in silence, then a 4,137-token prompt
    was refused. The user's num_ctx is planned as asked (the cache takes what is left, below one
    token's experts too), or refused naming what it needs, what is left, the most that fits and
    the ways out; a recipe's or the default context is still lowered to fit, with a note."""
    room = 3000 * QWEN3_16_KV  # beside the dense weights and the workspace: 3000 tokens, no slot
    budget = QWEN3_16_FIXED + room
    for device in ("auto", "gpu"):
        with pytest.raises(FitError) as err:
            plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=budget, num_ctx=4608, device=device))
        (vram,) = err.value.problems
        assert (vram.resource, vram.needed, vram.available) == ("VRAM", 4608 * QWEN3_16_KV, room)
        text = " ".join(str(err.value).split())
        assert (f"VRAM: needs 144.0 MiB (KV for num_ctx 4608 tokens at 32.0 KiB/token), the VRAM budget of {size(budget)} "
                f"less dense weights {size(QWEN3_16_GPU_DENSE)} and workspace {size(QWEN3_30B_WORKSPACE)} leaves 93.8 "
                "MiB, enough for at most 3000 tokens with no expert cache slot (misses computed on the CPU), 0 beside "
                "one token's experts; a smaller num_ctx (at most 3000), a larger VRAM budget (--vram-gib, 50.2 MiB "
                "more), or --device cpu") in text
    exact = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=budget, num_ctx=3000, device="gpu"))
    assert exact.context_length == 3000 and exact.cache_slots == 0 and exact.fits
    soft = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=budget, default_num_ctx=4608))
    assert soft.context_length == MIN_CONTEXT_TOKENS and "context 4608 does not fit beside the rest of the GPU's " \
        "contents: planned 2048 tokens" in soft.notes and not soft.warnings
    for extra_mib in range(0, 4096, 97):  # whatever the budget: exactly 4608 tokens, or a refusal
        try:
            p = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=budget + extra_mib * MiB, num_ctx=4608))
        except FitError:
            assert budget + extra_mib * MiB < QWEN3_16_FIXED + 4608 * QWEN3_16_KV
            continue
        assert p.context_length == 4608 and p.kv_bytes == 4608 * QWEN3_16_KV and p.vram_needed_bytes <= p.vram_budget_bytes


# -- properties --------------------------------------------------------------------------------------
def test_more_vram_never_gives_less_context_fewer_buffers_or_fewer_slots(qwen3_30b: ModelFootprint) -> None:
    """As the budget grows, the context, the prefill buffers and the cache's slots never shrink
    (the buffers are slots the cache lends: buying one costs decode nothing), and where every
    expert fits, the cache holds the buffers' slots beside them."""
    big = replace(WORKSTATION_5090, gpu=GPU("H200", 141 * GiB, 140 * GiB))
    last_slots = last_ctx = last_buffers = -1
    bought = []
    for half_gib in range(0, 2 * 80):
        p = plan(qwen3_30b, big, PlanOverrides(vram_budget_bytes=half_gib * GiB // 2))
        assert p.prefill_buffers >= last_buffers and p.cache_slots >= last_slots, half_gib / 2
        if p.prefill_buffers > last_buffers >= 0:
            bought.append(half_gib / 2)
        if p.device == "gpu":  # (the CPU plans below 4 GiB keep their context in RAM)
            assert p.context_length >= last_ctx, half_gib / 2
            assert p.cache_slots >= p.min_cache_slots or p.prefill_buffers == 0, half_gib / 2
            assert p.vram_needed_bytes <= p.vram_budget_bytes, half_gib / 2
            last_ctx = p.context_length
        last_slots, last_buffers = p.cache_slots, p.prefill_buffers
    assert len(bought) == 2 and p.prefill_buffers == 2  # one buffer, then the second
    assert last_slots == 6144 + 2 * 128  # every expert, and the two buffers' slots beside them
    assert any("all 6144 experts fit in VRAM" in n for n in p.notes)


def test_more_ram_never_turns_a_fit_into_a_refusal() -> None:
    fp = qwen3_30b_q4()
    fits = [plan(fp, CPU_BOX, PlanOverrides(ram_budget_bytes=g * GiB, force=True)).fits for g in range(16, 25)]
    assert fits == sorted(fits) and fits[0] is False and fits[-1] is True


def test_num_ctx_above_the_models_is_clamped_with_a_warning(qwen3_30b: ModelFootprint) -> None:
    p = plan(qwen3_30b, DESKTOP_5090, PlanOverrides(num_ctx=1_000_000))
    assert p.context_length == 40960
    assert "num_ctx 1000000 is above the model's context of 40960: clamped to it" in p.warnings
    recipe = plan(qwen3_30b, DESKTOP_5090, PlanOverrides(default_num_ctx=1_000_000))
    assert recipe.context_length == 40960 and not recipe.warnings
    assert "num_ctx 1000000 is above the model's context of 40960: clamped to it" in recipe.notes


def test_pinning_cap(qwen3_30b: ModelFootprint) -> None:
    capped = replace(DESKTOP_5090, max_pinned_bytes=32 * GiB)
    p = plan(qwen3_30b, capped, PlanOverrides())
    assert p.pinned_bytes == 32 * GiB and p.fits
    assert any("22.0 GiB run ~8x slower" in w for w in p.warnings)
    assert plan(qwen3_30b, capped, PlanOverrides(max_pinned_bytes=16 * GiB)).pinned_bytes == 16 * GiB


def test_sizes_only_plans_ram_and_says_what_is_unknown() -> None:
    gguf = ModelFootprint.from_sizes(expert_bytes=18 * GiB, name="qwen3-30b-a3b:q4_k_m", context_length=32768)
    p = plan(gguf, LAPTOP_4060, PlanOverrides())
    assert p.ram_needed_bytes == 18 * GiB + RAM_RESERVE_BYTES and p.cache_slots == 0 and p.max_kv_tokens is None
    assert p.context_length == 32768 and any("after `ft pull`" in n for n in p.notes)
    assert dict(p.describe())["expert cache"] == "unknown until the model is pulled"


def test_preflight_uses_the_planner(qwen3_30b: ModelFootprint) -> None:
    fp = Footprint(download_bytes=0, expert_bytes=54 * GiB, dense_bytes=QWEN3_30B_DENSE, model=qwen3_30b)
    laptop = Resources(10**13, 32 * GiB, 28 * GiB, True, machine=LAPTOP_4060)
    with pytest.raises(FitError) as err:
        plan(qwen3_30b, LAPTOP_4060, PlanOverrides())
    assert check_fit(fp, laptop) == [str(err.value.problems[0])]
    assert check_fit(fp, replace(laptop, machine=DESKTOP_5090)) == []


def test_probe_never_needs_cuda(monkeypatch) -> None:
    import torch

    m = Machine.probe()
    assert m.ram_total_bytes > 0 and m.num_physical_cores >= 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=0: (_ for _ in ()).throw(RuntimeError("no driver")))
    assert resources.probe_gpu() is None


# -- exactness: the pre-download estimate equals the converted model --------------------------------
@pytest.mark.parametrize("family,fused,fp8", [("qwen3_moe", False, False), ("qwen3_moe", True, False),
                                               ("qwen3_5_moe", False, False), ("deepseek_v3", False, True),
                                               ("glm_moe_dsa", False, False), ("mixtral", False, False)])
def test_checkpoint_estimate_matches_the_ftw_index(tmp_path: Path, family: str, fused: bool, fp8: bool) -> None:
    src = save_checkpoint(family, tmp_path / "hf", fused=fused)
    if fp8:
        src = to_fp8(src, tmp_path / "fp8")
    config = json.loads((src / "config.json").read_text())
    with SafetensorsCheckpoint(src) as ckpt:
        tensors = {name: (t.dtype, t.nbytes) for name, t in ckpt.tensors.items()}
    before = ModelFootprint.from_checkpoint(config, tensors)
    after = ModelFootprint.from_index(convert_checkpoint(src, tmp_path / "ftw"))
    assert replace(before, source="ftw") == after


@pytest.mark.parametrize("mxfp4", [False, True])
def test_gpt_oss_checkpoint_estimate_matches_the_ftw_index(tmp_path: Path, mxfp4: bool) -> None:
    """gpt-oss's expert biases are parts of its records; its released MXFP4 experts are planned
    as the bf16 the converter makes of them (two values a byte of `_blocks`, the `_scales` gone)."""
    src = save_checkpoint("gpt_oss", tmp_path / "hf")
    if mxfp4:
        src = to_mxfp4(src, tmp_path / "mxfp4")
    config = json.loads((src / "config.json").read_text())
    with SafetensorsCheckpoint(src) as ckpt:
        tensors = {name: (t.dtype, t.nbytes) for name, t in ckpt.tensors.items()}
    index = convert_checkpoint(src, tmp_path / "ftw")
    assert ModelFootprint.from_checkpoint(config, tensors) == replace(ModelFootprint.from_index(index), source="checkpoint")
    # pull's disk check counts the experts' converted bytes too: the records less their padding
    estimate = footprint(FAMILIES["gpt_oss"], 3, tensors, download_bytes=0).expert_bytes
    records = [(bank.num_experts, bank.expert_stride) for bank in index.banks]
    assert 0 <= sum(n * stride for n, stride in records) - estimate <= sum(n for n, _ in records) * 2 * 4096


def test_the_dense_bytes_planned_are_those_the_runtime_holds(tmp_path: Path) -> None:
    """FP8 dense weights are dequantized at load (their scales folded in), float weights cast to
    the compute dtype: the planner counts what the loaded model holds, not what FTW stores."""
    import torch

    from ftw.reader import FTWReader
    from runtime.loading.read_ftw import load_weights
    from runtime.models import keep_float32

    src = to_fp8(save_checkpoint("deepseek_v3", tmp_path / "hf"), tmp_path / "fp8")
    index = convert_checkpoint(src, tmp_path / "ftw")
    fp = ModelFootprint.from_index(index)
    stored = sum(t.nbytes for t in index.tensors)
    compute = torch.float32 if fp.dtype == "f32" else torch.bfloat16
    with FTWReader.open(tmp_path / "ftw") as reader:
        weights = load_weights(reader, compute, keep_float32=keep_float32(index.family))
    held = sum(t.numel() * t.element_size() for t in weights.dense.values())
    assert any(t.dtype.startswith("f8") for t in index.tensors) and held != stored
    assert held <= fp.dense_bytes <= held * 1.01  # exact but for the float32 routers (counted as float32)
    # in a 16-bit model: FP8 and block quants dequantized to 2 bytes, 16-bit floats as they are
    assert held_dense_bytes("f8_e4m3", 1000, 1000, scaled=True, compute=2) == 2000
    assert held_dense_bytes("q4_k", 144, 256, scaled=False, compute=2) == 512
    assert held_dense_bytes("f16", 2000, 1000, scaled=False, compute=2) == 2000
    assert held_dense_bytes("f8_e4m3", 1000, 1000, scaled=False, compute=2) == 1000  # unscaled: kept as stored


# -- `ft fit` ---------------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FT_HOME", str(tmp_path / "ft_home"))
    monkeypatch.setenv("FT_PULL_RETRY_DELAY_S", "0")
    return tmp_path / "ft_home"


def test_ft_fit_tiny(home: Path, capsys, monkeypatch) -> None:
    assert ft(capsys, "pull", "tiny")[0] == 0
    code, out, err = ft(capsys, "fit", "tiny")  # this machine, whatever it is
    assert code == 0 and out.startswith("tiny:latest\n") and "the FTW index in the store (exact)" in out, err
    assert max(len(line) for line in out.splitlines()) <= 80

    monkeypatch.setattr(Machine, "probe", staticmethod(lambda: CPU_BOX))
    code, out, _ = ft(capsys, "fit", "tiny", "--json")
    doc = json.loads(out)
    tiny_kv = 2 * 4 * 2 * 16 * 4  # 4 layers, 2 KV heads of 16, f32
    assert doc["present"] and doc["plan"]["device"] == "cpu" and doc["plan"]["fits"]
    assert doc["plan"]["expert_pool_bytes"] == 4 * 16 * 98304  # records of w13 [128, 128] + w2 [128, 64] f32
    assert doc["plan"]["kv_bytes_per_token"] == tiny_kv and doc["plan"]["kv_bytes"] == 2048 * tiny_kv
    assert doc["plan"]["context_length"] == 2048 and doc["plan"]["num_threads"] == 8
    code, out, _ = ft(capsys, "fit", "tiny")
    rows = dict(line.strip().split("  ", 1) for line in out.splitlines()[1:] if line.startswith("  "))
    assert rows["device"].strip() == "CPU only: no GPU found" and rows["context"].strip() == "2048 tokens (model 2048)"
    assert out.rstrip().endswith("fits: on the CPU")

    monkeypatch.setattr(Machine, "probe", staticmethod(lambda: LAPTOP_4060))
    code, out, _ = ft(capsys, "fit", "tiny", "--num-ctx", "99999", "--threads", "3")
    assert code == 0 and "all 64 experts fit in VRAM" in out and "clamped to it" in out
    assert "96 slots x 96.0 KiB = 9.0 MiB, 100.0% of 64 experts and 32 slots to lend" in " ".join(out.split()) and "threads          3 " in out and "2 x 1.5 MiB, double-buffered" in out
    for option, bad in (("--vram-gib", "inf"), ("--vram-gib", "-1"), ("--ram-gib", "0"), ("--ram-gib", "nan")):
        code, _, err = ft(capsys, "fit", "tiny", option, bad)
        assert code == 2 and f"Invalid value for '{option}'" in err and "GiB" in err, (option, bad, err)
    code, out, _ = ft(capsys, "fit", "tiny", "--ram-gib", "1")
    text = " ".join(out.split())
    assert code == 1 and ("RAM: needs 2.0 GiB (experts 6.0 MiB + token embeddings 640.0 KiB + 2.0 GiB reserve), the "
                          "RAM budget is 1.0 GiB") in text


def test_ft_fit_before_pulling_downloads_no_weights(fake_hub, home: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from tests.test_pull import REPO, weights_requested

    src = save_checkpoint("qwen3_moe", tmp_path / "repo", max_shard_size="200KB")
    fake_hub.add_repo(REPO, src)
    monkeypatch.setattr(Machine, "probe", staticmethod(lambda: DESKTOP_5090))
    code, out, err = ft(capsys, "fit", "qwen3-30b-a3b", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert not doc["present"] and doc["footprint"]["source"] == "checkpoint"
    assert doc["plan"]["model_context_length"] == 32768  # the recipe's CONTEXT
    assert weights_requested(fake_hub) == []  # only the headers, by Range requests from byte 0
    assert all((r.range or "").startswith("bytes=0-") for r in fake_hub.log
               if r.method == "GET" and r.path.endswith(".safetensors"))
    assert Store.default().list_models() == []

    assert ft(capsys, "pull", "qwen3-30b-a3b")[0] == 0
    code, out, _ = ft(capsys, "fit", "qwen3-30b-a3b", "--json")
    pulled = json.loads(out)
    assert pulled["present"] and pulled["footprint"]["source"] == "ftw"
    for key in ("expert_pool_bytes", "expert_stride_bytes", "dense_bytes", "kv", "num_moe_layers"):
        assert pulled["footprint"][key] == doc["footprint"][key], key  # the estimate was exact
    index = open_model(Store.default(), "qwen3-30b-a3b").open_ftw().index
    assert doc["footprint"]["expert_stride_bytes"] == index.banks[0].expert_stride


def test_ft_fit_of_a_gguf_tag_reads_only_its_size(fake_hub, home: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    repo = tmp_path / "gguf"
    repo.mkdir()
    (repo / "Qwen3-30B-A3B-Q4_K_M.gguf").write_bytes(b"GGUF" + bytes(300_000))
    fake_hub.add_repo("Qwen/Qwen3-30B-A3B-GGUF", repo)
    monkeypatch.setattr(Machine, "probe", staticmethod(lambda: CPU_BOX))
    code, out, err = ft(capsys, "fit", "qwen3-30b-a3b:q4_k_m", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["footprint"]["source"] == "sizes" and doc["plan"]["expert_pool_bytes"] == 300_004
    assert doc["plan"]["context_length"] == 32768 and doc["plan"]["max_kv_tokens"] is None
    assert not any(r.path.endswith(".gguf") for r in fake_hub.log if r.method == "GET")


def test_the_gpu_asked_for_where_there_is_none_is_told_to_run_on_the_cpu(qwen3_30b: ModelFootprint) -> None:
    """Not "choose a quantized tag": no tag gives a machine a GPU."""
    with pytest.raises(FitError) as err:
        plan(qwen3_30b, CPU_BOX, PlanOverrides(device="gpu"))
    vram = next(p for p in err.value.problems if p.resource == "VRAM")
    assert "no GPU was found" in str(vram) and "--device cpu" in vram.fix and "quantized" not in vram.fix


# a MoE FFN's token where the experts compute in grouped launches (footprint._ffn_bytes_per_token):
# the normed input, the sum and its cast, router logits and softmax, the routing (float32), and a
# bf16 activation row for each of the top-8 pairs
QWEN3_30B_FFN = 4 * (3 * 2048 + 2 * 128 + 16 * 8) + 2 * 8 * 768


def test_a_halved_chunk_leaves_the_experts_the_whole_chunk_where_their_launches_are_grouped(
        qwen3_16: ModelFootprint) -> None:
    """Where the plan halves the prompt chunk for a layer's top-k slots, a MoE layer's FFN still
    takes the whole 512 tokens when its experts compute in grouped launches: that FFN's tokens
    (QWEN3_30B_FFN each) fit the workspace 256 tokens of the whole layer (QWEN3_30B_ACT each) were
    given, and the prompt's experts then stream through the slots once, not twice. Experts the GPU
    computes in padded runs (float32 records) keep the chunk; so does a whole chunk."""
    assert qwen3_16.ffn_bytes_per_token == QWEN3_30B_FFN and 512 * QWEN3_30B_FFN <= 256 * QWEN3_30B_ACT
    stride, kv = 9 * MiB, 4096 * QWEN3_16_KV
    budget = QWEN3_16_FIXED + kv + 6 * stride
    p = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=budget, num_ctx=4096))
    assert (p.prefill_chunk_tokens, p.ffn_chunk_tokens) == (256, 512)
    assert p.workspace_bytes == GPU_RESERVE_BYTES + 256 * QWEN3_30B_ACT  # the experts' 512 tokens within it
    padded = replace(qwen3_16, ffn_bytes_per_token=0)  # (what from_checkpoint gives float32 experts)
    assert plan(padded, H200, PlanOverrides(vram_budget_bytes=budget, num_ctx=4096)).ffn_chunk_tokens == 256
    f32 = ModelFootprint.from_checkpoint(QWEN3_30B, qwen3_30b_tensors("f32", 4))
    assert f32.ffn_bytes_per_token == 0
    roomy = plan(qwen3_16, H200, PlanOverrides(vram_budget_bytes=budget + 8 * stride, num_ctx=4096))
    assert (roomy.prefill_chunk_tokens, roomy.ffn_chunk_tokens) == (512, 512)
    # a residual of several streams (hyper-connections) holds more per FFN token than either estimate counts
    from runtime.planner.footprint import MULTI_STREAM_FAMILIES, _ffn_bytes_per_token

    sizes = {"hidden_size": 2048, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768}
    assert _ffn_bytes_per_token(sizes, "bf16", True, "qwen3_moe") == QWEN3_30B_FFN
    assert all(_ffn_bytes_per_token(sizes, "bf16", True, f) == 0 for f in MULTI_STREAM_FAMILIES)


@pytest.mark.parametrize("dtype, activation, bias", [
    *[(d, "swiglu", None) for d in sorted(GROUPED_EXPERT_DTYPES | {"f32"})],
    ("mxfp4", "swiglu_limited", "bf16"), ("bf16", "swiglu_limited", None), ("bf16", "geglu_tanh", None),
    ("bf16", "relu2", None), ("bf16", "swiglu", "bf16"), ("q8_0", "relu2", None)])
def test_the_planners_grouped_records_are_those_the_gpu_computes_in_grouped_launches(
        dtype: str, activation: str, bias: str | None) -> None:
    """footprint.grouped_records (the planner's rule) against records.grouped_kind (the runtime's):
    a bank of each weight type, activation and bias, viewed from cache slots in its compute dtype
    (f16 records in f16, the rest in bf16), has a grouped kernel exactly where the planner says."""
    from ftw.format import ExpertActivation
    from runtime.experts.synthetic import random_bank
    from runtime.gpu.expert_cache import ExpertCache
    from runtime.gpu.records import grouped_kind

    act = ExpertActivation(activation, alpha=1.702, limit=7.0) if "limited" in activation else ExpertActivation(activation)
    bank = random_bank(dtype, 4, 256, 256, num_distinct=1, activation=act, bias_dtype=bias)
    views = ExpertCache(2, bank.layout.expert_stride, "cpu", num_layers=1, num_experts=4).views(bank.layout)
    compute = torch.float16 if dtype == "f16" else torch.bfloat16
    planned = grouped_records({dtype}, {bank.layout.activation}, bias is not None)
    assert (grouped_kind(views, compute) is not None) == planned
