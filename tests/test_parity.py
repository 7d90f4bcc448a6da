"""Our runtime against transformers, float32, on tiny random models of every family.

Each model goes through ft's own pull path (HF checkpoint -> FTW -> registry) and is loaded by
the runtime; transformers loads the same checkpoint. Logits must agree to 1e-4 relative error,
greedy decoding with the KV cache must give the same 32 tokens, and the cached decode must equal
a full recompute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.checkpoints import save_checkpoint
from tests.parity import assert_parity, convert_and_load

STEPS = 32
PROMPT = [3, 17, 92, 45, 8, 200, 31, 7, 64, 128, 5, 11]

FAMILIES = [
    pytest.param("qwen3_moe", False, id="qwen3_moe"),
    pytest.param("qwen3_moe", True, id="qwen3_moe-fused"),
    pytest.param("mixtral", False, id="mixtral"),
    pytest.param("mixtral", True, id="mixtral-fused"),  # (its router under `mlp`, as transformers>=5 saves it)
    pytest.param("granitemoe", False, id="granitemoe"),
    pytest.param("granitemoe", True, id="granitemoe-fused"),
    pytest.param("granitemoeshared", False, id="granitemoeshared"),
    pytest.param("jetmoe", False, id="jetmoe"),
    pytest.param("glm4_moe", False, id="glm4_moe"),
    pytest.param("qwen3_next", False, id="qwen3_next"),
    pytest.param("deepseek_v2", False, id="deepseek_v2"),
    pytest.param("qwen2_moe", False, id="qwen2_moe"),
    pytest.param("olmoe", False, id="olmoe"),
    pytest.param("minimax_m2", False, id="minimax_m2"),
    pytest.param("minimax_m2", True, id="minimax_m2-fused"),
    pytest.param("ernie4_5_moe", False, id="ernie4_5_moe"),
    pytest.param("hunyuan_v1_moe", False, id="hunyuan_v1_moe"),
    pytest.param("exaone_moe", False, id="exaone_moe"),
    # (transformers' own layout moves the correction bias under the router)
    pytest.param("ernie4_5_moe", True, id="ernie4_5_moe-fused"),
    pytest.param("exaone_moe", True, id="exaone_moe-fused"),
    pytest.param("glm4_moe_lite", False, id="glm4_moe_lite"),
    pytest.param("llama4", False, id="llama4"),
    pytest.param("dots1", False, id="dots1"),
    pytest.param("phimoe", False, id="phimoe"),
    pytest.param("phimoe", True, id="phimoe-fused"),
    pytest.param("dbrx", False, id="dbrx"),
    pytest.param("flex_olmo", False, id="flex_olmo"),
    pytest.param("gpt_oss", False, id="gpt_oss"),
    pytest.param("solar_open", False, id="solar_open"),
    pytest.param("solar_open", True, id="solar_open-fused"),
    pytest.param("deepseek_v32", False, id="deepseek_v32"),
    pytest.param("cohere2_moe", False, id="cohere2_moe"),
    pytest.param("cohere2_moe", True, id="cohere2_moe-fused"),
    pytest.param("afmoe", False, id="afmoe"),
    pytest.param("afmoe", True, id="afmoe-fused"),
    pytest.param("lfm2_moe", False, id="lfm2_moe"),
    pytest.param("lfm2_moe", True, id="lfm2_moe-fused"),
    pytest.param("mimo_v2_flash", False, id="mimo_v2_flash"),
    pytest.param("mimo_v2_flash", True, id="mimo_v2_flash-fused"),
    pytest.param("laguna", False, id="laguna"),
    pytest.param("laguna", True, id="laguna-fused"),
    pytest.param("minimax", False, id="minimax"),
    pytest.param("minimax", True, id="minimax-fused"),
    pytest.param("kimi_linear", False, id="kimi_linear"),
    pytest.param("kimi_linear", True, id="kimi_linear-fused"),
    pytest.param("bailing_hybrid", False, id="bailing_hybrid"),
    pytest.param("bailing_hybrid", True, id="bailing_hybrid-fused"),
    # (the release's names: query_key_value fused, word_embeddings, dense, query/key_layernorm, expert_bias)
    pytest.param("sarvam_moe", False, id="sarvam_moe"),
    pytest.param("sarvam_moe", True, id="sarvam_moe-fused"),
    pytest.param("param2moe", False, id="param2moe"),
    pytest.param("minicpm5_moe", False, id="minicpm5_moe"),
    pytest.param("minicpm5_moe", True, id="minicpm5_moe-fused"),  # (its q_gate_proj renamed back to q_proj)
    pytest.param("axk1", False, id="axk1"),  # (the release's post_mlp_layernorm beside the layer's norms)
    pytest.param("axk1", True, id="axk1-fused"),  # (transformers' mlp.post_mlp_layernorm)
    pytest.param("hy_v3", False, id="hy_v3"),  # (the release's mlp.router.gate, mlp.expert_bias, mlp.shared_mlp)
    pytest.param("hy_v3", True, id="hy_v3-fused"),
    pytest.param("mellum", False, id="mellum"),
    pytest.param("mellum", True, id="mellum-fused"),
    pytest.param("flint", False, id="flint"),  # (the release's self_attn.softmax_offset, transformers' sinks)
    pytest.param("flint", True, id="flint-fused"),
    # (MLA with DSA, sinks and an output gate, hyper-connections: the release's hc_pre.*, linear_gate and
    # learnable_sink_param; transformers' own names)
    pytest.param("hy_v4", False, id="hy_v4"),
    pytest.param("hy_v4", True, id="hy_v4-fused"),
    # (the release's moe.router.expert_bias, post_attn_norm and post_ffn_norm; transformers' own names)
    pytest.param("kolibri1", False, id="kolibri1"),
    pytest.param("kolibri1", True, id="kolibri1-fused"),
    # (the release's q_b_proj for the query-and-gate projection, W_down/W_up for the norms' gates)
    pytest.param("axk2", False, id="axk2"),
    pytest.param("axk2", True, id="axk2-fused"),
    # (per-head gate biases, NoPE query scale, sandwich norms around a depth-scaled residual, grouped routing)
    pytest.param("beam", False, id="beam"),
    pytest.param("beam", True, id="beam-fused"),
    # (the release's names, router and shared expert transposed; transformers' own; fused experts either way)
    pytest.param("ergo", False, id="ergo"),
    pytest.param("ergo", True, id="ergo-fused"),
    # (two MLA sublayers and a shortcut MoE a layer, identity zero experts among the routed ids)
    pytest.param("longcat_flash", False, id="longcat_flash"),
    pytest.param("longcat_flash", True, id="longcat_flash-fused"),
    # (a mistral3 checkpoint: the original format's language_model.model., transformers' model.language_model.)
    pytest.param("mistral4", False, id="mistral4"),
    pytest.param("mistral4", True, id="mistral4-fused"),
    # (a gemma4 checkpoint: its text model under model.language_model., experts fused either way)
    pytest.param("gemma4_text", False, id="gemma4_text"),
    pytest.param("granitemoe_swa", False, id="granitemoe_swa"),  # (transformers writes its experts fused either way)
    pytest.param("granitemoehybrid", False, id="granitemoehybrid"),  # (fused either way, as Granite's)
    # (CCA: convolved q/k and delayed values cached beside the keys; a router state passed layer to layer, the skip
    # expert; residual scales with biases; transformers writes its experts fused either way)
    pytest.param("zaya", False, id="zaya"),
    # (a qwen4_exp checkpoint: its text model under model.language_model.; gated hyper-connections, QSA indexers
    # dropping tokens from position 9 on, a sigmoid DeltaNet gate; transformers writes its experts fused either way)
    pytest.param("qwen4_exp", False, id="qwen4_exp"),
    # (Gated DeltaNet, sliding rope and full NoPE layers; the release's fused in_proj and out_norm, and transformers'
    # own split in_proj_qkv/z/b/a and norm; experts fused either way)
    pytest.param("lara_mini", False, id="lara_mini"),
    pytest.param("lara_mini", True, id="lara_mini-fused"),
]


def hf_model(src: Path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    # (transformers maps mistral3, Mistral Small 4's released type, to no causal-LM class; gemma4 and qwen4_exp to
    # their text models)
    wrapped = AutoConfig.from_pretrained(src).model_type in ("mistral3", "gemma4", "qwen4_exp")
    auto = AutoModelForImageTextToText if wrapped else AutoModelForCausalLM
    model = auto.from_pretrained(src, dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("family, fused", FAMILIES)
def test_logits_and_greedy_match_transformers(family: str, fused: bool, tmp_path: Path) -> None:
    src = save_checkpoint(family, tmp_path / "hf", fused=fused, seed=1)
    ref = hf_model(src)
    ours = convert_and_load(src, tmp_path / "store")

    assert_parity(ours, ref, PROMPT, STEPS)


def test_qwen3_moe_with_attention_biases_matches_transformers(tmp_path: Path) -> None:
    """attention_bias: q, k, v and o projections each have a bias (the o one was dropped)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.checkpoints import FAMILY_CONFIGS

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **FAMILY_CONFIGS["qwen3_moe"],
                                                                  attention_bias=True))
    with torch.no_grad():  # (initialized to zero: a missing one would not show)
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "hf")
    ours = convert_and_load(tmp_path / "hf", tmp_path / "store")
    assert ours.weights.maybe("model.layers.0.self_attn.o_proj.bias") is not None
    assert_parity(ours, model.eval(), PROMPT, 8)


