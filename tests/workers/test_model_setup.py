"""The HF config the generation engine is built from matches the training engine's spec."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from mindrl.config import load_config
from mindrl.config.specs import gpt_spec
from mindrl.workers.model_setup import hf_config_for, pretrained_config
from trainers.driver.cli import DEFAULT_CONFIG


@pytest.mark.parametrize(
    ("overrides", "biased"),
    [
        (["model.qkv_bias=true"], True),
        ([], False),
        (["model.family=qwen2", "model.qkv_bias=true"], True),
        (["model.family=qwen3", "model.qk_layernorm=true"], False),
    ],
    ids=["llama-bias", "llama", "qwen2", "qwen3"],
)
def test_the_generation_model_has_qkv_biases_exactly_when_the_spec_does(overrides, biased):
    spec = gpt_spec(load_config(DEFAULT_CONFIG, overrides).model)
    model = AutoModelForCausalLM.from_config(pretrained_config(hf_config_for(spec)))
    names = {name for name, _ in model.named_parameters()}
    assert spec.add_qkv_bias is biased
    assert ("model.layers.0.self_attn.q_proj.bias" in names) is biased
    assert ("model.layers.0.self_attn.v_proj.bias" in names) is biased


def test_a_deepseek_v3_section_builds_mla_and_deepseek_routing_for_both_engines():
    from mindrl.workers.model_setup import initial_model

    initial = initial_model(load_config("configs/tiny_deepseek.yaml").model)
    spec = initial.spec
    assert (spec.q_lora_rank, spec.kv_lora_rank, spec.moe_layers) == (64, 64, (1,))
    assert (spec.moe_router_num_groups, spec.moe_router_group_topk) == (4, 2)
    assert spec.moe_router_score_function == "sigmoid" and spec.yarn[0] == 4.0
    model = AutoModelForCausalLM.from_config(pretrained_config(initial.hf_config))
    names = dict(model.state_dict())
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in names
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names  # the dense first layer
