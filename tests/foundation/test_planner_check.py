"""The end-of-run check: the planner's per-device memory beside the run's measured peaks."""

from __future__ import annotations

from pathlib import Path

from mindrl.config import load_config
from mindrl.planner.check import check_memory, format_memory_check
from mindrl.planner.memory import plan_memory
from mindrl.planner.report import planned_roles
from mindrl.run_plan import build_run_plan
from trainers.registry import get_algorithm

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GIB, MIB = 2**30, 2**20


def smollm2_plan():
    config = load_config(CONFIGS / "smollm2_135m.yaml")
    return config, build_run_plan(get_algorithm("grpo"), config)


def test_the_update_is_planned_as_the_actors_weights_grads_optimizer_and_activations():
    config, plan = smollm2_plan()
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    checks = {c.stage: c for c in check_memory(config, plan, 24 * GIB, {}, on_cpu=True)}
    assert checks["update"].planned == memory.training.total
    assert checks["update"].measured is None  # nothing measured yet


def test_generation_is_planned_with_the_configured_kv_cache_not_the_free_remainder():
    config, plan = smollm2_plan()  # rollout.kv_cache_mib: 256, swap off
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    checks = {c.stage: c for c in check_memory(config, plan, 24 * GIB, {}, on_cpu=True)}
    assert checks["rollout"].planned == memory.generation_naive.total_without_kv + 256 * MIB


def test_a_cpu_run_is_measured_by_resident_size_and_an_accelerator_by_the_allocator():
    config, plan = smollm2_plan()
    peaks = {"update": {"host_peak_mib": 4096.0, "device_peak_mib": 512.0}}
    on_cpu = {c.stage: c for c in check_memory(config, plan, 24 * GIB, peaks, on_cpu=True)}
    on_gpu = {c.stage: c for c in check_memory(config, plan, 24 * GIB, peaks, on_cpu=False)}
    assert (on_cpu["update"].measured, on_cpu["update"].measured_as) == (4 * GIB, "host")
    assert (on_gpu["update"].measured, on_gpu["update"].measured_as) == (512 * MIB, "device")
    assert on_cpu["update"].ratio == 4 * GIB / on_cpu["update"].planned


def test_the_line_names_each_measured_stage_with_its_ratio_and_skips_unmeasured_ones():
    config, plan = smollm2_plan()
    peaks = {"update": {"host_peak_mib": 4096.0}}
    checks = check_memory(config, plan, 24 * GIB, peaks, on_cpu=True)
    update = next(c for c in checks if c.stage == "update")
    line = format_memory_check(checks)
    assert f"update {update.planned / GIB:.2f}G / 4.00G host ({update.ratio:.2f}x)" in line
    assert "rollout" not in line


def test_nothing_is_printed_when_no_planned_stage_was_measured():
    config, plan = smollm2_plan()
    assert format_memory_check(check_memory(config, plan, 24 * GIB, {}, on_cpu=True)) == ""


def test_a_dpo_run_is_checked_on_its_update_alone_with_no_rollout_figure():
    dpo = get_algorithm("dpo")
    config = load_config(CONFIGS / "tiny_dpo.yaml", algorithm=dpo)
    plan = build_run_plan(dpo, config)
    peaks = {"rollout": {"host_peak_mib": 512.0}, "update": {"host_peak_mib": 1024.0}}
    (check,) = check_memory(config, plan, 24 * GIB, peaks, on_cpu=True)
    memory = plan_memory(config, 24 * GIB, ("actor", "reference"), generates=False)
    assert (check.stage, check.planned, check.measured) == ("update", memory.training.total, GIB)
    line = format_memory_check([check])
    assert line.endswith(f"update {check.planned / GIB:.2f}G / 1.00G host ({check.ratio:.2f}x)")
    assert "rollout" not in line
