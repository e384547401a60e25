"""scripts/accelerator_checks.sh: on a machine without an accelerator it says so in one
line, writes the JSON summary with every check skipped and exits 0; a check whose
packages are missing is skipped naming them; a failing command is reported as failed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.devices import missing_reason

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "accelerator_checks.sh"
ACCELERATOR_MODULES = {
    "tests/foundation/test_device_layer.py",
    "tests/megatron/test_engine_on_devices.py",
    "tests/reshard/test_measure_on_devices.py",
}


def load_checks_module():
    spec = importlib.util.spec_from_file_location("accelerator_checks", SCRIPT.with_suffix(".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


checks = load_checks_module()
no_accelerator = all(missing_reason(name) is not None for name in ("cuda", "npu"))


@pytest.mark.skipif(not no_accelerator, reason="this machine has an accelerator")
def test_without_an_accelerator_every_check_is_skipped_in_one_line_and_json(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(out)],
        env=os.environ | {"PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("accelerator checks: no accelerator (")

    summary = json.loads(out.read_text())
    assert summary["accelerator"]["device"] is None
    assert "cuda:" in summary["accelerator"]["absent_because"]
    names = [c["name"] for c in summary["checks"]]
    assert {
        n.removeprefix("tests ") for n in names if n.startswith("tests ")
    } >= ACCELERATOR_MODULES
    assert {"train_step dense-1b MFU", "reshard --measure swap bandwidth"} <= set(names)
    assert {"rollout weight hand-over", *checks.RUN_NAMES} <= set(names)
    for check in summary["checks"]:
        assert (check["status"], check["rc"], check["seconds"]) == (
            "skipped: no accelerator",
            None,
            0,
        )
    commands = {c["name"]: c["command"] for c in summary["checks"]}
    assert (
        "-m 'cuda or npu or multi_device'"
        in commands["tests tests/megatron/test_engine_on_devices.py"]
    )
    assert "benchmarks/train_step.py" in commands["train_step dense-1b MFU"]
    assert "--models dense-1b" in commands["train_step dense-1b MFU"]
    assert "benchmarks/reshard.py --measure" in commands["reshard --measure swap bandwidth"]
    assert summary["counts"] == {"passed": 0, "failed": 0, "skipped": len(names)}


def machine_with(**modules: bool):
    return checks.Machine("cpu", 1, torch="any", modules=modules)


def test_a_check_whose_package_is_missing_is_skipped_naming_it_without_running():
    check = checks.Check("needs ray", [sys.executable, "-c", "raise SystemExit(1)"], ("ray",))
    checks.execute(check, machine_with(ray=False), timeout_s=60)
    assert check.result == {
        "status": "skipped: needs ray (not installed)",
        "rc": None,
        "seconds": 0.0,
    }


def test_an_import_of_a_missing_third_party_module_is_a_skip_and_any_other_failure_a_failure():
    missing = checks.Check("imports", [sys.executable, "-c", "import no_such_module_xyz"])
    checks.execute(missing, machine_with(), timeout_s=60)
    assert missing.result["status"] == "skipped: needs no_such_module_xyz (import failed)"
    assert missing.result["rc"] == 1

    broken = checks.Check("fails", [sys.executable, "-c", "import mindrl.no_such_part"])
    checks.execute(broken, machine_with(), timeout_s=60)
    assert (broken.result["status"], broken.result["rc"]) == ("failed", 1)
    assert "No module named 'mindrl.no_such_part'" in broken.result["output_tail"]


def test_a_passing_check_carries_the_figures_of_its_json_output():
    code = "import json, warnings; print('warming up'); print(json.dumps({'mfu': 0.41}, indent=2))"
    check = checks.Check(
        "bench", [sys.executable, "-c", code], parse=lambda out, _w: checks.last_json_document(out)
    )
    checks.execute(check, machine_with(), timeout_s=60)
    assert (check.result["status"], check.result["rc"]) == ("passed", 0)
    assert check.result["figures"] == {"mfu": 0.41}


def test_the_accelerator_test_modules_are_found_by_their_markers():
    found = {str(p.relative_to(ROOT)) for p in checks.accelerator_test_files()}
    assert found >= ACCELERATOR_MODULES
    assert "tests/foundation/test_layering.py" not in found


def test_the_peak_for_mfu_comes_from_the_product_name_or_the_environment(monkeypatch):
    monkeypatch.delenv("MINDRL_PEAK_TFLOPS", raising=False)
    assert checks.peak_tflops(checks.Machine("cuda", 1, product="NVIDIA H100 80GB HBM3")) == 989.0
    assert checks.peak_tflops(checks.Machine("cuda", 1, product="NVIDIA H100 PCIe")) == 756.0
    assert checks.peak_tflops(checks.Machine("npu", 1, product=None)) is None
    monkeypatch.setenv("MINDRL_PEAK_TFLOPS", "313")
    assert checks.peak_tflops(checks.Machine("npu", 1)) == 313.0


def test_on_a_gpu_box_without_ray_and_vllm_the_run_is_skipped_and_rollout_says_hf_only(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("MINDRL_PEAK_TFLOPS", raising=False)
    machine = checks.Machine(
        "cuda",
        1,
        product="NVIDIA H100 80GB HBM3",
        torch="2.11",
        modules={"ray": False, "vllm": False},
    )
    by_name = {c.name: c for c in checks.all_checks(sys.executable, machine, tmp_path)}
    run = by_name["run grpo tiny kl 0.001"]
    checks.execute(run, machine, timeout_s=60)
    assert run.result["status"] == "skipped: needs ray (not installed)"
    assert by_name["rollout weight hand-over"].notes == ["vllm not installed: hf engine only"]
    train = by_name["train_step dense-1b MFU"].command
    assert train[train.index("--peak-tflops") + 1] == "989.0"
    assert train[train.index("--tp") + 1] == "1"  # one device: no TP=2 row
    reshard = by_name["reshard --measure swap bandwidth"].command
    assert reshard[reshard.index("--world") + 1 : reshard.index("--world") + 4] == [
        "1",
        "--layout-world",
        "2",
    ]


#: What pytest wrote for tests/megatron/test_engine_on_devices.py on the first H200: two
#: errors, and the npu tests skipped with the device layer's reason, which names a module.
ERRORS_AND_AN_IMPORT_SKIP = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="2" failures="0" skipped="6" tests="10">
<testcase classname="tests.megatron.test_engine_on_devices" name="test_one[cuda-moe]">
<error message="NameError: name 'te_general_gemm' is not defined">trace</error></testcase>
<testcase classname="tests.megatron.test_engine_on_devices" name="test_one[npu-dense]">
<skipped type="pytest.skip" message="no npu device here: needs torch_npu (import failed:
ModuleNotFoundError: No module named 'torch_npu')">skip</skipped></testcase>
</testsuite></testsuites>
"""


