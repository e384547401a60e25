"""A checkpoint's config.json decides the architecture before the layout checks run."""

from __future__ import annotations

import json

import pytest

from mindrl.config import load_config
from mindrl.config.loader import ConfigError
from tests.megatron.deepseek_cases import tiny_config

TINY = "configs/tiny.yaml"


def checkpoint_folder(tmp_path, **changes) -> str:
    """An HF folder holding only a tiny DeepSeek-V3 config.json (all validation reads)."""
    config = tiny_config().to_dict() | {"architectures": ["DeepseekV3ForCausalLM"]} | changes
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_expert_parallelism_is_accepted_for_a_deepseek_checkpoint_the_recipe_calls_dense(
    tmp_path,
):
    overrides = [f"model.hf_path={checkpoint_folder(tmp_path)}", "actor.parallel.ep=2"]
    model = load_config(TINY, overrides).model
    assert (model.family, model.num_experts, model.first_k_dense_layers) == ("deepseek_v3", 8, 1)
    assert (model.kv_lora_rank, model.q_lora_rank, model.moe_router_groups) == (30, 32, 4)
    assert model.num_layers == 3 and model.rope_yarn_factor == 4.0


def test_a_checkpoint_the_family_cannot_build_is_refused_in_one_line_naming_the_field(tmp_path):
    folder = checkpoint_folder(tmp_path, rope_interleave=False)
    with pytest.raises(ConfigError) as refused:
        load_config(TINY, [f"model.hf_path={folder}"])
    assert len(refused.value.problems) == 1
    assert "model.hf_path" in str(refused.value) and "rope_interleave=false" in str(refused.value)
    assert "\n" not in str(refused.value)
