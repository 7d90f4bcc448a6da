"""A synthetic qwen3moe GGUF that llama.cpp and ft both read: real models' shapes, random weights.

The weights are Gaussian (std 0.02, norms 1), so routing is close to uniform: with random token
ids (what llama-bench feeds) that is the worst case for an expert cache, and the race's second
ft view replays a real trace's routing instead (ft_side.py). Tensors are written one at a time
(gguf-py's tensor-info-first mode), so memory stays at one tensor whatever the file's size, and
random numbers come from the GPU where there is one (a 21 GB file's weights in seconds).

The vocabulary is byte-level BPE as llama.cpp's qwen2 pre-tokenizer expects: the 256 byte
symbols first, filler tokens, then the special tokens at the end (ids as the file gives them
in both engines).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

BF16, F32 = gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F32
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Random ids through plain Gaussian weights route as no real model does: each layer's attention
# output (the mean of the values before it, std ~1.2) swamps the token's embedding (0.02), so every
# token's hidden state is alike and routes alike. At Qwen3-30B-A3B's attention and router, 16
# layers, random ids: 82% of a token's experts are its predecessor's and the top 10% of experts
# take 91% of picks (a cache of 12% of the experts hit 97% in the race's first run). A 5x embedding
# and a 0.1x attention output bring that to 37% and 59%, against 37% and 51% in the real
# Qwen3-30B-A3B trace (tests/test_vs_llamacpp.py measures both on the CPU).
EMBEDDING_SCALE = 5.0  # the token embeddings' std over 0.02
ATTENTION_SCALE = 0.1  # the attention output projection's std over 0.02


@dataclass(frozen=True)
class RaceShape:
    """A qwen3moe geometry: everything the GGUF's metadata and tensors need."""

    name: str
    num_layers: int  # the real model's; a race file may hold fewer
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    num_experts: int
    top_k: int
    moe_inter: int
    vocab: int
    context_length: int = 40960

    def expert_bytes(self) -> int:
        return 3 * self.hidden * self.moe_inter * 2  # bf16 gate, up, down

    def layer_bytes(self) -> int:
        attention = (2 * self.heads + 2 * self.kv_heads) * self.head_dim * self.hidden * 2
        return attention + self.num_experts * (self.expert_bytes() + self.hidden * 4)

    def file_bytes(self, layers: int) -> int:
        return layers * self.layer_bytes() + 2 * self.vocab * self.hidden * 2


SHAPES = {
    # Qwen/Qwen3-30B-A3B's config.json
    "qwen3-30b-a3b": RaceShape("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 128, 8, 768, 151936),
    # Qwen3.6-35B-A3B's expert geometry (256 experts of 512, top-8, hidden 2048, its 16 x 256 / 2 x 256
    # full-attention heads) on qwen3moe's plain GQA blocks: no linear attention, no shared expert
    "qwen3.6-35b-a3b": RaceShape("qwen3.6-35b-a3b", 40, 2048, 16, 2, 256, 256, 8, 512, 248320),
}


def layers_that_fit(shape: RaceShape, disk_bytes: int, copies: int = 2) -> int:
    """The most layers whose file fits `disk_bytes` `copies` times (the GGUF and ft's FTW copy)."""
    per_copy = disk_bytes // copies
    fixed = 2 * shape.vocab * shape.hidden * 2
    return max(1, min(shape.num_layers, (per_copy - fixed) // shape.layer_bytes()))


def _vocab(size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a byte-level BPE vocabulary of `size` ids."""
    byte_symbols = _bytes_to_unicode()
    fillers = size - len(byte_symbols) - len(SPECIALS) - 2
    tokens = byte_symbols + ["Ġt", "th"] + [f"tok{i}" for i in range(fillers)] + SPECIALS
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    return tokens, types, ["Ġ t", "t h"]


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable symbol table (the byte-level BPE alphabet), in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def _tensors(shape: RaceShape, layers: int) -> list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]]:
    """(name, numpy shape, type) in file order."""
    h, q, kv, d = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.head_dim
    out = [("token_embd.weight", (shape.vocab, h), BF16)]
    for i in range(layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (h,), F32),
            (p + "attn_q.weight", (q, h), BF16),
            (p + "attn_k.weight", (kv, h), BF16),
            (p + "attn_v.weight", (kv, h), BF16),
            (p + "attn_output.weight", (h, q), BF16),
            (p + "attn_q_norm.weight", (d,), F32),
            (p + "attn_k_norm.weight", (d,), F32),
            (p + "ffn_norm.weight", (h,), F32),
            (p + "ffn_gate_inp.weight", (shape.num_experts, h), F32),
            (p + "ffn_gate_exps.weight", (shape.num_experts, shape.moe_inter, h), BF16),
            (p + "ffn_up_exps.weight", (shape.num_experts, shape.moe_inter, h), BF16),
            (p + "ffn_down_exps.weight", (shape.num_experts, h, shape.moe_inter), BF16),
        ]
    out += [("output_norm.weight", (h,), F32), ("output.weight", (shape.vocab, h), BF16)]
    return out


def _data(name: str, dims: tuple[int, ...], qtype: gguf.GGMLQuantizationType, gen: torch.Generator,
          device: torch.device, embedding_scale: float, attention_scale: float) -> np.ndarray:
    if name.endswith("norm.weight"):
        return np.ones(dims, dtype=np.float32)
    std = 0.02 if not name.endswith("ffn_gate_inp.weight") else 1.0 / np.sqrt(dims[-1])
    if name == "token_embd.weight":
        std *= embedding_scale
    if name.endswith("attn_output.weight"):
        std *= attention_scale
    values = torch.randn(dims, generator=gen, device=device) * std
    if qtype == F32:
        return values.cpu().numpy()
    return values.to(torch.bfloat16).view(torch.uint16).cpu().numpy()  # bf16's bits, as GGUF stores them


def write_race_gguf(path: Path, shape: RaceShape, layers: int, *, seed: int = 0,
                    embedding_scale: float = EMBEDDING_SCALE, attention_scale: float = ATTENTION_SCALE) -> Path:
    """Write a `layers`-layer qwen3moe GGUF of `shape` at `path` (atomically: a temp file renamed)."""
    layers = min(layers, shape.num_layers)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device).manual_seed(seed)
    tmp = path.with_name(path.name + ".partial")
    w = gguf.GGUFWriter(tmp, "qwen3moe")
    w.add_name(f"race-{shape.name}-{layers}l")
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(6144)  # unused: every layer is MoE
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_expert_count(shape.num_experts)
    w.add_expert_used_count(shape.top_k)
    w.add_expert_feed_forward_length(shape.moe_inter)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    tokens, types, merges = _vocab(shape.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    specs = _tensors(shape, layers)
    for name, dims, qtype in specs:
        itemsize = 4 if qtype == F32 else 2
        w.add_tensor_info(name, dims, np.dtype(np.float32 if qtype == F32 else np.uint16),
                          int(np.prod(dims)) * itemsize, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, dims, qtype in specs:
        w.write_tensor_data(_data(name, dims, qtype, gen, device, embedding_scale, attention_scale))
    w.close()
    tmp.replace(path)
    return path