def test_a_test_module_with_errors_is_failed_even_when_its_output_names_a_missing_module(
    tmp_path,
):
    xml = tmp_path / "module.xml"
    junit = ERRORS_AND_AN_IMPORT_SKIP
    code = (
        f"import pathlib, sys; pathlib.Path({str(xml)!r}).write_text({junit!r}); "
        "print(\"SKIPPED [6] needs torch_npu: ModuleNotFoundError: No module named 'torch_npu'\"); "
        "sys.exit(1)"
    )
    check = checks.Check("tests module", [sys.executable, "-c", code], junit=xml)
    checks.execute(check, machine_with(), timeout_s=60)
    assert check.result["status"] == "failed: 0 failed, 2 errors"
    assert check.result["figures"]["errors"] == 2
    assert "No module named 'torch_npu'" in check.result["output_tail"]


def test_a_test_module_whose_tests_all_skip_or_pass_says_so_from_its_junit_counts(tmp_path):
    def run(skipped: int, tests: int) -> str:
        xml = tmp_path / f"{skipped}-{tests}.xml"
        xml.write_text(
            f'<testsuites><testsuite errors="0" failures="0" skipped="{skipped}" '
            f'tests="{tests}"></testsuite></testsuites>'
        )
        check = checks.Check("tests module", [sys.executable, "-c", "pass"], junit=xml)
        checks.execute(check, machine_with(), timeout_s=60)
        return check.result["status"]

    assert run(skipped=3, tests=3) == "skipped: all 3 tests skipped (see skip_reasons)"
    assert run(skipped=0, tests=0) == "skipped: no test selected"
    assert run(skipped=1, tests=3) == "passed"


