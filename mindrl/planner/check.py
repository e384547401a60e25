"""The planner checked on every run: its memory per worker beside what the run measured.

At the end of a run the driver prints, for the stages the planner sizes (generation, if
the run generates, and the actor's update), the planned bytes and the largest peak any
actor worker reported in that stage over the whole run (``mindrl.metrics.memory``). A
ratio far from 1 says the planner's model of this run is wrong, and by how much.

On an accelerator both sides are device bytes: the planner's per-device figures against
the device allocator's peak. On a CPU the "device" is the host, so the honest measured
figure is the worker's peak resident size (host RSS), and the planned side becomes what
a CPU worker holds (:func:`cpu_worker_bytes`): the planner's own terms plus those a
device plan leaves out, each taken from docs/memory.md's accounting of a SmolLM2 actor
rank. The CPU ledger (``device_peak_mib``) is no substitute: it sees only the tensors
declared to it (training weights and resharding buffers), not the optimizer state,
gradients, activations, the engine's weights or the KV cache that the planner sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mindrl.config import MindRLConfig
from mindrl.config.layout import DISAGGREGATED
from mindrl.planner.memory import MemoryPlan
from mindrl.planner.report import plan_run_memory
from mindrl.run_plan import RunPlan

MIB = 2**20

#: Resident size of a CPU worker process that holds no model yet: Python, torch,
#: Megatron-core, transformers, gloo and Ray's worker runtime. Measured on the 2-core box
#: (2026-11-25): a fresh Ray actor is 79 MiB, 374 MiB once it has imported
#: ``mindrl.workers.roles`` (the ModelWorker's module), and 439 MiB after a gloo group
#: and a first HF ``generate``, forward, backward and AdamW step on a 1.3 MB model (the
#: kernels' and thread pool's first-use memory); docs/memory.md.
CPU_WORKER_BASELINE_BYTES = 439 * MIB


@dataclass(frozen=True)
class StageCheck:
    """One stage's planned and measured bytes (measured: None if not seen)."""

    stage: str
    planned: int
    measured: int | None
    measured_as: str  # "device" (allocator peak) or "host RSS" (resident size on a CPU)

    @property
    def ratio(self) -> float | None:
        return self.measured / self.planned if self.measured and self.planned else None


def planned_kv_bytes(memory: MemoryPlan, config: MindRLConfig) -> int:
    """The KV cache one engine holds: ``rollout.kv_cache_mib``, else what the memory
    fraction leaves of the device."""
    if config.rollout.kv_cache_mib is not None:
        return int(config.rollout.kv_cache_mib * MIB)
    generation = memory.generation_swap if config.rollout.swap else memory.generation_naive
    return max(generation.kv_cache_budget, 0)


def planned_actor_bytes(memory: MemoryPlan, config: MindRLConfig, plan: RunPlan) -> dict[str, int]:
    """The actor worker's own device bytes per stage; the other roles live in their own
    workers (collocated on the device, but each measures only itself). A run that
    generates nothing plans the update alone."""
    update = {"update": memory.training.total}
    if not plan.generates:
        return update
    generation = memory.generation_swap if config.rollout.swap else memory.generation_naive
    others = sum(memory.other_roles.values())
    kv = planned_kv_bytes(memory, config)
    return {"rollout": generation.total_without_kv - others + kv, **update}