def test_qwen3_moe_with_a_sliding_window_is_refused_not_run_with_full_attention(tmp_path: Path) -> None:
    import json

    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("qwen3_moe", tmp_path / "hf", seed=1)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "use_sliding_window": True, "sliding_window": 8}))
    with pytest.raises(UnsupportedFamilyError, match="sliding attention window"):
        convert_and_load(src, tmp_path / "store")


def test_glm4_moe_with_glms_own_config_layout_matches_transformers(tmp_path: Path) -> None:
    """GLM-4.5's config.json keeps `partial_rotary_factor` and `rope_theta` at the top level (not
    in transformers 5's `rope_parameters`), and its checkpoint carries a multi-token-prediction
    layer after `num_hidden_layers`, which is dropped. A factor other than the default 0.5 shows
    which one is read."""
    import json

    from safetensors.torch import load_file, save_file

    src = save_checkpoint("glm4_moe", tmp_path / "hf", seed=3)
    config = json.loads((src / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.update(rope_theta=rope["rope_theta"], partial_rotary_factor=0.25, num_nextn_predict_layers=1)
    (src / "config.json").write_text(json.dumps(config))
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    mtp = config["num_hidden_layers"]
    tensors[f"model.layers.{mtp}.eh_proj.weight"] = torch.zeros(config["hidden_size"], 2 * config["hidden_size"])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ref = hf_model(src)
    assert ref.model.rotary_emb.inv_freq.numel() == 16 * 0.25 // 2  # transformers read the factor too
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, ref, PROMPT, STEPS)


def test_qwen3_next_drops_its_mtp_weights_and_matches_transformers(tmp_path: Path) -> None:
    """Qwen3-Next checkpoints carry multi-token-prediction weights under `mtp.`, which
    transformers' model has no place for; conversion drops them. (The tiny model's router
    renormalizes nothing, norm_topk_prob false, and has two value heads per key head: the
    grouped projections' regrouping is exercised.)"""
    from safetensors.torch import load_file, save_file

    src = save_checkpoint("qwen3_next", tmp_path / "hf", seed=4)
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    tensors["mtp.fc.weight"] = torch.zeros(64, 128)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_qwen4_exp_with_the_releases_layer_names_and_what_it_refuses(tmp_path: Path) -> None:
    """The release's config.json names its indexed layers "full_attention" (Qwen4ExpTextConfig reads them as
    indexed_attention): the same model, also as its text model saved alone (qwen4_exp_text). Refused by name at build: Per-Layer Embeddings (ple_layer_ids),
    attention layers without a QSA indexer, another output_gate_type; another hidden_act at pull."""
    from ftw.errors import UnsupportedArchitectureError
    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("qwen4_exp", tmp_path / "hf", seed=2)
    saved = json.loads((src / "config.json").read_text())
    text = saved["text_config"]
    assert text["layer_types"] == ["linear_attention", "indexed_attention"] * 2
    release = {**text, "layer_types": ["linear_attention", "full_attention"] * 2}
    (src / "config.json").write_text(json.dumps({**saved, "text_config": release}))
    assert_parity(convert_and_load(src, tmp_path / "store"), hf_model(src), PROMPT, STEPS)
    # (the text model saved alone, qwen4_exp_text: its weights under model.)
    from transformers.models.qwen4_exp import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    text_only = Qwen4ExpForCausalLM.from_pretrained(src, config=Qwen4ExpTextConfig(**release), dtype=torch.float32)
    text_only.save_pretrained(tmp_path / "text")
    assert json.loads((tmp_path / "text" / "config.json").read_text())["model_type"] == "qwen4_exp_text"
    assert_parity(convert_and_load(tmp_path / "text", tmp_path / "store-text"), hf_model(tmp_path / "text"), PROMPT, STEPS)

    for i, (edit, message) in enumerate([
            ({"ple_layer_ids": [1], "eos_token_id": 2}, "ple_layer_ids"), ({"indexer_n_heads": None}, "indexer_n_heads"),
            ({"output_gate_type": "gelu"}, "output_gate_type 'gelu'"), ({"hidden_act": "gelu"}, "hidden_act 'gelu'")]):
        (src / "config.json").write_text(json.dumps({**saved, "text_config": {**text, **edit}}))
        with pytest.raises(UnsupportedArchitectureError if "hidden_act" in edit else UnsupportedFamilyError, match=message):
            convert_and_load(src, tmp_path / f"store-{i}")


def test_deepseek_v2_with_group_limited_routing_matches_transformers(tmp_path: Path) -> None:
    """DeepSeek-V2 (not Lite) routes "group_limited_greedy": softmax scores, experts of all but the
    best `topk_group` groups zeroed (a group scores its best expert), no renormalization."""
    import json

    src = save_checkpoint("deepseek_v2", tmp_path / "hf", seed=5)
    config = json.loads((src / "config.json").read_text())
    config.update(topk_method="group_limited_greedy", n_group=4, topk_group=2)
    (src / "config.json").write_text(json.dumps(config))
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_minimax_m2_with_a_correction_bias_and_its_released_config_matches_transformers(tmp_path: Path) -> None:
    """The released checkpoints name their partial RoPE `rotary_dim` (not partial_rotary_factor),
    and a nonzero correction bias changes which experts are chosen (not how they are weighed)."""
    import json

    from safetensors.torch import load_file, save_file

    src = save_checkpoint("minimax_m2", tmp_path / "hf", seed=6)
    config = json.loads((src / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.update(rope_theta=rope["rope_theta"], rotary_dim=4)  # a quarter of the 16-channel heads
    (src / "config.json").write_text(json.dumps(config))
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    gen = torch.Generator().manual_seed(6)
    biases = [n for n in tensors if n.endswith("e_score_correction_bias")]
    assert biases
    for name in biases:
        tensors[name] = torch.randn(tensors[name].shape, generator=gen)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ref = hf_model(src)
    assert ref.model.rotary_emb.inv_freq.numel() == 2  # transformers read rotary_dim too
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, ref, PROMPT, STEPS)


def test_qwen2_moe_without_norm_topk_prob_in_its_config_renormalizes_nothing(tmp_path: Path) -> None:
    """Released Qwen1.5-MoE configs may leave norm_topk_prob out; transformers' default is False
    (Qwen3-Next's is True)."""
    import json

    src = save_checkpoint("qwen2_moe", tmp_path / "hf", seed=7)
    config = json.loads((src / "config.json").read_text())
    config.pop("norm_topk_prob", None)
    (src / "config.json").write_text(json.dumps(config))
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_ernie4_5_moe_with_a_correction_bias_and_its_released_layout_matches_transformers(tmp_path: Path) -> None:
    """A nonzero `moe_statics.e_score_correction_bias` changes which experts are chosen, not how
    they are weighed; the released config keeps `rope_theta` at the top level, and the released
    checkpoints carry multi-token-prediction weights (`model.mtp_*`), which are dropped."""
    import json

    from safetensors.torch import load_file, save_file

    src = save_checkpoint("ernie4_5_moe", tmp_path / "hf", seed=8)
    config = json.loads((src / "config.json").read_text())
    config["rope_theta"] = 10000.0  # (not the default 500000, so which one is read shows)
    config.pop("rope_parameters")
    (src / "config.json").write_text(json.dumps(config))
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    gen = torch.Generator().manual_seed(8)
    biases = [n for n in tensors if n.endswith("moe_statics.e_score_correction_bias")]
    assert len(biases) == 2
    for name in biases:
        tensors[name] = torch.randn(tensors[name].shape, generator=gen)
    tensors["model.mtp_emb_norm.0.weight"] = torch.ones(config["hidden_size"])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ref = hf_model(src)
    assert float(ref.model.rotary_emb.inv_freq[1]) == pytest.approx(10000 ** (-2 / 16))  # it read rope_theta too
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, ref, PROMPT, STEPS)


def test_hunyuan_v1_moe_with_its_released_config_layout_matches_transformers(tmp_path: Path) -> None:
    """Hunyuan-A13B's config.json lists `moe_topk` (and sizes transformers does not read) once per
    layer, and keeps its NTK-alpha RoPE in `rope_scaling` beside `rope_theta`; a top-k that differs
    between layers is refused at conversion, not run with one layer's."""
    import json

    from ftw import SourceError

    src = save_checkpoint("hunyuan_v1_moe", tmp_path / "hf", seed=9)
    config = json.loads((src / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config.update(rope_theta=config.pop("rope_parameters")["rope_theta"], moe_topk=[3] * layers,
                  moe_intermediate_size=[config["intermediate_size"]] * layers, num_shared_expert=[1] * layers,
                  rope_scaling={"alpha": 50.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                                "mscale_all_dim": 1.0, "type": "dynamic"})
    (src / "config.json").write_text(json.dumps(config))
    ref = hf_model(src)
    assert ref.model.rotary_emb.rope_type == "ntk_alpha" and ref.model.layers[1].mlp.gate.top_k == 3
    ours = convert_and_load(src, tmp_path / "store")
    assert ours.model.config.num_experts_per_tok == 3
    assert_parity(ours, ref, PROMPT, STEPS)

    (src / "config.json").write_text(json.dumps({**config, "moe_topk": [2] + [3] * (layers - 1)}))
    with pytest.raises(SourceError, match=r"moe_topk is \[2, 3\]"):
        convert_and_load(src, tmp_path / "store-mixed")


def test_exaone_moe_with_its_released_config_layout_matches_transformers(tmp_path: Path) -> None:
    """K-EXAONE's config.json names its local/global schedule as a string ("LLLG") beside an
    explicit `layer_types` (the one read), keeps `rope_theta` at the top level, and the checkpoint
    carries multi-token-prediction weights (`mtp.`), which are dropped. A window of 3 positions
    here: every prefill block and decode step reaches past it."""
    import json

    from safetensors.torch import load_file, save_file

    src = save_checkpoint("exaone_moe", tmp_path / "hf", seed=10)
    config = json.loads((src / "config.json").read_text())
    config.update(rope_theta=config.pop("rope_parameters")["rope_theta"], rope_scaling=None, sliding_window=3,
                  sliding_window_pattern="LLLG")
    (src / "config.json").write_text(json.dumps(config))
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    tensors["mtp.norm.weight"] = torch.ones(config["hidden_size"])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ours = convert_and_load(src, tmp_path / "store")
    assert [b.mixer.window for b in ours.model.blocks] == [3, 3, 3, None]
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_phimoe_past_its_original_context_takes_the_long_rope_factors(tmp_path: Path) -> None:
    """A call past `original_max_position_embeddings` rotates with LongRoPE's `long_factor` and
    `long_mscale`, as Phi-3.5-MoE's released code and transformers 4 chose them (by the length so
    far). transformers 5.24's Phimoe switches the scale there but keeps `short_factor` (it computes
    the frequencies without the length), so the reference is transformers with the long factors
    given as its short ones: past the original context it then rotates as the released model does."""
    import json
    import shutil

    from tests.parity import hf_logits, our_logits, rel_error

    src = save_checkpoint("phimoe", tmp_path / "hf", seed=2)
    config = json.loads((src / "config.json").read_text())
    rope = config["rope_parameters"]
    prompt = (PROMPT * 5)[: rope["original_max_position_embeddings"] + 4]
    released = shutil.copytree(src, tmp_path / "released")
    (released / "config.json").write_text(json.dumps({**config, "rope_parameters": {**rope,
                                                                                    "short_factor": rope["long_factor"]}}))
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, hf_model(released), prompt, 8)
    # (transformers 5.24 on the checkpoint itself rotates otherwise there: where this fails, it no
    # longer does, and the reference above can be the checkpoint)
    assert rel_error(our_logits(ours, prompt), hf_logits(hf_model(src), prompt)) > 1e-2


def test_phimoe_with_a_sliding_window_shorter_than_its_context_is_refused(tmp_path: Path) -> None:
    """The released config's window (131072) spans its whole context and masks nothing; a
    shorter one would, and is refused rather than run with full attention."""
    import json

    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("phimoe", tmp_path / "hf", seed=1)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "sliding_window": 16}))
    with pytest.raises(UnsupportedFamilyError, match="sliding attention window of 16 tokens"):
        convert_and_load(src, tmp_path / "store")


