"""What the driver hands each trained role when it checkpoints (trainers/driver/train.py,
``save_checkpoint``), without Ray: the runner's samples in flight go to the actor only,
between iterations only; a run with none saves exactly the position it saved before."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from mindrl.dock import DockSlice
from trainers.driver.iteration import InFlightState
from trainers.driver.state import RunState
from trainers.driver.train import save_checkpoint

SLICES = [DockSlice(np.arange(4), ("prompt_ids", "record_id"))]
BOOKKEEPING = {"drawn": 7}


class Group:
    """A worker group that records the arguments of each call."""

    def __init__(self, name: str) -> None:
        self.name, self.calls = name, []

    def call(self, method: str, *args, stage: str, timeout_s: float) -> list:
        self.calls.append((method, args))
        return []


class Runner:
    def __init__(self) -> None:
        self.asked = 0

    def in_flight_state(self) -> InFlightState:
        self.asked += 1
        return InFlightState(BOOKKEEPING, SLICES)


def fake_run(iterating: bool = False) -> SimpleNamespace:
    groups = [Group("actor"), Group("critic")]
    run = SimpleNamespace(
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
