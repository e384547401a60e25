"""SIGTERM, a scheduler's notice, to a real ``mindrl-train`` process (joined to the shared
Ray cluster): the run finishes its iteration, saves it, exits 0 within
``resilience.preempt_timeout_s`` and prints the command that resumes it; the resumed run
ends with the metrics of a run that was never stopped (both on one device: the layout does
not matter here, and each start-up is a process per role and device)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mindrl.metrics import read_metrics
from tests.trainers.conftest import WITH_REFERENCE
from tests.trainers.test_pipeline import ONE_DEVICE, tiny_config
from trainers.driver.preemption import resume_command
from trainers.driver.train import train

pytestmark = [pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
KEYS = ("reward_mean", "pg_loss", "grad_norm", "entropy", "kl")


def test_the_resume_command_is_the_run_s_own_with_resume():
    argv = ["--trainer", "grpo", "--resume-from", "a/step_00000002", "iterations=9", "x=[]"]
    assert resume_command(argv) == "mindrl-train --trainer grpo iterations=9 'x=[]' --resume"


def test_sigterm_saves_the_iteration_exits_0_and_the_resumed_run_ends_as_an_unstopped_one(
    ray_cluster, one_device_records, tmp_path
):
    args = [
        "--trainer", "grpo", "--device", "cpu", f"logging.dir={tmp_path / 'run'}",
        "logging.progress_bar=false", "logging.backends=[]", "checkpoint.every=0",
        *WITH_REFERENCE, *ONE_DEVICE,
    ]  # fmt: skip
    driver = subprocess.Popen(
        [str(Path(sys.executable).parent / "mindrl-train"), *args],
        cwd=REPO,
        env={**os.environ, "RAY_ADDRESS": ray_cluster.address},
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in driver.stderr:  # its workers are placed: iteration 0 is about to run
        lines.append(line.rstrip())
        if "] ready" in line:
            break
    driver.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    lines += driver.stderr.read().splitlines()
    assert driver.wait(timeout=120) == 0, "\n".join(lines)
    assert time.monotonic() - signalled < 120  # resilience.preempt_timeout_s, the default
    # Its own last line; Ray's raylet may print to the same stream (a full disk's warning).
    last = [line for line in lines if line.startswith("mindrl-train: ")][-1]
    assert last.startswith("mindrl-train: preempted; saved iteration 0 to ")
    assert last.endswith(f"resume with: {resume_command(args)}")
    assert [r["iteration"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0]

    config = tiny_config(tmp_path, "grpo", *WITH_REFERENCE, *ONE_DEVICE)  # the same run, resumed
    assert train(config, "grpo", "cpu", resume=True) == 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [0, 1]
    expected = one_device_records
    for key in KEYS:
        assert [r[key] for r in records] == pytest.approx([r[key] for r in expected], abs=1e-6)
