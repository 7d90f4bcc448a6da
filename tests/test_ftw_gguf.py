"""GGUF -> FTW: block-quantized tensors kept byte for byte, names and config, and bad files refused.

The oracle is gguf-py: its GGUFWriter writes the files, its GGUFReader reads them back
independently of ftw/gguf_file.py, and its quants module (quantize / dequantize) is the reference
for the block formats.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, Keys

from ftw import FTWReader, SourceError, UnsupportedArchitectureError
from ftw.errors import CorruptIndexError
from ftw.format import BLOCK_DTYPES, Index, nbytes_of, storage_shape
from ftw.gguf_convert import GGUF_SIDE_FILES, convert_gguf
from ftw.gguf_file import GGML_TYPES, GGUFModel, architecture_in_prefix
from ftw.gguf_tokenizer import gguf_tokenizer_config, gguf_tokenizer_json
from ftw.gguf_undo import hf_rows_of_llama_qk

Q = GGMLQuantizationType
HIDDEN, INTER, NUM_EXPERTS, HEADS, HEAD_DIM, VOCAB, LAYERS = 256, 256, 4, 4, 64, 64, 2
# f16 scale fields of the k-quant blocks (byte offsets in a block), set to sane values so the
# random blocks dequantize to finite numbers
KQUANT_F16_FIELDS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def quantized(qtype: GGMLQuantizationType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """`shape` float weights as `qtype` bytes: gguf-py's quantizer where it has one, else random valid blocks."""
    if qtype in KQUANT_F16_FIELDS:
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, size=(int(np.prod(shape)) // block_size, type_size), dtype=np.uint8)
        for offset in KQUANT_F16_FIELDS[qtype]:
            scale = (rng.random(len(blocks)) * 0.01 + 0.001).astype(np.float16)
            blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)
        return blocks.reshape(*shape[:-1], shape[-1] // block_size * type_size)
    weights = rng.standard_normal(shape).astype(np.float32) * 0.02
    return weights if qtype == Q.F32 else gguf.quants.quantize(weights, qtype)


GGUF_TYPES = {str: gguf.GGUFValueType.STRING, float: gguf.GGUFValueType.FLOAT32, int: gguf.GGUFValueType.UINT32,
              list: gguf.GGUFValueType.ARRAY}


def write_gguf(path: Path, tensors: dict[str, tuple[GGMLQuantizationType, np.ndarray]], *, arch: str = "qwen3moe",
               tokenizer: bool = True, split_max_tensors: int = 0, metadata: dict[str, Any] | None = None) -> Path:
    """The tiny model's GGUF; `metadata`: keys written with these values instead (or besides)."""
    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    extra = dict(metadata or {})
    written = w.add_key_value

    def add_key_value(key: str, value: Any, vtype: Any, *args: Any, **kwargs: Any) -> None:
        if key in extra:
            value = extra.pop(key)
            vtype = GGUF_TYPES[type(value)]
        written(key, value, vtype, *args, **kwargs)

    w.add_key_value = add_key_value  # type: ignore[method-assign]
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(2)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_expert_count(NUM_EXPERTS)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(INTER)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    if tokenizer:
        tokens = [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(VOCAB - 2)] + ["<|im_start|>", "<|im_end|>"]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types([1] * (VOCAB - 2) + [3, 3])
        w.add_token_merges(["a a", "b b"])
        w.add_eos_token_id(VOCAB - 1)
        w.add_add_bos_token(False)
        w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    for key, value in extra.items():
        written(key, value, GGUF_TYPES[type(value)])
    for name, (qtype, data) in tensors.items():
        w.add_tensor(name, data, raw_dtype=None if qtype in (Q.F32,) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_qwen3_moe_tensors(seed: int = 0) -> dict[str, tuple[GGMLQuantizationType, np.ndarray]]:
    """A 2-layer Qwen3-MoE: Q8_0 attention, F32 norms and router, F16 output projection, experts
    Q4_K/Q6_K in layer 0 and Q4_K gate / Q5_K up (different types) / Q8_0 down in layer 1."""
    rng = np.random.default_rng(seed)
    t: dict[str, tuple[GGMLQuantizationType, np.ndarray]] = {
        "token_embd.weight": (Q.Q8_0, quantized(Q.Q8_0, (VOCAB, HIDDEN), rng)),
        "output_norm.weight": (Q.F32, np.ones(HIDDEN, dtype=np.float32)),
        "output.weight": (Q.Q6_K, quantized(Q.Q6_K, (VOCAB, HIDDEN), rng)),
    }
    expert_types = [(Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q4_K, Q.Q5_K, Q.Q8_0)]
    for layer, (gate_q, up_q, down_q) in enumerate(expert_types):
        p = f"blk.{layer}."
        t.update({
            p + "attn_norm.weight": (Q.F32, rng.random(HIDDEN, dtype=np.float32)),
            p + "attn_q.weight": (Q.Q8_0, quantized(Q.Q8_0, (HEADS * HEAD_DIM, HIDDEN), rng)),
            p + "attn_k.weight": (Q.Q8_0, quantized(Q.Q8_0, (2 * HEAD_DIM, HIDDEN), rng)),
            p + "attn_v.weight": (Q.Q8_0, quantized(Q.Q8_0, (2 * HEAD_DIM, HIDDEN), rng)),
            p + "attn_output.weight": (Q.F16, rng.standard_normal((HIDDEN, HEADS * HEAD_DIM)).astype(np.float16)),
            p + "attn_q_norm.weight": (Q.F32, rng.random(HEAD_DIM, dtype=np.float32)),
            p + "attn_k_norm.weight": (Q.F32, rng.random(HEAD_DIM, dtype=np.float32)),
            p + "ffn_norm.weight": (Q.F32, rng.random(HIDDEN, dtype=np.float32)),
            p + "ffn_gate_inp.weight": (Q.F32, rng.standard_normal((NUM_EXPERTS, HIDDEN)).astype(np.float32)),
            p + "ffn_gate_exps.weight": (gate_q, quantized(gate_q, (NUM_EXPERTS, INTER, HIDDEN), rng)),
            p + "ffn_up_exps.weight": (up_q, quantized(up_q, (NUM_EXPERTS, INTER, HIDDEN), rng)),
            p + "ffn_down_exps.weight": (down_q, quantized(down_q, (NUM_EXPERTS, HIDDEN, INTER), rng)),
        })
    return t


HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight", "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate_inp.weight": "mlp.gate.weight",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name in HF_NAMES:
        return HF_NAMES[gguf_name]
    _, layer, rest = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{HF_NAMES[rest]}"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Index]:
    tmp = tmp_path_factory.mktemp("gguf")
    path = write_gguf(tmp / "tiny.gguf", tiny_qwen3_moe_tensors())
    return path, tmp / "ftw", convert_gguf(path, tmp / "ftw")


def test_every_tensor_and_part_is_the_gguf_bytes(converted: tuple[Path, Path, Index]) -> None:
    path, out, index = converted
    source = {t.name: t for t in gguf.GGUFReader(path).tensors}  # gguf-py's own reader
    reader = FTWReader.open(out)
    reader.verify()
    for name, t in source.items():
        if "_exps." in name:
            continue
        entry = index.tensor(hf_name(name))
        assert entry.dtype == t.tensor_type.name.lower()
        assert entry.shape == tuple(reversed(t.shape.tolist()))
        got = reader.tensor(entry.name)
        assert tuple(got.shape) == storage_shape(entry.dtype, entry.shape)
        assert got.numpy().tobytes() == t.data.tobytes(), name
    for bank in index.banks:
        data = reader.bank_bytes(bank.layer)
        gate, up, down = (source[f"blk.{bank.layer}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))
        for e in range(bank.num_experts):
            def part(name: str, bank=bank, data=data, e=e) -> bytes:
                return reader.expert_part(data, bank, e, name).numpy().tobytes()

            if gate.tensor_type == up.tensor_type:
                assert part("w13") == gate.data[e].tobytes() + up.data[e].tobytes()
            else:
                assert part("w1") == gate.data[e].tobytes() and part("w3") == up.data[e].tobytes()
            assert part("w2") == down.data[e].tobytes()


def test_dequantized_parts_match_the_gguf_tensors(converted: tuple[Path, Path, Index]) -> None:
    path, out, index = converted
    source = {t.name: t for t in gguf.GGUFReader(path).tensors}
    reader = FTWReader.open(out)
    bank = index.bank(0)
    data = reader.bank_bytes(0)
    gate, up, down = (source[f"blk.0.ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))
    w13_type = GGMLQuantizationType[bank.part("w13").dtype.upper()]
    for e in range(bank.num_experts):
        w13 = gguf.quants.dequantize(reader.expert_part(data, bank, e, "w13").numpy(), w13_type)
        want = np.concatenate([gguf.quants.dequantize(gate.data[e], gate.tensor_type),
                               gguf.quants.dequantize(up.data[e], up.tensor_type)])
        assert w13.shape == (2 * INTER, HIDDEN) and np.isfinite(w13).all()
        assert np.array_equal(w13, want)
        w2 = gguf.quants.dequantize(reader.expert_part(data, bank, e, "w2").numpy(), down.tensor_type)
        assert np.array_equal(w2, gguf.quants.dequantize(down.data[e], down.tensor_type))
    embed = reader.tensor("model.embed_tokens.weight").numpy()
    assert np.array_equal(gguf.quants.dequantize(embed, Q.Q8_0),
                          gguf.quants.dequantize(source["token_embd.weight"].data, Q.Q8_0))


def test_names_parts_and_config(converted: tuple[Path, Path, Index]) -> None:
    _, out, index = converted
    assert index.family == "qwen3_moe"
    assert [(p.name, p.dtype, p.shape) for p in index.bank(0).parts] == [
        ("w13", "q4_k", (2 * INTER, HIDDEN)), ("w2", "q6_k", (HIDDEN, INTER))]
    assert [(p.name, p.dtype) for p in index.bank(1).parts] == [("w1", "q4_k"), ("w3", "q5_k"), ("w2", "q8_0")]
    c = index.config
    assert (c["num_layers"], c["hidden_size"], c["vocab_size"], c["num_experts"], c["num_experts_per_tok"]) == \
        (LAYERS, HIDDEN, VOCAB, NUM_EXPERTS, 2)
    assert (c["moe_intermediate_size"], c["head_dim"], c["num_key_value_heads"], c["moe_layers"]) == (INTER, HEAD_DIM, 2, [0, 1])
    assert c["context_length"] == 4096 and c["rope_theta"] == 1_000_000.0 and c["dtype"] == "q4_k"
    assert index.source_config["rms_norm_eps"] == 1e-6 and index.source_config["model_type"] == "qwen3_moe"
    assert [t.name for t in index.tensors][0] == "model.embed_tokens.weight"
    assert [t.name for t in index.tensors][-2:] == ["lm_head.weight", "model.norm.weight"]
    assert index.metadata["gguf_metadata"]["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q4_K_M
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert sorted(index.metadata["side_files"]) == sorted(GGUF_SIDE_FILES)
    assert config["eos_token"] == "<|im_end|>" and "<|im_start|>" in config["chat_template"]
    assert [a["content"] for a in tokenizer["added_tokens"]] == ["<|im_start|>", "<|im_end|>"]
    assert Index.from_json((out / "model.ftw.json").read_text()) == index


def test_split_gguf_is_read_as_one(tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors(), split_max_tensors=7)
    parts = sorted(tmp_path.glob("tiny-*-of-*.gguf"))
    assert len(parts) > 2
    index = convert_gguf(parts[1], tmp_path / "ftw")
    whole = convert_gguf(write_gguf(tmp_path / "whole.gguf", tiny_qwen3_moe_tensors()), tmp_path / "ftw2")
    assert [s.sha256 for s in index.shards] == [s.sha256 for s in whole.shards]
    parts[-1].unlink()
    with pytest.raises(SourceError, match="lacks tiny-0000"):
        convert_gguf(parts[0], tmp_path / "ftw3")


# -- the dtype table ------------------------------------------------------------------------------

def test_block_dtypes_match_gguf_py() -> None:
    for type_id, name in GGML_TYPES.items():
        qtype = GGMLQuantizationType(type_id)
        assert qtype.name.lower() == name
        if name in BLOCK_DTYPES:
            assert BLOCK_DTYPES[name] == GGML_QUANT_SIZES[qtype]
    assert set(BLOCK_DTYPES) <= set(GGML_TYPES.values())
    assert nbytes_of("q4_k", (512, 1024)) == 512 * 4 * 144
    assert storage_shape("q8_0", (3, 64)) == (3, 68)
    with pytest.raises(ValueError, match="multiple of 256"):
        nbytes_of("q6_k", (4, 100))


def _index_doc(dtype: str, shape: list[int], nbytes: int) -> dict:
    return {"format": "ftw", "version": 1, "family": "qwen3_moe", "config": {}, "source_config": {}, "metadata": {},
            "shards": [{"name": "model-00001.ftw", "size": 4096, "sha256": "0" * 64}],
            "tensors": [{"name": "w", "dtype": dtype, "shape": shape, "shard": "model-00001.ftw", "offset": 0,
                         "nbytes": nbytes}], "banks": []}


def test_index_validates_block_quantized_shapes(tmp_path: Path) -> None:
    from ftw.reader import check_layout

    index = Index.from_json(json.dumps(_index_doc("q8_0", [2, 64], 136)))
    check_layout(index)
    with pytest.raises(CorruptIndexError, match="multiple of 32"):
        Index.from_json(json.dumps(_index_doc("q8_0", [2, 60], 136)))
    with pytest.raises(CorruptIndexError, match="needs 136"):
        check_layout(Index.from_json(json.dumps(_index_doc("q8_0", [2, 64], 128))))
    with pytest.raises(CorruptIndexError, match="unknown"):
        Index.from_json(json.dumps(_index_doc("q9_z", [2, 64], 136)))


def test_llama_qk_unpermutation_inverts_llama_cpp() -> None:
    w = torch.arange(8 * 64 * 3).reshape(8 * 64, 3)
    permuted = w.reshape(8, 2, 32, 3).swapaxes(1, 2).reshape(w.shape)  # llama.cpp's permute
    assert torch.equal(permuted[torch.from_numpy(hf_rows_of_llama_qk(8 * 64, 8))], w)


# -- refusals ---------------------------------------------------------------------------------------

def test_truncated_file_is_named(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors())
    path.write_bytes(path.read_bytes()[:-5000])
    with pytest.raises(SourceError, match=r"tiny\.gguf.*past the end of the file.*truncated"):
        convert_gguf(path, tmp_path / "ftw")
    head = path.read_bytes()[:200]
    path.write_bytes(head)
    with pytest.raises(SourceError, match=r"tiny\.gguf: ends inside the GGUF header"):
        convert_gguf(path, tmp_path / "ftw")
    assert not (tmp_path / "ftw" / "model.ftw.json").exists()


@pytest.mark.parametrize("patch, message", [
    (lambda b: b"GGML" + b[4:], "not a GGUF file"),
    (lambda b: b[:4] + struct.pack("<I", 99) + b[8:], "GGUF version 99"),
    (lambda b: b[:16] + struct.pack("<Q", 1 << 40) + b[24:], "claims"),
    (lambda b: b"", "not a GGUF file"),
])
def test_corrupt_header_is_refused(tmp_path: Path, patch, message: str) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors())
    path.write_bytes(patch(path.read_bytes()))
    with pytest.raises(SourceError, match=message):
        GGUFModel(path)


@pytest.mark.parametrize(("writer_method", "value", "message"), [
    ("add_head_count", 0, "num_attention_heads is 0, not a whole number from 1 to 4096"),
    ("add_block_count", 2**32 - 1, "num_hidden_layers is 4294967295, not a whole number from 1 to 4096"),
])
def test_metadata_sizes_beyond_any_model_are_refused(tmp_path: Path, monkeypatch, writer_method: str, value: int,
                                                     message: str) -> None:
    """Sizes are checked before anything is sized by them (a head count of 0 divided by zero, a
    block count of 2**32 - 1 looped without end)."""
    real = getattr(gguf.GGUFWriter, writer_method)
    monkeypatch.setattr(gguf.GGUFWriter, writer_method, lambda self, n: real(self, value))
    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors())
    monkeypatch.undo()
    with pytest.raises(SourceError, match=rf"tiny\.gguf: GGUF metadata: {message}"):
        convert_gguf(path, tmp_path / "ftw")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("qwen3moe.rope.freq_base", "1e6x", "rope.freq_base is not one finite number"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", float("nan"), "layer_norm_rms_epsilon is not one finite number"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", [1.0, 2.0], "layer_norm_rms_epsilon is not one finite number"),
    ("qwen3moe.rope.scaling.type", ["yarn"], "rope.scaling.type is not a string"),
    ("qwen3moe.rope.scaling.original_context_length", "4k", "original_context_length is missing or not one integer"),
    ("qwen3moe.rope.scaling.yarn_log_multiplier", "x", "yarn_log_multiplier is not one finite number"),
])
def test_metadata_of_the_wrong_type_is_named(tmp_path: Path, key: str, value: object, message: str) -> None:
    """A string, an array or NaN where a number belongs raised a raw ValueError or reached the
    model (an rms eps of NaN gave NaN logits)."""
    metadata = {key: value}
    if key.startswith("qwen3moe.rope.scaling.") and key != "qwen3moe.rope.scaling.type":
        metadata["qwen3moe.rope.scaling.type"] = "yarn"
    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors(), metadata=metadata)
    with pytest.raises(SourceError, match=message):
        convert_gguf(path, tmp_path / "ftw")


def test_a_router_the_config_does_not_size_is_refused(tmp_path: Path) -> None:
    """A router with a row too few converted and ran, one expert never chosen."""
    tensors = tiny_qwen3_moe_tensors()
    qtype, router = tensors["blk.1.ffn_gate_inp.weight"]
    tensors["blk.1.ffn_gate_inp.weight"] = (qtype, router[:-1].copy())
    with pytest.raises(SourceError, match=r"mlp.gate.weight' has shape \[3, \d+\], not \[4, \d+\]"):
        convert_gguf(write_gguf(tmp_path / "tiny.gguf", tensors), tmp_path / "ftw")


def test_long_metadata_values_stay_out_of_the_index(tmp_path: Path) -> None:
    """The GGUF's scalar metadata is kept for `ft show`, but not a value of megabytes: five 60 MB
    strings made an index over the reader's limit, a model registered that could never open."""
    long = "x" * ((64 << 10) + 1)
    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors(),
                      metadata={"general.description": long, "general.name": "tiny"})
    index = convert_gguf(path, tmp_path / "ftw")
    kept = index.metadata["gguf_metadata"]
    assert kept["general.name"] == "tiny" and "general.description" not in kept
    with FTWReader.open(tmp_path / "ftw") as reader:
        assert "general.description" not in reader.index.metadata["gguf_metadata"]


def test_metadata_arrays_beyond_any_vocabulary_are_refused(tmp_path: Path, monkeypatch) -> None:
    """Every array item becomes a Python object: a file of arrays took ~7x its size in memory
    before any check. The items of all arrays together are bounded (here the bound is lowered
    under the tiny vocabulary's)."""
    import ftw.gguf_file

    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors())
    monkeypatch.setattr(ftw.gguf_file, "MAX_METADATA_ITEMS", VOCAB)
    with pytest.raises(SourceError, match=f"metadata arrays hold over {VOCAB} items"):
        GGUFModel(path)


