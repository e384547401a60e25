"""What the driver hands each trained role when it checkpoints (trainers/driver/train.py,
``save_checkpoint``), without Ray: the runner's samples in flight go to the actor only,
between iterations only; a run with none saves exactly the position it saved before. And
what it does when a role's checkpoint could not be written (``checkpoint.on_error``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mindrl.dock import DockSlice
from trainers.driver.iteration import InFlightState
from trainers.driver.state import RunState
from trainers.driver.train import CheckpointWriteFailed, save_checkpoint

SLICES = [DockSlice(np.arange(4), ("prompt_ids", "answer"))]
BOOKKEEPING = {"drawn": 7}


class Group:
    """A worker group that records the arguments of each call."""

    def __init__(self, name: str, failed: list[tuple[str, str]] = ()) -> None:
        self.name, self.calls, self.failed = name, [], list(failed)

    def call(self, method: str, *args, stage: str, timeout_s: float) -> list:
        self.calls.append((method, args))
        step_dir = None if self.failed else f"{args[0]}/{self.name}/step_00000004"
        return [{"step_dir": step_dir, "failed": self.failed}] * 2  # two ranks, alike


class Runner:
    def __init__(self) -> None:
        self.asked = 0

    def in_flight_state(self) -> InFlightState:
        self.asked += 1
        return InFlightState(BOOKKEEPING, SLICES)


def fake_run(
    iterating: bool = False, groups: list[Group] | None = None, on_error: str = "stop"
) -> SimpleNamespace:
    groups = groups or [Group("actor"), Group("critic")]
    run = SimpleNamespace(
        config=SimpleNamespace(checkpoint=SimpleNamespace(on_error=on_error, keep=2)),
        checkpoint_failures=0,
        finished_iteration=3,
        iterating=iterating,
        dataset=SimpleNamespace(state_dict=lambda: {"drawn": 64}),
        kl=SimpleNamespace(value=0.1),
        checkpoint_dir="ckpt",
        plan=SimpleNamespace(stage_deadline_s=60.0),
        trained_groups=lambda: groups,
        groups=groups,
    )
    run.position = lambda in_flight=None: RunState.position(run, in_flight)
    return run


SYNC_POSITION = {"next_iteration": 4, "dataset": {"drawn": 64}, "kl_coef": 0.1}


def test_between_iterations_the_actor_gets_the_samples_and_the_position_the_bookkeeping():
    run = fake_run()
    save_checkpoint(run, Runner())
    actor, critic = run.groups
    position = SYNC_POSITION | {"in_flight": BOOKKEEPING}
    assert actor.calls == [("save_checkpoint", ("ckpt", position, SLICES))]
    assert critic.calls == [("save_checkpoint", ("ckpt", position))]


def test_inside_an_iteration_a_checkpoint_keeps_nothing_in_flight():
    run, runner = fake_run(iterating=True), Runner()
    save_checkpoint(run, runner)  # a Ctrl-C half-way through an iteration
    assert runner.asked == 0
    assert all(g.calls == [("save_checkpoint", ("ckpt", SYNC_POSITION))] for g in run.groups)


def test_with_nothing_in_flight_the_checkpoint_is_the_one_a_sync_run_saves():
    run = fake_run()
    save_checkpoint(run, SimpleNamespace(in_flight_state=lambda: None))
    assert all(g.calls == [("save_checkpoint", ("ckpt", SYNC_POSITION))] for g in run.groups)


CRITIC_FULL = (
    "checkpoint ckpt/critic/step_00000004 could not be written (rank 0: [Errno 28] No space "
    "left on device); its partial folder is removed and 'latest' still names step_00000002"
)


def published_steps(root: Path, role: str, *steps: int) -> Path:
    """``root/role`` with complete-looking step folders and ``latest`` on the last."""
    folder = root / role
    for step in steps:
        (folder / f"step_{step:08d}").mkdir(parents=True)
    (folder / "latest").write_text(f"step_{steps[-1]:08d}\n")
    return folder


def test_a_failed_write_under_warn_is_counted_and_the_roles_stay_on_one_step(tmp_path, capsys):
    actor = published_steps(tmp_path, "actor", 2, 4)  # the actor wrote step 4, the critic not
    published_steps(tmp_path, "critic", 2)
    groups = [Group("actor"), Group("critic", [("step_00000004", CRITIC_FULL)])]
    run = fake_run(groups=groups, on_error="warn")
    run.checkpoint_dir = tmp_path
    save_checkpoint(run, Runner())
    assert run.checkpoint_failures == 1
    # The actor's step 4 is unpublished: a resume finds both roles at step 2.
    assert (actor / "latest").read_text() == "step_00000002\n"
    assert not (actor / "step_00000004").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"mindrl-train: warning: {CRITIC_FULL}; training goes on (checkpoint.on_error=warn; "
        "1 failed so far)"
    ]


def test_a_failed_write_stops_the_run_in_one_line_by_default():
    run = fake_run(groups=[Group("actor", [("step_00000004", CRITIC_FULL)])])
    with pytest.raises(CheckpointWriteFailed) as stopped:
        save_checkpoint(run, Runner())
    assert str(stopped.value) == (
        f"{CRITIC_FULL}; free space (or grant write access) under ckpt, or point "
        "checkpoint.dir at another disk, or set checkpoint.on_error=warn to train on without it"
    )


def test_the_final_checkpoint_failing_stops_the_run_even_under_warn():
    run = fake_run(groups=[Group("actor", [("step_00000004", CRITIC_FULL)])], on_error="warn")
    with pytest.raises(CheckpointWriteFailed, match=r"^the run's final checkpoint is lost: "):
        save_checkpoint(run, Runner(), final=True)
