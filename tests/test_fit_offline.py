"""`ft fit` of a shipped recipe without the Hub: the footprint stored with the recipe
(Modelfiles/footprints.json). No test here reaches a network: the Hub's functions are replaced."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from ftpull import hub
from ftpull.modelfile import builtin_modelfiles, load_builtin_modelfile
from ftpull.recipe_footprint import (
    GGUF_FILE_TYPES,
    SOURCE,
    NoStoredFootprintError,
    _dense_numel,
    _gguf_quant,
    recipe_footprint,
    stored_config,
    unsized_recipes,
)
from ftpull.resolve import ResolveError, resolve
from ftw.families import family_for_config, normalized_config
from runtime.planner.plan import ModelFootprint, PlanOverrides, plan
from runtime.planner.resources import Machine
from tests.clirun import ft
from tests.test_plan import DESKTOP_5090, QWEN3_30B, WORKSTATION_5090, qwen3_30b_tensors

UNREACHABLE = "looking up Qwen/Qwen3-30B-A3B: cannot resolve huggingface.co: this machine is offline"


def _offline(*_args: object) -> None:
    raise hub.HubUnreachable(UNREACHABLE)


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FT_HOME", str(tmp_path / "ft_home"))
    monkeypatch.setattr(hub, "fetch_checkpoint_info", _offline)
    monkeypatch.setattr(hub, "fetch_file_sizes", _offline)
    monkeypatch.setattr(Machine, "probe", staticmethod(lambda: DESKTOP_5090))


def _planned_recipes() -> list[str]:
    """Every name:tag of a shipped recipe that `ft fit` plans from the Hub (not one ft cannot
    convert yet, which resolve refuses first, nor builtin:// ones, built locally)."""
    names = []
    for model in builtin_modelfiles():
        for tag in load_builtin_modelfile(model).tags:
            try:
                target = resolve(f"{model}:{tag}")
            except ResolveError:
                continue
            if target.recipe.source.scheme != "builtin":
                names.append(f"{model}:{tag}")
    return names


@pytest.mark.parametrize("ref", _planned_recipes())
def test_every_shipped_recipe_has_a_plannable_offline_footprint(ref: str) -> None:
    """Every one but those listed as unsized (no public source for their sizes: none is guessed)."""
    target = resolve(ref)
    if target.recipe.name in unsized_recipes():
        with pytest.raises(NoStoredFootprintError) as e:
            recipe_footprint(target.recipe, name=ref)
        assert e.value.reason == unsized_recipes()[target.recipe.name]
        return
    fp = recipe_footprint(target.recipe, name=ref)
    fitted = plan(fp, WORKSTATION_5090, PlanOverrides(force=True))
    assert fitted.context_length > 0 and fp.expert_pool_bytes > 0
    if target.recipe.source.scheme == "gguf" and fp.source == "sizes":  # a file type GGUF_FILE_TYPES lacks
        assert _gguf_quant(target.recipe.source.path or "") not in GGUF_FILE_TYPES
        return
    assert fp.source == SOURCE and fp.layout_known and fp.dense_bytes > 0
    assert fp.kv.bytes_per_token > 0 and fp.activation_bytes_per_token > 0


def test_the_unsized_recipes_are_shipped_and_store_no_footprint() -> None:
    """A recipe listed as unsized stores no footprint (a made-up one would make `ft fit` offline say a
    model fits that does not), and every listed name is a shipped recipe with its reason."""
    unsized = unsized_recipes()
    assert {"a.x-k2", "hy4-preview", "granite-moe-shared-7b"} <= set(unsized)
    for model, reason in unsized.items():
        assert model in builtin_modelfiles() and reason
        with pytest.raises(NoStoredFootprintError):
            stored_config(model)


def _counted_parameters(model: str) -> float:
    """The parameters the stored footprint adds up to, counted as recipe_footprint counts them
    (the routed experts' gate, up and down, and every other tensor), in billions."""
    config = stored_config(model)
    family = family_for_config(config)
    c, text = normalized_config(family, config), family.text_config(config)
    weights = 3 if family.expert_activation(text).gated else 2
    experts = len(c["moe_layers"]) * c["num_experts"] * weights * c["hidden_size"] * c["moe_intermediate_size"]
    return (experts + _dense_numel(family.name, c, text)) / 1e9


@pytest.mark.parametrize("model,published", [("minimax-text-01", 456.0), ("k-exaone", 236.0), ("gemma4-26b", 25.2)])
def test_a_verified_footprint_adds_up_to_the_published_size(model: str, published: float) -> None:
    """The footprints taken from the releases' published configs count what their model cards say
    (within 15%; they were transformers' defaults, 10x off, before)."""
    assert abs(_counted_parameters(model) - published) <= 0.15 * published


def test_ft_fit_offline_of_an_unsized_recipe_says_its_size_is_unknown(offline, capsys) -> None:
    code, out, err = ft(capsys, "fit", "a.x-k2")
    text = " ".join(err.split())
    assert code == 1 and not out and "Traceback" not in err
    assert "a.x-k2" in text and "its size is unknown until the Hugging Face Hub answers" in text
    assert unsized_recipes()["a.x-k2"] in text and UNREACHABLE in text
    assert "Run `ft fit a.x-k2" in text
    code, out, err = ft(capsys, "fit", "granite-moe-shared-7b", "--json")
    assert code == 1 and not out and "its size is unknown" in err


def test_the_qwen3_30b_recipe_stores_its_config_and_plans_as_its_checkpoint_would() -> None:
    config = stored_config("qwen3-30b-a3b")
    for key in ("hidden_size", "num_hidden_layers", "num_experts", "moe_intermediate_size", "num_experts_per_tok",
                "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"):
        assert config[key] == QWEN3_30B[key], key
    recipe = load_builtin_modelfile("qwen3-30b-a3b").recipe()
    expected = ModelFootprint.from_checkpoint(QWEN3_30B, qwen3_30b_tensors(), target_dtype="bf16",
                                              name="qwen3-30b-a3b:latest", context_length=recipe.context_length)
    assert recipe_footprint(recipe, name="qwen3-30b-a3b:latest") == replace(expected, source=SOURCE)

    fp8 = load_builtin_modelfile("qwen3-30b-a3b").recipe("fp8")
    expected = ModelFootprint.from_checkpoint(QWEN3_30B, _fp8_tensors(), target_dtype="fp8",
                                              name="qwen3-30b-a3b:fp8", context_length=fp8.context_length)
    assert recipe_footprint(fp8, name="qwen3-30b-a3b:fp8") == replace(expected, source=SOURCE)


def _fp8_tensors() -> dict[str, tuple[str, int]]:
    """Qwen3-30B-A3B-FP8's table: 2-D projections in e4m3 with an f32 scale per 128 x 128 block."""
    shapes = {"q_proj": (4096, 2048), "k_proj": (512, 2048), "v_proj": (512, 2048), "o_proj": (2048, 4096),
              "gate_proj": (768, 2048), "up_proj": (768, 2048), "down_proj": (2048, 768)}
    out = {}
    for name, (dtype, nbytes) in qwen3_30b_tensors().items():
        proj = name.split(".")[-2]
        if proj not in shapes:
            out[name] = (dtype, nbytes)
            continue
        rows, cols = shapes[proj]
        out[name] = ("f8_e4m3", rows * cols)
        out[name + "_scale_inv"] = ("f32", -(-rows // 128) * -(-cols // 128) * 4)
    return out


def test_ft_fit_offline_says_the_figures_are_the_recipes_estimate(offline, capsys) -> None:
    code, out, err = ft(capsys, "fit", "qwen3-30b-a3b")
    assert code == 0, err
    text = " ".join(out.split())
    assert "the recipe's stored footprint (estimate; not read from the model's files), not pulled" in text
    assert "note: the Hub could not be reached" in text and "an estimate, not sizes read from the model's files" in text
    assert "48 MoE layers x 128 experts, top-8" in text
    code, out, _ = ft(capsys, "fit", "qwen3-30b-a3b:q4_k_m", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["footprint"]["source"] == SOURCE and "could not be reached" in doc["estimate_note"]


def test_ft_fit_offline_of_a_model_no_recipe_ships_says_the_hub_is_unreachable(offline, capsys) -> None:
    code, _, err = ft(capsys, "fit", "hf://Qwen/Qwen3-30B-A3B")
    assert code == 1 and UNREACHABLE in err


def test_a_network_failure_reads_as_unreachable_and_a_refusal_does_not(monkeypatch) -> None:
    monkeypatch.setenv("FT_PULL_RETRIES", "2")
    monkeypatch.setenv("FT_PULL_RETRY_DELAY_S", "0")

    def no_dns() -> None:
        raise socket.gaierror(-2, "Name or service not known")

    def refused() -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    for fail in (no_dns, refused):
        with pytest.raises(hub.HubUnreachable):
            hub.with_retries("looking up org/repo", fail)
    with pytest.raises(hub.HubError) as e:
        hub.with_retries("looking up org/repo", lambda: (_ for _ in ()).throw(hub.NotASafetensorsRepoError("x")))
    assert not isinstance(e.value, hub.HubUnreachable)


def test_online_the_stored_footprint_is_checked_against_the_real_config(tmp_path: Path, monkeypatch, caplog) -> None:
    """The footprint an offline `ft fit` plans from is a copy of config.json's sizes: where the Hub
    answers, `ft fit` compares them and names every key that no longer agrees."""
    import logging

    from ftpull.fit import fit
    from registry import Store

    real = dict(QWEN3_30B)

    def online(repo_id: str, revision: str | None) -> hub.RemoteCheckpoint:
        return hub.RemoteCheckpoint(repo_id, "0" * 40, dict(real), (), qwen3_30b_tensors())

    monkeypatch.setattr(hub, "fetch_checkpoint_info", online)
    store = Store(tmp_path / "ft_home")
    with caplog.at_level(logging.WARNING, logger="ftpull.recipe_footprint"):
        fit("qwen3-30b-a3b", store, PlanOverrides(), DESKTOP_5090)
    assert not caplog.records  # (they agree)
    real.update(num_experts=256, rope_scaling={"type": "yarn"})  # (a key the recipe does not store: not compared)
    with caplog.at_level(logging.WARNING, logger="ftpull.recipe_footprint"):
        fit("qwen3-30b-a3b", store, PlanOverrides(), DESKTOP_5090)
    assert [r.getMessage() for r in caplog.records] == [
        "qwen3-30b-a3b:latest: the footprint stored with the recipe (Modelfiles/footprints.json) differs from the "
        "checkpoint's config.json (num_experts: stored 128, config.json 256): `ft fit` offline plans from the stored "
        "one; update its entry"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ftpull.recipe_footprint"):
        fit("hf://Qwen/Qwen3-30B-A3B", store, PlanOverrides(), DESKTOP_5090)  # (no recipe's: nothing stored)
    assert not caplog.records


def test_a_recipe_of_experts_without_a_gate_counts_their_two_matrices() -> None:
    """Nemotron-H's relu2 experts hold up and down only (w13 is the up rows alone), as the FTW writer
    lays them out: the offline footprint counted a gate too, 82 GiB of experts for ~55."""
    from ftw.format import PART_ALIGNMENT, align_up

    fp = recipe_footprint(load_builtin_modelfile("nemotron-3-nano").recipe(), name="nemotron-3-nano")
    config = stored_config("nemotron-3-nano")
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]
    assert fp.expert_stride_bytes == align_up(2 * align_up(hidden * inter * 2, PART_ALIGNMENT))
    assert fp.expert_pool_bytes < 56 << 30


@pytest.mark.parametrize("gate_up, down", [("q4_k", "q6_k"), ("q4_k", "q4_k"), ("q8_0", "q8_0"), ("q5_k", "q6_k")])
def test_a_gguf_file_types_expert_record_is_the_one_ftw_keeps(gate_up: str, down: str) -> None:
    """The offline estimate's record (blocks as stored, gate and up one part) against a bank laid
    out as FTW keeps a GGUF model's experts (runtime/experts/synthetic.random_bank)."""
    from ftpull.recipe_footprint import gguf_expert_stride
    from runtime.experts.synthetic import random_bank

    bank = random_bank(gate_up, 2, 512, 768, down_dtype=down, num_distinct=1)
    assert gguf_expert_stride(512, 768, gate_up, down) == bank.layout.expert_stride


def test_a_gguf_tag_is_planned_with_its_layout_where_the_estimate_meets_the_files_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`ft fit qwen3-30b-a3b:q4_k_m`: offline, and online where the Hub's file size is within 15% of
    the estimate, the plan has the layout (cache slots, KV a token) from the stored config and
    llama.cpp's Q4_K_M tensor types; online with a size far from it, only the size is planned from."""
    monkeypatch.setenv("FT_HOME", str(tmp_path / "ft_home"))
    monkeypatch.setattr(Machine, "probe", staticmethod(lambda: DESKTOP_5090))
    monkeypatch.setattr(hub, "fetch_checkpoint_info", _offline)
    fp = recipe_footprint(resolve("qwen3-30b-a3b:q4_k_m").recipe, name="qwen3-30b-a3b:q4_k_m")
    assert fp.layout_known and fp.kv.bytes_per_token == 96 * 1024 and fp.dtype == "q4_k"
    estimate = fp.dense_bytes + fp.expert_pool_bytes
    assert 16 << 30 < estimate < 19 << 30  # (the released file: 18.6 GB)
    for size, source in ((int(estimate * 1.1), SOURCE), (int(estimate * 1.5), "sizes")):
        monkeypatch.setattr(hub, "fetch_file_sizes",
                            lambda *_a, size=size: (None, {"Qwen3-30B-A3B-Q4_K_M.gguf": size}))
        code, out, err = ft(capsys, "fit", "qwen3-30b-a3b:q4_k_m", "--json")
        assert code == 0, err
        assert json.loads(out)["footprint"]["source"] == source
