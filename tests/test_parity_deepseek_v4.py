"""DeepSeek-V4 (deepseek_v4) against transformers' DeepseekV4ForCausalLM, float32, on tiny random models.

As tests/test_parity.py: through ft's own pull path, logits within 1e-4 relative error, the same
32 greedy tokens with the KV cache, and the cached decode equal to a full recompute. The config
has every attention kind (a sliding layer, CSA layers whose indexer keeps 3 of up to 11
compressed entries, HCA layers) with a window of 6 positions and compress rates 4 and 8, so the
12-token prompt and the 32 decoded tokens slide past the window, close windows mid-prompt and
mid-decode, and select; two hash-routed layers, then score-routed ones with a correction bias;
two hyper-connection streams; a swiglu_limit low enough that routed and shared experts clamp.
Checkpoints come as transformers saves them (DeepSeek's names under model., or its own fused
layout) and as the release ships them (no model. prefix, FP8 weights with e8m0 `.scale`s, FP4
experts, the legacy config keys), the last against the dequantized weights.

Weights are drawn wider than transformers' init, and the parameters it inits to constants (norms,
sinks, position biases, hyper-connection biases and scales, the correction bias, tid2eid) at random.
"""

from __future__ import annotations

import copy
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.checkpoints import load_all, quantize_mxfp4
from tests.parity import assert_parity, convert_and_load, our_logits, rel_error

STEPS = 32
PROMPT = [3, 17, 92, 45, 8, 200, 31, 7, 64, 128, 5, 11]
TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
         "compressed_sparse_attention", "heavily_compressed_attention"]
CONFIG = dict(
    vocab_size=256, hidden_size=64, num_hidden_layers=5, num_attention_heads=4, head_dim=32, q_lora_rank=32,
    moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, o_groups=2, o_lora_rank=16,
    index_n_heads=8, index_head_dim=16, index_topk=3, sliding_window=6,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, layer_types=TYPES,
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"], partial_rotary_factor=0.25, hc_mult=2,
    max_position_embeddings=512, initializer_range=0.15, swiglu_limit=0.5)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, original_max_position_embeddings=64, beta_fast=32,
            beta_slow=1)
RANDOM = ("norm.weight", "sinks", "position_bias", "_hc.base", "_hc.scale", "hc_head.hc_base", "hc_head.hc_scale")