def test_jetmoe_with_nonzero_biases_matches_transformers(tmp_path: Path) -> None:
    """JetMoE's attention and MLP mixtures each add a bias after their experts, which transformers
    initializes to zero (a missing one would not show)."""
    from tests.checkpoints import build_model

    model = build_model("jetmoe", seed=8)
    with torch.no_grad():
        biases = [p for name, p in model.named_parameters() if name.endswith(".bias")]
        assert len(biases) == 2 * model.config.num_hidden_layers
        for p in biases:
            p.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "hf")
    ours = convert_and_load(tmp_path / "hf", tmp_path / "store")
    assert_parity(ours, model.eval(), PROMPT, STEPS)


def test_jetmoe_without_num_attention_heads_in_its_config_derives_them_as_transformers(tmp_path: Path) -> None:
    """JetMoeConfig derives the query heads (num_key_value_heads x num_experts_per_tok); a config.json
    that leaves them out, as older ones do, converts and runs as one that writes them."""
    src = save_checkpoint("jetmoe", tmp_path / "hf", seed=3)
    config = json.loads((src / "config.json").read_text())
    assert config.pop("num_attention_heads") == config["num_key_value_heads"] * config["num_experts_per_tok"]
    (src / "config.json").write_text(json.dumps(config))
    assert_parity(convert_and_load(src, tmp_path / "store"), hf_model(src), PROMPT, STEPS)


