"""Automatic restart (``resilience.max_restarts``) on the shared Ray cluster: a model
worker killed with SIGKILL during its update, then a dock warehouse killed during the
redone iteration; each time the run tears its workers down, starts them again from the
latest checkpoint and ends with exactly the records of a run that never failed. One
device: restarting does not depend on the layout, and each restart starts every process
again."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

import pytest
import ray

import trainers.driver.setup as setup
from mindrl.metrics import read_metrics
from mindrl.workers.group import WorkerGroup
from tests.trainers.conftest import WITH_REFERENCE
from tests.trainers.test_pipeline import ONE_DEVICE, tiny_config
from trainers.driver.train import train

pytestmark = [pytest.mark.ray]

KEYS = ("reward_mean", "pg_loss", "grad_norm", "entropy", "kl")
KILL_AFTER_S = 0.1  # the call is on its way: the process dies in the middle of it


def pid_of(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))


def kill_soon(actor) -> None:
    pid = pid_of(actor)  # a process of this run's own actor, never a guess
    threading.Timer(KILL_AFTER_S, os.kill, (pid, signal.SIGKILL)).start()


def test_a_killed_worker_and_a_killed_warehouse_restart_the_run_from_its_checkpoint(
    ray_cluster, one_device_records, tmp_path, monkeypatch, capsys
):
    calls, docks = Counter(), []
    call_each, create_dock = WorkerGroup.call_each, setup.create_dock

    def killing_call_each(group, method, args_per_rank, **kwargs):
        calls[group.name, method] += 1
        if (group.name, method) == ("actor", "update") and calls[group.name, method] == 2:
            kill_soon(group.workers[0])  # iteration 1's update
        if (group.name, method) == ("actor", "generate") and calls[group.name, method] == 3:
            kill_soon(docks[-1].warehouses[0].actor)  # iteration 1 again, generating
        return call_each(group, method, args_per_rank, **kwargs)

    def recording_create_dock(*args, **kwargs):
        docks.append(create_dock(*args, **kwargs))
        return docks[-1]

    monkeypatch.setattr(WorkerGroup, "call_each", killing_call_each)
    monkeypatch.setattr(setup, "create_dock", recording_create_dock)
    config = tiny_config(
        tmp_path, "grpo", *WITH_REFERENCE, *ONE_DEVICE, "checkpoint.every=1",
        "resilience.max_restarts=2",
    )  # fmt: skip
    assert train(config, "grpo", "cpu") == 0

    err = capsys.readouterr().err
    restarts = [line for line in err.splitlines() if " restart " in line]
    assert len(restarts) == 2
    assert restarts[0].startswith("mindrl-train: restart 1/2 after worker actor[0] died")
    assert "during stage 'update'" in restarts[0]
    assert restarts[1].startswith("mindrl-train: restart 2/2 after ")
    assert all(line.endswith(", resuming from step_00000001") for line in restarts)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]  # the redone iteration replaced
    expected = one_device_records
    for key in KEYS:
        assert [r[key] for r in records] == pytest.approx([r[key] for r in expected], abs=1e-6)
    notes = records[1]["restarts"]
    assert [(n["restart"], n["max_restarts"], n["resumed_from"]) for n in notes] == [
        (1, 2, "step_00000001"),
        (2, 2, "step_00000001"),
    ]
    assert "restarts" not in records[0]