def save_v4(out: Path, *, fused: bool = False, seed: int = 1, **overrides) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = {**copy.deepcopy(CONFIG), **overrides}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("deepseek_v4", **config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(RANDOM):
                p.copy_((0.0 if name.endswith(("base", "position_bias")) else 1.0) + 0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn_like(b))
            if name.endswith("tid2eid"):  # (distinct experts per token, as the release's table)
                b.copy_(torch.stack([torch.randperm(config["n_routed_experts"])[: config["num_experts_per_tok"]]
                                     for _ in range(config["vocab_size"])]))
    model.save_pretrained(out, **({"save_original_format": False} if fused else {}))
    return out


def hf_model(src: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
def test_logits_and_greedy_match_transformers(fused: bool, tmp_path: Path) -> None:
    src = save_v4(tmp_path / "hf", fused=fused)
    ours = convert_and_load(src, tmp_path / "store")
    with ours.registered.open_ftw() as reader:
        activation = reader.index.banks[0].activation
    assert (activation.kind, activation.limit) == ("swiglu_limited", 0.5)
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_the_mechanisms_each_change_the_output(tmp_path: Path) -> None:
    """The config exercises what it claims: the indexer drops entries, the window drops keys, the
    clamps cut, and the hash layers route by the token (another table routes otherwise)."""
    ours = convert_and_load(save_v4(tmp_path / "hf"), tmp_path / "store")
    ids = PROMPT * 3
    base = our_logits(ours, ids)

    def changed(block_edit) -> float:
        saved = [(b.mixer.__dict__.copy(), b.ffn.__dict__.copy()) for b in ours.model.blocks]
        for block in ours.model.blocks:
            block_edit(block)
        try:
            return rel_error(our_logits(ours, ids), base)
        finally:
            for block, (mixer, ffn) in zip(ours.model.blocks, saved, strict=True):
                block.mixer.__dict__.update(mixer)
                block.ffn.__dict__.update(ffn)

    def every_entry(block) -> None:
        if block.mixer.indexer is not None:
            block.mixer.indexer.topk = math.inf

    def wide_window(block) -> None:
        block.mixer.c = type(block.mixer.c)(**{**block.mixer.c.__dict__, "window": 1000})

    def unclamped_shared(block) -> None:
        block.ffn.limit = math.inf

    def other_table(block) -> None:
        if block.ffn.table is not None:
            block.ffn.table = block.ffn.table.roll(1, dims=0)

    for edit in (every_entry, wide_window, unclamped_shared, other_table):
        assert changed(edit) > 100 * 1e-4, edit.__name__


def test_a_prompt_in_chunks_or_after_a_cached_prefix_is_the_whole_prompts(tmp_path: Path) -> None:
    """The GPU path's prefill chunks (DecoderModel.prefill_chunk_tokens) and a turn after a cached
    one continue the window and the compressors' open windows: the same logits as one call."""
    ours = convert_and_load(save_v4(tmp_path / "hf"), tmp_path / "store")
    ids = list(range(3, 50))
    whole = our_logits(ours, ids)
    ours.model.prefill_chunk_tokens = 5
    assert rel_error(our_logits(ours, ids), whole) < 1e-5
    ours.model.prefill_chunk_tokens = None
    state = ours.model.new_state(64)
    parts = [ours.model.forward(torch.tensor(ids[a:b]), state) for a, b in ((0, 13), (13, 30), (30, len(ids)))]
    assert rel_error(torch.cat(parts), whole) < 1e-5
    assert not ours.model.rewinds  # (its state cannot be taken back: a session starts over instead)


# -- the release's layout -------------------------------------------------------------------------

RELEASE_NAMES = (("model.layers.", "layers."), ("model.embed_tokens.", "embed."), ("model.norm.", "norm."),
                 ("model.hc_head.hc_", "hc_head_"))
FP8_LINEARS = (".wq_a.weight", ".wq_b.weight", ".wkv.weight", ".wo_a.weight", ".wo_b.weight", ".shared_experts.w1.weight",
               ".shared_experts.w2.weight", ".shared_experts.w3.weight")


def _fp8_ue8m0(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """w as e4m3 with one power-of-two scale per 128 x 128 block (DeepSeek-V4's ue8m0): (q, scale)."""
    rows, cols = w.shape
    nr, nc = math.ceil(rows / block), math.ceil(cols / block)
    padded = torch.zeros(nr * block, nc * block)
    padded[:rows, :cols] = w
    amax = padded.view(nr, block, nc, block).abs().amax(dim=(1, 3)).clamp(min=1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / torch.finfo(torch.float8_e4m3fn).max)))
    full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    return (w / full).to(torch.float8_e4m3fn), scale


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file of raw (dtype, shape, bytes) entries: the Python writer knows no F8_E8M0."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _, _, data in tensors.values():
            f.write(data)


def to_release(src: Path, out: Path, ref: Path) -> None:
    """`src` (transformers' save, DeepSeek's names) as the release ships it in `out`, and in `ref`
    the weights it stands for, dequantized, as transformers loads them (src's names and config)."""
    out.mkdir(parents=True)
    ref.mkdir(parents=True)
    released: dict[str, tuple[str, list[int], bytes]] = {}
    reference: dict[str, torch.Tensor] = {}
    for name, t in load_all(src).items():
        stem = name
        for old, new in RELEASE_NAMES:
            stem = new + stem[len(old):] if stem.startswith(old) else stem
        if name.endswith(FP8_LINEARS):  # (the compressors' and the indexer scorer's stay as they were)
            q, scale = _fp8_ue8m0(t.float())
            released[stem] = ("F8_E4M3", list(q.shape), q.view(torch.uint8).numpy().tobytes())
            exponents = (torch.log2(scale).to(torch.int32) + 127).to(torch.uint8)
            released[stem.removesuffix("weight") + "scale"] = ("F8_E8M0", list(scale.shape), exponents.numpy().tobytes())
            full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[: t.shape[0], : t.shape[1]]
            reference[name] = q.float() * full
        elif ".experts." in name:  # FP4: e2m1 pairs (even element low) as int8, e8m0 per 32 values
            blocks, scales = quantize_mxfp4(t.float())
            released[stem] = ("I8", [t.shape[0], t.shape[1] // 2], blocks.numpy().tobytes())
            released[stem.removesuffix("weight") + "scale"] = ("F8_E8M0", list(scales.shape), scales.numpy().tobytes())
            from ftw.fp4 import dequantize_fp4

            reference[name] = torch.from_numpy(dequantize_fp4(blocks.numpy().reshape(t.shape[0], -1), scales.numpy()))
        else:
            dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
            released[stem] = (dtype, list(t.shape), t.contiguous().numpy().tobytes())
            reference[name] = t
    _write_safetensors(out / "model.safetensors", released)
    from safetensors.torch import save_file

    save_file(reference, str(ref / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (ref / "config.json").write_text(json.dumps(config, indent=2))
    # the release's config keys: compress_ratios per layer, num_hash_layers, qk_rope_head_dim, a flat
    # rope_scaling (the compressed layers' YaRN), the FP8 quantization with FP4 experts
    rates = config.pop("compress_rates")
    ratios = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    config["compress_ratios"] = [ratios[t] for t in config.pop("layer_types")]
    config["compress_rate_hca"] = rates["heavily_compressed_attention"]
    config["num_hash_layers"] = config.pop("mlp_layer_types").count("hash_moe")
    config["qk_rope_head_dim"] = int(config["head_dim"] * config.pop("partial_rotary_factor"))
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope["main"]["rope_theta"]
    config["rope_scaling"] = {k: v for k, v in rope["compress"].items()
                              if k not in ("rope_theta", "partial_rotary_factor", "attention_factor")}
    config["rope_scaling"]["type"] = config["rope_scaling"].pop("rope_type")
    config["expert_dtype"] = "fp4"
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                     "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    (out / "config.json").write_text(json.dumps(config, indent=2))


def test_the_released_layout_matches_transformers_on_its_dequantized_weights(tmp_path: Path) -> None:
    """The release's names and config keys, FP8 dense weights with e8m0 scales (dequantized at load,
    bit for bit what transformers reads) and FP4 experts (kept FP4, as GGML mxfp4 blocks)."""
    src = save_v4(tmp_path / "hf", seed=2, rope_parameters=YARN)
    to_release(src, tmp_path / "release", tmp_path / "ref")
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tmp_path / "release").layer_types == TYPES  # (transformers reads it alike)
    ours = convert_and_load(tmp_path / "release", tmp_path / "store")
    with ours.registered.open_ftw() as reader:
        dtypes = {t.name: t.dtype for t in reader.index.tensors}
        assert reader.index.banks[0].parts[0].dtype == "mxfp4"
    assert dtypes["model.layers.1.self_attn.q_b_proj.weight"] == "f8_e4m3"
    assert dtypes["model.layers.1.self_attn.q_b_proj.weight_scale_inv"] == "f32"
    reference = load_all(tmp_path / "ref")
    w13, w2 = ours.weights.banks[2].weights(5, torch.float32)
    expert = "model.layers.2.ffn.experts.5."
    assert torch.equal(w13, torch.cat([reference[expert + "w1.weight"], reference[expert + "w3.weight"]]))
    assert torch.equal(w2, reference[expert + "w2.weight"])
    assert np.array_equal(ours.weights.get("model.layers.1.self_attn.q_b_proj.weight").numpy(),
                          reference["model.layers.1.attn.wq_b.weight"].numpy())
    assert_parity(ours, hf_model(tmp_path / "ref"), PROMPT, STEPS)


# -- the hybrid path ------------------------------------------------------------------------------

PROFILE_GBPS = dict(pcie_gbps=50.0, cpu_gbps=30.0, cpu_fixed_ms=0.0, pcie_fixed_ms=0.0)


@pytest.mark.parametrize("release", [False, True], ids=["float-experts", "fp4-experts"])
@pytest.mark.parametrize("mode, slots", [("offload", 12), ("auto", 4)])
def test_the_hybrid_path_matches_the_cpu_path(mode: str, slots: int, release: bool, tmp_path: Path) -> None:
    """The "gpu" backend on device "cpu" (the hybrid executor's code, copies synchronous): experts
    from cache slots, filled over "PCIe", streamed for the prompt and (auto, a cache below one
    token's experts) on the CPU beside them, each path with the clamped activation (the Triton
    SwiGLU kernels, which lack it, are not taken for these banks) and the FP4 experts' mxfp4 blocks."""
    from runtime.gpu import BandwidthProfile
    from tests.parity import our_greedy

    src = save_v4(tmp_path / "hf")
    if release:
        to_release(src, tmp_path / "release", tmp_path / "ref")
        src = tmp_path / "release"
    ours = convert_and_load(src, tmp_path / "store")
    from runtime.loading.runnable import load_registered

    hybrid = load_registered(ours.registered, torch.float32, backend="gpu", device="cpu", mode=mode, cache_slots=slots,
                             prefill_min_tokens=8, profile=BandwidthProfile(**PROFILE_GBPS))
    tokens, logits = our_greedy(hybrid, PROMPT, 16)
    ref_tokens, ref_logits = our_greedy(ours, PROMPT, 16)
    assert tokens == ref_tokens
    assert max(rel_error(a, b) for a, b in zip(logits, ref_logits, strict=True)) < 1e-5
    stats = hybrid.experts.stats()
    assert stats.pcie_experts > 0 and stats.prefill_calls > 0
    assert (stats.cpu_experts > 0) == (mode == "auto")


def test_the_fit_planners_footprint_from_the_release_headers_is_the_converted_models(tmp_path: Path) -> None:
    """What `ft pull` and `ft fit` plan from the release's config and safetensors headers (its own
    names, FP4 experts) is what the converted FTW index holds, KV layout included."""
    from ftw import FTWReader, convert_checkpoint
    from ftw.safetensors_source import read_header
    from runtime.planner.footprint import ModelFootprint

    to_release(save_v4(tmp_path / "hf"), tmp_path / "release", tmp_path / "ref")
    config = json.loads((tmp_path / "release" / "config.json").read_text())
    headers = {n: (t.dtype, t.nbytes) for n, t in read_header(tmp_path / "release" / "model.safetensors").items()}
    planned = ModelFootprint.from_checkpoint(config, headers, target_dtype="auto")
    convert_checkpoint(tmp_path / "release", tmp_path / "ftw")
    exact = ModelFootprint.from_index(FTWReader.open(tmp_path / "ftw").index)
    for field in ("dense_bytes", "expert_pool_bytes", "expert_stride_bytes", "num_moe_layers", "kv"):
        assert getattr(planned, field) == getattr(exact, field), field
    assert exact.kv.kind == "compressed" and exact.kv.bytes_per_token > 0 and exact.kv.state_bytes > 0
