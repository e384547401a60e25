"""The run plan: one table of stages that the dock, the loop, the planner and start-up read."""

from __future__ import annotations

import pytest

from mindrl import run_plan
from mindrl.config import load_config
from mindrl.data.records import RECORD_FIELDS
from mindrl.planner.report import build_plan, response_fields
from mindrl.run_plan import PROMPT_FIELDS, SEQUENCE, build_run_plan
from trainers.registry import get_algorithm

GIB = 2**30


def plan_for(trainer: str, *overrides: str):
    algorithm = get_algorithm(trainer)
    return build_run_plan(algorithm, load_config(None, list(overrides), algorithm=algorithm))


def test_grpo_with_one_step_per_iteration_runs_no_old_logprob_stage():
    plan = plan_for("grpo")
    assert plan.stage_names == ("rollout", "reward", "ref_logp", "advantage", "update")
    assert plan.model_roles == ("actor", "reference")
    assert plan.stage("update").reads == (*SEQUENCE, "advantages", "rollout_logprob", "ref_logprob")


def test_two_minibatches_add_the_old_logprob_stage_and_the_update_reads_it():
    plan = plan_for("grpo", "data.global_batch_size=4", "actor.mini_batch_size=2")
    assert plan.needs_old_logprob
    assert plan.stage("old_logp").role == "actor"
    assert plan.scoring_stages() == ("ref_logp", "old_logp")
    assert "old_logprob" in plan.stage("update").reads


def test_ppo_adds_the_critic_stages_and_its_advantages_read_values_and_write_returns():
    plan = plan_for("ppo")
    assert plan.stage_names == (
        "rollout", "reward", "ref_logp", "values", "advantage", "update", "critic_update",
    )  # fmt: skip
    assert plan.stage("advantage").reads == ("reward", "response_ids", "group_id", "values")
    assert plan.stage("advantage").writes == ("advantages", "returns")
    assert plan.model_roles == ("actor", "reference", "critic")
    assert plan.scoring_stages() == ("ref_logp", "values")


def test_the_rewards_read_the_record_and_a_reward_model_also_reads_the_prompt():
    record = ("uid", "text", "prompt", "answer", "domain", "meta")
    assert plan_for("grpo").stage("reward").reads == ("response_ids", *record)
    with_model = plan_for("grpo", "reward.reward_model=some/model")
    assert with_model.stage("reward").reads == ("response_ids", *record, "prompt_ids")


def test_the_driver_puts_each_prompt_with_its_whole_record_and_group():
    assert PROMPT_FIELDS == (
        "prompt_ids", "uid", "text", "prompt", "answer", "domain", "meta", "group_id"
    )  # fmt: skip


def test_an_environments_rollout_reads_the_record_its_reset_gets():
    plan = build_run_plan(get_algorithm("grpo"), load_config("configs/tiny_env.yaml", []))
    assert plan.stage("rollout").reads == ("prompt_ids", *RECORD_FIELDS)


def test_each_group_gets_the_stages_it_serves_with_their_reads_and_writes():
    from mindrl.workers.context import stage_context

    algorithm = get_algorithm("ppo")
    config = load_config(None, [], algorithm=algorithm)
    plan = build_run_plan(algorithm, config)
    reward = stage_context(plan, "reward", config, algorithm)
    assert [s.name for s in reward.stages] == ["reward", "advantage"]
    assert reward.options == plan.options and reward.algorithm is algorithm
    critic = stage_context(plan, "critic", config, algorithm)
    assert [s.name for s in critic.stages] == ["values", "critic_update"]
    assert critic.response_fields("critic_update") == ("values", "returns")
    actor = stage_context(plan, "actor", config, algorithm)
    assert actor.response_fields("update") == ("advantages", "rollout_logprob", "ref_logprob")
    with pytest.raises(KeyError, match="serve rollout, update"):
        actor.stage("values")
    rollout_workers = stage_context(plan, "actor", config, algorithm, only=("rollout",))
    assert [s.name for s in rollout_workers.stages] == ["rollout"]


