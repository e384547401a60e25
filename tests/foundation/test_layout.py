"""The layout module decides a run's mode, devices and layouts once; the run plan holds
them; one validator owns the layout rules; one matrix says what combines with what."""

from __future__ import annotations

import pytest

from mindrl.config import load_config
from mindrl.config.compat import FEATURES, NOT_YET_SUPPORTED, RunFacts, unsupported_combinations
from mindrl.config.layout import layout_problems, resolve_layout
from mindrl.run_plan import build_run_plan
from trainers.registry import get_algorithm

TINY = "configs/tiny.yaml"


def plan_of(recipe: str, trainer: str, *overrides: str):
    algorithm = get_algorithm(trainer)
    return build_run_plan(algorithm, load_config(recipe, list(overrides), algorithm))


def test_the_plan_holds_every_model_roles_resolved_layout_in_plan_order():
    plan = plan_of("configs/qwen3_30b_a3b.yaml", "ppo", "algorithm.kl_coef=0.001")
    assert tuple(plan.layout.training) == plan.model_roles == ("actor", "reference", "critic")
    actor = plan.layout.training["actor"]
    assert (actor.world, actor.tp, actor.ep, actor.dp, actor.edp) == (16, 4, 4, 4, 4)
    assert actor.stage_layers == (48,)
    generation = plan.layout.generation
    assert (generation.world, generation.tp, generation.ep, generation.dp) == (16, 4, 4, 4)


def test_a_pipeline_layout_lists_each_stages_layers():
    plan = plan_of("configs/deepseek671b.yaml", "grpo")
    actor = plan.layout.training["actor"]
    assert (actor.tp, actor.pp, actor.ep, actor.etp, actor.dp, actor.edp) == (4, 6, 16, 2, 16, 2)
    assert sum(actor.stage_layers) == 61 and len(actor.stage_layers) == 6


def test_every_layout_rule_a_config_breaks_is_one_line_from_the_one_validator():
    config = load_config(TINY, [])
    config.actor.parallel.tp = 3  # the loader would refuse it: build the broken layout here
    config.rollout.tp = 4
    layout = resolve_layout(config, ("actor",))
    assert layout.training["actor"].dp == 0  # 3 does not divide the 2 devices
    assert layout_problems(layout, config) == [
        "actor.parallel: tp*cp*pp = 3*1*1 = 3 does not divide the world size 2 "
        "(resources.nodes * resources.devices_per_node)",
        "actor.parallel.tp: 3 does not divide model.num_attention_heads 2",
        "actor.parallel.tp: 3 does not divide model.num_kv_heads 2",
        "actor.parallel.tp: 3 does not divide model.ffn_hidden_size 256",
        "rollout.tp: 4 does not divide the world size 2",
        "rollout.tp: 4 does not divide model.num_attention_heads 2",
        "rollout.tp: 4 does not divide model.num_kv_heads 2 (the resharder splits qkv by "
        "whole query groups; KV-head replication is not supported yet)",
        "rollout.tp: generation TP 4 and actor.parallel.tp 3 must be multiples of one another "
        "so each generation shard is a run of training shards",
    ]


def test_the_matrix_names_only_features_it_defines_and_every_row_has_a_way_out():
    for feature, limits in NOT_YET_SUPPORTED.items():
        assert feature in FEATURES and set(limits.without) <= set(FEATURES)
        assert limits.instead.endswith("for it")


def test_a_run_using_two_limited_features_hears_from_both_rows_in_one_line_each():
    algorithm = get_algorithm("grpo")
    config = load_config(TINY, ["rollout.partial_rollout_budget=2"], algorithm)
    config.rollout.placement, config.rollout.devices = "disaggregated", 1
    config.dock.pipeline = "stream"
    facts = RunFacts(config, algorithm, resolve_layout(config, ("actor",)))
    assert unsupported_combinations("disaggregated", facts) == [
        "rollout.placement: disaggregated with dock.pipeline: stream is not yet supported; "
        "use rollout.placement: collocated for it"
    ]
    assert unsupported_combinations("partial rollout", facts) == [
        "rollout.partial_rollout_budget=2 with rollout.placement: disaggregated is not yet "
        "supported; remove rollout.partial_rollout_budget for it",
        "rollout.partial_rollout_budget=2 with dock.pipeline: stream is not yet supported; "
        "remove rollout.partial_rollout_budget for it",
    ]


@pytest.mark.parametrize(
    ("trainer", "overrides", "mode", "runner"),
    [
        ("grpo", (), "collocated", "online"),
        ("grpo", ("dock.pipeline=stream",), "collocated", "online"),
        ("grpo", ("rollout.partial_rollout_budget=2",), "collocated", "partial_rollout"),
        (
            "grpo",
            (
                "rollout.placement=disaggregated",
                "rollout.devices=1",
                "actor.parallel.tp=1",
                "reference.parallel.tp=1",
            ),
            "disaggregated",
            "disaggregated",
        ),
    ],
)
def test_the_mode_and_its_runner_are_decided_once_in_the_plan(trainer, overrides, mode, runner):
    plan = plan_of(TINY, trainer, *overrides)
    assert (plan.mode, plan.runner, plan.layout.mode) == (mode, runner, mode)
