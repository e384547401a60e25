"""A role's section becomes the engine's ``OptimSpec`` and ``ParallelSpec`` (workers/roles.py)."""

from __future__ import annotations

from backends.megatron import ParallelSpec
from mindrl.config import load_config
from mindrl.config.schema import OptimConfig
from mindrl.workers.roles import optim_spec, parallel_spec
from trainers.driver.cli import DEFAULT_CONFIG
from trainers.registry import get_algorithm


def test_the_distributed_optimizer_is_off_by_default_and_reaches_the_engine_when_set():
    assert OptimConfig().distributed_optimizer is False
    default = load_config(DEFAULT_CONFIG, [], algorithm=get_algorithm("grpo"))
    assert not optim_spec(default.actor, total_steps=10).distributed_optimizer
    config = load_config(
        DEFAULT_CONFIG,
        ["actor.optim.distributed_optimizer=true", "actor.optim.adam_eps=1e-6"],
        algorithm=get_algorithm("grpo"),
    )
    spec = optim_spec(config.actor, total_steps=10)
    assert spec.distributed_optimizer and spec.eps == 1e-6 and spec.total_steps == 10
    assert not optim_spec(config.critic, total_steps=10).distributed_optimizer


def test_a_roles_layout_and_activation_checkpointing_reach_the_engine():
    config = load_config(
        DEFAULT_CONFIG,
        ["actor.activation_checkpointing=true", "actor.parallel.tp=2", "critic.parallel.tp=2"],
        algorithm=get_algorithm("ppo"),
    )
    assert parallel_spec(config.actor) == ParallelSpec(tp=2, activation_checkpointing=True)
    assert parallel_spec(config.critic) == ParallelSpec(tp=2)
