"""Continuous generation (``rollout.continuous``) in the run plan: which runner, the pool
the dock holds, the per-token versions the rollout writes, and the one-line refusals."""

from __future__ import annotations

import pytest

from mindrl.config import load_config
from mindrl.config.layout import DISAGGREGATED
from mindrl.run_plan import CONTINUOUS, build_run_plan
from tests.foundation.plans import DISAGGREGATED as SPLIT
from tests.foundation.plans import config_and_plan
from tests.foundation.test_placement import TINY, problems_of
from trainers.driver.continuous import streamed_stages
from trainers.registry import get_algorithm

GRPO = get_algorithm("grpo")


def plan_of(*overrides: str):
    return build_run_plan(GRPO, load_config(TINY, list(overrides), algorithm=GRPO))


def test_continuous_generation_runs_its_own_runner_over_a_pool_of_staleness_plus_one_batches():
    plan = plan_of(*SPLIT, "rollout.continuous=true", "rollout.max_staleness=2")
    assert (plan.mode, plan.runner) == (DISAGGREGATED, CONTINUOUS)
    assert plan.dock_groups == 3 * 16  # (max_staleness + 1) x data.global_batch_size
    assert plan.tokens_may_lag
    assert plan.stage("rollout").writes == ("response_ids", "rollout_logprob", "rollout_version")


def test_on_policy_continuous_is_the_on_policy_run():
    continuous = plan_of(*SPLIT, "rollout.continuous=true", "rollout.max_staleness=0")
    today = plan_of(*SPLIT, "rollout.max_staleness=0")
    assert continuous.runner == today.runner == DISAGGREGATED
    assert continuous.dock_groups == today.dock_groups == 16
    # Nothing lags on-policy: no per-token versions moved through the dock.
    assert continuous.stage("rollout").writes == ("response_ids", "rollout_logprob")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rollout.continuous=true"],
            "rollout.continuous needs rollout.placement: disaggregated",
        ),
        (
            [*SPLIT, "rollout.continuous_slots=64"],
            "rollout.continuous_slots=64 needs rollout.continuous: true",
        ),
    ],
)
def test_continuous_settings_without_what_they_need_are_refused_in_one_line(overrides, message):
    (problem,) = problems_of(overrides)
    assert message in problem


@pytest.mark.parametrize(
    ("trainer", "streamed"),
    [
        ("grpo", ["reward", "ref_logp", "advantage"]),
        ("rloo", ["reward", "ref_logp", "advantage"]),
        # PPO's advantages read the critic's values, scored only for the groups an update
        # keeps; REINFORCE++ whitens over the whole batch.
        ("ppo", ["reward", "ref_logp"]),
        ("reinforce_pp", ["reward", "ref_logp"]),
    ],
)
def test_group_local_advantages_are_computed_as_groups_finish(trainer, streamed):
    overrides = (*SPLIT, "rollout.continuous=true", "rollout.max_staleness=1")
    _, plan = config_and_plan(trainer, *overrides, "algorithm.kl_coef=0.001")
    assert streamed_stages(plan) == streamed
