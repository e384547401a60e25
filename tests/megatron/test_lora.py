"""LoRA adapters on the Megatron engine: sharded with TP and PP they train exactly as on one
rank, only they train, fresh ones leave the base's outputs alone, the base is the
reference, a checkpoint resumes them exactly (float64, spawned gloo ranks), and the
generation engine gets the base once, then the adapters only, and holds the policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backends.megatron import checkpoint
from backends.megatron.families import get_family
from backends.megatron.sharded_store import FullTensors
from mindrl.config import ModelConfig
from mindrl.config.schema import LoRAConfig
from mindrl.config.specs import model_section_for
from mindrl.planner.params import lora_stage_params
from tests.megatron import cases, lora_cases
from tests.support.spawn import run_ranks
from trainers.export import export_adapter, export_checkpoint
from trainers.export import main as export_main

EXACT = {"rtol": 1e-10, "atol": 1e-12}
#: Another layout in float64: only summation order should differ, yet TP2 log-probs
#: differ from TP1 by up to 4.8e-7 (float32's ulp), the same without adapters: some op
#: on the base model's TP path rounds to float32.
LAYOUT = {"rtol": 1e-6, "atol": 1e-6}

#: A float32 AdamW step against float64's: Adam divides each gradient by its own RMS, so
#: the output adapter's rows of tokens the batch hardly scores (gradients ~1e-7) take a
#: full-size step whose float32 rounding reaches 4e-5.
FLOAT32_ADAM = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lora_ckpt"))
    (one,) = run_ranks(lora_cases.on_one_rank, 1, root)
    two = run_ranks(lora_cases.on_two_ranks, 2, root)
    return one, two


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_a_lora_model_at_two_ranks_trains_exactly_like_one_rank(runs, layout):
    one, two = runs
    reference = one["tp1"]
    for rank in range(2):
        result = two[rank][layout]
        torch.testing.assert_close(result["logprobs"], reference["logprobs"], **LAYOUT)
        cases.assert_same_step(result, reference, tol=LAYOUT, scalar_rel=1e-6)
        for name, weight in reference["policy"].items():
            torch.testing.assert_close(result["policy"][name], weight, **LAYOUT, msg=name)


def test_the_distributed_optimizer_takes_the_adamw_step_on_the_adapters_only(runs):
    one, two = runs
    reference = {**one["tp1"], "policy": {}}  # float64 AdamW at TP=1; this run is float32
    for rank in range(2):
        distributed = two[rank]["tp2_distributed_fp32"]
        weights = {name: w.double() for name, w in distributed["weights"].items()}
        # DDP keeps its grads in its own buffers: the step's result shows them.
        step = {**distributed, "grads": reference["grads"], "weights": weights}
        cases.assert_same_step(step, reference, tol=FLOAT32_ADAM)
        assert distributed["trainable"] == reference["trainable"]
        # Moments (fp32 main weights are views) of this rank's adapters, never the base's.
        assert 0 < distributed["state_numel"] <= 3 * distributed["adapter_numel"]


def test_only_the_adapters_get_gradients_and_optimizer_state(runs):
    one, two = runs
    reference = one["tp1"]
    assert set(reference["grads"]) == set(reference["trainable"])
    assert reference["trainable"] and all(".lora." in n for n in reference["trainable"])
    # 2 layers x 4 linears x (A, B), and the output layer's pair
    assert len(reference["trainable"]) == 2 * 4 * 2 + 2
    # AdamW: two moments shaped as each adapter matrix (and a 0-d step each)
    assert reference["state_numel"] == 2 * reference["adapter_numel"]
    assert reference["state_tensors"] == 3 * 18
    # Per layer, rank 4: qkv 4 x 64 + 128 x 4, proj 4 x 64 + 64 x 4, fc1 4 x 64 + 256 x 4,
    # fc2 4 x 128 + 64 x 4; two layers; the output layer 4 x 64 + 96 (padded vocab) x 4.
    output = 4 * 64 + 96 * 4
    assert reference["trainable_params"] == reference["adapter_numel"] == 2 * 3328 + output
    for layout in ("tp2", "pp2"):
        assert all(".lora." in n for n in two[0][layout]["trainable"])
        assert two[1][layout]["trainable_params"] == reference["trainable_params"]
    # The base did not move: every non-adapter weight after the step is the loaded one.
    for name, weight in one["base"].items():
        torch.testing.assert_close(reference["weights"][name], weight, rtol=0, atol=0, msg=name)


def test_the_planner_counts_exactly_the_adapters_the_engine_trains(runs):
    one, _ = runs
    spec, lora = lora_cases.SPEC, lora_cases.LORA
    model = model_section_for(spec, ModelConfig())
    config = LoRAConfig(rank=lora.rank, targets=list(lora.targets))
    for stage_layers in ([2], [1, 1]):
        stages = lora_stage_params(model, config, stage_layers)
        assert sum(s.total for s in stages) == one["tp1"]["trainable_params"]


def test_the_merged_policy_is_the_base_with_the_adapters_merged_in(runs):
    one, _ = runs
    reference = one["tp1"]
    weights, scale = reference["weights"], lora_cases.LORA.scale
    qkv = "decoder.layers.0.self_attention.linear_qkv"
    merged = weights[f"{qkv}.weight"] + scale * weights[f"{qkv}.lora.B"] @ weights[f"{qkv}.lora.A"]
    torch.testing.assert_close(reference["policy"][f"{qkv}.weight"], merged, **EXACT)
    assert not any(".lora." in name for name in reference["policy"])


def test_the_base_is_handed_over_once_then_only_the_adapters_and_the_engine_is_the_policy(runs):
    _, two = runs
    for rank in two:
        handover = rank["handover"]
        sizes = handover["sizes"]
        # The first hand-over: the whole base (this rank's engine is whole) and the adapters.
        whole = {"bytes": sizes["base"] + sizes["adapters"], "engine_is_policy": True}
        assert handover["first"] == whole
        # After LoRA steps (they moved every adapted weight, the output layer's too): the
        # adapters only, and the engine's weights are exactly the trained policy's (bit
        # for bit in float32).
        assert "output_layer.weight" in handover["moved"] and len(handover["moved"]) == 2 * 4 + 1
        for later in handover["later"]:
            assert later == {"bytes": sizes["adapters"], "engine_is_policy": True}
        assert sizes["adapters"] < sizes["base"] / 10
        # A new base (a checkpoint load, HF weights) is handed over again.
        assert handover["reloaded"] == whole


def test_each_hf_linear_gets_its_rows_of_the_fused_adapter(runs):
    """``lora_to_hf`` (PEFT names): base + scale * B_hf @ A_hf is the merged policy's HF
    weight for q/k/v, o, gate/up/down and lm_head alike."""
    one, _ = runs
    step = one["tp1"]
    family, spec = get_family(lora_cases.SPEC.family), lora_cases.SPEC
    weights = step["weights"]
    base = family.megatron_to_hf({n: w for n, w in weights.items() if ".lora." not in n}, spec)
    merged = family.megatron_to_hf(step["policy"], spec)
    adapters = family.lora_to_hf({n: w for n, w in weights.items() if ".lora." in n}, spec)
    assert {"model.layers.0.self_attn.k_proj", "model.layers.1.mlp.up_proj", "lm_head"} <= set(
        adapters
    )
    for module, (a, b) in adapters.items():
        expected = base[f"{module}.weight"] + lora_cases.LORA.scale * b @ a
        torch.testing.assert_close(merged[f"{module}.weight"], expected, **EXACT)
    assert len(adapters) == 7 * spec.num_layers + 1


def test_an_output_adapter_on_a_tied_model_is_refused(runs):
    one, _ = runs
    assert "lora target 'output'" in one["tied_output"] and "tied" in one["tied_output"]


def test_a_target_that_matches_no_linear_is_refused_at_start_up(runs):
    one, _ = runs
    assert one["unmatched"] is not None
    assert "lora targets ['qkv'] match no linear of this model" in one["unmatched"]
    assert "remove them from actor.lora.targets" in one["unmatched"]


def test_fresh_adapters_leave_the_base_models_log_probs_exactly(runs):
    one, _ = runs
    logprobs = one["logprobs"]
    torch.testing.assert_close(logprobs["fresh"], logprobs["base"], rtol=0, atol=0)
    # What the generation engine gets before any load or step: the base, adapters at zero.
    assert logprobs["as_built_policy_is_base"]


def test_the_actor_with_adapters_off_scores_exactly_as_a_reference_built_from_the_base(runs):
    one, _ = runs
    logprobs = one["logprobs"]
    torch.testing.assert_close(logprobs["off"], logprobs["base"], rtol=0, atol=0)
    assert not torch.allclose(logprobs["on"], logprobs["base"])  # the adapters do act


def test_a_resumed_lora_run_trains_on_exactly_as_the_uninterrupted_run(runs):
    one, _ = runs
    resume = one["resume"]
    assert resume["resumed"] == pytest.approx(resume["uninterrupted"][2:], rel=1e-12)


def test_a_lora_checkpoint_resumed_at_tp2_on_a_base_drawn_there_trains_on_as_at_tp1(runs):
    one, two = runs
    uninterrupted = one["resume"]["uninterrupted"][2:]
    for rank in range(2):
        assert two[rank]["resumed_at_tp2"] == pytest.approx(uninterrupted, rel=1e-6)


def test_a_lora_step_holds_the_adapters_and_their_moments_and_the_base_lies_once_beside_it(
    runs,
):
    one, _ = runs
    step_dir = Path(one["resume"]["step_dir"])
    adapters = set(one["tp1"]["trainable"])
    saved = FullTensors(step_dir / checkpoint.SHARDS, "")
    assert {n.removeprefix("model/") for n in saved if n.startswith("model/")} == adapters
    assert {n.split("/", 2)[2] for n in saved if n.startswith("optim/")} == adapters
    base_dir = step_dir.parent / checkpoint.BASE
    assert checkpoint.open_checkpoint(step_dir).meta["base_weights"] == checkpoint.BASE
    base = FullTensors(base_dir / checkpoint.SHARDS, "model/")
    assert set(base) == set(one["base"])
    for name, weight in one["base"].items():  # the base as loaded, unpadded vocabulary rows
        torch.testing.assert_close(base[name], weight[: base[name].shape[0]], rtol=0, atol=0)
    step_bytes = _bytes(step_dir / checkpoint.SHARDS)
    # Adapters (7296 elements) and two moments, float64, against the 86k-element base.
    assert step_bytes < 0.3 * _bytes(base_dir / checkpoint.SHARDS)
    # A base with a source of its own (an HF folder) is not written at all.
    hf_origin = Path(one["resume"]["hf_origin_step_dir"])
    assert checkpoint.open_checkpoint(hf_origin).meta["base_weights"] is None
    assert not (hf_origin.parent / checkpoint.BASE).exists()


def test_a_fresh_lora_run_into_a_folder_another_run_used_replaces_its_base(runs):
    one, _ = runs
    rerun = Path(one["resume"]["step_dir"]).parent / lora_cases.RERUN
    base = FullTensors(rerun / checkpoint.BASE / checkpoint.SHARDS, "model/")
    fresh = one["resume"]["fresh_base"]
    fc2 = "decoder.layers.0.mlp.linear_fc2.weight"
    assert not torch.equal(fresh[fc2], one["base"][fc2])  # the two runs' bases differ
    for name in base:
        torch.testing.assert_close(base[name], fresh[name][: base[name].shape[0]], rtol=0, atol=0)


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*.safetensors"))


def test_a_lora_checkpoint_names_its_adapters_and_base_and_resumes_on_that_base_only(runs):
    one, _ = runs
    resume = one["resume"]
    step_dir = Path(resume["step_dir"])
    meta = checkpoint.open_checkpoint(step_dir).meta
    targets = lora_cases.LORA.targets
    assert meta["lora"] == {"rank": 4, "alpha": 8.0, "dropout": 0.0, "targets": targets}
    assert meta["base"] == lora_cases.BASE
    saved = FullTensors(step_dir / checkpoint.SHARDS, "")
    qkv = "decoder.layers.1.self_attention.linear_qkv.lora"
    assert saved[f"optim/exp_avg/{qkv}.B"].abs().sum() > 0  # the adapters' moments
    assert "optim/exp_avg/decoder.layers.1.self_attention.linear_qkv.weight" not in saved
    other_base, full_weights = resume["refusals"]
    assert "trained adapters on base" in other_base and "/elsewhere" in other_base
    assert "holds lora" in full_weights and "set actor.lora" in full_weights


def exported_and_merged_policy(resume: dict, step_dir: str, out_dir: Path) -> tuple[dict, dict]:
    """The HF export of ``step_dir`` and the merged policy it should be, both HF-named."""
    exported = load_file(export_checkpoint(step_dir, out_dir) / "model.safetensors")
    family = get_family(lora_cases.SPEC.family)
    return exported, family.megatron_to_hf(resume["policy"], lora_cases.SPEC)


def test_the_hf_export_of_a_lora_checkpoint_is_the_merged_policy(runs, tmp_path):
    one, _ = runs
    resume = one["resume"]
    exported, expected = exported_and_merged_policy(resume, resume["step_dir"], tmp_path / "hf")
    assert exported.keys() == expected.keys()
    for name, weight in expected.items():
        torch.testing.assert_close(exported[name], weight, **EXACT, msg=name)


def test_the_hf_export_of_a_lora_checkpoint_reads_a_base_named_by_its_hf_folder(runs, tmp_path):
    one, _ = runs
    resume = one["resume"]
    step_dir = resume["hf_origin_step_dir"]
    exported, expected = exported_and_merged_policy(resume, step_dir, tmp_path / "hf")
    for name, weight in expected.items():
        torch.testing.assert_close(exported[name], weight, **EXACT, msg=name)


def test_mindrl_export_writes_a_peft_adapter_folder_naming_the_base_it_wrote(runs, tmp_path):
    one, _ = runs
    out = tmp_path / "hf_adapter"
    assert export_main([one["resume"]["step_dir"], str(out), "--adapter"]) == 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (4, 8.0, 0.0)
    assert config["target_modules"] == [
        "down_proj", "gate_proj", "k_proj", "lm_head", "o_proj", "q_proj", "up_proj", "v_proj",
    ]  # fmt: skip
    assert (config["bias"], config["fan_in_fan_out"]) == ("none", False)
    # A random-init base has no HF folder of its own: written beside the adapter folder.
    assert config["base_model_name_or_path"] == str((tmp_path / "hf_base").resolve())
    assert (tmp_path / "hf_base" / "config.json").is_file()
    keys = load_file(out / "adapter_model.safetensors").keys()
    assert "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight" in keys
    assert len(keys) == 2 * (7 * lora_cases.SPEC.num_layers + 1)


def test_the_peft_adapter_of_a_base_loaded_from_an_hf_folder_names_that_folder(runs, tmp_path):
    one, _ = runs
    step_dir = Path(one["resume"]["hf_origin_step_dir"])
    out = export_adapter(step_dir, tmp_path / "hf_adapter")
    config = json.loads((out / "adapter_config.json").read_text())
    hf_folder = step_dir.parent.parent / lora_cases.HF_BASE
    assert config["base_model_name_or_path"] == str(hf_folder.resolve())
    assert not (tmp_path / "hf_base").exists()  # it has one: none is written


def test_a_peft_adapter_on_its_base_scores_as_the_merged_hf_export(runs, tmp_path):
    peft = pytest.importorskip("peft", reason="the test extra installs peft")
    from transformers import AutoModelForCausalLM

    one, _ = runs
    step_dir = one["resume"]["step_dir"]
    adapter = export_adapter(step_dir, tmp_path / "hf_adapter", tmp_path / "base")
    merged = export_checkpoint(step_dir, tmp_path / "hf")
    base_dir = json.loads((adapter / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(
        base_dir["base_model_name_or_path"], dtype=torch.float32
    )
    with_adapter = peft.PeftModel.from_pretrained(base, adapter).eval()
    merged_model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    ids = torch.randint(0, lora_cases.SPEC.vocab_size, (2, 10), generator=torch.Generator())
    with torch.no_grad():
        expected = merged_model(ids).logits
        logits = with_adapter(ids).logits
        with with_adapter.disable_adapter():
            base_logits = with_adapter(ids).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(base_logits, expected, rtol=1e-3, atol=1e-3)  # adapters act
