"""The end-of-run check: the planner's per-device memory beside the run's measured peaks."""

from __future__ import annotations

from pathlib import Path

from mindrl.config import load_config
from mindrl.planner.check import (
    CPU_WORKER_BASELINE_BYTES,
    check_memory,
    cpu_worker_bytes,
    format_memory_check,
    gather_bucket_bytes,
)
from mindrl.planner.memory import GenerationMemory, MemoryPlan, TrainingMemory, plan_memory
from mindrl.planner.report import planned_roles
from mindrl.run_plan import build_run_plan
from trainers.registry import get_algorithm

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GIB, MIB = 2**30, 2**20


def smollm2_plan(*overrides: str):
    config = load_config(CONFIGS / "smollm2_135m.yaml", list(overrides))
    return config, build_run_plan(get_algorithm("grpo"), config)


def round_plan() -> MemoryPlan:
    """Weights 100 MiB, grads 100, optimizer 200, activations 50, a 100 MiB generation
    shard: figures whose sums can be checked by hand."""
    training = TrainingMemory(100 * MIB, 100 * MIB, 200 * MIB, 50 * MIB)
    generation = GenerationMemory(100 * MIB, 400 * MIB, 0, 1)
    return MemoryPlan(24 * GIB, training, generation, generation, 0, 100 * MIB)


def test_the_update_is_planned_as_the_actors_weights_grads_optimizer_and_activations():
    config, plan = smollm2_plan()
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    checks = {c.stage: c for c in check_memory(config, plan, 24 * GIB, {}, on_cpu=False)}
    assert checks["update"].planned == memory.training.total
    assert checks["update"].measured is None  # nothing measured yet


def test_generation_is_planned_with_the_configured_kv_cache_not_the_free_remainder():
    config, plan = smollm2_plan()  # rollout.kv_cache_mib: 256, swap off
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    checks = {c.stage: c for c in check_memory(config, plan, 24 * GIB, {}, on_cpu=False)}
    assert checks["rollout"].planned == memory.generation_naive.total_without_kv + 256 * MIB


def test_a_cpu_run_is_measured_by_resident_size_and_an_accelerator_by_the_allocator():
    config, plan = smollm2_plan()
    peaks = {"update": {"host_peak_mib": 4096.0, "device_peak_mib": 512.0}}
    on_cpu = {c.stage: c for c in check_memory(config, plan, 24 * GIB, peaks, on_cpu=True)}
    on_gpu = {c.stage: c for c in check_memory(config, plan, 24 * GIB, peaks, on_cpu=False)}
    assert (on_cpu["update"].measured, on_cpu["update"].measured_as) == (4 * GIB, "host RSS")
    assert (on_gpu["update"].measured, on_gpu["update"].measured_as) == (512 * MIB, "device")
    assert on_cpu["update"].ratio == 4 * GIB / on_cpu["update"].planned


def test_on_a_cpu_the_planned_side_is_the_workers_resident_size_not_the_device_plan():
    config, plan = smollm2_plan()
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    on_cpu = {c.stage: c.planned for c in check_memory(config, plan, 24 * GIB, {}, on_cpu=True)}
    assert on_cpu == cpu_worker_bytes(memory, config, plan)
    # SmolLM2 (fp32, TP1, no swap): 513 MiB of weights, 1026 of AdamW moments, 513 of
    # grads, a 513 MiB engine copy; generation buffers (513) above the 256 MiB KV cache.
    training, shard = memory.training, memory.generation_naive.shard
    assert [round(b / MIB) for b in (training.weights, training.optimizer, shard)] == [
        513,
        1026,
        513,
    ]
    base = CPU_WORKER_BASELINE_BYTES
    bucket = 512 * MIB  # rollout.reshard_bucket_mib, below the 513 MiB of weights
    assert gather_bucket_bytes(memory, config) == bucket
    resharding = shard + bucket  # generation buffers + the bucket being gathered > KV 256
    state = training.weights + training.optimizer
    assert on_cpu["rollout"] == base + shard + state + resharding
    assert on_cpu["update"] == base + shard + training.total


def test_a_cpu_worker_holds_the_baseline_the_engines_copy_and_no_grads_while_generating():
    config, plan = smollm2_plan()  # swap off, rollout.kv_cache_mib: 256
    base = CPU_WORKER_BASELINE_BYTES
    # engine 100 + weights 100 + optimizer 200 + max(buffers 100, KV 256)
    assert cpu_worker_bytes(round_plan(), config, plan) == {
        "rollout": base + 656 * MIB,
        "update": base + 100 * MIB + 450 * MIB,  # engine + the whole training stage
    }