def test_the_architecture_is_read_from_the_first_bytes(tmp_path: Path) -> None:
    """What a pull reads before downloading a GGUF: enough bytes give the architecture, too few
    give None (no verdict), other bytes are refused."""
    data = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors()).read_bytes()
    assert architecture_in_prefix(data[: 1 << 20], "tiny.gguf") == "qwen3moe"
    assert architecture_in_prefix(data[:30], "tiny.gguf") is None
    with pytest.raises(SourceError, match="not a GGUF file"):
        architecture_in_prefix(b"<html>rate limited</html>", "tiny.gguf")


def test_bad_tensor_type_is_named(tmp_path: Path) -> None:
    tensors = tiny_qwen3_moe_tensors()
    tensors["blk.0.attn_q_norm.weight"] = (Q.F32, np.ones(HEAD_DIM, dtype=np.float64).astype(np.float32))
    path = write_gguf(tmp_path / "tiny.gguf", tensors)
    data = bytearray(path.read_bytes())
    name = b"blk.0.attn_q_norm.weight"
    at = data.index(name) + len(name) + 4 + 8  # skip n_dims and the one dimension
    data[at : at + 4] = struct.pack("<I", 28)  # F64, which ft does not store
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"attn_q_norm.weight.*GGML type 28 \(f64\)"):
        convert_gguf(path, tmp_path / "ftw")


