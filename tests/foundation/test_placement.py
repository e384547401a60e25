"""Start-up refuses impossible placements and staleness settings, one line each."""

from __future__ import annotations

import pytest

from backends.generation import registry
from mindrl.config import ConfigError, load_config
from mindrl.run_plan import build_run_plan
from tests.foundation.plans import DISAGGREGATED, TINY, config_and_plan
from tests.foundation.plans import dry_run as dry_run_of
from trainers.registry import get_algorithm

TP1 = ["actor.parallel.tp=1", "reference.parallel.tp=1", "critic.parallel.tp=1"]


def problems_of(overrides: list[str], trainer: str = "grpo") -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_config(TINY, overrides, algorithm=get_algorithm(trainer))
    return err.value.problems


def test_a_negative_staleness_is_refused_in_one_line():
    assert problems_of(["rollout.max_staleness=-1"]) == [
        "configs/tiny.yaml: rollout.max_staleness: must be >= 0, got -1"
    ]


def test_staleness_without_disaggregated_placement_is_refused_naming_the_placement():
    (problem,) = problems_of(["rollout.max_staleness=1"])
    assert "rollout.max_staleness=1 needs rollout.placement: disaggregated" in problem


@pytest.mark.parametrize("devices", [0, 2, 3])
def test_more_rollout_devices_than_the_cluster_leaves_room_for_are_refused(devices):
    (problem,) = problems_of([*DISAGGREGATED, f"rollout.devices={devices}"])
    assert f"rollout.devices={devices}: a disaggregated run needs at least one" in problem
    assert "set 1 <= rollout.devices <= 1" in problem


def test_rollout_devices_with_collocated_placement_would_do_nothing_and_are_refused():
    (problem,) = problems_of(["rollout.devices=1"])
    assert problem.endswith("remove it or set the placement")


@pytest.mark.parametrize(
    ("overrides", "trainer", "what"),
    [
        (["dock.pipeline=stream"], "grpo", "dock.pipeline: stream"),
        ([], "dapo", "dynamic sampling (DAPO)"),
        (["rollout.max_staleness=1"], "gspo", "--trainer gspo and rollout.max_staleness > 0"),
        (
            ["data.val_every=5", "data.val_source=synthetic:tiny"],
            "grpo",
            "validation (data.val_every > 0)",
        ),
    ],
)
def test_what_disaggregated_runs_cannot_do_yet_is_refused_as_not_yet_supported(
    overrides, trainer, what
):
    (problem,) = problems_of([*DISAGGREGATED, *overrides], trainer)
    assert f"disaggregated with {what} is not yet supported" in problem


def test_a_rollout_tp_group_must_fill_the_rollout_devices_and_split_with_vllm():
    four = [*DISAGGREGATED, "resources.devices_per_node=4", "rollout.tp=2"]
    (problem,) = problems_of([*four, "rollout.devices=3", "rollout.engine=vllm"])
    assert problem == "configs/tiny.yaml: rollout.tp: 2 does not divide rollout.devices 3"
    (problem,) = problems_of([*four, "rollout.devices=2", "rollout.engine=hf"])
    assert "rollout.tp=2 needs the vllm engine" in problem
    # Whole weights reach a rollout worker: its TP need not be a multiple of training's.
    plan = plan_of([*four, "rollout.devices=2", "rollout.engine=vllm", "actor.parallel.tp=1"])
    assert (plan.layout.generation.tp, plan.layout.generation.dp) == (2, 1)


def plan_of(overrides: list[str], trainer: str = "grpo"):
    return config_and_plan(trainer, *overrides)[1]


def test_disaggregated_roles_train_on_the_devices_the_rollout_leaves():
    plan = plan_of([*DISAGGREGATED, "rollout.max_staleness=1"])
    layout = plan.layout
    assert (plan.mode, plan.runner) == ("disaggregated", "disaggregated")
    assert (layout.train_devices, layout.rollout_devices, layout.generation.world) == (1, 1, 1)
    assert layout.training["actor"].dp == 1
    collocated = plan_of([])
    assert (collocated.mode, collocated.runner) == ("collocated", "online")
    layout = collocated.layout
    assert (layout.train_devices, layout.rollout_devices, layout.generation.world) == (2, 0, 2)
    assert (layout.training["actor"].tp, layout.generation.dp) == (2, 2)


def test_the_plan_names_the_runner_of_every_kind_of_run_once():
    assert plan_of(["rollout.partial_rollout_budget=2"]).runner == "partial_rollout"
    assert plan_of(["dock.pipeline=stream"]).runner == "online"
    offline = build_run_plan(get_algorithm("dpo"), load_config("configs/tiny_dpo.yaml"))
    assert (offline.mode, offline.runner, offline.layout.generation) == ("offline", "offline", None)


@pytest.mark.parametrize("budget", [0, -4])
def test_a_partial_rollout_budget_below_one_token_is_refused_in_one_line(budget):
    assert problems_of([f"rollout.partial_rollout_budget={budget}"]) == [
        f"configs/tiny.yaml: rollout.partial_rollout_budget: must be >= 1, got {budget}"
    ]