def cpu_worker_bytes(memory: MemoryPlan, config: MindRLConfig, plan: RunPlan) -> dict[str, int]:
    """The peak resident size of a CPU actor worker per stage, from the planner's terms.

    On a CPU nothing leaves the process: what a device plan swaps to the host or puts to
    sleep stays in the same RAM. So, beside :data:`CPU_WORKER_BASELINE_BYTES`:

    * the training state between stages is the weights and optimizer state; gradients
      exist in the update only (``ModelWorker.update`` releases them after every step,
      so neither generation nor the swap holds them);
    * the generation engine's own weights (one generation shard) stay resident through
      the update: sleeping has nowhere to move them to;
    * with ``rollout.swap`` the pinned host buffers (weights, + optimizer state with
      ``actor.swap_optimizer``), allocated at the first reshard, are kept: a second copy
      of what they swap;
    * while resharding, the resharder's generation buffers (one shard) live until the
      engine has copied them, beside the bucket being all-gathered
      (:func:`gather_bucket_bytes`); the KV cache comes after they are freed, so the
      rollout peak holds the larger of the two.

    Disaggregated, the actor's workers train only (no engine, nothing swapped) and the
    rollout stage is the rollout workers': an engine's weights and its KV cache.
    """
    training, baseline = memory.training, CPU_WORKER_BASELINE_BYTES
    if not plan.generates:
        return {"update": baseline + training.total}
    kv = planned_kv_bytes(memory, config)
    shard = memory.generation_naive.shard
    if plan.mode == DISAGGREGATED:
        return {"rollout": baseline + shard + kv, "update": baseline + training.total}
    swap_buffers = 0
    if config.rollout.swap:
        swap_buffers = training.weights + (training.optimizer if config.actor.swap_optimizer else 0)
    held = baseline + shard + swap_buffers  # both stages, besides the training state
    resharding = shard + gather_bucket_bytes(memory, config)
    return {
        "rollout": held + training.weights + training.optimizer + max(resharding, kv),
        "update": held + training.total,
    }


def gather_bucket_bytes(memory: MemoryPlan, config: MindRLConfig) -> int:
    """The all-gather buffer of one resharding bucket: ``rollout.reshard_bucket_mib`` at
    most, and no more than the TP-gathered weights of a smaller model (the resharder
    gathers bucket by bucket and frees each before the next, mindrl/reshard)."""
    whole = memory.training.weights * config.actor.parallel.tp
    return min(int(config.rollout.reshard_bucket_mib * MIB), whole)


def check_memory(
    config: MindRLConfig,
    plan: RunPlan,
    device_bytes: int,
    stage_peaks: Mapping[str, Mapping[str, float]],
    on_cpu: bool,
) -> list[StageCheck]:
    """Planned against measured for the generation (if ``plan`` generates) and update
    stages: device bytes on an accelerator, the worker's resident size ``on_cpu``.

    ``stage_peaks``: stage name -> the largest ``device_peak_mib`` / ``host_peak_mib``
    over the run (``IterationRunner.stage_peaks``).
    """
    memory = plan_run_memory(config, plan, device_bytes)
    if on_cpu:
        key, measured_as, planned = "host_peak_mib", "host RSS", cpu_worker_bytes
    else:
        key, measured_as, planned = "device_peak_mib", "device", planned_actor_bytes
    checks = []
    for stage, planned_bytes in planned(memory, config, plan).items():
        peak = stage_peaks.get(stage, {}).get(key)
        measured = int(peak * MIB) if peak is not None else None
        checks.append(StageCheck(stage, planned_bytes, measured, measured_as))
    return checks


def format_memory_check(checks: list[StageCheck]) -> str:
    """``memory planned / measured per device ...: rollout 2.69G / 3.10G device (1.15x),
    ...`` (on a CPU: ``per worker`` and ``host RSS``); empty when no planned stage was
    measured."""
    parts = []
    for check in checks:
        if check.measured is None:
            continue  # not measured: the run ended before the stage reported
        text = (
            f"{check.stage} {check.planned / 2**30:.2f}G / "
            f"{check.measured / 2**30:.2f}G {check.measured_as}"
        )
        if check.ratio is not None:
            text += f" ({check.ratio:.2f}x)"
        parts.append(text)
    if not parts:
        return ""
    per = "device" if checks[0].measured_as == "device" else "worker"
    return f"memory planned / measured per {per} (actor, peak of the run): " + ", ".join(parts)