def test_on_a_cpu_the_resharders_buffers_set_the_generation_peak_above_a_small_kv_cache():
    config, plan = smollm2_plan("rollout.kv_cache_mib=64")
    rollout = cpu_worker_bytes(round_plan(), config, plan)["rollout"]
    # engine 100 + state 300 + (generation buffers 100 + the whole 100 MiB in one bucket)
    assert rollout == CPU_WORKER_BASELINE_BYTES + (100 + 300 + 200) * MIB


def test_the_gathered_bucket_is_the_configured_cap_or_the_tp_gathered_weights_if_smaller():
    config, _ = smollm2_plan()
    assert gather_bucket_bytes(round_plan(), config) == 100 * MIB  # weights < 512 MiB
    config, _ = smollm2_plan("rollout.reshard_bucket_mib=64")
    assert gather_bucket_bytes(round_plan(), config) == 64 * MIB
    tp2 = load_config(CONFIGS / "tiny.yaml", ["rollout.reshard_bucket_mib=1000"])
    assert gather_bucket_bytes(round_plan(), tp2) == 200 * MIB  # 2 TP shards of 100 MiB


def test_on_a_cpu_the_swaps_host_buffers_are_one_more_copy_in_both_stages():
    base = CPU_WORKER_BASELINE_BYTES
    config, plan = smollm2_plan("rollout.swap=true")  # swap_optimizer on: weights + moments
    assert cpu_worker_bytes(round_plan(), config, plan) == {
        "rollout": base + 956 * MIB,
        "update": base + 850 * MIB,
    }
    config, plan = smollm2_plan("rollout.swap=true", "actor.swap_optimizer=false")
    assert cpu_worker_bytes(round_plan(), config, plan) == {
        "rollout": base + 756 * MIB,
        "update": base + 650 * MIB,
    }


def test_the_line_names_each_measured_stage_with_its_ratio_and_skips_unmeasured_ones():
    config, plan = smollm2_plan()
    peaks = {"update": {"host_peak_mib": 4096.0}}
    checks = check_memory(config, plan, 24 * GIB, peaks, on_cpu=True)
    update = next(c for c in checks if c.stage == "update")
    line = format_memory_check(checks)
    assert line.startswith("memory planned / measured per worker (actor, peak of the run): ")
    assert f"update {update.planned / GIB:.2f}G / 4.00G host RSS ({update.ratio:.2f}x)" in line
    assert "rollout" not in line


def test_an_accelerators_line_compares_device_bytes_per_device():
    config, plan = smollm2_plan()
    peaks = {"update": {"device_peak_mib": 2048.0}, "rollout": {"device_peak_mib": 3072.0}}
    checks = check_memory(config, plan, 24 * GIB, peaks, on_cpu=False)
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    update = memory.training.total
    rollout = memory.generation_naive.total_without_kv + 256 * MIB
    assert format_memory_check(checks) == (
        "memory planned / measured per device (actor, peak of the run): "
        f"rollout {rollout / GIB:.2f}G / 3.00G device ({3 * GIB / rollout:.2f}x), "
        f"update {update / GIB:.2f}G / 2.00G device ({2 * GIB / update:.2f}x)"
    )


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
    planned = CPU_WORKER_BASELINE_BYTES + memory.training.total  # no engine, no swap
    assert (check.stage, check.planned, check.measured) == ("update", planned, GIB)
    line = format_memory_check([check])
    assert line.endswith(f"update {check.planned / GIB:.2f}G / 1.00G host RSS ({check.ratio:.2f}x)")
    assert "rollout" not in line


def test_disaggregated_on_a_cpu_the_actor_trains_only_and_the_rollout_worker_generates():
    grpo = get_algorithm("grpo")
    tp1 = ["actor.parallel.tp=1", "reference.parallel.tp=1", "critic.parallel.tp=1"]
    overrides = ["rollout.placement=disaggregated", "rollout.devices=1", *tp1]
    config = load_config(CONFIGS / "tiny.yaml", overrides, grpo)  # swap on, KV 64 MiB
    plan = build_run_plan(grpo, config)
    memory = round_plan()
    # no engine, swap buffers or resharding in the actor; the rollout worker holds an
    # engine's weights and its KV cache
    assert cpu_worker_bytes(memory, config, plan) == {
        "rollout": CPU_WORKER_BASELINE_BYTES + (100 + 64) * MIB,
        "update": CPU_WORKER_BASELINE_BYTES + 450 * MIB,
    }