def test_dapo_has_no_reference_and_holds_two_prompt_batches_for_dynamic_sampling():
    plan = plan_for("dapo", "data.global_batch_size=4")
    assert "ref_logp" not in plan.stage_names and plan.model_roles == ("actor",)
    assert plan.sample_batches == 2 and plan.uses_groups
    assert plan.dock_groups == 2 * 4


def test_the_dock_holds_one_batch_or_partial_rollouts_whole_in_flight_pool():
    assert plan_for("grpo", "data.global_batch_size=4").dock_groups == 4
    budget = "rollout.partial_rollout_budget=2"
    assert plan_for("grpo", "data.global_batch_size=4", budget).dock_groups == 8  # 2G
    pool = "rollout.partial_rollout_groups=5"
    assert plan_for("grpo", "data.global_batch_size=4", budget, pool).dock_groups == 5


def test_only_stages_off_the_generating_devices_stream_and_never_past_the_batch_barriers(
    monkeypatch,
):
    plan = plan_for("ppo", "data.global_batch_size=4", "actor.mini_batch_size=2")
    # Reward workers are CPU processes; the model roles share the actor's devices.
    assert plan.streaming_stages() == ("reward",)
    # A role on devices of its own streams too; advantage / updates always wait.
    monkeypatch.setattr(run_plan, "ROLES_OFF_GENERATION_DEVICES", {"reward", "critic", "actor"})
    assert plan.streaming_stages() == ("reward", "old_logp", "values")
    # A group filter (DAPO) needs every reward before any model stage scores a group.
    assert plan.streaming_stages(until_filter=True) == ("reward",)


def test_the_stage_deadline_is_five_dock_timeouts():
    assert plan_for("grpo", "dock.timeout_s=7").stage_deadline_s == 35


def test_a_stage_switched_off_is_named_when_asked_for():
    with pytest.raises(KeyError, match="stage 'values' is not part of this grpo run"):
        plan_for("grpo").stage("values")


@pytest.mark.parametrize("trainer", ["grpo", "ppo", "dapo"])
def test_the_dry_run_lists_exactly_the_stages_the_run_gives_the_dock(trainer):
    plan = plan_for(trainer)
    config = load_config(None, [], algorithm=get_algorithm(trainer))
    report = build_plan(config, plan, "cpu", 16 * GIB, 64 * GIB)
    assert report["placement"][0]["td_controllers"] == list(plan.dock_stages())


def test_the_planner_counts_the_per_token_fields_this_run_stores():
    # grpo: response_ids, rollout_logprob, ref_logprob, advantages (no old log-probs)
    assert response_fields(plan_for("grpo")) == 4
    # ppo adds values and returns
    assert response_fields(plan_for("ppo")) == 6


def test_dpo_trains_on_stored_pairs_with_no_generation_reward_or_advantage_stage():
    plan = plan_for("dpo", "data.global_batch_size=4", "actor.mini_batch_size=2")
    assert plan.offline and plan.stage_names == ("ref_logp", "update")
    assert plan.model_roles == ("actor", "reference") and not plan.needs_old_logprob
    assert plan.stage("update").reads == (*SEQUENCE, "ref_logprob")
    assert plan.group_size == 2  # a pair: chosen and rejected, adjacent in the dock
    assert plan.scoring_stages() == ("ref_logp",) and plan.streaming_stages() == ()


def test_the_plan_carries_the_options_the_run_trains_with_resolved_once():
    config = load_config(None, ["rollout.max_response_length=12"])
    plan = build_run_plan(get_algorithm("dr_grpo"), config)
    assert plan.options.loss_agg_mode == "seq-mean-token-sum-norm"
    assert plan.options.norm_len == 12  # Dr. GRPO's constant: the generation budget
    assert build_run_plan(get_algorithm("grpo"), config).options.kl_coef == 0.001