def test_the_runs_are_the_issues_four_on_one_device_each_bounded_in_time(tmp_path):
    machine = checks.Machine("cuda", 1, torch="2.11", modules={"ray": True})
    runs = {c.name: c for c in checks.run_checks(sys.executable, machine, tmp_path)}
    assert list(runs) == [
        "run 0.18b grpo planned vs measured",
        "run grpo tiny kl 0.001",
        "run ppo tiny",
        "run tiny_deepseek tp1 ep1",
    ]
    for check in runs.values():
        command = " ".join(check.command)
        assert "--device cuda" in command and "resources.devices_per_node=1" in command
        assert "actor.parallel.tp=1" in command and "actor.parallel.ep=1" in command
        assert 0 < check.timeout_s <= 240
    assert "--trainer ppo" in " ".join(runs["run ppo tiny"].command)
    assert "algorithm.kl_coef=0.001" in runs["run grpo tiny kl 0.001"].command
    big = runs["run 0.18b grpo planned vs measured"].command
    assert {"model.num_layers=12", "model.hidden_size=1024", "model.dtype=bfloat16"} <= set(big)
    assert {"data.global_batch_size=64", "data.n_samples_per_prompt=8"} <= set(big)
    # The whole list, run one after the other, leaves time in a 10-minute device call.
    every = checks.all_checks(sys.executable, machine, tmp_path)
    assert checks.BUDGET_S <= 540 and min(c.timeout_s for c in every) > checks.MIN_CHECK_S


def test_on_the_cpu_only_the_runs_are_shortened_and_run_the_rest_skips(tmp_path):
    machine = checks.Machine("cpu", 1, torch="any", modules={"ray": True})
    runs = checks.run_checks(sys.executable, machine, tmp_path)
    big = runs[0].command
    assert "iterations=2" in big and "model.num_layers=2" in big and "--device" in big
    assert big[big.index("--device") + 1] == "cpu"
    assert runs[0].notes == ["scaled for the CPU: model.num_layers=2 data.global_batch_size=8"]


def test_a_check_past_its_time_is_killed_with_its_children_and_failed(tmp_path):
    marker = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(marker)!r}, 'w').write(str(child.pid)); time.sleep(60)"
    )
    check = checks.Check("slow", [sys.executable, "-c", code])
    checks.execute(check, machine_with(), timeout_s=3)
    assert check.result["status"] == "failed: timed out" and check.result["rc"] is None
    assert check.result["seconds"] < 30
    child = int(marker.read_text())
    with pytest.raises(ProcessLookupError):  # the grandchild went with its group
        for _ in range(50):
            os.kill(child, 0)
            time.sleep(0.1)


def test_the_mfu_rows_say_whether_they_reach_the_goal():
    out = json.dumps(
        {"results": [{"model": "dense-1b", "tp": 1, "mfu": 0.36}, {"tp": 2, "mfu": 0.2}]},
        indent=2,
    )
    figures = checks.train_step_figures("building\n" + out, checks.MFU_GOAL)
    assert [(r["mfu_goal"], r["meets_goal"]) for r in figures["results"]] == [
        (0.35, True),
        (0.35, False),
    ]


def test_a_runs_memory_figures_come_from_its_memory_check_file(tmp_path):
    (tmp_path / "memory_check.json").write_text(
        json.dumps(
            {
                "tolerance": 0.15,
                "stages": [
                    {
                        "stage": "rollout",
                        "planned_bytes": 2 * 2**30,
                        "measured_bytes": 2**31 + 2**27,
                        "measured_as": "device",
                        "ratio": 1.0625,
                        "within_tolerance": True,
                    }
                ],
            }
        )
    )
    assert checks.memory_figures(tmp_path / "memory_check.json") == {
        "rollout": {
            "planned_gib": 2.0,
            "measured_gib": 2.125,
            "ratio": 1.0625,
            "measured_as": "device",
            "within_tolerance": True,
        },
        "tolerance": 0.15,
    }
    assert checks.memory_figures(tmp_path / "absent.json") is None


def test_a_runs_figures_say_how_much_of_its_updates_was_padding(tmp_path):
    records = [
        {"iteration_time_s": 9.0, "reward_mean": 0.1, "train_tokens_per_real_token": 1.04},
        {"iteration_time_s": 1.0, "reward_mean": 0.3, "train_tokens_per_real_token": 1.08},
        {"iteration_time_s": 2.0, "reward_mean": 0.5, "train_tokens_per_real_token": 1.02},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    figures = checks.run_figures(tmp_path)
    assert figures["train_tokens_per_real_token"] == 1.08  # the worst update's
    assert (figures["iterations"], figures["first_iteration_s"]) == (3, 9.0)
    assert figures["iteration_time_s"] == 1.5 and figures["memory"] is None
