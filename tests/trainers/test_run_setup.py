"""Start-up arithmetic of trainers/driver/setup.py that needs no Ray."""

from __future__ import annotations

from mindrl.config import load_config
from trainers.driver.cli import DEFAULT_CONFIG
from trainers.driver.setup import _updates_per_iteration
from trainers.registry import get_algorithm


def test_each_role_schedules_its_learning_rate_over_its_own_optimizer_steps():
    config = load_config(
        DEFAULT_CONFIG,
        ["actor.mini_batch_size=8", "critic.mini_batch_size=4", "critic.ppo_epochs=2"],
        algorithm=get_algorithm("ppo"),
    )
    # 16 prompts per iteration: the actor steps 16 / 8 = 2 times, the critic 2 x 16 / 4 = 8.
    assert _updates_per_iteration(config, "actor") == 2
    assert _updates_per_iteration(config, "critic") == 8