def test_llama4_with_its_released_config_layout_and_two_experts_per_token_matches_transformers(tmp_path: Path) -> None:
    """The released config.json names no layer_types, no_rope_layers or moe_layers (both sides derive
    them from no_rope_layer_interval and interleave_moe_layer_step) and writes the Llama 3 scaling as
    `rope_scaling` beside `rope_theta`. Two experts a token: each reads the token scaled by its own
    sigmoid score, and their outputs add up."""
    import json

    src = save_checkpoint("llama4", tmp_path / "hf", seed=9)
    config = json.loads((src / "config.json").read_text())
    text = config["text_config"]
    for key in ("layer_types", "no_rope_layers", "moe_layers"):
        text.pop(key)
    rope = text.pop("rope_parameters")
    text.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope, num_experts_per_tok=2)
    (src / "config.json").write_text(json.dumps(config))
    ref = hf_model(src)
    assert ref.config.layer_types[-1] == "full_attention" and ref.config.num_experts_per_tok == 2
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, ref, PROMPT, STEPS)


def test_dbrx_with_its_released_config_takes_the_rope_base_from_attn_config(tmp_path: Path) -> None:
    """DBRX's released config.json sets rope_theta only in attn_config (500000), has no top-level
    rope_parameters, and leaves moe_normalize_expert_weights (1) and ffn_act_fn (silu) out.
    transformers 5 reads no attn_config.rope_theta and rotates at its default base, 10000; DBRX's
    own code and transformers 4 rotate at attn_config's, as ft does. The reference is transformers
    given that base at the top level."""
    import json
    import shutil

    from tests.parity import hf_logits, our_logits, rel_error

    src = save_checkpoint("dbrx", tmp_path / "hf", seed=2)
    config = json.loads((src / "config.json").read_text())
    for key in ("rope_parameters", "num_key_value_heads"):  # (transformers 5 writes them; the release has neither)
        config.pop(key)
    config["attn_config"] = {"clip_qkv": 1.0, "kv_n_heads": 2, "model_type": "", "rope_theta": 500000}
    config["ffn_config"] = {"ffn_hidden_size": 64, "model_type": "", "moe_jitter_eps": 0.01, "moe_loss_weight": 0.05,
                            "moe_num_experts": 4, "moe_top_k": 2}
    (src / "config.json").write_text(json.dumps(config))
    told = shutil.copytree(src, tmp_path / "told")
    (told / "config.json").write_text(json.dumps({**config, "rope_parameters": {"rope_type": "default",
                                                                                 "rope_theta": 500000.0}}))
    ours = convert_and_load(src, tmp_path / "store")
    assert float(ours.model.blocks[0].mixer.rope.inv_freq[1]) == pytest.approx(500000 ** (-2 / 16))
    assert ours.registered.open_ftw().index.config["rope_theta"] == 500000  # (the normalized config's too)
    assert_parity(ours, hf_model(told), PROMPT, STEPS)
    as_released = hf_model(src)
    assert float(as_released.transformer.rotary_emb.inv_freq[1]) == pytest.approx(10000 ** (-2 / 16))
    assert rel_error(our_logits(ours, PROMPT), hf_logits(as_released, PROMPT)) > 1e-2


def test_dots1_with_sliding_window_layers_is_refused_not_run_with_full_attention(tmp_path: Path) -> None:
    import json

    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("dots1", tmp_path / "hf", seed=10)
    config = json.loads((src / "config.json").read_text())
    config.update(layer_types=["full_attention", "sliding_attention", "sliding_attention"], sliding_window=8)
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedFamilyError, match=r"sliding-window attention layers \(\[1, 2\]"):
        convert_and_load(src, tmp_path / "store")


def test_kimi_k2_is_deepseek_v3_under_its_own_model_type(tmp_path: Path) -> None:
    """Kimi K2's config.json says model_type kimi_k2 (its architecture DeepseekV3ForCausalLM): the
    same model as DeepSeek-V3, converted as it (an alias, not new code) and matching transformers'
    DeepSeek-V3 on the same weights."""
    import json

    src = save_checkpoint("deepseek_v3", tmp_path / "hf", seed=6)
    ref = hf_model(src)  # (transformers has no kimi_k2 type of its own)
    config = json.loads((src / "config.json").read_text())
    config.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"])
    (src / "config.json").write_text(json.dumps(config))
    ours = convert_and_load(src, tmp_path / "store")
    assert ours.weights.config.family == "deepseek_v3"
    assert_parity(ours, ref, PROMPT, STEPS)


@pytest.mark.parametrize("fused", [False, True], ids=["original", "fused"])
def test_kimi_k25_is_deepseek_v3_beside_a_vision_tower(fused: bool, tmp_path: Path) -> None:
    """Kimi K2.5 and K2.6 (model_type kimi_k25) are DeepSeek-V3's text model under `text_config`,
    beside a vision tower and projector: converted as deepseek_v3 (an alias and a rename table, not
    new code), the vision parts dropped, matching transformers' Kimi_K25ForConditionalGeneration on
    text. Its original-format save names the layers `blocks` (transformers renames them back)."""
    from transformers.models.kimi_k25 import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    from tests.checkpoints import FAMILY_CONFIGS

    torch.manual_seed(7)
    text = {**FAMILY_CONFIGS["deepseek_v3"], "model_type": "deepseek_v3", "tie_word_embeddings": False}
    vision = dict(patch_size=14, pos_emb_height=4, pos_emb_width=4, num_attention_heads=2, num_hidden_layers=1,
                  hidden_size=32, intermediate_size=64)
    model = Kimi_K25ForConditionalGeneration(Kimi_K25Config(text_config=text, vision_config=vision,
                                                            projection_hidden_size=32, tie_word_embeddings=False))
    with torch.no_grad():  # (a correction bias of zeros would hide a missing one)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path / "hf", **({"save_original_format": False} if fused else {}))
    ref = Kimi_K25ForConditionalGeneration.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ours = convert_and_load(tmp_path / "hf", tmp_path / "store")
    assert ours.weights.config.family == "deepseek_v3"
    assert not any("vision" in t.name or "mm_projector" in t.name for t in ours.registered.open_ftw().index.tensors)
    assert_parity(ours, ref, PROMPT, STEPS)


