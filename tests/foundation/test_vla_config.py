"""``model.family: vla``: its options reach the engine's VLASpec, and what it cannot run
yet (a text task, pipeline and context parallelism, LoRA) is refused at load, one line each."""

from __future__ import annotations

import pytest

from backends.megatron.families.vla import VLASpec
from mindrl.config import ConfigError, load_config
from mindrl.config.specs import gpt_spec, vla_spec
from trainers.registry import get_algorithm

TINY = "configs/tiny.yaml"
VLA = ["model.family=vla", "model.vocab_size=281"]


def problems_of(overrides: list[str], algorithm=None) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_config(TINY, VLA + overrides, algorithm=algorithm)
    return [p.removeprefix(f"{TINY}: ") for p in err.value.problems]


def test_the_vla_options_reach_the_engine_under_the_same_names():
    options = [
        "model.vla.image_size=48",
        "model.vla.patch_size=12",
        "model.vla.state_dim=5",
        "model.vla.action_dims=7",
        "model.vla.chunk_size=3",
        "model.vla.decode=parallel",
        "model.vla.keypoints=4",
        "model.vla.action_head=gaussian",
    ]
    model = load_config(TINY, VLA + options).model
    assert vla_spec(model) == VLASpec(
        image_size=48,
        patch_size=12,
        keypoints=4,
        state_dim=5,
        action_dims=7,
        chunk_size=3,
        decode="parallel",
        action_head="gaussian",
    )
    assert vla_spec(model, reward_level="action").values_per_chunk == 3  # a value per action
    assert gpt_spec(model).family == "vla"


def test_a_value_head_of_neither_one_value_per_chunk_nor_one_per_action_is_refused():
    line = r"values_per_chunk=2: one value per chunk \(1\) or per action \(3\)"
    with pytest.raises(ValueError, match=line):
        VLASpec(chunk_size=3, values_per_chunk=2)


def test_a_training_run_of_the_vla_family_on_a_text_task_is_refused_in_one_line():
    assert problems_of([], get_algorithm("grpo")) == [
        "model.family=vla acts in simulators: it trains with env.kind=embodied (an env.cls "
        "VectorEnv); set them, or choose a text model family"
    ]


def test_a_patch_that_does_not_divide_the_image_and_a_vocabulary_without_text_are_refused():
    assert problems_of(["model.vla.patch_size=5", "model.vocab_size=256"]) == [
        "model.vla.patch_size=5 does not divide model.vla.image_size=32; choose a patch "
        "size that divides it",
        "model.vocab_size=256 leaves no ids for the instruction: the last 256 ids of a vla "
        "model are action bins; set it to the tokenizer's size + 256",
    ]


def test_an_unknown_decode_is_refused_naming_the_choices():
    (problem,) = problems_of(["model.vla.decode=beam"])
    assert "model.vla.decode" in problem and "autoregressive" in problem and "parallel" in problem


def test_context_parallelism_with_the_vla_family_is_refused_in_one_line():
    problems = problems_of(["resources.devices_per_node=4", "actor.parallel.cp=2"])
    assert (
        "actor.parallel.cp=2 with a vision-language-action model (image and state tokens "
        "in its rows) is not supported yet; set actor.parallel.cp=1"
    ) in problems


def test_pipeline_parallelism_with_the_vla_family_is_refused_in_one_line():
    problems = problems_of(["resources.devices_per_node=4", "actor.parallel.pp=2"])
    assert (
        "actor.parallel.pp=2 with model.family=vla is not supported yet (its image and "
        "state tokens are built on one stage); set actor.parallel.pp=1"
    ) in problems


def test_lora_with_the_vla_family_is_refused_in_one_line():
    assert problems_of(["actor.lora.rank=4"]) == [
        "actor.lora with model.family=vla is not supported yet (no adapters on its image, "
        "state and value heads); set actor.lora.rank=0"
    ]


def test_a_value_lr_without_a_value_head_on_the_policy_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["actor.optim.value_lr=1e-3", "critic.optim.value_lr=1e-3"])
    assert [p.removeprefix(f"{TINY}: ") for p in err.value.problems] == [
        "actor.optim.value_lr applies to a value head on the policy (model.family=vla); a "
        "llama policy has none: remove it (critic.optim.lr sets a critic's)",
        "critic.optim.value_lr: a critic learns values with all its weights; set "
        "critic.optim.lr instead",
    ]
