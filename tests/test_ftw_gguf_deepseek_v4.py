"""DeepSeek-V4 (deepseek_v4) as a GGUF file (`deepseek4`), written the way llama.cpp's converter writes it
(conversion/deepseek.py:525, DeepseekV4Model over TextModel, at llama.cpp 0c1e570), pulled through ft and run
against transformers.

The converter reads the release's layout (no model. prefix, DeepSeek's names: attn.kv_norm, hc_head_fn), not
transformers' save_pretrained (whose original format keeps attn.norm and model. names): the checkpoint is
made as test_parity_deepseek_v4 makes its release (FP4 experts, FP8 linears with e8m0 scales, the release's
config keys), with the kv norm under its release name, and with float linears where the test says so.
`export_deepseek4_gguf` follows the converter: the base keys (rope.freq_base, the flat rope_scaling's YaRN,
expert_gating_func sqrtsoftplus from scoring_func, key_length head_dim), then rope.dimension_count
qk_rope_head_dim, q_lora_rank, sliding_window, the expert keys, swiglu_clamp_exp and _shexp one a layer, the
indexer's, output_group_count and output_lora_rank, compress_ratios and compress_rope_freq_base, the
hyper-connections', hash_layer_count, embedding_length_out; FP8 linears dequantized and written Q8_0
(tensor_force_quant), float ones as they are, the FP4 experts repacked into MXFP4 blocks (repack_mxfp4_blocks)
and stacked, tid2eid as I32; the MTP blocks skipped. llama.cpp's loader builds compress ratios 0, 4 and 128
only, so the HCA layers compress by 128 (no window closes within the test's tokens; the CSA layers' do).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import load_all
from tests.gguf_export import add_arch_keys, add_padded_vocab, assert_same_ftw, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_gguf_hf import write_gguf
from tests.test_parity_deepseek_v4 import (
    PROMPT,
    STEPS,
    YARN,
    _write_safetensors,
    hf_model,
    save_v4,
    to_release,
)

pytest.importorskip("transformers")

RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.int64: "I64", torch.int8: "I8", torch.float8_e4m3fn: "F8_E4M3",
                      torch.float8_e8m0fnu: "F8_E8M0"}

# DeepseekV4Model._map_dsv4_tensor_name, with llama-arch.cpp's names (gguf 0.19 has no deepseek4)
ROOT = {"embed.weight": "token_embd.weight", "norm.weight": "output_norm.weight", "head.weight": "output.weight",
        "hc_head_fn": "output_hc_fn.weight", "hc_head_base": "output_hc_base.weight",
        "hc_head_scale": "output_hc_scale.weight"}
LAYER = {
    "hc_attn_fn": "hc_attn_fn.weight", "hc_attn_base": "hc_attn_base.weight", "hc_attn_scale": "hc_attn_scale.weight",
    "hc_ffn_fn": "hc_ffn_fn.weight", "hc_ffn_base": "hc_ffn_base.weight", "hc_ffn_scale": "hc_ffn_scale.weight",
    "attn.attn_sink": "attn_sinks.weight", "attn.wq_a.weight": "attn_q_a.weight", "attn.wq_b.weight": "attn_q_b.weight",
    "attn.q_norm.weight": "attn_q_a_norm.weight", "attn.wkv.weight": "attn_kv.weight",
    "attn.kv_norm.weight": "attn_kv_a_norm.weight", "attn.wo_a.weight": "attn_output_a.weight",
    "attn.wo_b.weight": "attn_output_b.weight", "attn.compressor.ape": "attn_compressor_ape.weight",
    "attn.compressor.wkv.weight": "attn_compressor_kv.weight", "attn.compressor.wgate.weight": "attn_compressor_gate.weight",
    "attn.compressor.norm.weight": "attn_compressor_norm.weight", "attn.indexer.wq_b.weight": "indexer.attn_q_b.weight",
    "attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "attn.indexer.compressor.ape": "indexer_compressor_ape.weight",
    "attn.indexer.compressor.wkv.weight": "indexer_compressor_kv.weight",
    "attn.indexer.compressor.wgate.weight": "indexer_compressor_gate.weight",
    "attn.indexer.compressor.norm.weight": "indexer_compressor_norm.weight",
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight", "ffn.gate.weight": "ffn_gate_inp.weight",
    "ffn.gate.bias": "exp_probs_b.bias", "ffn.gate.tid2eid": "ffn_gate_tid2eid.weight",
    "ffn.shared_experts.w1.weight": "ffn_gate_shexp.weight", "ffn.shared_experts.w2.weight": "ffn_down_shexp.weight",
    "ffn.shared_experts.w3.weight": "ffn_up_shexp.weight",
}
EXPERT = {"w1": "ffn_gate_exps.weight", "w2": "ffn_down_exps.weight", "w3": "ffn_up_exps.weight"}


def _raw(t: torch.Tensor) -> tuple[str, list[int], bytes]:
    return SAFETENSORS_DTYPES[t.dtype], list(t.shape), t.contiguous().view(torch.uint8).numpy().tobytes()


def save_release(out: Path, *, fp8: bool, seed: int = 1, **overrides) -> tuple[Path, Path]:
    """(the release, the weights it stands for under transformers' names and config): test_parity_deepseek_v4's
    release with the attention's kv norm under its release name (attn.kv_norm), its linears FP8 or, without
    `fp8`, the checkpoint's float32 ones (no quantization_config)."""
    src = save_v4(out / "hf", seed=seed, compress_rates=RATES, **overrides)
    release, ref = out / "release", out / "ref"
    to_release(src, release, ref)
    tensors, reference = load_all(release), load_all(ref)
    if not fp8:
        for name, t in load_all(src).items():
            stem = "layers." + name.removeprefix("model.layers.") if name.startswith("model.layers.") else None
            if stem and stem.endswith(".weight") and tensors[stem].dtype == torch.float8_e4m3fn:
                tensors[stem] = reference[name] = t
                del tensors[stem.removesuffix("weight") + "scale"]
        from safetensors.torch import save_file

        save_file(reference, str(ref / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((release / "config.json").read_text())
        del config["quantization_config"]
        (release / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {re.sub(r"\.attn\.norm\.", ".attn.kv_norm.", n): t for n, t in tensors.items()}
    _write_safetensors(release / "model.safetensors", {n: _raw(t) for n, t in tensors.items()})
    return release, ref


def _dequantized_fp8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """DeepseekV4Model.dequant_model's dequant_fp8_weight."""
    rows, cols = weight.shape
    s = scale.float().repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
    return weight.float() * s


def _repacked_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """ModelBase.repack_mxfp4_blocks: per 32 values an e8m0 byte, then 16 bytes (value j low, j + 16 high)."""
    p, s = packed.view(torch.uint8), scale.view(torch.uint8)
    rows, blocks = s.shape
    src = p.reshape(rows, blocks, 16)
    vals = torch.stack((src & 0x0F, (src >> 4) & 0x0F), dim=-1).reshape(rows, blocks, 32)
    qs = vals[:, :, :16] | (vals[:, :, 16:] << 4)
    return torch.cat((s.unsqueeze(-1), qs.to(torch.uint8)), dim=-1).reshape(rows, blocks * 17).numpy()


def export_deepseek4_gguf(release: Path, out: Path, *, keys: dict | None = None) -> Path:
    """The file DeepseekV4Model writes from the release directory; `keys`, metadata to write in place of its
    own (a list of floats as an array, a bool or an int as such)."""
    c = json.loads((release / "config.json").read_text())
    layers, keys = c["num_hidden_layers"], dict(keys or {})
    w = gguf.GGUFWriter(out, "deepseek4")
    w.add_block_count(layers)  # (TextModel's)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    if (rope := c.get("rope_scaling") or {}).get("type") == "yarn":  # (the base writes nothing for "default")
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    own: dict = {  # (the base's gating function, SQRTSOFTPLUS from scoring_func; then DeepseekV4Model's)
        "expert_gating_func": 4,
        "rope.dimension_count": c["qk_rope_head_dim"], "attention.q_lora_rank": c["q_lora_rank"],
        "attention.sliding_window": c["sliding_window"], "expert_feed_forward_length": c["moe_intermediate_size"],
        "expert_shared_count": c["n_shared_experts"], "expert_weights_scale": float(c["routed_scaling_factor"]),
        "expert_weights_norm": bool(c["norm_topk_prob"]), "swiglu_clamp_exp": [float(c["swiglu_limit"])] * layers,
        "swiglu_clamp_shexp": [float(c["swiglu_limit"])] * layers, "attention.indexer.head_count": c["index_n_heads"],
        "attention.indexer.key_length": c["index_head_dim"], "attention.indexer.top_k": c["index_topk"],
        "attention.output_group_count": c["o_groups"], "attention.output_lora_rank": c["o_lora_rank"],
        "attention.compress_ratios": c["compress_ratios"], "attention.compress_rope_freq_base": float(c["compress_rope_theta"]),
        "hyper_connection.count": c["hc_mult"], "hyper_connection.sinkhorn_iterations": c["hc_sinkhorn_iters"],
        "hyper_connection.epsilon": float(c["hc_eps"]), "hash_layer_count": c["num_hash_layers"],
        "embedding_length_out": c["hidden_size"] * c["hc_mult"],
    }
    add_arch_keys(w, "deepseek4", {**own, **keys})
    add_padded_vocab(w, c["vocab_size"], "deepseek-v3", bos=c["bos_token_id"], eos=c["eos_token_id"])
    tensors = load_all(release)
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name, t in tensors.items():
        if name.endswith(".scale") and name.removesuffix("scale") + "weight" in tensors:
            continue  # (consumed with its weight)
        if m := re.match(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$", name):
            experts.setdefault((int(m[1]), m[3]), {})[int(m[2])] = _repacked_mxfp4(t, tensors[name[:-6] + "scale"])
            continue
        if t.dtype == torch.float8_e4m3fn:  # (dequant_model, then tensor_force_quant's Q8_0)
            data, raw = quantize(_dequantized_fp8(t, tensors[name[:-6] + "scale"]).numpy(), GGMLQuantizationType.Q8_0), True
        elif name.endswith("tid2eid"):  # (_write_hash_routing_tensors)
            data, raw = t.to(torch.int32).numpy(), False
        else:
            data, raw = t.contiguous().numpy(), False
        if m := re.match(r"layers\.(\d+)\.(.+)$", name):
            gname = f"blk.{m[1]}.{LAYER[m[2]]}"
        else:
            gname = ROOT[name]
        w.add_tensor(gname, data, raw_dtype=GGMLQuantizationType.Q8_0 if raw else None)
    for (layer, proj), by_expert in sorted(experts.items()):  # (_write_mxfp4_expert_tensor)
        stacked = np.stack([by_expert[e] for e in range(len(by_expert))])
        w.add_tensor(f"blk.{layer}.{EXPERT[proj]}", stacked, raw_dtype=GGMLQuantizationType.MXFP4)
    return write_gguf(w, out)


@pytest.mark.parametrize("rope", ["plain", "yarn"])
def test_deepseek_v4_gguf_generates_what_transformers_does(tmp_path: Path, rope: str) -> None:
    """Float linears (kept F32), FP4 experts (MXFP4): transformers on the dequantized experts."""
    release, ref = save_release(tmp_path, fp8=False, **({"rope_parameters": YARN} if rope == "yarn" else {}))
    ours = convert_and_load(export_deepseek4_gguf(release, tmp_path / "model.gguf"), tmp_path / "store")
    with ours.registered.open_ftw() as reader:
        bank = reader.index.banks[0]
        assert (bank.parts[0].dtype, bank.activation.kind, bank.activation.limit) == ("mxfp4", "swiglu_limited", 0.5)
    assert_parity(ours, hf_model(ref), PROMPT, STEPS)


def test_deepseek_v4_gguf_fp8_release_runs_its_q8_0_linears(tmp_path: Path) -> None:
    """The release's FP8 linears, which the converter dequantizes and requantizes Q8_0: kept Q8_0, and the
    model is transformers' on those Q8_0 values (gguf-py's dequantization) and the FP4 experts."""
    release, ref = save_release(tmp_path, fp8=True, seed=2, rope_parameters=YARN)
    ours = convert_and_load(export_deepseek4_gguf(release, tmp_path / "model.gguf"), tmp_path / "store")
    with ours.registered.open_ftw() as reader:
        assert {t.name: t.dtype for t in reader.index.tensors}["model.layers.1.self_attn.q_b_proj.weight"] == "q8_0"
    reference = load_all(ref)
    for name, t in load_all(release).items():
        if t.dtype == torch.float8_e4m3fn:
            hf = "model.layers." + name.removeprefix("layers.").replace(".kv_norm.", ".norm.")
            q8 = quantize(reference[hf].numpy(), GGMLQuantizationType.Q8_0)
            reference[hf] = torch.from_numpy(dequantize(q8, GGMLQuantizationType.Q8_0).copy())
    from safetensors.torch import save_file

    save_file(reference, str(ref / "model.safetensors"), metadata={"format": "pt"})
    assert_parity(ours, hf_model(ref), PROMPT, STEPS)


def test_deepseek_v4_gguf_config_and_tensors_are_the_releases(tmp_path: Path) -> None:
    """The FTW config and source config from the GGUF are the HF path's from the same release, every dense
    tensor (tid2eid widened back to int64) and every expert bank (the MXFP4 blocks) bit for bit."""
    from ftw import convert_checkpoint

    release, _ = save_release(tmp_path, fp8=False, rope_parameters=YARN)
    direct = convert_checkpoint(release, tmp_path / "ftw-hf")
    index = convert_gguf(export_deepseek4_gguf(release, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == direct.family == "deepseek_v4"
    # (but "dtype": the GGUF path names the type of most parameters, mxfp4, the HF path the source's float)
    assert {k: v for k, v in index.config.items() if k != "dtype"} == {k: v for k, v in direct.config.items() if k != "dtype"}
    assert config_differences(index.source_config, json.loads((release / "config.json").read_text())) == {}
    assert_same_ftw(tmp_path / "ftw", tmp_path / "ftw-hf")


def test_deepseek_v4_gguf_refusals(tmp_path: Path) -> None:
    """What llama.cpp runs and DeepSeek-V4 cannot, refused by name: unrenormalized routing, a clamp by layer,
    another gating function; and a compress ratio llama.cpp's loader does not build."""
    release, _ = save_release(tmp_path, fp8=False)
    layers = json.loads((release / "config.json").read_text())["num_hidden_layers"]
    for keys, match in (({"expert_weights_norm": False}, "without expert_weights_norm"),
                        ({"swiglu_clamp_exp": [0.5] * (layers - 1) + [1.0]}, "differing by layer"),
                        ({"swiglu_clamp_shexp": [1.0] * layers}, "one positive swiglu_limit"),
                        ({"expert_gating_func": 2}, "sqrtsoftplus"),
                        ({"attention.compress_ratios": [0, 4, 8, 4, 8]}, "compress ratios \\[8\\]")):
        name = re.sub(r"\W", "_", str(keys))[:40]
        with pytest.raises(UnsupportedArchitectureError, match=match):
            convert_gguf(export_deepseek4_gguf(release, tmp_path / f"{name}.gguf", keys=keys), tmp_path / f"ftw-{name}")