def test_laguna_with_a_gate_per_channel_matches_transformers(tmp_path: Path) -> None:
    """gating "per-element": g_proj has one softplus gate a channel of every head, not one a head."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.checkpoints import FAMILY_CONFIGS

    torch.manual_seed(4)
    config = AutoConfig.for_model("laguna", **{**FAMILY_CONFIGS["laguna"], "gating": "per-element"})
    model = AutoModelForCausalLM.from_config(config)
    assert model.model.layers[0].self_attn.g_proj.weight.shape[0] == 4 * 16
    model.save_pretrained(tmp_path / "hf")
    ours = convert_and_load(tmp_path / "hf", tmp_path / "store")
    assert_parity(ours, hf_model(tmp_path / "hf"), PROMPT, STEPS)


@pytest.mark.parametrize("family", ["kimi_linear", "bailing_hybrid"])
def test_kda_past_one_chunk_matches_transformers(family: str, tmp_path: Path) -> None:
    """A prompt longer than KDA's 64-token chunks: the chunked form carries its state from chunk
    to chunk (the parity prompt fits in one), and decoding after it continues that state."""
    src = save_checkpoint(family, tmp_path / "hf", seed=5)
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, hf_model(src), (PROMPT * 12)[:140], 8)


def test_bailing_hybrid_with_the_unbounded_forget_gate_matches_transformers(tmp_path: Path) -> None:
    """kda_safe_gate false: the KDA log decay is -exp(A_log) * softplus(f_proj x + dt_bias), not
    bounded by kda_lower_bound."""
    import json

    src = save_checkpoint("bailing_hybrid", tmp_path / "hf", seed=6)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "kda_safe_gate": False}))
    ref = hf_model(src)
    assert not ref.model.layers[0].self_attn.forget_gate.safe_gate
    assert_parity(convert_and_load(src, tmp_path / "store"), ref, PROMPT, STEPS)


@pytest.mark.parametrize("model_type", ["sarvam_moe", "param2moe"])
def test_sarvam_moe_with_its_released_config_layout_matches_transformers(model_type: str, tmp_path: Path) -> None:
    """Sarvam's and Param2's released config.json say num_experts, num_shared_experts and
    use_qkv_bias (transformers' attribute_map reads them as n_routed_experts, n_shared_experts and
    attention_bias) and keep rope_theta at the top level with no partial_rotary_factor (RoPE over
    the whole head); the checkpoint fuses q/k/v and their biases into attention.query_key_value."""
    import json

    from tests.checkpoints import load_all

    src = save_checkpoint("sarvam_moe", tmp_path / "hf", seed=11)
    assert "model.layers.0.attention.query_key_value.bias" in load_all(src)
    config = json.loads((src / "config.json").read_text())
    renamed = {"n_routed_experts": "num_experts", "n_shared_experts": "num_shared_experts",
               "attention_bias": "use_qkv_bias"}
    config = {renamed.get(key, key): value for key, value in config.items()}
    config.update(model_type=model_type, rope_theta=config.pop("rope_parameters")["rope_theta"])
    (src / "config.json").write_text(json.dumps(config))
    ref = hf_model(src)
    assert ref.config.n_routed_experts == 8 and ref.config.attention_bias
    assert ref.model.rotary_emb.inv_freq.numel() == 8  # the whole 16-channel head rotates
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, ref, PROMPT, STEPS)


def test_granitemoe_swa_with_the_default_schedule_and_granites_own_names_matches_transformers(tmp_path: Path) -> None:
    """A config.json without layer_types or layer_rope_theta: every fourth layer full from layer 0,
    the global rope base on every layer (GraniteMoeSWAConfig's defaults). The same weights under
    Granite's own names (block_sparse_moe.input_linear/output_linear, router.layer, as granitemoe's
    releases have them; transformers 5.25 reads only its own for this family) convert to the same model."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    src = save_checkpoint("granitemoe_swa", tmp_path / "hf", seed=12)
    config = json.loads((src / "config.json").read_text())
    for key in ("layer_types", "layer_rope_theta"):
        config.pop(key)
    (src / "config.json").write_text(json.dumps(config))
    ref = hf_model(src)
    assert ref.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"]
    assert ref.config.layer_rope_theta == [10000.0] * 4 and ref.config.sliding_window == 3
    assert_parity(convert_and_load(src, tmp_path / "store"), ref, PROMPT, STEPS)

    granite = shutil.copytree(src, tmp_path / "granite")
    shard = next(granite.glob("*.safetensors"))
    renames = {".block_sparse_moe.experts.gate_up_proj": ".block_sparse_moe.input_linear.weight",
               ".block_sparse_moe.experts.down_proj": ".block_sparse_moe.output_linear.weight",
               ".block_sparse_moe.router.weight": ".block_sparse_moe.router.layer.weight"}
    tensors = {}
    for name, tensor in load_file(shard).items():
        for old, new in renames.items():
            name = name.replace(old, new)
        tensors[name] = tensor
    assert sum(name.endswith("block_sparse_moe.input_linear.weight") for name in tensors) == 4
    save_file(tensors, str(shard), metadata={"format": "pt"})
    assert_parity(convert_and_load(granite, tmp_path / "store-granite"), ref, PROMPT, STEPS)


def test_minicpm5_moe_with_first_k_dense_replace_in_its_config_matches_transformers(tmp_path: Path) -> None:
    """A config.json that says first_k_dense_replace (the older name) and no mlp_layer_types:
    MiniCPM5MoeConfig makes that many leading layers dense, as the converter does."""
    import json

    from safetensors.torch import load_file, save_file

    src = save_checkpoint("minicpm5_moe", tmp_path / "hf", seed=13)
    config = json.loads((src / "config.json").read_text())
    config.pop("mlp_layer_types")
    config.update(first_k_dense_replace=2, architectures=["MiniCPM5MoEForCausalLM"])
    (src / "config.json").write_text(json.dumps(config))
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    for name in [n for n in tensors if n.startswith("model.layers.1.mlp.")]:  # (layer 1 now a dense MLP)
        del tensors[name]
    gen = torch.Generator().manual_seed(13)
    for proj, shape in (("gate_proj", (128, 64)), ("up_proj", (128, 64)), ("down_proj", (64, 128))):
        tensors[f"model.layers.1.mlp.{proj}.weight"] = torch.randn(shape, generator=gen) * 0.1
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ref = hf_model(src)
    assert ref.config.mlp_layer_types == ["dense", "dense", "sparse"]
    ours = convert_and_load(src, tmp_path / "store")
    assert ours.weights.config.moe_layers == (2,)
    assert_parity(ours, ref, PROMPT, STEPS)


