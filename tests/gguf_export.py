"""What the llama.cpp-style GGUF exporters of the newer families share: the base converter's keys
(TextModel.set_gguf_parameters at llama.cpp 0c1e570) and a byte-level vocabulary written as
get_vocab_base writes one, padded to the embedding's rows.

The exporters follow llama.cpp's converters, not ftw/gguf_names.py: GGUF names come from gguf-py's
own tensor tables.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from ftw import FTWReader

# gguf-py TokenType
NORMAL, CONTROL, UNUSED = 1, 3, 5


def add_base_keys(w: gguf.GGUFWriter, c: dict, *, block_count: int | None = None) -> None:
    """TextModel.set_gguf_parameters for a config that names its keys as transformers does."""
    w.add_block_count(block_count if block_count is not None else c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    rope = c.get("rope_parameters") or {}
    if "rope_theta" in rope or "rope_theta" in c:
        w.add_rope_freq_base(rope.get("rope_theta", c.get("rope_theta")))
    eps = c.get("rms_norm_eps", c.get("norm_eps"))
    if eps is not None:
        w.add_layer_norm_rms_eps(eps)
    experts = next((c[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if k in c), None)
    if experts is not None:
        w.add_expert_count(experts)
    w.add_expert_used_count(c["num_experts_per_tok"])
    if c.get("n_group") is not None:
        w.add_expert_group_count(c["n_group"])
        w.add_expert_group_used_count(c["topk_group"])
    if c.get("head_dim") is not None:
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def add_yarn_keys(w: gguf.GGUFWriter, rope: dict) -> None:
    """The base converter's YaRN keys from a config's rope parameters (rope_type "yarn")."""
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])


def add_deepseek2_keys(w: gguf.GGUFWriter, c: dict) -> None:
    """DeepseekV2Model.set_gguf_parameters' MLA and expert keys, kv_b split (the writers of the
    MLA families it converts: glm-dsa, mistral4)."""
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_vocab_size(c["vocab_size"])
    w.add_q_lora_rank(c["q_lora_rank"])
    w.add_kv_lora_rank(c["kv_lora_rank"])
    w.add_key_length(c["kv_lora_rank"] + c["qk_rope_head_dim"])  # (over head_dim's, with the writer's warning)
    w.add_value_length(c["kv_lora_rank"])
    w.add_key_length_mla(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    w.add_value_length_mla(c["v_head_dim"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    if c["norm_topk_prob"]:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(c["qk_rope_head_dim"])


def add_arch_keys(w: gguf.GGUFWriter, arch: str, keys: dict) -> None:
    """`arch`.key = value for each key, typed as llama.cpp's converters write them: a list as an array,
    a bool, a float as float32, anything else as uint32; a None value is not written."""
    for key, value in keys.items():
        if value is None:
            continue
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        elif isinstance(value, bool):
            w.add_bool(f"{arch}.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)


def add_padded_vocab(w: gguf.GGUFWriter, vocab_size: int, pre: str, *, num_pad: int = 16, bos: int | None = None,
                     eos: int | None = None, unk: int | None = None, pad: int | None = None) -> None:
    """A byte-level BPE vocabulary `num_pad` tokens shorter than the embedding, padded as
    get_vocab_base pads it ([PAD<i>] tokens of type UNUSED at the ids past the tokenizer's), its
    special tokens CONTROL at the ids the model's config names (SpecialVocab's bos, eos, unk and pad
    ids), `pre` the tokenizer.ggml.pre name."""
    real = vocab_size - num_pad
    tokens = [f"t{i}" for i in range(real - 3)] + ["a", "b", "ab"] + [f"[PAD{i}]" for i in range(real, vocab_size)]
    types = [NORMAL] * real + [UNUSED] * num_pad
    for special, token_id in (("<|bos|>", bos), ("<|eos|>", eos), ("<|unk|>", unk), ("<|pad|>", pad)):
        if token_id is not None:
            assert token_id < real - 3, "a special id among the merged tokens or the padding"
            tokens[token_id], types[token_id] = special, CONTROL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["a b"])
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if unk is not None:
        w.add_unk_token_id(unk)
    if pad is not None:
        w.add_pad_token_id(pad)
    w.add_chat_template("{{ messages[0]['content'] }}")


def config_differences(gguf_config: dict, hf_config: dict) -> dict[str, tuple]:
    """The keys both configs have whose values differ: (the GGUF's, the checkpoint's)."""
    return {k: (v, hf_config[k]) for k, v in gguf_config.items() if k in hf_config and hf_config[k] != v}


def assert_same_ftw(ours_dir: Path, theirs_dir: Path) -> None:
    """Two FTW directories hold the same tensors (name, dtype, shape and values) and the same expert
    banks (layout and bytes): a GGUF's conversion against the HF path's of the same checkpoint."""
    ours, theirs = FTWReader.open(ours_dir), FTWReader.open(theirs_dir)
    mine, hf = ours.index, theirs.index
    assert {(t.name, t.dtype, t.shape) for t in mine.tensors} == {(t.name, t.dtype, t.shape) for t in hf.tensors}
    for t in hf.tensors:
        assert torch.equal(ours.tensor(t.name), theirs.tensor(t.name)), t.name
    assert [(b.layer, b.parts, b.activation) for b in mine.banks] == [(b.layer, b.parts, b.activation) for b in hf.banks]
    for b in hf.banks:
        assert np.array_equal(np.asarray(ours.bank_bytes(b.layer)), np.asarray(theirs.bank_bytes(b.layer))), b.layer
