"""The built-in tiny model: a real Qwen3-MoE checkpoint as transformers sees it, deterministic."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import jinja2
import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer, pre_tokenizers

from ftpull import tiny

transformers = pytest.importorskip("transformers")

FILE_NAMES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
}

# Real Qwen3-MoE checkpoints (Qwen3-30B-A3B) name their tensors like this.
QWEN3_MOE_LAYER_TENSORS = [
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate.weight",
]
QWEN3_MOE_EXPERT_TENSORS = ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]

ROUND_TRIP_TEXTS = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nCRLF\nand\n\n\nblank lines\x00nul \x1b[31mansi\x1b[0m",
    "emoji 🙂🚀👍🏽 ZWJ 👩‍💻👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 keycap 1️⃣ ❤️",
    "decomposed e\u0301 vs composed \u00e9, Å vs A\u030a, ﬁ ligature, Ｆｕｌｌｗｉｄｔｈ",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "RTL: שלום עולם, مرحبا بالعالم \u200f\u200e",
    "math 𝔸𝔹ℂ ∑∫√∞ ≠ ≤ and private use \ue000 and noncharacter \ufffe \U0010ffff",
    "zero width \u200b\u200c\u200d\ufeff and replacement char \ufffd",
    "def f(x):\n    return {'a': [1, 2.5e-3, None]}  # comment\n",
    "literal specials <|im_start|>user\nhi<|im_end|> <think>x</think> <tool_call>{}</tool_call>",
    "<|im_end" + "|" * 3 + "im_start>",
    "a" * 500 + " " * 100 + "🙂" * 50,
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.build_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def hf_model(tiny_dir: Path):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir, output_loading_info=True)
    return model.eval(), info


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(tiny_dir)


def _file_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _expected_tensor_names(config: dict) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(config["num_hidden_layers"]):
        names |= {f"model.layers.{i}.{t}" for t in QWEN3_MOE_LAYER_TENSORS}
        for e in range(config["num_experts"]):
            names |= {f"model.layers.{i}.mlp.experts.{e}.{t}" for t in QWEN3_MOE_EXPERT_TENSORS}
    return names


# --- files, names, config ---------------------------------------------------------------------


def test_file_names(tiny_dir: Path) -> None:
    assert {p.name for p in tiny_dir.iterdir()} == FILE_NAMES


def test_tensor_names_shapes_and_metadata(tiny_dir: Path) -> None:
    c = tiny.TINY_CONFIG
    with safe_open(tiny_dir / "model.safetensors", framework="pt") as f:
        assert set(f.keys()) == _expected_tensor_names(c)
        assert f.metadata() == {
            "format": "pt",
            "ft_tiny_seed": "0",
            "ft_embedding_scale": repr(tiny.TINY_EMBEDDING_SCALE),
        }
        assert f.get_tensor("model.embed_tokens.weight").shape == (c["vocab_size"], c["hidden_size"])
        assert f.get_tensor("lm_head.weight").shape == (c["vocab_size"], c["hidden_size"])
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight").shape == (8 * 16, 128)
        assert f.get_tensor("model.layers.0.self_attn.k_proj.weight").shape == (2 * 16, 128)
        assert f.get_tensor("model.layers.0.self_attn.q_norm.weight").shape == (16,)
        assert f.get_tensor("model.layers.3.mlp.gate.weight").shape == (16, 128)
        assert f.get_tensor("model.layers.3.mlp.experts.15.gate_proj.weight").shape == (64, 128)
        assert f.get_tensor("model.layers.3.mlp.experts.15.down_proj.weight").shape == (128, 64)
        for name in f.keys():
            assert f.get_tensor(name).dtype == torch.float32, name
        embed = f.get_tensor("model.embed_tokens.weight")
        router = f.get_tensor("model.layers.1.mlp.gate.weight")
        assert embed.std().item() == pytest.approx(0.02 * tiny.TINY_EMBEDDING_SCALE, rel=0.05)
        assert router.std().item() == pytest.approx(0.02, rel=0.1)
        assert torch.equal(f.get_tensor("model.norm.weight"), torch.ones(128))


def test_config_keys_are_known_to_transformers(tiny_dir: Path) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config == tiny.TINY_CONFIG
    fields = {f.name for f in dataclasses.fields(transformers.Qwen3MoeConfig)}
    # Keys real Qwen3 checkpoints carry that transformers maps rather than declares.
    legacy = {"model_type", "head_dim", "rope_theta", "torch_dtype"}
    assert set(config) - fields == legacy
    loaded = transformers.AutoConfig.from_pretrained(tiny_dir)
    assert type(loaded).__name__ == "Qwen3MoeConfig"
    assert loaded.head_dim == 16
    assert loaded.rope_parameters["rope_theta"] == 1e6
    assert loaded.dtype == torch.float32
    assert loaded.num_experts == 16 and loaded.num_experts_per_tok == 4
    assert loaded.mlp_only_layers == [] and loaded.norm_topk_prob is True


def test_special_token_ids_agree(tiny_dir: Path, hf_tokenizer) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    tok = hf_tokenizer
    assert len(tok) == config["vocab_size"] == tiny.VOCAB_SIZE
    assert config["bos_token_id"] == tok.bos_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert config["eos_token_id"] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.pad_token_id == generation["pad_token_id"] == tiny.ENDOFTEXT_ID
    assert generation["eos_token_id"] == [tiny.IM_END_ID, tiny.ENDOFTEXT_ID]
    for token in tiny.SPECIAL_TOKENS + tiny.MARKUP_TOKENS:
        assert tok.encode(token, add_special_tokens=False) == [tok.convert_tokens_to_ids(token)]
    assert tok("hi").input_ids == tok.encode("hi", add_special_tokens=False)  # no BOS added
    # ChatML control tokens are special (skipped), reasoning/tool markup is kept.
    ids = tok.encode("<|im_start|>assistant\n<think>x</think><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>x</think>"


# --- transformers loads and runs it -----------------------------------------------------------


def test_loads_with_no_missing_or_unexpected_weights(
    tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING, logger="transformers"):
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                tiny_dir, output_loading_info=True
            )
    finally:
        transformers.logging.disable_propagation()
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not info["error_msgs"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert model.dtype == torch.float32


def test_transformers_merges_our_experts(tiny_dir: Path, hf_model) -> None:
    model, _ = hf_model
    experts = model.model.layers[2].mlp.experts
    with safe_open(tiny_dir / "model.safetensors", framework="pt") as f:
        p = "model.layers.2.mlp.experts.5."
        gate, up = f.get_tensor(p + "gate_proj.weight"), f.get_tensor(p + "up_proj.weight")
        assert torch.equal(experts.gate_up_proj[5], torch.cat([gate, up], dim=0))
        assert torch.equal(experts.down_proj[5], f.get_tensor(p + "down_proj.weight"))
        embed = f.get_tensor("model.embed_tokens.weight")
    assert torch.equal(model.model.embed_tokens.weight, embed)


def test_generates(hf_model, hf_tokenizer) -> None:
    model, _ = hf_model
    messages = [{"role": "user", "content": "Write a haiku about experts."}]
    inputs = hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out1 = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        out2 = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    prompt_len = inputs["input_ids"].shape[1]
    assert out1.shape[1] > prompt_len
    assert torch.equal(out1, out2)
    assert int(out1.max()) < tiny.VOCAB_SIZE
    assert isinstance(hf_tokenizer.decode(out1[0, prompt_len:]), str)


def _greedy_expert_reuse(model, input_ids: torch.Tensor, num_tokens: int) -> float:
    """Fraction of (layer, expert) picks at decode step t that layer also picked at step t-1."""
    top_k = model.config.num_experts_per_tok
    routers = [layer.mlp.gate for layer in model.model.layers]
    picks: list[list[set[int]]] = [[] for _ in routers]  # [layer][forward call] -> experts

    def record(layer: int):
        def hook(module, args, output) -> None:
            router_logits = output[0]  # [tokens, num_experts]
            picks[layer].append(set(router_logits[-1].topk(top_k).indices.tolist()))

        return hook

    handles = [router.register_forward_hook(record(i)) for i, router in enumerate(routers)]
    try:
        with torch.no_grad():
            model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=num_tokens,
                min_new_tokens=num_tokens,
                do_sample=False,
            )
    finally:
        for handle in handles:
            handle.remove()
    num_reused = sum(len(a & b) for layer in picks for a, b in zip(layer[1:], layer[:-1], strict=True))
    num_picked = sum(len(a) for layer in picks for a in layer[1:])
    return num_reused / num_picked


def test_expert_reuse_is_realistic(hf_model, hf_tokenizer) -> None:
    # Chance is top_k / num_experts = 25%; a stock random init sits near 64%, x10 at 25-27%.
    model, _ = hf_model
    messages = [{"role": "user", "content": "Explain how a mixture-of-experts model picks experts."}]
    ids = hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    reuse = _greedy_expert_reuse(model, ids, 100)
    assert 0.35 < reuse < 0.65, reuse


# --- tokenizer ----------------------------------------------------------------------------------


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    ranges = [(0x00, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]
    texts = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randrange(1, 40)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        texts.append("".join(chars))
    return texts


def test_tokenizer_round_trips_unicode(tiny_dir: Path, hf_tokenizer) -> None:
    raw = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    for text in ROUND_TRIP_TEXTS + _random_texts(300, seed=1):
        ids = raw.encode(text, add_special_tokens=False).ids
        assert raw.decode(ids, skip_special_tokens=False) == text
        hf_ids = hf_tokenizer.encode(text, add_special_tokens=False)
        assert hf_ids == ids
        assert hf_tokenizer.decode(hf_ids) == text


def test_token_pieces_split_utf8_but_bytes_rejoin(tiny_dir: Path) -> None:
    # Single tokens may hold part of a character; a streaming decoder must join bytes, not text.
    raw = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    byte_of = {ch: b for b, ch in _byte_level_chars().items()}
    text = "naïve 🙂👩‍💻 日本"
    ids = raw.encode(text).ids
    pieces = [bytes(byte_of[ch] for ch in raw.id_to_token(i)) for i in ids]
    assert b"".join(pieces).decode("utf-8") == text
    assert any(_is_invalid_utf8(p) for p in pieces)
    assert "".join(raw.decode([i]) for i in ids) != text


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which ByteLevel token strings are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(extra)})
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    return table


def _is_invalid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_tokenizer_training_is_deterministic() -> None:
    first = tiny.build_tiny_tokenizer().to_str()
    assert tiny.build_tiny_tokenizer().to_str() == first
    vocab = json.loads(first)["model"]["vocab"]
    assert len(vocab) == tiny.NUM_BPE_TOKENS


# --- chat template ------------------------------------------------------------------------------


def test_chat_template_chatml(hf_tokenizer) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "2+2?"},
    ]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")
    no_system = hf_tokenizer.apply_chat_template(messages[1:2], tokenize=False)
    assert no_system == "<|im_start|>user\nHi<|im_end|>\n"
    ids = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)[
        "input_ids"
    ]
    assert ids[0] == tiny.IM_START_ID and ids.count(tiny.IM_END_ID) == 4
    # The runtime renders with plain jinja2: same text.
    plain = jinja2.Environment().from_string(tiny.CHAT_TEMPLATE)
    assert plain.render(messages=messages, add_generation_prompt=True) == text


def test_chat_template_tools_and_thinking(hf_tokenizer) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Berlin"}}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Berlin?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temperature": 18}'},
        {"role": "assistant", "content": "<think>\nIt says 18.\n</think>\n\nIt is 18 degrees."},
    ]
    text = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '\n<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Berlin"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert '<|im_start|>user\n<tool_response>\n{"temperature": 18}\n</tool_response><|im_end|>\n' in text
    # Reasoning after the last user turn is kept; Qwen3 drops it from earlier turns.
    assert text.endswith(
        "<|im_start|>assistant\n<think>\nIt says 18.\n</think>\n\nIt is 18 degrees.<|im_end|>\n"
    )
    later = messages + [{"role": "user", "content": "Thanks"}]
    text = hf_tokenizer.apply_chat_template(later, tools=tools, tokenize=False, add_generation_prompt=True)
    assert "<think>" not in text.split("<|im_start|>user\nThanks")[0].split("</tools>")[1]
    no_think = hf_tokenizer.apply_chat_template(
        later, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


# --- determinism and speed ---------------------------------------------------------------------


def test_same_seed_same_bytes_other_seed_other_weights(tiny_dir: Path, tmp_path: Path) -> None:
    again = _file_bytes(tiny.build_tiny_checkpoint(tmp_path / "again", seed=0))
    assert again == _file_bytes(tiny_dir)
    other = _file_bytes(tiny.build_tiny_checkpoint(tmp_path / "other", seed=1))
    assert other["model.safetensors"] != again["model.safetensors"]
    assert {k: v for k, v in other.items() if k != "model.safetensors"} == {
        k: v for k, v in again.items() if k != "model.safetensors"
    }


def test_same_bytes_in_a_fresh_process(tiny_dir: Path, tmp_path: Path) -> None:
    # Hash-map seeds (Rust's in tokenizers, Python's str hashing) differ per process.
    code = "import sys; from pathlib import Path; from ftpull.tiny import build_tiny_checkpoint as b; b(Path(sys.argv[1]))"
    root = str(Path(tiny.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": root}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, cwd=root)
    assert _file_bytes(tmp_path) == _file_bytes(tiny_dir)


def test_build_is_fast(tmp_path: Path) -> None:
    start = time.perf_counter()
    tiny.build_tiny_checkpoint(tmp_path)
    assert time.perf_counter() - start < 5.0


def test_safetensors_header_is_plain(tiny_dir: Path) -> None:
    data = (tiny_dir / "model.safetensors").read_bytes()
    header_size = int.from_bytes(data[:8], "little")
    assert header_size % 8 == 0
    header = json.loads(data[8 : 8 + header_size])
    assert next(iter(header)) == "__metadata__"
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    assert len(data) == 8 + header_size + end
    assert re.fullmatch(rb"[ -~]*", data[8 : 8 + header_size])  # ASCII JSON, space padded
