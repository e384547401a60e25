"""A checkpoint that cannot be written, in whole runs on the shared Ray cluster: by default
the run stops in one line; under ``checkpoint.on_error: warn`` it trains on, counts the
failures in metrics.jsonl and writes the next checkpoint once the disk has room."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from mindrl.metrics import read_metrics
from tests.trainers.test_pipeline import ONE_DEVICE, tiny_config
from trainers.driver.train import train

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def test_a_checkpoint_that_cannot_be_written_stops_the_run_in_one_line(tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the checkpoint folder should go\n")
    config = tiny_config(
        tmp_path,
        "grpo",
        "iterations=2",
        "checkpoint.every=1",
        f"checkpoint.dir={blocker}/ckpt",
        *ONE_DEVICE,
    )
    assert train(config, "grpo", device="cpu") == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in errors[0]
    assert f"checkpoint {blocker}/ckpt/actor/step_00000001 could not be written" in errors[0]
    assert "Not a directory" in errors[0]
    assert errors[0].endswith("or set checkpoint.on_error=warn to train on without it")
    # It stopped at the first save: iteration 0 is the last one trained.
    assert [r["iteration"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0]


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (no checkpoint of tiny fits) and a function that enlarges it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a size-limited tmpfs here (needs root): {mounted.stderr!r}")

    def enlarge() -> None:
        subprocess.run(["mount", "-o", "remount,size=256m", str(disk)], check=True)

    yield disk, enlarge
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_under_warn_trains_on_and_saves_once_there_is_room(
    tmp_path, small_disk, capsys
):
    disk, enlarge = small_disk
    config = tiny_config(
        tmp_path, "grpo", "iterations=6", "checkpoint.every=1", "checkpoint.async=true",
        "checkpoint.on_error=warn", f"checkpoint.dir={disk}/ckpt", *ONE_DEVICE,
    )  # fmt: skip
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(code=train(config, "grpo", "cpu")))
    runner.start()
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while runner.is_alive():  # the disk gets room once the first failure is counted
        if metrics.exists() and "checkpoint_write_failures" in metrics.read_text():
            enlarge()
            break
        assert time.monotonic() < deadline, "no failed checkpoint was counted"
        time.sleep(0.05)
    runner.join(timeout=180)
    assert outcome["code"] == 0
    records = read_metrics(metrics)
    assert [r["iteration"] for r in records] == list(range(6))
    counts = [r.get("checkpoint_write_failures", 0) for r in records]
    assert counts[0] == 0 and counts[2] >= 1 and counts == sorted(counts)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(warnings) == counts[-1] + (counts[-1] > counts[-2])  # the last one's too
    assert all("No space left on device" in line for line in warnings)
    # The final checkpoint is complete; no partial folder is left of the failed ones.
    actor = Path(disk) / "ckpt" / "actor"
    assert (actor / "latest").read_text() == "step_00000006\n"
    assert not list(actor.glob("*.tmp"))
