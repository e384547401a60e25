"""A role's ``optim`` section becomes the engine's ``OptimSpec`` (mindrl/workers/roles.py)."""

from __future__ import annotations

from mindrl.config import load_config
from mindrl.config.schema import OptimConfig
from mindrl.workers.roles import optim_spec
from trainers.cli import DEFAULT_CONFIG


def test_the_distributed_optimizer_is_off_by_default_and_reaches_the_engine_when_set():
    assert OptimConfig().distributed_optimizer is False
    default = load_config(DEFAULT_CONFIG, [], trainer="grpo")
    assert not optim_spec(default.actor, total_steps=10).distributed_optimizer
    config = load_config(
        DEFAULT_CONFIG,
        ["actor.optim.distributed_optimizer=true", "actor.optim.adam_eps=1e-6"],
        trainer="grpo",
    )
    spec = optim_spec(config.actor, total_steps=10)
    assert spec.distributed_optimizer and spec.eps == 1e-6 and spec.total_steps == 10
    assert not optim_spec(config.critic, total_steps=10).distributed_optimizer