def test_unknown_architecture_lists_supported(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors(), arch="gemma3")
    with pytest.raises(UnsupportedArchitectureError, match=r"'gemma3'.*qwen3moe \(qwen3_moe\), llama \(mixtral\), deepseek2"):
        convert_gguf(path, tmp_path / "ftw")


def test_unknown_tensor_is_refused(tmp_path: Path) -> None:
    tensors = tiny_qwen3_moe_tensors()
    tensors["blk.0.ssm_conv1d.weight"] = (Q.F32, np.ones((4, 8), dtype=np.float32))
    with pytest.raises(SourceError, match="'blk.0.ssm_conv1d.weight' has no Hugging Face name"):
        convert_gguf(write_gguf(tmp_path / "tiny.gguf", tensors), tmp_path / "ftw")


@pytest.mark.parametrize("alias", ["blk.01.ffn_gate_exps.weight", "blk.\u00b2.attn_norm.weight"])
def test_a_block_number_in_another_spelling_is_refused(tmp_path: Path, alias: str) -> None:
    """"blk.01" is block 1 to int(): its tensor replaced block 1's in silence; "blk.²" raised a
    raw ValueError."""
    tensors = tiny_qwen3_moe_tensors()
    real = "blk.1.ffn_gate_exps.weight" if "exps" in alias else "blk.1.attn_norm.weight"
    tensors[alias] = (tensors[real][0], np.zeros_like(tensors[real][1]))
    with pytest.raises(SourceError, match="is not a plain decimal index"):
        convert_gguf(write_gguf(tmp_path / "tiny.gguf", tensors), tmp_path / "ftw")


