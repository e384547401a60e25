"""LoRA adapters on the Megatron engine: sharded with TP and PP they train exactly as on one
rank, only they train, fresh ones leave the base's outputs alone, the base is the
reference, a checkpoint resumes them exactly (float64, spawned gloo ranks), and the
generation engine gets the base once, then the adapters only, and holds the policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backends.megatron import checkpoint
from backends.megatron.families import get_family
from backends.megatron.sharded_store import FullTensors
from tests.megatron import cases, lora_cases
from tests.support.spawn import run_ranks
from trainers.export import export_checkpoint

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
    two = run_ranks(lora_cases.on_two_ranks, 2)
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


def test_the_hf_export_of_a_lora_checkpoint_is_the_merged_policy(runs, tmp_path):
    one, _ = runs
    resume = one["resume"]
    out = export_checkpoint(resume["step_dir"], tmp_path / "hf")
    exported = load_file(out / "model.safetensors")
    family = get_family(lora_cases.SPEC.family)
    expected = family.megatron_to_hf(resume["policy"], lora_cases.SPEC)
    assert exported.keys() == expected.keys()
    for name, weight in expected.items():
        torch.testing.assert_close(exported[name], weight, **EXACT, msg=name)
