"""The end-of-run check: the planner's per-device memory beside the run's measured peaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mindrl.config import load_config
from mindrl.planner.check import (
    CPU_WORKER_BASELINE_BYTES,
    check_memory,
    cpu_worker_bytes,
    format_memory_check,
    write_memory_check,
)
from mindrl.planner.memory import (
    GenerationMemory,
    MemoryPlan,
    TrainingMemory,
    gather_bucket_bytes,
    plan_memory,
    rollout_device_memory,
)
from mindrl.planner.report import planned_roles
from mindrl.run_plan import build_run_plan
from trainers.registry import get_algorithm

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GIB, MIB = 2**30, 2**20


def smollm2_plan(*overrides: str):
    config = load_config(CONFIGS / "smollm2_135m.yaml", list(overrides))
    return config, build_run_plan(get_algorithm("grpo"), config)


def round_plan(swap: bool = False) -> MemoryPlan:
    """Weights 100 MiB, grads 100, optimizer 200, activations 50, optimizer step 100, a
    100 MiB generation shard generating with 64 MiB: figures checkable by hand."""
    training = TrainingMemory(100 * MIB, 100 * MIB, 200 * MIB, 50 * MIB, 100 * MIB)
    generation = GenerationMemory(100 * MIB, 400 * MIB, 0, 1, 64 * MIB)
    swapped = 300 * MIB if swap else 0
    return MemoryPlan(24 * GIB, training, generation, generation, 0, swapped)


def test_the_update_peaks_at_the_larger_of_a_micro_batch_and_the_optimizer_step():
    training = round_plan().training
    assert training.resident == 300 * MIB  # weights + optimizer state: grads are released
    # backward: grads 100 + activations 50 < the step: grads 100 + its temporaries 100
    assert training.total == (300 + 200) * MIB
    bigger_micro_batch = TrainingMemory(100 * MIB, 100 * MIB, 200 * MIB, 150 * MIB, 100 * MIB)
    assert bigger_micro_batch.total == (300 + 250) * MIB
    # one micro-batch per step: no gradients exist while its activations do
    one = TrainingMemory(100 * MIB, 100 * MIB, 200 * MIB, 150 * MIB, 10 * MIB, False)
    assert one.total == (300 + 150) * MIB


def test_the_update_is_planned_as_the_actors_update_stage():
    config, plan = smollm2_plan()  # swap off: the engine stays awake through the update
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    checks = {c.stage: c for c in check_memory(config, plan, 24 * GIB, {}, on_cpu=False)}
    assert checks["update"].planned == memory.update_stage
    assert memory.update_stage == memory.training.total + memory.generation_naive.shard
    assert checks["update"].measured is None  # nothing measured yet
    config, plan = smollm2_plan("rollout.swap=true")  # asleep on the host
    assert plan_memory(config, 24 * GIB, planned_roles(plan)).engine_in_update == 0


def test_the_rollout_is_planned_as_the_largest_of_its_four_steps():
    config, plan = smollm2_plan("rollout.swap=true")
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    checks = {c.stage: c for c in check_memory(config, plan, 24 * GIB, {}, on_cpu=False)}
    steps, training = memory.rollout, memory.training
    shard, working = memory.generation_swap.shard, memory.generation_swap.working
    bucket = 512 * MIB  # rollout.reshard_bucket_mib, below SmolLM2's 513 MiB of weights
    assert steps.reshard == training.resident + shard + bucket  # + the generation buffers
    assert steps.load == shard + shard  # the engine's weights woken beside the buffers
    assert steps.generate == shard + working  # weights and moments on the host
    assert steps.swap_in == training.resident  # the engine asleep on the host
    assert checks["rollout"].planned == steps.peak == steps.reshard


def test_the_hf_engine_plans_the_kv_cache_and_logits_of_the_rows_it_batches():
    config, plan = smollm2_plan()  # rollout.kv_cache_mib: 256, 64-sample chunks
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    rollout, model, data = config.rollout, config.model, config.data
    context = rollout.max_prompt_length + rollout.max_response_length
    kv_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 4
    per_row = context * kv_per_token + rollout.max_response_length * model.vocab_size * 4
    per_rank = data.global_batch_size * data.n_samples_per_prompt // 2  # 2 generation ranks
    rows = min(64, per_rank, 256 * MIB // per_row)  # the engine's own batch rule
    kv = rows * (context - 1) * kv_per_token
    logits = rows * rollout.max_response_length * model.vocab_size * 4
    assert memory.generation_naive.working >= kv + logits
    assert memory.generation_naive.working <= (kv + logits) * 1.1  # + one step's extras


def test_each_gpu_process_is_planned_with_its_cublas_workspace_in_every_stage():
    from backends.device import library_workspace_bytes

    assert library_workspace_bytes("cuda") == 64 * MIB  # measured on an H100, torch 2.11
    assert library_workspace_bytes("cpu") == 0
    config, plan = smollm2_plan("algorithm.kl_coef=0.001")  # a reference beside the actor
    bare = plan_memory(config, 80 * GIB, planned_roles(plan))
    gpu = plan_memory(config, 80 * GIB, planned_roles(plan), workspace=64 * MIB)
    assert gpu.update_stage == bare.update_stage + 64 * MIB
    assert gpu.rollout_peak == bare.rollout.peak + 64 * MIB
    assert gpu.other_roles["reference"] == bare.other_roles["reference"] + 64 * MIB
    assert gpu.training_stage_total == bare.training_stage_total + 2 * 64 * MIB
    checks = check_memory(config, plan, 80 * GIB, {}, on_cpu=False, workspace=64 * MIB)
    assert {c.stage: c.planned for c in checks} == {
        "rollout": gpu.rollout_peak,
        "update": gpu.update_stage,
    }


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
    # grads, a 513 MiB engine copy; generation buffers (513) above the engine's working
    # memory.
    training, shard = memory.training, memory.generation_naive.shard
    assert [round(b / MIB) for b in (training.weights, training.optimizer, shard)] == [
        513,
        1026,
        513,
    ]
    base = CPU_WORKER_BASELINE_BYTES
    bucket = 512 * MIB  # rollout.reshard_bucket_mib, below the 513 MiB of weights
    assert gather_bucket_bytes(config, training) == bucket
    resharding = shard + bucket  # generation buffers + the bucket being gathered
    assert resharding > memory.generation_naive.working
    assert on_cpu["rollout"] == base + shard + training.resident + resharding
    assert on_cpu["update"] == base + shard + training.total


def test_a_cpu_worker_holds_the_baseline_the_engines_copy_and_no_grads_while_generating():
    config, plan = smollm2_plan()  # swap off
    base = CPU_WORKER_BASELINE_BYTES
    # engine 100 + weights 100 + optimizer 200 + max(buffers 100 + bucket 100, working 64)
    assert cpu_worker_bytes(round_plan(), config, plan) == {
        "rollout": base + 600 * MIB,
        "update": base + 100 * MIB + 500 * MIB,  # engine + the whole update
    }


def test_the_gathered_bucket_is_the_configured_cap_or_the_tp_gathered_weights_if_smaller():
    config, _ = smollm2_plan()
    training = round_plan().training
    assert gather_bucket_bytes(config, training) == 100 * MIB  # weights < 512 MiB
    config, _ = smollm2_plan("rollout.reshard_bucket_mib=64")
    assert gather_bucket_bytes(config, training) == 64 * MIB
    tp2 = load_config(CONFIGS / "tiny.yaml", ["rollout.reshard_bucket_mib=1000"])
    # 2 TP shards of 100 MiB gathered, and this rank's 100 MiB packed to send
    assert gather_bucket_bytes(tp2, training) == 300 * MIB


def test_on_a_cpu_the_swaps_host_buffers_are_one_more_copy_in_both_stages():
    base = CPU_WORKER_BASELINE_BYTES
    config, plan = smollm2_plan("rollout.swap=true")  # swap_optimizer on: weights + moments
    assert cpu_worker_bytes(round_plan(swap=True), config, plan) == {
        "rollout": base + 900 * MIB,
        "update": base + 900 * MIB,
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


def test_an_accelerators_line_compares_device_bytes_and_says_if_within_15_percent():
    config, plan = smollm2_plan()
    memory = plan_memory(config, 24 * GIB, planned_roles(plan))
    update, rollout = memory.update_stage, memory.rollout.peak
    peaks = {
        "update": {"device_peak_mib": update * 1.10 / MIB},
        "rollout": {"device_peak_mib": rollout * 1.30 / MIB},
    }
    checks = check_memory(config, plan, 24 * GIB, peaks, on_cpu=False)
    assert [c.within_tolerance for c in checks] == [False, True]  # rollout, update
    measured = [c.measured for c in checks]
    assert format_memory_check(checks) == (
        "memory planned / measured per device (actor, peak of the run): "
        f"rollout {rollout / GIB:.2f}G / {measured[0] / GIB:.2f}G device (1.30x, outside "
        f"+-15%), update {update / GIB:.2f}G / {measured[1] / GIB:.2f}G device (1.10x, "
        "within +-15%)"
    )


def test_the_check_is_written_as_json_for_the_accelerator_checks(tmp_path):
    config, plan = smollm2_plan()
    peaks = {"update": {"device_peak_mib": 2048.0}}
    checks = check_memory(config, plan, 24 * GIB, peaks, on_cpu=False)
    write_memory_check(checks, tmp_path / "memory_check.json")
    written = json.loads((tmp_path / "memory_check.json").read_text())
    assert written["tolerance"] == 0.15
    rollout, update = written["stages"]
    assert (rollout["stage"], rollout["measured_bytes"], rollout["within_tolerance"]) == (
        "rollout",
        None,
        None,
    )
    assert (update["stage"], update["measured_bytes"], update["measured_as"]) == (
        "update",
        2 * GIB,
        "device",
    )
    assert update["ratio"] == pytest.approx(2 * GIB / checks[1].planned, abs=1e-4)


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
    engine = rollout_device_memory(config, memory.device_bytes)
    # no engine, swap buffers or resharding in the actor; the rollout worker holds an
    # engine's weights, then the next weights it receives or its working memory (well
    # inside its 64 MiB budget)
    assert 0 < engine.working < 64 * MIB
    assert cpu_worker_bytes(memory, config, plan) == {
        "rollout": CPU_WORKER_BASELINE_BYTES + engine.shard + max(engine.shard, engine.working),
        "update": CPU_WORKER_BASELINE_BYTES + 500 * MIB,
    }
    # decoding continuously, it holds the received weights beside its working memory
    continuous = [*overrides, "rollout.max_staleness=1", "rollout.continuous=true"]
    config = load_config(CONFIGS / "tiny.yaml", continuous, grpo)
    engine = rollout_device_memory(config, memory.device_bytes)
    assert cpu_worker_bytes(memory, config, build_run_plan(grpo, config))["rollout"] == (
        CPU_WORKER_BASELINE_BYTES + 2 * engine.shard + engine.working
    )


def test_a_rollout_worker_whose_engine_runs_its_tp_ranks_apart_is_not_compared():
    grpo = get_algorithm("grpo")
    overrides = [
        "rollout.placement=disaggregated", "resources.devices_per_node=3", "rollout.devices=2",
        "rollout.tp=2", "rollout.engine=vllm", "rollout.max_staleness=1",
        "actor.parallel.tp=1", "reference.parallel.tp=1", "critic.parallel.tp=1",
    ]  # fmt: skip
    config = load_config(CONFIGS / "tiny.yaml", overrides, grpo)
    plan = build_run_plan(grpo, config)
    peaks = {"rollout": {"host_peak_mib": 1800.0}, "update": {"host_peak_mib": 560.0}}
    # vLLM's own processes hold the weights and the KV cache; the worker measured here
    # only receives the weights, so its peak says nothing of the plan.
    for on_cpu in (True, False):
        checks = check_memory(config, plan, 24 * GIB, peaks, on_cpu=on_cpu)
        assert [check.stage for check in checks] == ["update"]


def test_the_continuous_loop_plans_every_slot_live_and_keeps_no_logits():
    from mindrl.planner.generation import hf_working_bytes

    disaggregated = ["rollout.placement=disaggregated", "rollout.devices=1", "rollout.engine=hf"]
    continuous = [*disaggregated, "rollout.max_staleness=1", "rollout.continuous=true"]
    config, _ = smollm2_plan(*continuous)  # 4 prompts x 4 samples, one rollout worker
    working = rollout_device_memory(config, 24 * GIB).working
    assert working == hf_working_bytes(config, rows=16, keeps_logits=False)
    kept_logits = 16 * config.rollout.max_response_length * config.model.vocab_size * 4
    assert hf_working_bytes(config, rows=16) == working + kept_logits
    config, _ = smollm2_plan(*continuous, "rollout.continuous_slots=6")
    assert rollout_device_memory(config, 24 * GIB).working == hf_working_bytes(
        config, rows=6, keeps_logits=False
    )