def test_unsupported_tokenizer_is_refused_unless_skipped(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors(), tokenizer=False)
    with pytest.raises(SourceError, match="tokenizer model None is not supported"):
        convert_gguf(path, tmp_path / "ftw")
    assert not (tmp_path / "ftw").exists()
    index = convert_gguf(path, tmp_path / "ftw", tokenizer=False)
    assert index.metadata["side_files"] == [] and not (tmp_path / "ftw" / "tokenizer.json").exists()
    with pytest.raises(SourceError, match="'t5' is not supported"):  # SentencePiece ('llama'): test_ftw_gguf_tokenizer
        gguf_tokenizer_json({Keys.Tokenizer.MODEL: "t5", Keys.Tokenizer.LIST: ["<s>"]})
    with pytest.raises(SourceError, match="pre-tokenizer 'viking'"):
        gguf_tokenizer_json({Keys.Tokenizer.MODEL: "gpt2", Keys.Tokenizer.PRE: "viking", Keys.Tokenizer.LIST: ["a"]})


def test_tokenizer_config_special_tokens() -> None:
    meta = {Keys.Tokenizer.MODEL: "gpt2", Keys.Tokenizer.LIST: ["a", "<s>", "</s>"], Keys.Tokenizer.TOKEN_TYPE: [1, 3, 3],
            Keys.Tokenizer.BOS_ID: 1, Keys.Tokenizer.EOS_ID: 2, Keys.Tokenizer.ADD_BOS: True}
    config = gguf_tokenizer_config(meta, context_length=128)
    assert (config["bos_token"], config["eos_token"], config["add_bos_token"], config["model_max_length"]) == \
        ("<s>", "</s>", True, 128)
    assert config["added_tokens_decoder"]["1"]["special"] is True and "chat_template" not in config
    from tokenizers import Tokenizer

    doc = gguf_tokenizer_json(meta)
    assert doc["post_processor"]["type"] == "TemplateProcessing"
    assert Tokenizer.from_str(json.dumps(doc)).encode("a").ids == [1, 0]  # BOS added, as add_bos_token says
    with pytest.raises(SourceError, match="eos_token_id = 7"):
        gguf_tokenizer_config({**meta, Keys.Tokenizer.EOS_ID: 7})
