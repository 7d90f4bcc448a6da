"""The built-in `tiny` model: a small random Qwen3-MoE checkpoint made on this machine.

`ft pull tiny` / `ft run tiny` must work with no network, so instead of downloading, the package
writes a Hugging Face-format directory (config, safetensors, tokenizer, chat template) that then
goes through the normal conversion path like any other Qwen3-MoE checkpoint.

The weights are random (transformers' init, std 0.02) except that the token embeddings are scaled
up: with the stock init every token's hidden state looks alike to the routers, so consecutive
tokens pick nearly the same experts and cache benchmarks look better than on a real model
(DESIGN.md section 9). The factor and the seed go into the safetensors metadata, not the config,
so transformers sees a stock config.

The tokenizer is a byte-level BPE (Qwen2's split regex, no normalizer, so every string
round-trips) trained at build time on `tiny_corpus.txt`. Same seed, same package: byte-identical
files, hence a stable registry digest.
"""

from __future__ import annotations

import json
import os
import struct
from importlib import resources
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# ChatML control tokens (special: skipped by decode(skip_special_tokens=True)), then the
# markup tokens Qwen3 keeps as plain added tokens so that they survive decoding. Qwen3's order.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKUP_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
VOCAB_SIZE = 1280  # a multiple of 64; the corpus supports ~1290 BPE tokens seen at least twice
NUM_BPE_TOKENS = VOCAB_SIZE - len(SPECIAL_TOKENS) - len(MARKUP_TOKENS)
ENDOFTEXT_ID = NUM_BPE_TOKENS
IM_START_ID = NUM_BPE_TOKENS + 1
IM_END_ID = NUM_BPE_TOKENS + 2

# Qwen2/Qwen3's pre-tokenizer split: contractions, letter runs, single digits, punctuation runs,
# newlines, other whitespace.
SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Chosen by measurement on this model (4 prompts x 100 tokens, seeds 0-4), next-token expert
# reuse, greedy / sampled at T=1: x1 64% / 50%, x1.5 53% / 40%, x2 42% / 34%, x10 27% / 25%;
# chance is top_k / num_experts = 25%. The Qwen3-30B-A3B trace in shared/traces reuses 38% at a
# chance of 4.7%, i.e. a third of the way from chance to 100%: 50% here. x1.5 lands there with
# greedy decoding, as that trace was taken. x10, right for the 128-expert model of DESIGN.md
# section 9, routes at chance on a model this small. tests/test_tiny.py re-measures it.
TINY_EMBEDDING_SCALE = 1.5
INIT_STD = 0.02

TINY_CONFIG: dict = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": ENDOFTEXT_ID,
    "decoder_sparse_step": 1,
    "dtype": "float32",
    "eos_token_id": IM_END_ID,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": INIT_STD,
    "intermediate_size": 256,
    "max_position_embeddings": 2048,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
    "num_attention_heads": 8,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB_SIZE,
}

GENERATION_CONFIG: dict = {
    "bos_token_id": ENDOFTEXT_ID,
    "do_sample": True,
    "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
    "pad_token_id": ENDOFTEXT_ID,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}

