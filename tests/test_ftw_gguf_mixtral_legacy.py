"""Mixtral GGUFs in the old per-expert layout (llama.cpp's convert.py before April 2024).

Those files store each expert as its own tensors, blk.N.ffn_{gate,up,down}.E.weight, where today's
converters write one ffn_{gate,up,down}_exps.weight [E, ...] per layer; llama.cpp still names them
(LLM_TENSOR_FFN_*_EXP, "split experts for backward compatibility"). ft stacks them per layer: each
expert's rows are whole GGML rows, so the bank is the experts' bytes one after the other. The tiny
Mixtral checkpoint is written both ways (tests/test_ftw_gguf_hf.py export_gguf); the legacy file must
give the FTW the fused one gives, bit for bit, also when the experts are quantized, and run as
transformers runs the checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import GGMLQuantizationType

from ftw import FTWReader
from ftw.errors import SourceError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import save_checkpoint
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import export_gguf
from tests.test_parity import PROMPT, STEPS, hf_model


def _same_ftw(a: Path, b: Path) -> None:
    with FTWReader.open(a) as ra, FTWReader.open(b) as rb:
        assert ra.index.family == rb.index.family == "mixtral"
        assert ra.index.config == rb.index.config
        assert ra.index.source_config == rb.index.source_config
        assert {t.name for t in ra.index.tensors} == {t.name for t in rb.index.tensors}
        for t in ra.index.tensors:
            assert torch.equal(ra.tensor(t.name).view(torch.uint8), rb.tensor(t.name).view(torch.uint8)), t.name
        assert [(k.layer, [(p.name, p.dtype, p.shape) for p in k.parts]) for k in ra.index.banks] == \
            [(k.layer, [(p.name, p.dtype, p.shape) for p in k.parts]) for k in rb.index.banks]
        assert ra.index.banks
        for bank in ra.index.banks:
            assert torch.equal(ra.bank_bytes(bank.layer), rb.bank_bytes(bank.layer)), bank.layer


def test_legacy_mixtral_gguf_converts_as_the_fused_one(tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf", seed=1)
    fused = export_gguf(src, tmp_path / "fused.gguf")
    legacy = export_gguf(src, tmp_path / "legacy.gguf", per_expert=True)
    names = gguf.GGUFReader(legacy).tensors
    assert {t.name for t in names} >= {"blk.0.ffn_gate.0.weight", "blk.1.ffn_down.3.weight"}
    assert not any("_exps" in t.name for t in names)
    convert_gguf(fused, tmp_path / "ftw-fused")
    index = convert_gguf(legacy, tmp_path / "ftw-legacy")
    assert index.config["num_experts"] == 4 and index.config["moe_intermediate_size"] == 32
    _same_ftw(tmp_path / "ftw-fused", tmp_path / "ftw-legacy")
    assert_round_trip(src, tmp_path / "ftw-legacy").verify()


def test_legacy_mixtral_gguf_runs_as_transformers(tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf", seed=1)
    legacy = export_gguf(src, tmp_path / "legacy.gguf", per_expert=True)
    assert_parity(convert_and_load(legacy, tmp_path / "store"), hf_model(src), PROMPT, STEPS)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.F16])
def test_quantized_legacy_experts_are_kept_byte_for_byte(qtype: GGMLQuantizationType, tmp_path: Path) -> None:
    """Each expert quantized on its own (as convert.py did) gives the bytes of the stack quantized at
    once: the bank is the same bit for bit, in the file's type."""
    src = save_checkpoint("mixtral", tmp_path / "hf", seed=1)
    fused = export_gguf(src, tmp_path / "fused.gguf", experts_qtype=qtype)
    legacy = export_gguf(src, tmp_path / "legacy.gguf", per_expert=True, experts_qtype=qtype)
    convert_gguf(fused, tmp_path / "ftw-fused")
    index = convert_gguf(legacy, tmp_path / "ftw-legacy")
    assert {p.dtype for b in index.banks for p in b.parts} == {qtype.name.lower()}
    _same_ftw(tmp_path / "ftw-fused", tmp_path / "ftw-legacy")


def _rewrite(path: Path, out: Path, drop: str | None = None, rename: tuple[str, str] | None = None) -> Path:
    """`path` again, less the tensor `drop`, or with one tensor renamed."""
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(out, "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, value, kind, sub_type=sub)
    for t in reader.tensors:
        if t.name == drop:
            continue
        name = rename[1] if rename and t.name == rename[0] else t.name
        w.add_tensor(name, t.data, raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_legacy_layout_refusals(tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf", seed=1)
    legacy = export_gguf(src, tmp_path / "legacy.gguf", per_expert=True)
    missing = _rewrite(legacy, tmp_path / "missing.gguf", drop="blk.1.ffn_up.2.weight")
    with pytest.raises(SourceError, match=r"layer 1 has per-expert ffn_up tensors for experts \[0, 1, 3\]"):
        convert_gguf(missing, tmp_path / "a")
    padded = _rewrite(legacy, tmp_path / "padded.gguf", rename=("blk.1.ffn_up.2.weight", "blk.1.ffn_up.02.weight"))
    with pytest.raises(SourceError, match="not a plain decimal index"):
        convert_gguf(padded, tmp_path / "b")
    fused = export_gguf(src, tmp_path / "fused.gguf")
    both = _rewrite(fused, tmp_path / "both.gguf", rename=("blk.0.attn_norm.weight", "blk.0.ffn_gate.0.weight"))
    with pytest.raises(SourceError, match="layer 0 has both ffn_gate_exps and per-expert ffn_gate.E"):
        convert_gguf(both, tmp_path / "c")
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").glob("*.ftw"))