def test_axk1_as_released_without_a_correction_bias_matches_transformers(tmp_path: Path) -> None:
    """A.X-K1's releases route without e_score_correction_bias (transformers fills zeros) and store a
    post_mlp_layernorm on the dense layers too, which nothing reads."""
    from safetensors.torch import load_file, save_file

    src = save_checkpoint("axk1", tmp_path / "hf", seed=5)
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    assert "model.layers.1.post_mlp_layernorm.weight" in tensors  # (the release's place for it)
    for name in [n for n in tensors if n.endswith("e_score_correction_bias")]:
        del tensors[name]
    tensors["model.layers.0.post_mlp_layernorm.weight"] = torch.full((64,), 3.0)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ref = hf_model(src)
    assert not ref.model.layers[1].mlp.gate.e_score_correction_bias.any()
    ours = convert_and_load(src, tmp_path / "store")
    assert ours.weights.maybe("model.layers.1.mlp.gate.e_score_correction_bias") is None
    assert_parity(ours, ref, PROMPT, STEPS)


def test_mellum_drops_its_mtp_layer_and_refuses_a_partial_rotary_factor(tmp_path: Path) -> None:
    """The release's multi-token-prediction layer (mtp., which transformers ignores) is dropped at
    conversion; a partial_rotary_factor, which transformers' Mellum crashes on, is refused."""
    import json

    from safetensors.torch import load_file, save_file

    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("mellum", tmp_path / "hf", seed=7)
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    tensors["mtp.layers.0.input_layernorm.weight"] = torch.ones(64)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ours = convert_and_load(src, tmp_path / "store")
    assert not any(name.startswith("mtp.") for name in ours.weights.dense)
    assert_parity(ours, hf_model(src), PROMPT, 8)

    config = json.loads((src / "config.json").read_text())
    config["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 0.5
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedFamilyError, match="partial_rotary_factor"):
        convert_and_load(src, tmp_path / "store-partial")


def test_gemma4_text_alone_with_the_released_config_keys_matches_transformers(tmp_path: Path) -> None:
    """The text model alone (Gemma4ForCausalLM, model_type gemma4_text), its full layers sized by
    config.json's global_head_dim and num_global_key_value_heads as the releases write them (no
    per_layer_config, which transformers 5.25 derives from them and saves), and values of their own
    (no attention_k_eq_v: a v_proj on every layer, the global KV heads not taken); the default
    5:1 layer schedule over 7 layers, one full before the last (forced full)."""
    import json

    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    from tests.checkpoints import GEMMA4_TEXT, RANDOMIZED

    torch.manual_seed(9)
    text = {**GEMMA4_TEXT, "attention_k_eq_v": False, "num_hidden_layers": 7, "layer_types": None}
    model = Gemma4ForCausalLM(Gemma4TextConfig(**text))
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if any(part in name for part in RANDOMIZED["gemma4_text"] + ("model.norm.",)):
                p.normal_(1.0, 0.2)
    model.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "gemma4_text" and set(config.pop("per_layer_config")) == {"5", "6"}
    config.update(global_head_dim=32, num_global_key_value_heads=1)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    ref = hf_model(tmp_path / "hf")
    assert ref.model.layers[5].self_attn.head_dim == 32 and ref.model.layers[5].self_attn.v_proj is not None
    ours = convert_and_load(tmp_path / "hf", tmp_path / "store")
    assert_parity(ours, ref, PROMPT, STEPS)


def test_gemma4_text_refuses_what_it_does_not_run(tmp_path: Path) -> None:
    """Per-layer embeddings (the E2B/E4B models'), KV shared between layers and bidirectional text
    attention are refused by name, not run wrong."""
    import json

    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("gemma4_text", tmp_path / "hf", seed=2)
    config = json.loads((src / "config.json").read_text())
    for i, (key, value) in enumerate((("hidden_size_per_layer_input", 8), ("num_kv_shared_layers", 2),
                                      ("use_bidirectional_attention", "all"))):
        (src / "config.json").write_text(json.dumps({**config, "text_config": {**config["text_config"], key: value}}))
        with pytest.raises(UnsupportedFamilyError, match=key):
            convert_and_load(src, tmp_path / f"store{i}")


def test_longcat_flash_drops_its_mtp_layer_and_refuses_other_zero_experts(tmp_path: Path) -> None:
    """The release's multi-token-prediction layer (model.mtp., which transformers ignores) is
    dropped at conversion; zero experts of a type other than the identity are refused."""
    import json

    from safetensors.torch import load_file, save_file

    from ftw.errors import UnsupportedArchitectureError

    src = save_checkpoint("longcat_flash", tmp_path / "hf", seed=7)
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    tensors["model.mtp.layers.0.input_layernorm.weight"] = torch.ones(64)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ours = convert_and_load(src, tmp_path / "store")
    assert not any(".mtp." in name for name in ours.weights.dense)
    assert ours.model.config.num_layers == 2 and len(ours.model.blocks) == 4
    assert_parity(ours, hf_model(src), PROMPT, 8)

    config = json.loads((src / "config.json").read_text())
    config["zero_expert_type"] = "constant"
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="zero experts of type 'constant'"):
        convert_and_load(src, tmp_path / "store-constant")


