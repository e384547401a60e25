"""scripts/compare_metrics.py: two runs are identical when every field but the timings
matches exactly; the first difference is named with its record and dotted path."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_metrics.py"


def load_script():
    spec = importlib.util.spec_from_file_location("compare_metrics", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


compare_metrics = load_script()


def write_run(folder: Path, records: list[dict]) -> Path:
    folder.mkdir(parents=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (folder / "metrics.jsonl").write_text(lines)
    return folder


def record(loss: float, seconds: float) -> dict:
    return {
        "iteration": 0,
        "loss": loss,
        "iteration_time_s": seconds,
        "tps": 1000 / seconds,
        "time": {"rollout": seconds / 2},
        "overhead": {"dock_s": 0.1, "share": 0.2},
        "memory": {"actor": {"host_peak_mib": 500 + seconds}},
        "val/reward_mean": 0.5,
        "val/time_s": seconds,
        "critic": {"loss": loss / 2},
    }


def test_runs_that_differ_only_in_timings_are_identical(tmp_path):
    before = write_run(tmp_path / "a" / "grpo", [record(0.25, 1.0)])
    after = write_run(tmp_path / "b" / "grpo", [record(0.25, 3.0)])
    same, verdict = compare_metrics.compare_runs(before, after)
    assert same
    # iteration, loss, val/reward_mean, critic.loss: the timings are not counted
    assert verdict == "identical (1 records, 4 non-timing fields)"


def test_a_changed_loss_is_named_with_its_record_and_path(tmp_path):
    before = write_run(tmp_path / "a", [record(0.25, 1.0), record(0.5, 1.0)])
    after = write_run(tmp_path / "b", [record(0.25, 1.0), record(0.5000001, 1.0)])
    same, verdict = compare_metrics.compare_runs(before, after)
    assert not same
    assert verdict == "record 1 (iteration 0): loss 0.5 before, 0.5000001 after"


def test_folders_of_runs_compare_by_name_one_line_each(tmp_path, capsys):
    write_run(tmp_path / "a" / "grpo", [record(0.25, 1.0)])
    write_run(tmp_path / "a" / "ppo", [record(0.5, 1.0)])
    write_run(tmp_path / "b" / "grpo", [record(0.25, 2.0)])
    code = compare_metrics.main([str(tmp_path / "a"), str(tmp_path / "b")])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines[0] == "grpo: identical (1 records, 4 non-timing fields)"
    assert lines[1] == f"ppo: no metrics.jsonl in {tmp_path / 'b' / 'ppo'}"


def test_new_keys_are_a_difference_unless_their_prefix_is_allowed(tmp_path):
    before = write_run(tmp_path / "a", [{"iteration": 0, "reward_mean": 0.5}])
    after = write_run(tmp_path / "b", [{"iteration": 0, "reward_mean": 0.5, "reward/math": 0.5}])
    assert not compare_metrics.compare_runs(before, after)[0]
    assert compare_metrics.compare_runs(before, after, ("reward/",))[0]
    changed = write_run(tmp_path / "c", [{"iteration": 0, "reward_mean": 0.7, "reward/math": 0.7}])
    assert not compare_metrics.compare_runs(before, changed, ("reward/",))[0]
