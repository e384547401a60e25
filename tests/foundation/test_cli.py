"""`mindrl-train` as a user meets it: what it prints and the exit code, run by the
command's own ``main`` in this process (a subprocess would import torch and Megatron again,
~4 s a call on this CI machine); one test runs the console script itself, where a
traceback would reach the terminal."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainers.driver.cli import main

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "trainers.driver.cli"]


def mindrl_train(*args: str) -> subprocess.CompletedProcess:
    """``mindrl-train args`` run from the repository root: its exit code and outputs."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:  # argparse's exits
            code = stop.code
    return subprocess.CompletedProcess(list(args), code or 0, out.getvalue(), err.getvalue())


def test_the_console_script_reports_a_bad_override_in_one_line_without_a_traceback():
    out = subprocess.run(
        [*CLI, "--trainer", "grpo", "--dry-run", "actor.optim.lr=fast"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("mindrl-train: config error: ") and out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr


def test_deepseek_dry_run_prints_the_plan_for_384_devices():
    out = mindrl_train("--trainer", "grpo", "--config", "configs/deepseek671b.yaml", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "384" in out.stdout and "671.03B params" in out.stdout
    assert "redundant weight bytes (Eq. 3)" in out.stdout


def test_a_piped_dry_run_prints_every_figure_whole():
    out = mindrl_train("--trainer", "grpo", "--config", "configs/deepseek671b.yaml", "--dry-run")
    assert "…" not in out.stdout
    assert "9,394.37 GB" in out.stdout  # the actor's whole checkpoint, weights to fp32 main


def test_dry_run_json_carries_layouts_memory_and_sample_flow():
    out = mindrl_train(
        "--trainer", "ppo", "--config", "configs/qwen25_32b.yaml", "--dry-run", "--json"
    )
    plan = json.loads(out.stdout)
    assert plan["training_layouts"]["actor"]["dp"] == 2
    assert plan["generation_layout"] == {"tp": 4, "ep": 1, "dp": 4, "pp": 1}
    assert "values" in plan["placement"][0]["td_controllers"]
    assert plan["memory"]["redundant_bytes"] / 1e9 == pytest.approx(8.19, abs=0.02)


def test_a_ppo_plan_fits_once_its_reference_and_critic_wait_on_the_host():
    args = ("--trainer", "ppo", "--config", "configs/qwen3_30b_a3b.yaml", "--dry-run")
    out = mindrl_train(*args, "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    # Resident, the training stage would need 129.9 GB of the 127.8 GB device; the
    # reference's 15.3 GB of weights waiting on the host are enough.
    (kind,) = plan["device_processes"]
    assert kind["offloaded"] == ["reference"]
    assert round(plan["memory"]["training_stage_total"] / 1e9, 1) == 114.6


def test_a_ppo_plan_that_does_not_fit_even_offloaded_names_the_stage_and_exits_3():
    out = mindrl_train(
        "--trainer", "ppo", "--config", "configs/qwen3_30b_a3b.yaml", "--dry-run",
        "resources.device_memory_gib=30",
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert "training stage (actor) needs 76.4 GB per device, 44.2 GB more" in out.stdout


def test_a_swap_that_overflows_host_memory_is_a_fit_problem_with_exit_code_3():
    out = mindrl_train(
        "--trainer", "grpo", "--config", "configs/qwen25_32b.yaml", "--dry-run", "--json",
        "resources.host_memory_gib=100",
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    memory = json.loads(out.stdout)["memory"]
    assert memory["host_swap_bytes"] == 8 * memory["swap_bytes"]
    assert memory["host_bytes"] == 100 * 2**30
    (problem,) = json.loads(out.stdout)["fit_problems"]
    # 8 devices x (weights + optimizer state): gradients are released before the swap
    assert problem.startswith("allgather-swap pins 262.1 GB of host memory per node")


def test_a_malformed_config_gets_one_line_and_exit_code_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  hidden_size: [\n")
    out = mindrl_train("--trainer", "grpo", "--config", str(bad), "--dry-run")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "invalid YAML at line 3" in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_config_files_get_one_line_each_and_exit_code_2(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    # (directories, lists and scalars: tests/foundation/test_config.py, in-process)
    for bad, words in (
        ("empty.yaml", "config file is empty"),
        ("binary.yaml", "not a UTF-8 text file"),
    ):
        out = mindrl_train("--trainer", "grpo", "--config", str(tmp_path / bad), "--dry-run")
        assert out.returncode == 2, (bad, out.stderr)
        assert out.stderr.count("\n") == 1 and words in out.stderr, out.stderr
        assert out.stdout == ""


def test_bad_overrides_are_all_reported_with_exit_code_2():
    out = mindrl_train("--trainer", "grpo", "--dry-run", "actor.optim.lr=fast", "--set", "seeed=1")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("mindrl-train: config error:") for line in lines)


def test_an_unmet_device_request_fails_at_once_in_one_line():
    out = mindrl_train("--trainer", "grpo", "--device", "npu")
    assert out.returncode == 2
    assert out.stderr.startswith("mindrl-train: error: device 'npu' was requested but")
    assert "Traceback" not in out.stderr


def test_a_plan_that_does_not_fit_says_by_how_much_with_exit_code_3():
    out = mindrl_train(
        "--trainer",
        "grpo",
        "--config",
        "configs/qwen25_32b.yaml",
        "--dry-run",
        "resources.device_memory_gib=40",
        "rollout.swap=false",
    )
    assert out.returncode == 3
    assert "does not fit" in out.stdout and "GB" in out.stdout


def test_help_config_documents_every_key_with_its_default():
    out = mindrl_train("--help-config")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    lr = next(line for line in lines if line.startswith("actor.optim.lr "))
    assert "Peak learning rate." in lr and "default 1e-06" in lr
    assert all("[" in line and "default" in line for line in lines)