def test_flint_with_flintconfigs_defaults_and_a_partial_rotary_factor_refused(tmp_path: Path) -> None:
    """A config.json without layer_types and mlp_only_layers takes FlintConfig's schedule (full
    attention on layers 0, 1 and the last, dense MLPs on 0 and 1), as transformers fills them in;
    a partial_rotary_factor, which transformers' Flint cannot apply, is refused."""
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    from runtime.models import UnsupportedFamilyError
    from tests.checkpoints import FAMILY_CONFIGS

    config = {k: v for k, v in FAMILY_CONFIGS["flint"].items() if k not in ("layer_types", "mlp_only_layers")}
    torch.manual_seed(6)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("flint", **config))
    assert model.config.layer_types == ["full_attention", "full_attention", "sliding_attention", "full_attention"]
    model.save_pretrained(tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    del saved["layer_types"], saved["mlp_only_layers"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(saved))
    ours = convert_and_load(tmp_path / "hf", tmp_path / "store")
    assert ours.weights.config.moe_layers == (2, 3)
    assert_parity(ours, hf_model(tmp_path / "hf"), PROMPT, STEPS)

    saved["rope_parameters"]["partial_rotary_factor"] = 0.5
    (tmp_path / "hf" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(UnsupportedFamilyError, match="partial_rotary_factor"):
        convert_and_load(tmp_path / "hf", tmp_path / "store-partial")



def test_kolibri1_without_a_window_is_refused(tmp_path: Path) -> None:
    """No sliding_window: transformers' Kolibri 1 would rotate every layer, but its mask maker raises
    (sliding layers without a window, transformers' config refuses): ft refuses both at build."""
    import json

    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("kolibri1", tmp_path / "hf", seed=6)
    config = json.loads((src / "config.json").read_text())
    for types in (config["layer_types"], ["full_attention"] * 3):
        (src / "config.json").write_text(json.dumps({**config, "sliding_window": None, "layer_types": types}))
        with pytest.raises(UnsupportedFamilyError, match="sliding_window"):
            convert_and_load(src, tmp_path / f"store-{types[0]}")


def test_axk2_with_expert_groups_fills_dropped_groups_with_zero(tmp_path: Path) -> None:
    """The larger A.X-K2 releases route within expert groups (n_group, topk_group); transformers'
    AXK2TopkRouter sets the dropped groups' choice scores to 0, not -inf (DeepSeek-V3's), which
    decides where a negative correction bias pushes a kept expert's below 0."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.checkpoints import FAMILY_CONFIGS

    torch.manual_seed(8)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "axk2", **{**FAMILY_CONFIGS["axk2"], "n_group": 4, "topk_group": 2}))
    with torch.no_grad():
        for name, p in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                p.normal_(-0.8, 0.3)  # (most kept experts' sigmoid + bias below a dropped one's 0)
    model.save_pretrained(tmp_path / "hf")
    ours = convert_and_load(tmp_path / "hf", tmp_path / "store")
    assert ours.model.blocks[1].ffn.num_groups == 4 and ours.model.blocks[1].ffn.dropped == 0.0
    assert_parity(ours, hf_model(tmp_path / "hf"), PROMPT, STEPS)


def test_beam_over_a_long_prompt_and_with_beamconfigs_defaults_matches_transformers(tmp_path: Path, monkeypatch) -> None:
    """Over 400 positions, where the NoPE layers' query scale (1 + (p + 1) / 2048) ** 0.1 reaches 1.02
    (dropping it moves these logits by ~0.4; at the parity run's 44 positions by ~1e-3); then a
    config.json without layer_types, mlp_layer_types and rope_parameters takes BeamConfig's (layers
    0-2 sliding and dense, the last full NoPE and MoE, rope base 10000), as transformers fills them in."""
    import json
    import random

    from tests.checkpoints import FAMILY_CONFIGS

    src = save_checkpoint("beam", tmp_path / "hf", seed=4)
    prompt = random.Random(0).choices(range(256), k=400)
    assert_parity(convert_and_load(src, tmp_path / "store"), hf_model(src), prompt, 4)

    defaults = ("layer_types", "mlp_layer_types", "rope_parameters")
    monkeypatch.setitem(FAMILY_CONFIGS, "beam", {k: v for k, v in FAMILY_CONFIGS["beam"].items() if k not in defaults})
    src = save_checkpoint("beam", tmp_path / "hf-defaults", seed=4)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in defaults}))
    ours, ref = convert_and_load(src, tmp_path / "store-defaults"), hf_model(src)
    assert ref.config.layer_types[-1] == "full_attention" and ours.weights.config.moe_layers == (3,)
    assert_parity(ours, ref, PROMPT, 8)


def test_beam_refuses_what_transformers_cannot_run(tmp_path: Path) -> None:
    """No expert groups (transformers' router views the scores by n_group), sliding layers without a
    window, rope_parameters not keyed by layer type, a partial_rotary_factor: refused at build."""
    import json

    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("beam", tmp_path / "hf", seed=5)
    config = json.loads((src / "config.json").read_text())
    rope = {"rope_type": "default", "rope_theta": 1000.0}
    for i, (change, match) in enumerate([
            ({"n_group": None}, "n_group"), ({"sliding_window": None}, "sliding_window"),
            ({"rope_parameters": rope}, "rope_parameters keyed by layer type"),
            ({"rope_parameters": {"sliding_attention": {**rope, "partial_rotary_factor": 0.5}, "full_attention": None}},
             "partial_rotary_factor")]):
        (src / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UnsupportedFamilyError, match=match):
            convert_and_load(src, tmp_path / f"store-{i}")


def test_ergo_with_its_released_config_keys_matches_transformers_and_refuses_other_ropes(tmp_path: Path) -> None:
    """The release's config.json: flat rope_parameters (the sliding layers'; ErgoConfig makes the full layers
    NoPE), local_attention_window, no layer_types or mlp_layer_types (every global_attention_every_n_layers-th
    full, the first num_dense_blocks dense): parity. A YaRN rope is refused (ft rotates at default frequencies)."""
    import json

    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("ergo", tmp_path / "hf", seed=3)
    config = json.loads((src / "config.json").read_text())
    released = {k: v for k, v in config.items() if k not in ("layer_types", "mlp_layer_types", "sliding_window")}
    released.update(rope_parameters=config["rope_parameters"]["sliding_attention"], local_attention_window=5)
    (src / "config.json").write_text(json.dumps(released))
    assert_parity(convert_and_load(src, tmp_path / "store"), hf_model(src), PROMPT, STEPS)

    yarn = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 64}
    (src / "config.json").write_text(json.dumps({**released, "rope_parameters": yarn}))
    with pytest.raises(UnsupportedFamilyError, match="'yarn' rope"):
        convert_and_load(src, tmp_path / "store-yarn")


class OneTokenAtATime:
    """A transformers model fed one token at a time through its cache, for logits and greedy tokens
    (what assert_parity asks of a model): its decode path, where a model's full forward pass computes
    something else (Doge's router mixes the tokens of a call: runtime/models/doge.py)."""

    def __init__(self, model) -> None:
        from transformers import DynamicCache

        self.model, self.new_cache = model, lambda: DynamicCache(config=model.config)

    def __call__(self, ids: torch.Tensor):
        from types import SimpleNamespace

        cache = self.new_cache()
        with torch.no_grad():
            rows = [self.model(ids[:, i:i + 1], cache=cache, use_cache=True).logits[:, -1] for i in range(ids.shape[1])]
        return SimpleNamespace(logits=torch.stack(rows, dim=1))

    def generate(self, ids: torch.Tensor, max_new_tokens: int, **_) -> torch.Tensor:
        cache, out = self.new_cache(), ids[0].tolist()
        with torch.no_grad():
            for i in range(ids.shape[1] + max_new_tokens - 1):
                logits = self.model(torch.tensor([[out[i]]]), cache=cache, use_cache=True).logits[0, -1]
                if i >= ids.shape[1] - 1:
                    out.append(int(torch.argmax(logits)))
        return torch.tensor([out])


@pytest.mark.parametrize("change", [{}, {"sliding_window": 5}], ids=["doge", "doge-window"])
def test_doge_matches_transformers_decoding_a_token_at_a_time(change: dict, tmp_path: Path) -> None:
    """Doge's dynamic mask (a bias a key from its value, added to its scores; every layer in a 5-token window
    too), product-key routing of one-neuron experts beside the MLP, residual scales: logits to 1e-4, 32 greedy
    tokens, cached decode = recompute, against transformers fed a token at a time. Its full forward pass routes a
    token by other tokens' logits (DogeCDMoE's view(2, T, K)), so its prompt logits are neither ft's nor its own
    one-token steps'. (keep_window_size past the sequence here: greedy tokens repeat, and where equal biases tie
    at the keep-th place transformers' topk and ft keep different keys; test_doge_keeps_each_querys_keys_...)"""
    import json

    from tests.parity import our_logits, rel_error

    src = save_checkpoint("doge", tmp_path / "hf", seed=1)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "keep_window_size": 2048, **change}))
    ref, ours = hf_model(src), convert_and_load(src, tmp_path / "store")
    assert_parity(ours, OneTokenAtATime(ref), PROMPT, STEPS)
    full = ref(torch.tensor([PROMPT])).logits[0].detach()
    assert rel_error(our_logits(ours, PROMPT), full) > 1e-2  # (the mixed routing of transformers' full pass)