def test_partial_rollout_with_an_engine_that_cannot_continue_a_prefix_is_refused(monkeypatch):
    # Both engines shipped continue a prefix; an engine declared without it is refused.
    monkeypatch.setattr(registry.engine_class("hf"), "continues_prefix", False)
    assert problems_of(["rollout.partial_rollout_budget=2"]) == [
        "configs/tiny.yaml: rollout.partial_rollout_budget=2: generation engine 'hf' cannot "
        "continue a response from its prefix; use rollout.engine vllm"
    ]


@pytest.mark.parametrize(
    ("overrides", "trainer", "what"),
    [
        (DISAGGREGATED, "grpo", "rollout.placement: disaggregated"),
        (["dock.pipeline=stream"], "grpo", "dock.pipeline: stream"),
        ([], "dapo", "dynamic sampling (DAPO)"),
        ([], "gspo", "--trainer gspo"),
        (
            ["resources.devices_per_node=4", "data.n_samples_per_prompt=2", *TP1],
            "grpo",
            "data.n_samples_per_prompt=2 not a multiple of every data-parallel size (actor 4)",
        ),
    ],
)
def test_what_partial_rollout_cannot_do_yet_is_refused_as_not_yet_supported(
    overrides, trainer, what
):
    (problem,) = problems_of(["rollout.partial_rollout_budget=2", *overrides], trainer)
    assert problem == (
        f"configs/tiny.yaml: rollout.partial_rollout_budget=2 with {what} is not yet "
        "supported; remove rollout.partial_rollout_budget for it"
    )


def test_an_in_flight_pool_smaller_than_a_batch_or_without_a_budget_is_refused():
    budget = "rollout.partial_rollout_budget=2"
    assert problems_of([budget, "rollout.partial_rollout_groups=15"]) == [
        "configs/tiny.yaml: rollout.partial_rollout_groups=15: must be >= "
        "data.global_batch_size (16), the finished groups an update trains"
    ]
    assert problems_of(["rollout.partial_rollout_groups=32"]) == [
        "configs/tiny.yaml: rollout.partial_rollout_groups=32 needs "
        "rollout.partial_rollout_budget; set a budget or remove it"
    ]
    assert problems_of([budget, "rollout.partial_rollout_groups=0"]) == [
        "configs/tiny.yaml: rollout.partial_rollout_groups: must be >= 1, got 0"
    ]
    config = load_config(TINY, [budget, "rollout.partial_rollout_groups=16"], get_algorithm("grpo"))
    assert config.rollout.partial_rollout_groups == 16  # exactly one batch is allowed


def test_the_loss_corrects_token_lag_with_partial_rollout_or_staleness_only():
    def lags(*overrides: str) -> bool:
        return plan_of(list(overrides)).tokens_may_lag

    assert lags("rollout.partial_rollout_budget=2")
    assert lags(*DISAGGREGATED, "rollout.max_staleness=1")
    assert not lags()


def dry_run(*overrides: str) -> dict:
    return dry_run_of("grpo", "configs/qwen25_7b.yaml", *overrides)


def test_the_planner_shows_which_devices_train_and_which_generate_per_mode():
    collocated = dry_run()
    assert [(g["ranks"], g["trains"], g["generates"]) for g in collocated["placement"]] == [
        ([0, 7], True, True),
        ([8, 15], True, True),
    ]
    assert collocated["memory"]["rollout_devices"] is None
    plan = dry_run(
        "resources.nodes=1", "rollout.placement=disaggregated", "rollout.devices=4",
        "rollout.tp=1", "rollout.max_staleness=1",
    )  # fmt: skip
    groups = [(g["ranks"], g["roles"], g["trains"], g["generates"]) for g in plan["placement"]]
    assert groups == [
        ([0, 3], ["actor", "reference"], True, False),
        ([4, 7], ["rollout"], False, True),
    ]
    assert plan["training_layouts"]["actor"]["dp"] == 1  # TP 4 over the 4 training devices
    assert plan["generation_layout"]["dp"] == 4  # one whole model per rollout device
    rollout = plan["memory"]["rollout_devices"]
    assert rollout["shard"] == plan["model"]["params"] * 2  # bf16, nothing else resident
    assert rollout["resident_training"] == 0
    assert plan["memory"]["host_swap_bytes"] == 0  # nothing generates on training devices


def test_a_rollout_tp_group_plans_a_shard_per_device_and_receives_one_tensor_at_a_time():
    layout = ["resources.nodes=1", "rollout.placement=disaggregated", "rollout.devices=4",
              "rollout.max_staleness=1", "rollout.engine=vllm"]  # fmt: skip
    tp1, tp2 = (dry_run(*layout, f"rollout.tp={tp}")["memory"]["rollout_devices"] for tp in (1, 2))
    assert tp2["shard"] == pytest.approx(tp1["shard"] / 2, rel=1e-3)
    # At TP 1 the next weights arrive whole beside the shard; a TP group's worker takes
    # them into the host, through the device one tensor at a time (the largest: the
    # 152064 x 3584 bf16 embedding).
    embedding = 152064 * 3584 * 2
    assert tp1["peak"] == tp1["shard"] + tp1["shard"] + tp1["working"]
    assert tp2["peak"] == tp2["shard"] + embedding + tp2["working"]
