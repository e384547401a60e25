"""A tiny random DeepSeek-V3 scores tokens like transformers at every layout and trains
at TP2 x EP2 exactly like one rank.

Reference: ``DeepseekV3ForCausalLM`` (fp32) with the same weights (see
``deepseek_cases``): MLA with a low-rank or full-rank query, YaRN rope with mscale,
sigmoid routing over 4 expert groups with a non-zero expert bias, a shared expert and a
dense first layer.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.megatron import cases
from tests.megatron import deepseek_cases as ds
from tests.support.spawn import run_ranks

#: Megatron vs transformers, fp32, same CPU: only the summation order differs.
HF_TOL = {"rtol": 0.0, "atol": 1e-4}


@pytest.fixture(scope="module")
def runs():
    (one,) = run_ranks(ds.one_rank, 1, timeout_s=600)
    two = run_ranks(ds.two_ranks, 2, timeout_s=600)
    return one, two


@pytest.fixture(scope="module")
def reference():
    """transformers' log-probs of the same tokens, per query kind."""
    return {
        label: ds.hf_logprobs(ds.tiny_model(rank), ds.tokens()) for label, rank in ds.Q_LORA.items()
    }


def test_the_expert_bias_changes_which_experts_the_reference_picks(reference):
    model = ds.tiny_model()
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.zero_()
    unbiased = ds.hf_logprobs(model, ds.tokens())
    assert (unbiased - reference["q_lora"]).abs().max() > 1e-3


@pytest.mark.parametrize("query", list(ds.Q_LORA))
def test_one_rank_log_probs_equal_transformers(runs, reference, query):
    one, _ = runs
    torch.testing.assert_close(one["tp1"][query], reference[query], **HF_TOL)


@pytest.mark.parametrize(
    ("layout", "query"),
    [(name, q) for name, (_, queries) in ds.TWO_RANK_LAYOUTS.items() for q in queries],
)
def test_two_rank_log_probs_equal_transformers(runs, reference, layout, query):
    _, two = runs
    for rank in range(2):
        torch.testing.assert_close(two[rank][layout][query], reference[query], **HF_TOL)


def test_one_training_step_at_tp2_ep2_equals_one_rank(runs):
    one, two = runs
    for rank in range(2):
        cases.assert_same_step(two[rank]["step"], one["step"])


def test_mla_and_router_parameters_report_their_layouts_for_the_resharder(runs):
    _, two = runs
    layouts = two[0]["step"]["layouts"]
    attn = "decoder.layers.0.self_attention."
    assert layouts[attn + "linear_q_down_proj.weight"].full_shape == (32, 64)
    assert layouts[attn + "linear_kv_down_proj.weight"].full_shape == (38, 64)  # latent + rope
    assert layouts[attn + "linear_kv_up_proj.weight"].full_shape == (4 * (16 + 16), 30)
    for name in ("linear_q_up_proj", "linear_kv_up_proj"):  # split by heads
        assert layouts[f"{attn}{name}.weight"].kind == "column"
    assert layouts[attn + "linear_proj.weight"].kind == "row"
    for name in ("linear_q_down_proj", "linear_kv_down_proj", "q_layernorm", "kv_layernorm"):
        assert layouts[f"{attn}{name}.weight"].kind == "replicated"
    router = layouts["decoder.layers.1.mlp.router.weight"]
    assert (router.kind, router.full_shape) == ("replicated", (8, 64))
    experts = {lay.expert_index for lay in layouts.values() if lay.is_expert}
    assert experts == {0, 1, 2, 3}  # EP rank 0 of 2 holds the first half of 8 experts
    bias = layouts["decoder.layers.1.mlp.router.expert_bias"]  # a buffer, moved like a weight
    assert (bias.kind, bias.full_shape) == ("replicated", (8,))
    assert two[0]["step"]["weights"]["decoder.layers.1.mlp.router.expert_bias"].abs().sum() > 0


def test_the_planner_counts_the_parameters_the_engine_builds(runs):
    from mindrl.config.schema import ModelConfig
    from mindrl.config.specs import model_section_for
    from mindrl.planner.params import model_params

    one, _ = runs
    spec = ds.FAMILY.spec_from_hf_config(ds.tiny_config().to_dict())
    planned = model_params(model_section_for(spec, ModelConfig()))
    built = {name: math.prod(layout.full_shape) for name, layout in one["step"]["layouts"].items()}
    experts = [name for name, layout in one["step"]["layouts"].items() if layout.is_expert]
    assert planned.expert == sum(built[name] for name in experts)
    biases = [name for name in built if name.endswith("router.expert_bias")]  # 8 per MoE layer
    assert planned.total == sum(built.values()) - sum(built[name] for name in biases)