def test_doge_keeps_each_querys_keys_of_largest_bias_as_transformers(tmp_path: Path) -> None:
    """keep_window_size 6: 44 distinct tokens (no two keys of one bias on the first layer) give transformers'
    logits a token at a time at every position, to 1e-4, in one prompt pass and in chunks, and keeping every key
    moves them. With repeated tokens (equal biases), the later of equal keys stay: a prompt's logits are those
    of its tokens decoded one by one."""
    import json

    from runtime.layers.key_bias_attention import key_bias_causal_attention
    from tests.parity import our_logits, rel_error

    src = save_checkpoint("doge", tmp_path / "hf", seed=1)
    config = json.loads((src / "config.json").read_text())
    assert config["keep_window_size"] == 6
    ids = torch.randperm(256, generator=torch.Generator().manual_seed(3))[:44].tolist()
    ours, ref = convert_and_load(src, tmp_path / "store"), OneTokenAtATime(hf_model(src))
    expected = ref(torch.tensor([ids])).logits[0]
    assert rel_error(our_logits(ours, ids), expected) < 1e-4
    ours.model.prefill_chunk_tokens = 16
    try:
        assert rel_error(our_logits(ours, ids), expected) < 1e-4
    finally:
        ours.model.prefill_chunk_tokens = None
    (src / "config.json").write_text(json.dumps({**config, "keep_window_size": 2048}))
    assert rel_error(our_logits(convert_and_load(src, tmp_path / "store-all"), ids), expected) > 1e-2

    repeated = [5, 9, 5, 9, 5, 9, 7, 5, 9, 5, 7, 7, 9, 5]
    state = ours.model.new_state(len(repeated))
    steps = torch.cat([ours.model.forward(torch.tensor([t]), state) for t in repeated])
    torch.testing.assert_close(our_logits(ours, repeated), steps, atol=1e-5, rtol=0)
    # one key head, four keys of bias 1, 2, 2, 2, keeping two: keys 2 and 3 (values 20, 30)
    q, k = torch.zeros(1, 1, 4), torch.zeros(4, 1, 4)
    v = torch.tensor([0.0, 10.0, 20.0, 30.0]).view(4, 1, 1)
    bias = torch.tensor([1.0, 2.0, 2.0, 2.0]).view(4, 1)
    assert float(key_bias_causal_attention(q, k, v, bias, 3, 1.0, keep=2)) == 25.0


def test_doge_dense_models_and_other_activations_are_refused(tmp_path: Path) -> None:
    """A dense Doge (is_moe off) has no experts to offload; experts of another hidden_act than silu have no
    runtime activation: both refused by name at pull."""
    import json

    from ftw.errors import UnsupportedArchitectureError

    src = save_checkpoint("doge", tmp_path / "hf", seed=2)
    config = json.loads((src / "config.json").read_text())
    for i, (change, match) in enumerate([({"is_moe": False}, "a dense Doge"), ({"hidden_act": "gelu"}, "hidden_act")]):
        (src / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UnsupportedArchitectureError, match=match):
            convert_and_load(src, tmp_path / f"store-{i}")


def test_hy_v4_with_hyv4configs_defaults_and_its_mtp_layers_dropped(tmp_path: Path, monkeypatch) -> None:
    """A config.json without indexer_types, mlp_layer_types and layer_types takes HYV4Config's
    schedule (6 layers: indexers on 0, 1 and 5, layers 2-4 sharing layer 1's selection; a dense
    first layer), as transformers fills it in, and the fit planner's KV counts those indexers; the
    release's MTP layer (model.mtp_layers.*, which transformers ignores) is dropped at conversion."""
    import json

    from safetensors.torch import save_file

    from runtime.planner.footprint import kv_layout
    from tests.checkpoints import FAMILY_CONFIGS, load_all

    monkeypatch.setitem(FAMILY_CONFIGS, "hy_v4", {**{k: v for k, v in FAMILY_CONFIGS["hy_v4"].items()
                                                     if k != "indexer_types"}, "num_hidden_layers": 6})
    src = save_checkpoint("hy_v4", tmp_path / "hf", seed=6)
    config = json.loads((src / "config.json").read_text())
    assert config["indexer_types"] == ["full", "full", "shared", "shared", "shared", "full"]
    config = {k: v for k, v in config.items() if k not in ("indexer_types", "mlp_layer_types", "layer_types")}
    (src / "config.json").write_text(json.dumps(config))
    tensors = load_all(src)
    tensors["model.mtp_layers.0.eh_proj.weight"] = torch.zeros(64, 128)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    ours = convert_and_load(src, tmp_path / "store")
    assert ours.weights.config.moe_layers == (1, 2, 3, 4, 5)
    assert [b.mixer.indexer is not None for b in ours.model.blocks] == [True, True, False, False, False, True]
    assert kv_layout("hy_v4", config, 2).bytes_per_token == 6 * (16 + 8) * 2 + 3 * 16 * 2
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_hy_v4_refuses_what_it_cannot_match(tmp_path: Path) -> None:
    """Attention other than indexed_attention, a first layer sharing a selection it has not got, and
    another hidden_act are refused at build; a swiglu_limit at or below 0 (no clamp by HYV4Config's
    word, a clamp there in HYV4Experts) at conversion."""
    import json

    from ftw import UnsupportedArchitectureError
    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("hy_v4", tmp_path / "hf", seed=7)
    config = json.loads((src / "config.json").read_text())
    for n, (change, match) in enumerate([
            ({"layer_types": ["indexed_attention", "sliding_attention"] * 2}, "layer_types"),
            ({"indexer_types": ["shared", "full", "full", "shared"]}, "indexer_types"),
            ({"hidden_act": "gelu"}, "hidden_act"),
            ({"swiglu_limit": 0.0}, "swiglu_limit")]):
        (src / "config.json").write_text(json.dumps({**config, **change}))
        error = UnsupportedArchitectureError if "swiglu_limit" in change else UnsupportedFamilyError
        with pytest.raises(error, match=match):
            convert_and_load(src, tmp_path / f"store-{n}")


def test_lara_mini_with_laraminiconfigs_schedule_and_what_it_refuses(tmp_path: Path) -> None:
    """A config.json without layer_types takes LaraMiniConfig's period-5 schedule (the test
    checkpoint's own), as transformers fills it in; a partial_rotary_factor (transformers' default
    rope rotates whole heads whatever it says) and sliding layers without a sliding_window are
    refused by name at build, another hidden_act at pull."""
    from ftw.errors import UnsupportedArchitectureError
    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("lara_mini", tmp_path / "hf", seed=2)
    saved = json.loads((src / "config.json").read_text())
    del saved["layer_types"]
    (src / "config.json").write_text(json.dumps(saved))
    assert_parity(convert_and_load(src, tmp_path / "store"), hf_model(src), PROMPT, STEPS)

    for i, (edit, message) in enumerate([
            ({"rope_parameters": {**saved["rope_parameters"], "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
            ({"sliding_window": None}, "no sliding_window"), ({"hidden_act": "gelu"}, "hidden_act 'gelu'")]):
        (src / "config.json").write_text(json.dumps({**saved, **edit}))
        with pytest.raises(UnsupportedArchitectureError if "hidden_act" in edit else UnsupportedFamilyError, match=message):
            convert_and_load(src, tmp_path / f"store-{i}")
