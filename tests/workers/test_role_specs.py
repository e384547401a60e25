"""A role's section and resolved layout become the engine's ``OptimSpec`` and
``ParallelSpec`` (mindrl/config/specs.py), field for field."""

from __future__ import annotations

import dataclasses

from backends.megatron import OptimSpec, ParallelSpec
from mindrl.config import load_config
from mindrl.config.schema import OptimConfig
from mindrl.config.specs import engine_specs, optim_spec, parallel_spec
from mindrl.run_plan import build_run_plan
from trainers.driver.cli import DEFAULT_CONFIG
from trainers.registry import get_algorithm


def test_the_distributed_optimizer_is_off_by_default_and_reaches_the_engine_when_set():
    assert OptimConfig().distributed_optimizer is False
    default = load_config(DEFAULT_CONFIG, [], algorithm=get_algorithm("grpo"))
    assert not optim_spec(default.actor.optim, total_steps=10).distributed_optimizer
    config = load_config(
        DEFAULT_CONFIG,
        ["actor.optim.distributed_optimizer=true", "actor.optim.adam_eps=1e-6"],
        algorithm=get_algorithm("grpo"),
    )
    spec = optim_spec(config.actor.optim, total_steps=10)
    assert spec.distributed_optimizer and spec.adam_eps == 1e-6 and spec.total_steps == 10
    assert not optim_spec(config.critic.optim, total_steps=10).distributed_optimizer


def test_every_optimizer_setting_has_the_engines_name_and_reaches_it():
    optim = OptimConfig(lr=3e-4, lr_schedule="cosine", lr_warmup_steps=5, adam_beta2=0.95)
    spec = optim_spec(optim, total_steps=100)
    assert {f.name for f in dataclasses.fields(OptimSpec)} == {
        f.name for f in dataclasses.fields(OptimConfig)
    } | {"total_steps"}
    assert (spec.lr, spec.lr_schedule, spec.lr_warmup_steps, spec.adam_beta2) == (
        3e-4,
        "cosine",
        5,
        0.95,
    )


def test_a_roles_layout_and_activation_checkpointing_reach_the_engine():
    config = load_config(
        DEFAULT_CONFIG,
        ["actor.activation_checkpointing=true", "actor.parallel.tp=2", "critic.parallel.tp=2"],
        algorithm=get_algorithm("ppo"),
    )
    layout = build_run_plan(get_algorithm("ppo"), config).layout
    assert parallel_spec(layout.training["actor"]) == ParallelSpec(
        tp=2, activation_checkpointing=True
    )
    assert parallel_spec(layout.training["critic"]) == ParallelSpec(tp=2)


def test_the_reference_gets_no_optimizer_and_a_trained_role_one_over_its_steps():
    config = load_config(DEFAULT_CONFIG, ["algorithm.kl_coef=0.1"], get_algorithm("grpo"))
    layout = build_run_plan(get_algorithm("grpo"), config).layout
    reference = engine_specs(config.reference, layout.training["reference"], None)
    actor = engine_specs(config.actor, layout.training["actor"], 200)
    assert reference.optim is None and reference.parallel == ParallelSpec(tp=2)
    assert actor.optim.total_steps == 200 and actor.optim.lr == config.actor.optim.lr
