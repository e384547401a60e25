"""Start-up refuses impossible placements and staleness settings, one line each."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mindrl.config import ConfigError, load_config
from mindrl.config.placement import rollout_world_size, train_world_size
from trainers.registry import get_algorithm

TINY = "configs/tiny.yaml"
DISAGGREGATED = [
    "rollout.placement=disaggregated",
    "rollout.devices=1",
    "actor.parallel.tp=1",
    "reference.parallel.tp=1",
    "critic.parallel.tp=1",
]


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


def test_disaggregated_roles_train_on_the_devices_the_rollout_leaves():
    config = load_config(TINY, [*DISAGGREGATED, "rollout.max_staleness=1"], get_algorithm("grpo"))
    assert (train_world_size(config), rollout_world_size(config)) == (1, 1)
    collocated = load_config(TINY, [], get_algorithm("grpo"))
    assert (train_world_size(collocated), rollout_world_size(collocated)) == (2, 2)


def dry_run(*overrides: str) -> dict:
    args = ["--trainer", "grpo", "--config", "configs/qwen25_7b.yaml", "--dry-run", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "trainers.driver.cli", *args, *overrides],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


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