# ChatML as Qwen3 writes it: optional system turn (the tool list goes into it), user/assistant
# turns, assistant tool calls as <tool_call> JSON, tool results grouped into one user turn as
# <tool_response> blocks, reasoning kept only for turns after the last real user message, and
# `enable_thinking=false` pre-filling an empty think block.
CHAT_TEMPLATE = (
    "{%- set msgs = messages -%}"
    "{%- if msgs and msgs[0].role == 'system' -%}"
    "{%- set system = msgs[0].content -%}{%- set msgs = msgs[1:] -%}"
    "{%- else -%}{%- set system = none -%}{%- endif -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if system -%}{{- system + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- elif system is not none -%}"
    "{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in msgs -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in msgs -%}"
    "{%- set content = m.content if m.content is string else '' -%}"
    "{%- if m.role == 'user' or m.role == 'system' -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.index0 > ns.last_user and reasoning -%}"
    "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- content -}}"
    "{%- for call in (m.tool_calls or []) -%}"
    "{%- set f = call.function if call.function is defined else call -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + f.name + \'", "arguments": \' -}}'
    "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or msgs[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}"
    "{%- if loop.last or msgs[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def _load_corpus() -> str:
    text = resources.files("ftpull").joinpath("tiny_corpus.txt").read_text(encoding="utf-8")
    # A checkout with CRLF line endings must still train the same tokenizer.
    return text.replace("\r\n", "\n")


def build_tiny_tokenizer() -> Tokenizer:
    """Train the tiny model's byte-level BPE on the bundled corpus (deterministic, ~30 ms)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=NUM_BPE_TOKENS,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([_load_corpus()], trainer=trainer)
    if tokenizer.get_vocab_size() != NUM_BPE_TOKENS:
        raise RuntimeError(
            f"tiny tokenizer: the corpus yields {tokenizer.get_vocab_size()} BPE tokens, "
            f"{NUM_BPE_TOKENS} are needed; add text to ftpull/tiny_corpus.txt or lower VOCAB_SIZE"
        )
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in MARKUP_TOKENS])
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    assert tokenizer.token_to_id("<|im_end|>") == IM_END_ID
    return tokenizer


def _added_token_entry(content: str, special: bool) -> dict:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def _tokenizer_config() -> dict:
    added = [(t, True) for t in SPECIAL_TOKENS] + [(t, False) for t in MARKUP_TOKENS]
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(ENDOFTEXT_ID + i): _added_token_entry(t, special) for i, (t, special) in enumerate(added)
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": TINY_CONFIG["max_position_embeddings"],
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        # Not Qwen2Tokenizer: transformers rebuilds that class's pipeline with an NFC normalizer,
        # which would break the byte-exact round trip that tokenizer.json guarantees.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def _special_tokens_map() -> dict:
    def entry(content: str) -> dict:
        return {k: v for k, v in _added_token_entry(content, True).items() if k != "special"}

    return {
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": entry("<|endoftext|>"),
        "eos_token": entry("<|im_end|>"),
        "pad_token": entry("<|endoftext|>"),
    }


def _weight_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Qwen3-MoE checkpoint, in module order, with its shape."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config["num_key_value_heads"] * head_dim
    moe_size = config["moe_intermediate_size"]
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", (config["vocab_size"], hidden))
    ]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (q_size, hidden)),
            (p + "self_attn.k_proj.weight", (kv_size, hidden)),
            (p + "self_attn.v_proj.weight", (kv_size, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, q_size)),
            (p + "self_attn.q_norm.weight", (head_dim,)),
            (p + "self_attn.k_norm.weight", (head_dim,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate.weight", (config["num_experts"], hidden)),
        ]
        for e in range(config["num_experts"]):
            shapes += [
                (p + f"mlp.experts.{e}.gate_proj.weight", (moe_size, hidden)),
                (p + f"mlp.experts.{e}.up_proj.weight", (moe_size, hidden)),
                (p + f"mlp.experts.{e}.down_proj.weight", (hidden, moe_size)),
            ]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (config["vocab_size"], hidden))]
    return shapes


def build_tiny_weights(
    seed: int = 0, embedding_scale: float = TINY_EMBEDDING_SCALE
) -> dict[str, torch.Tensor]:
    """The tiny model's float32 weights, in module order: norms 1, the rest N(0, 0.02)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in _weight_shapes(TINY_CONFIG):
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape, dtype=torch.float32)
            continue
        # Drawn in float64 and rounded: CPUs differ in the last bits of torch's vectorized
        # float32 normal kernel, and rounding hides float64 last-bit differences.
        std = INIT_STD * (embedding_scale if name == "model.embed_tokens.weight" else 1.0)
        values = torch.randn(shape, generator=generator, dtype=torch.float64) * std
        weights[name] = values.to(torch.float32)
    return weights


def _safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list[bytes]:
    """Serialize float32 tensors in the given order with a fixed header layout.

    Written by hand rather than with safetensors.save_file so that header key order (metadata
    included) does not depend on the library version: the bytes are the registry digest.
    """
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, tensor in tensors.items():
        num_bytes = tensor.numel() * 4
        header[name] = {
            "dtype": "F32",
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + num_bytes],
        }
        offset += num_bytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # data starts 8-byte aligned, as the library does
    chunks = [struct.pack("<Q", len(header_bytes)), header_bytes]
    chunks += [t.contiguous().numpy().astype("<f4", copy=False).tobytes() for t in tensors.values()]
    return chunks


def _write(path: Path, chunks: list[bytes]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
    os.replace(tmp, path)


def _json_bytes(obj: dict) -> list[bytes]:
    return [(json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")]


def build_tiny_checkpoint(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny model as a Hugging Face Qwen3-MoE directory and return `out_dir`.

    Files: config.json, generation_config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json, special_tokens_map.json. The same seed (and package version) gives
    byte-identical files. Existing files of those names are replaced.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    metadata = {"format": "pt", "ft_tiny_seed": str(seed), "ft_embedding_scale": repr(TINY_EMBEDDING_SCALE)}
    weights = build_tiny_weights(seed)
    _write(out_dir / "config.json", _json_bytes(TINY_CONFIG))
    _write(out_dir / "generation_config.json", _json_bytes(GENERATION_CONFIG))
    _write(out_dir / "model.safetensors", _safetensors_bytes(weights, metadata))
    _write(out_dir / "tokenizer.json", [tokenizer.to_str(pretty=True).encode("utf-8")])
    _write(out_dir / "tokenizer_config.json", _json_bytes(_tokenizer_config()))
    _write(out_dir / "special_tokens_map.json", _json_bytes(_special_tokens_map()))
    return out_dir
