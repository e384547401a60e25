"""Sync vs streaming vs asynchronous iterations: measured here, and simulated on the
paper's 16-device cluster; with ``--partial-budget``, whole vs partial rollout measured.

**Measured.** One process, one Ray session: the same config (``--config``, tiny by
default) trains ``--iterations`` iterations in each mode (``MODES``), ``--repeats`` times
in alternating order so a shift in machine load hits all alike:

* ``sync`` / ``stream``: ``dock.pipeline`` sync / stream, collocated (every device
  generates and trains);
* ``disagg-sync``: ``rollout.placement: disaggregated``, ``rollout.devices`` =
  ``--rollout-devices`` (default half the world) generate and the rest train,
  ``rollout.max_staleness: 0``: on-policy, so it shows the placement's cost alone;
* ``async``: the same placement with ``max_staleness: 1``: the next batch generates while
  this one trains (docs/architecture.md section 8);
* ``continuous``: the same with ``rollout.continuous: true``: the rollout worker keeps
  its slots decoding, refilling each as its sequence ends, and the update trains groups
  in draw order (trainers/driver/continuous.py).

Every mode uses the same devices (TPS, paper Eq. 5, is per device of the whole world) and
trains its roles at ``--train-tp`` (default 1: the disaggregated modes train on
``world - rollout devices``, one on tiny), so the layouts differ in data parallelism
only. Per mode, after ``--warmup`` iterations: median iteration time, TPS and samples/s;
each stage's wall, busy and overlap time (a streamed stage's wall: its tail after
generation; async: ``rollout`` wall is the wait when the batch is collected, its overlap
the generation that ran during the previous update, ``weight_transfer`` the hand-over);
the overhead (dock operations, resharding, scheduling; ``dock beside``: the dock time of
continuous generation's scoring chunks, spent in the scoring workers beside decoding and
training, so not inside the iteration); the trained samples' staleness.
Ratios are each mode / sync and async / disagg-sync (the asynchrony's own gain). Stream
and sync train on the same samples (checked: every non-timing metric equal); the
disaggregated modes do not (generation is split differently, and async trains on samples
one update old), so only their times compare.

**Simulated.** The paper's 16-device setup (2 nodes x 8 NPUs, 128 GB each; GRPO on
Qwen2.5-7B, G=256 prompts x N=16 responses; host<->device 50 GB/s, 300 MB/s between
servers; MindSpeed RL paper, "Experiments"). The paper gives no per-stage times, so
they come from this cost model (every constant is a flag, printed with the result):

* generation: vLLM, TP1 x DP16, a replica decoding as many sequences at once as its KV
  cache holds (HBM x 0.9 less the bf16 weights, over the length-weighted live context;
  Qwen2.5-7B's K and V are 2 x 28 layers x 4 KV heads x 128 x 2 B = 56 KiB per token),
  admitting the next as one ends. A decode step is bound by its HBM reads, the bf16
  weights (2P bytes, the same for one live sequence as for 200) plus the live
  sequences' KV cache, ``t_step = (2P + kv_bytes) / (HBM_BW * eff)``, unless its FLOPs
  (``2P`` per live sequence, attention ``4 x layers x q_heads x head_dim`` per context
  token) take longer at ``--sim-decode-mfu``; at these batch sizes they never do. So a
  drain with few sequences live pays the whole weight read per token of each. A prefill
  costs ``2P * L_p / (peak * prefill_mfu)`` per prompt; response lengths are log-normal
  (mean ``--sim-response-mean``, sigma ``--sim-response-sigma``, capped at
  ``--sim-response-max``) -- the long tail the paper and AReaL describe. A response is
  ready when its replica has decoded its last token.
* reward: rule-based, ``--sim-reward-ms`` per response on ``--sim-reward-workers`` CPU
  workers, served first-come first-served.
* reference log-probs: a forward pass, ``2P`` FLOPs per token at ``--sim-mfu``;
  update: ``6P`` FLOPs per token at ``--sim-mfu`` (one optimizer step per iteration, so
  no old-log-prob pass).
* resharding: the training state (16 B/param: bf16 weights, fp32 master + Adam moments)
  swapped out and back at 50 GB/s, sharded over the 16 devices;
  dock dispatch: the planner's per-warehouse volume (paper Eq. 4, 2 warehouses) at
  300 MB/s.

Sync runs the stages one after another. Stream lets the reward workers take responses
as they finish (what ``dock.pipeline: stream`` does); the reference and the update share
the actor's devices and still take turns. A what-if row puts the reference on a quarter
of the devices (4 of 16; generation and update on the other 12): a placement mindrl does
not build, shown to say where streaming pays.

The disaggregated rows generate on ``--sim-rollout-devices`` (default 8: one node
generates, the other trains) and run the reference and the update on the rest; nothing
is swapped (each side holds only its own state) and after every update the bf16 weights
(2 B/param, 15.2 GB) go to the rollout workers at ``--sim-transfer-mb-per-s``, default
300 MB/s: the paper's only figure between servers, which an 8 + 8 split crosses (an
RDMA or HCCS / NVLink link is ~100x faster; ``--sim-transfer-mb-per-s 25600`` for
25 GB/s). The reward scores a batch once it is collected (stream is refused with the
placement). ``disagg-sync`` runs the stages one after another; ``async`` as mindrl's
runner does (trainers/driver/async_iteration.py): batch k+1 starts generating after
batch k's reward, weight transfer and reference pass and runs beside batch k's update,
so an iteration takes reward + transfer + reference + dock + max(generation, update) in
steady state. ``async, best split`` is the async row at the number of generating devices
(1..15) with the shortest iteration; memory and the KV cache's capacity are not checked.
``continuous async`` (trainers/driver/continuous.py) generates at a replica's steady
full-slot rate (no drain: a slot is refilled the step its sequence ends), scores and
hands weights over beside decoding, and takes the slowest of generation, the training
side (update + the longer of the reference pass and the transfer) and the reward. The
*overlap ceiling* is what no placement beats: the same work at the full-slot rate with
every device busy all the time; beside it, how much longer sync's batched generation
takes than that work at the full-slot rate (its drain). The long-CoT comparison is also
run with each accelerator's figures (``DEVICES``: Ascend 910B, H100 SXM5, H200 SXM; the
other constants unchanged).

What the model predicts, and why peers report more. With the defaults, async is 0.77x
sync at 8 + 8 and 0.95x at its best split (6 + 10): the asynchrony itself gains 1.45x
over the same placement on-policy (async / disagg-sync 0.688x), but each side has half
the devices and the update and the reference scale linearly with them (generation
nearly so: 546 s on 8 devices vs 338 s on 16). Continuous async is 1.10x at its best
split (5 + 11), and with long-CoT lengths (mean 8K, max 32K) 1.27x at 8 + 8, against an
overlap ceiling of 1.29x; the issue's goal, 2x, is out of reach at 16 devices in this
model, on every accelerator (910B 1.27x, H100 1.24x, H200 1.26x at their best splits;
ceilings 1.29x, 1.31x, 1.30x). Continuous refill removes the batch's drain, not work:
sync's long-CoT generation takes 1.57x the same work at the full-slot rate (2287 s of
3721 s), since each of 16 replicas holds 256 of the batch's 4096 sequences against 84
KV slots, so its batch stays full for two waves and only the third drains; the update
and the reference pass (1416 s) are the same work either way. verl's fully-async
trainer reports 2.35-2.67x with Qwen2.5-7B on 128 GPUs: with ``--sim-devices 128
--sim-rollout-devices 64`` this model gives 2.45x (2.58x at 68 + 60), a ceiling of
2.72x and a drain of 4.48x, as each replica then holds 32 sequences, fewer than its
slots, and the whole batch is one wave waiting for its longest response. The gain is
the drain's, and the drain grows with devices per sample. The
scale table (the same batch on 16, 32, 64 and 128 devices) shows it: continuous async,
long-CoT, best split, x1.27, x1.43, x1.81, x2.58. At 16 devices 2x would need the
iteration in 1860 s, and its work alone, every device busy at the full-slot rate, takes
2886 s: no schedule of this work reaches 2x there.

Figures of the four modes (2026-11-25, this 2-core x86_64 box, quiet: load 1.0 at start;
``--iterations 20 --repeats 4``; tiny at TP 1, 128 samples per iteration; disaggregated:
1 device generates, 1 trains). Median iteration: sync 0.176 s (TPS 3233, 728 samples/s),
stream 0.183 s (1.04x the time: the tiny task's reward is ~10 ms, nothing to hide),
disagg-sync 0.202 s (1.15x), async 0.164 s (0.93x; TPS 1.08x, samples/s 1.07x; 0.81x of
disagg-sync): the next batch's generation (0.082 s busy) ran wholly during the update,
collection waited 0 s, staleness 1. Each repeat's median stayed within 0.02 s of the
others. Simulated (defaults, 2026-11-26): sync 918.6 s per iteration, stream 913.5 s
(x1.006), disagg-sync 1746.4 s (x0.53), async 8 + 8 1200.8 s (x0.77), best split 6 + 10
972.0 s (x0.95), continuous async 8 + 8 1147.4 s (x0.80), best split 5 + 11 835.4 s
(x1.10); with the transfer at 25 GB/s async is x0.80, its best split x0.99.

Continuous vs sync measured (2026-11-26, under the heavy-run lock, quiet: load average
1.6 -> 2.6; ``--modes sync continuous --warm-start-steps 400 --iterations 30 --warmup 5
--repeats 3``, ``synthetic:longtail-48``, 64-token responses and prompts, lr 1e-4;
continuous on 1 rollout + 1 training device): sync 39.27 trained groups/s, continuous
51.14 (1.302x; per repeat 1.296x, 1.240x, 1.378x), both trained responses of 8.3 tokens
and prompts of 10.3 on average, 0 of continuous's 1200 drawn groups refused as stale,
final reward 0.995 vs 0.994; a second invocation 1.296x (1.216x, 1.295x, 1.387x). With
``--continuous-slots 256`` (two batches) 1.225x. Five later invocations on the quiet box
gave 1.20x-1.45x, 7d0ea46 1.217x. On 2026-11-27, with GRPO's advantages computed in the
reward workers' call, three invocations gave 1.385x, 1.341x and at 62ee1be (``--modes
sync stream continuous --repeats 4``) 1.375x, median repeat 1.301x (stream 1.034x),
final reward 0.996 vs 0.995: 1.3x reached in all three, within the spread between
invocations; at 27399d7 1.398x (per repeat 1.376x-1.424x), final reward 0.995 vs
0.995. What bounds it is the wait for a due batch's longest response (a third of the
iterations) and the two cores four busy processes share.
Details and why: docs/pipeline.md, "Continuous generation".

**Partial rollout** (``--partial-budget B``): instead of the four modes, the same config
trains with every response generated to its end (``whole``) and with
``rollout.partial_rollout_budget=B`` under both refill rules (``partial``: fresh prompts
only for missing finished groups; ``partial-pool``: into every free slot),
``--repeats`` times in alternating order in one Ray session. Per run kind: p50 / p90 /
max iteration time after ``--warmup`` iterations, the trained throughput (trained tokens
/ wall seconds, the records' ``tps`` times their seconds; and trained groups / wall
seconds), groups trained, generation rounds and staleness per iteration, each stage's
mean wall time (where the time goes); ratios are over whole. Use a task with
long-tailed response lengths, ``data.source=synthetic:longtail`` (1 prompt in 8 asks for
a 12-digit answer) or ``synthetic:longtail-48`` (48 digits), with room for it, and
``--warm-start-steps S``: S supervised steps on the task's right answers first
(benchmarks/harness/warm_start.py), so that responses are long because their prompt
asks for more, not because an untrained policy never emits eos. Measured figures and
what they mean: docs/pipeline.md, "Partial rollout" (small gains on the 2-core CPU box).

    .venv/bin/python benchmarks/async.py                       # tiny, 12 iterations x 1
    .venv/bin/python benchmarks/async.py --partial-budget 16 --warm-start-steps 400 \
        --iterations 30 --warmup 5 --repeats 2 --set data.source=synthetic:longtail-48 \
        rollout.max_response_length=64 rollout.max_prompt_length=64 actor.optim.lr=1e-4
    .venv/bin/python benchmarks/async.py --iterations 20 --repeats 4 --json out.json
    .venv/bin/python benchmarks/async.py --simulate-only
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.report import machine  # noqa: E402  (after the path)
from mindrl.planner.sample_flow import dispatch_seconds, sample_flow  # noqa: E402

#: What a disaggregated run adds: generation on ``rollout.devices`` of the world's devices,
#: training on the rest (stream is refused with it: mindrl/config/compat.py).
DISAGGREGATED = (
    "dock.pipeline=sync",
    "rollout.placement=disaggregated",
    "rollout.devices={rollout_devices}",
)
#: The measured comparison, one config: label -> what each run adds to it. The collocated
#: runs generate and train on every device; ``disagg-sync`` is the disaggregated placement
#: on-policy (its cost alone), ``async`` the same placement generating one batch ahead.
MODES = {
    "sync": ("dock.pipeline=sync",),
    "stream": ("dock.pipeline=stream",),
    "disagg-sync": (*DISAGGREGATED, "rollout.max_staleness=0"),
    "async": (*DISAGGREGATED, "rollout.max_staleness=1"),
    "continuous": (*DISAGGREGATED, "rollout.max_staleness=1", "rollout.continuous=true"),
}
#: Ratios printed, (mode, baseline): each mode vs sync, and async vs its own placement
#: on-policy, which separates the asynchrony's gain from the placement's cost.
RATIOS = (
    ("stream", "sync"),
    ("disagg-sync", "sync"),
    ("async", "sync"),
    ("async", "disagg-sync"),
    ("continuous", "sync"),
    ("continuous", "async"),
)
#: Iterations at the end of a run whose mean reward is its final reward.
FINAL_REWARD_ITERATIONS = 5
#: Roles whose tensor parallelism ``--train-tp`` sets in every mode.
TRAIN_ROLES = ("actor", "reference", "critic")
#: Partial rollout's comparison: label -> what the run adds to the config (and the budget).
PARTIAL_KINDS = ("whole", "partial", "partial-pool")
#: What each partial kind adds to the whole-rollout run (the budget goes with both).
PARTIAL_REFILL = {"partial": "missing", "partial-pool": "pool"}
#: Record keys that are timings or memory; every other metric must match across modes.
MEASURED = {"tps", "iteration_time_s", "time", "busy", "overlap", "overhead"}


# ---------------------------------------------------------------- measured


def train_once(
    config_path: Path, label: str, iterations: int, run_dir: Path, extra: list[str]
) -> list[dict]:
    """Train in this process (Ray already up); the run's metrics records. ``extra`` is
    what the run ``label`` adds to the config."""
    from mindrl.config import load_config
    from mindrl.metrics import read_metrics
    from trainers.driver.train import train
    from trainers.registry import get_algorithm

    overrides = [
        *extra,
        f"iterations={iterations}",
        f"logging.dir={run_dir}",
        "logging.backends=[]",
        "logging.progress_bar=false",
        "checkpoint.every=0",
    ]
    config = load_config(config_path, overrides, algorithm=get_algorithm("grpo"))
    if train(config, "grpo", device="cpu") != 0:
        raise RuntimeError(f"the {label} run failed; see its output above")
    return read_metrics(run_dir / "metrics.jsonl")


def summarize(records: list[dict], samples_per_iteration: int, groups: int) -> dict[str, Any]:
    """Medians over the timed ``records``: iteration time, TPS and samples per second
    (``samples_per_iteration`` over the median iteration); trained groups per second
    (every group the updates trained over the timed wall seconds; a record without
    ``trained_groups`` trained ``groups``) and the mean reward of the trained samples; as
    means, each stage's wall, busy and overlap seconds and the overhead inside the
    iteration (dock operations, resharding, scheduling); the mean response and prompt
    length of the trained samples; the staleness of what trained and the groups refused
    as stale, where the records carry them."""
    iteration_s = run_median(records)
    wall = sum(r["iteration_time_s"] for r in records)

    def mean_of(key: str) -> dict[str, float]:
        stages = sorted({s for r in records for s in r.get(key, {})})
        return {s: statistics.fmean(r.get(key, {}).get(s, 0.0) for r in records) for s in stages}

    summary = {
        "iterations_timed": len(records),
        "iteration_s": iteration_s,
        "tps": statistics.median(r["tps"] for r in records),
        "samples_per_s": samples_per_iteration / iteration_s,
        "groups_per_s": sum(r.get("trained_groups", groups) for r in records) / wall,
        "reward_mean": statistics.fmean(r["reward_mean"] for r in records),
        "stage_s": mean_of("time"),
        "busy_s": mean_of("busy"),
        "overlap_s": mean_of("overlap"),
        "overhead_s": mean_of("overhead"),
    }
    trained = [r.get("trained_groups", groups) for r in records]
    for key in ("response_length_mean", "prompt_length_mean"):  # per trained sample
        summary[key] = sum(r[key] * n for r, n in zip(records, trained, strict=True)) / sum(trained)
    if any("staleness_max" in r for r in records):  # a disaggregated run's records
        summary["staleness_max"] = max(r["staleness_max"] for r in records)
        summary["staleness_mean"] = statistics.fmean(r["staleness_mean"] for r in records)
    if any("dropped_stale_groups" in r for r in records):  # a continuous run's records
        summary["drawn_groups"] = sum(r["drawn_groups"] for r in records)
        summary["dropped_stale_groups"] = sum(r["dropped_stale_groups"] for r in records)
    return summary


def outcomes(record: dict) -> dict:
    """The record's numbers that the samples decide (not timings, not memory)."""
    return {
        k: v
        for k, v in record.items()
        if k not in MEASURED and not k.endswith("_mib") and isinstance(v, int | float)
    }


def same_samples(a: list[dict], b: list[dict]) -> bool:
    """Whether two runs trained on the same samples: every non-timing metric equal."""
    return len(a) == len(b) and all(
        outcomes(x).keys() == outcomes(y).keys()
        and all(
            np.isclose(outcomes(x)[k], outcomes(y)[k], rtol=1e-6, atol=1e-9) for k in outcomes(x)
        )
        for x, y in zip(a, b, strict=True)
    )


def run_alternating(
    args: argparse.Namespace, kinds: dict[str, list[str]]
) -> tuple[dict[str, list[list[dict]]], Path]:
    """Every run kind (label -> what it adds to the config), ``--repeats`` times in
    alternating order so a shift in machine load hits all alike, in one Ray session."""
    import ray

    from mindrl.config import load_config
    from mindrl.run_plan import build_run_plan
    from trainers.driver.setup import _connect_ray  # the CPU slots a run's devices need
    from trainers.registry import get_algorithm

    grpo = get_algorithm("grpo")
    config = load_config(args.config, args.set, algorithm=grpo)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mindrl-async-"))
    # Every kind uses the config's devices (the disaggregated ones split them): one slot each.
    _connect_ray(config, "cpu", build_run_plan(grpo, config))
    labels = list(kinds)
    runs: dict[str, list[list[dict]]] = {label: [] for label in labels}
    try:
        for repeat in range(args.repeats):
            for label in labels if repeat % 2 == 0 else labels[::-1]:
                print(f"async: {label} run {repeat + 1}/{args.repeats} ...", flush=True)
                run_dir = work / f"{label}-{repeat}"
                records = train_once(args.config, label, args.iterations, run_dir, kinds[label])
                runs[label].append(records)
    finally:
        ray.shutdown()
    return runs, work


def mode_overrides(args: argparse.Namespace, world: int) -> tuple[int, dict[str, list[str]]]:
    """The rollout devices of the disaggregated modes (``--rollout-devices``, by default
    half the world) and what each mode's run adds to the config: ``--set``, every training
    role at ``--train-tp`` (the disaggregated modes train on ``world - rollout devices``,
    so one TP for all keeps the modes' layouts apart in data parallelism only), the mode;
    the continuous mode's slots at ``--continuous-slots`` where given (the other modes
    refuse the option)."""
    rollout_devices = args.rollout_devices or max(world // 2, 1)
    common = [*args.set, *(f"{role}.parallel.tp={args.train_tp}" for role in TRAIN_ROLES)]
    kinds = {
        label: [*common, *(o.format(rollout_devices=rollout_devices) for o in added)]
        for label, added in MODES.items()
        if label in args.modes
    }
    if args.continuous_slots and "continuous" in kinds:
        kinds["continuous"].append(f"rollout.continuous_slots={args.continuous_slots}")
    return rollout_devices, kinds


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every mode, ``--repeats`` times in alternating order, in one Ray session."""
    from mindrl.config import load_config
    from trainers.registry import get_algorithm

    config = load_config(args.config, args.set, algorithm=get_algorithm("grpo"))
    args.work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="mindrl-async-"))
    warm = warm_start_policy(args)
    if warm:
        args.set = [*args.set, f"model.hf_path={warm['hf_path']}"]
    rollout_devices, kinds = mode_overrides(args, config.world_size)
    for overrides in kinds.values():  # a mode the config cannot run stops here, in one line
        load_config(args.config, overrides, algorithm=get_algorithm("grpo"))
    runs, work = run_alternating(args, kinds)
    groups = config.data.global_batch_size
    samples = groups * config.data.n_samples_per_prompt
    summaries = {
        mode: summarize([r for run in runs[mode] for r in run[args.warmup :]], samples, groups)
        | {
            "run_iteration_s": [run_median(run[args.warmup :]) for run in runs[mode]],
            "groups_per_s_per_repeat": [
                summarize(run[args.warmup :], samples, groups)["groups_per_s"] for run in runs[mode]
            ],
            "reward_final": statistics.fmean(
                r["reward_mean"] for run in runs[mode] for r in run[-FINAL_REWARD_ITERATIONS:]
            ),
        }
        for mode in kinds
    }
    same = {"sync", "stream"} <= set(runs) and all(
        same_samples(runs["sync"][0], run) for run in runs["stream"]
    )
    return {"config": str(args.config), "overrides": args.set, "world": config.world_size,
            "rollout_devices": rollout_devices, "train_tp": args.train_tp, "warm_start": warm,
            "samples_per_iteration": samples, "modes": summaries, "same_samples": same,
            "ratios": ratios(summaries), "work_dir": str(work)}  # fmt: skip


def run_median(records: list[dict]) -> float:
    """One run's median iteration seconds: the spread between repeats shows the noise."""
    return statistics.median(r["iteration_time_s"] for r in records)


def ratios(summaries: dict[str, dict]) -> dict[str, dict[str, float]]:
    """``"mode / baseline"`` -> iteration time, TPS and samples/s ratios (``RATIOS``)."""
    return {
        f"{mode} / {base}": {
            "iteration_time": summaries[mode]["iteration_s"] / summaries[base]["iteration_s"],
            "throughput": summaries[mode]["tps"] / summaries[base]["tps"],
            "samples_per_s": summaries[mode]["samples_per_s"] / summaries[base]["samples_per_s"],
            "groups_per_s": summaries[mode]["groups_per_s"] / summaries[base]["groups_per_s"],
            **repeat_ratios(summaries[mode], summaries[base]),
        }
        for mode, base in RATIOS
        if mode in summaries and base in summaries
    }


def repeat_ratios(mode: dict, base: dict) -> dict[str, Any]:
    """Trained groups/s of each repeat over the baseline's of the same repeat (run next to
    it, in alternating order), and their median: the box's speed drifts between repeats,
    and a ratio of neighbours sees less of that drift than one over the invocation."""
    pairs = zip(mode["groups_per_s_per_repeat"], base["groups_per_s_per_repeat"], strict=True)
    per_repeat = [m / b for m, b in pairs]
    return {
        "groups_per_s_per_repeat": per_repeat,
        "groups_per_s_median_repeat": statistics.median(per_repeat),
    }


def iteration_percentiles(records: list[dict]) -> dict[str, float]:
    """p50 / p90 / max iteration seconds (numpy's linear-interpolated percentiles)."""
    seconds = np.array([r["iteration_time_s"] for r in records])
    return {
        "p50_s": float(np.percentile(seconds, 50)),
        "p90_s": float(np.percentile(seconds, 90)),
        "max_s": float(seconds.max()),
    }


def summarize_partial(records: list[dict], groups: int) -> dict[str, Any]:
    """Iteration-time percentiles, trained throughput (tokens and groups per second),
    groups trained, generation rounds and the oldest trained group's staleness per
    iteration, and each stage's mean wall time
    (a whole-rollout record trains every group in one round: it carries no
    ``trained_groups`` / ``generation_rounds``)."""
    seconds = sum(r["iteration_time_s"] for r in records)
    trained = [r.get("trained_groups", groups) for r in records]
    stages = sorted({s for r in records for s in r.get("time", {})})
    return {
        "iterations_timed": len(records),
        **iteration_percentiles(records),
        "trained_tokens_per_s": sum(r["tps"] * r["iteration_time_s"] for r in records) / seconds,
        "trained_groups_per_s": sum(trained) / seconds,
        "groups_per_iteration": statistics.fmean(trained),
        "rounds_per_iteration": statistics.fmean(r.get("generation_rounds", 1) for r in records),
        "reward_mean": statistics.fmean(r["reward_mean"] for r in records),
        # Updates between a trained group's first tokens and the trained weights.
        "staleness_mean": statistics.fmean(r.get("staleness_max", 0) for r in records),
        "stage_s": {
            stage: statistics.fmean(r.get("time", {}).get(stage, 0.0) for r in records)
            for stage in stages
        },
    }


def measure_partial(args: argparse.Namespace) -> dict[str, Any]:
    """Whole vs partial rollout on one config, ``--repeats`` times, one Ray session."""
    from mindrl.config import load_config
    from trainers.registry import get_algorithm

    args.work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="mindrl-async-"))
    warm = warm_start_policy(args)
    whole = [
        *args.set,
        *([f"model.hf_path={warm['hf_path']}"] if warm else []),
        "dock.pipeline=sync",
    ]
    budget = f"rollout.partial_rollout_budget={args.partial_budget}"
    kinds = {"whole": whole} | {
        kind: [*whole, budget, f"rollout.partial_rollout_refill={refill}"]
        for kind, refill in PARTIAL_REFILL.items()
    }
    runs, work = run_alternating(args, kinds)
    groups = load_config(args.config, args.set, get_algorithm("grpo")).data.global_batch_size
    summaries = {
        kind: summarize_partial([r for run in runs[kind] for r in run[args.warmup :]], groups)
        for kind in PARTIAL_KINDS
    }
    ratios = {kind: partial_ratios(summaries[kind], summaries["whole"]) for kind in PARTIAL_REFILL}
    return {"config": str(args.config), "overrides": args.set, "budget": args.partial_budget,
            "warm_start": warm, "partial": summaries, "partial_ratios": ratios,
            "work_dir": str(work)}  # fmt: skip


def partial_ratios(partial: dict[str, Any], whole: dict[str, Any]) -> dict[str, float]:
    """A partial kind's iteration-time percentiles and trained throughput over whole's."""
    ratios = {key: partial[key] / whole[key] for key in ("p50_s", "p90_s", "max_s")}
    ratios["throughput"] = partial["trained_tokens_per_s"] / whole["trained_tokens_per_s"]
    ratios["groups_per_s"] = partial["trained_groups_per_s"] / whole["trained_groups_per_s"]
    return ratios


def warm_start_policy(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--warm-start-steps`` of supervised training on the task's right answers, saved
    under the work folder for both run kinds to start from (benchmarks/harness/warm_start.py:
    an untrained policy runs every response to the cap, so no prompt's response is long
    because it asks for more); None without it."""
    if not args.warm_start_steps:
        return None
    from benchmarks.harness.warm_start import warm_start
    from mindrl.config import load_config
    from trainers.registry import get_algorithm

    config = load_config(args.config, args.set, algorithm=get_algorithm("grpo"))
    print(f"async: warm start, {args.warm_start_steps} supervised steps ...", flush=True)
    return warm_start(config, args.work_dir / "warm-start", args.warm_start_steps)


# ---------------------------------------------------------------- simulated


@dataclass(frozen=True)
class ClusterModel:
    """The cost model's constants (module docstring); every one is a flag."""

    devices: int = 16
    params: float = 7.6e9  # Qwen2.5-7B
    layers: int = 28
    q_heads: int = 28
    kv_heads: int = 4
    head_dim: int = 128
    prompts: int = 256
    responses_per_prompt: int = 16
    prompt_len: int = 2048
    response_mean: float = 2048.0
    response_sigma: float = 0.8
    response_max: int = 8192
    peak_flops: float = 313e12  # assumed bf16 peak of one NPU
    hbm_bytes_per_s: float = 1.6e12  # assumed HBM bandwidth of one NPU
    hbm_efficiency: float = 0.6
    mfu: float = 0.35  # training and forward passes
    prefill_mfu: float = 0.5
    decode_mfu: float = 0.5
    reward_ms: float = 20.0
    reward_workers: int = 16
    host_bytes_per_s: float = 50e9  # paper: H2D / D2H
    inter_host_mb_per_s: float = 300.0  # paper: between servers
    warehouses: int = 2
    rollout_devices: int = 8  # disaggregated: devices that generate (one node of 8)
    transfer_mb_per_s: float = 300.0  # weights to the rollout workers: between servers
    device_memory_gb: float = 64.0  # HBM of one device (Ascend 910B: 64 GB)
    kv_memory_share: float = 0.9  # of it the engine may fill (vLLM's default 0.9)
    long_cot_mean: float = 8192.0  # long-CoT response lengths (the long-CoT regime: mean 8K ...)
    long_cot_max: int = 32768  # ... max 32K
    seed: int = 0

    @property
    def samples(self) -> int:
        return self.prompts * self.responses_per_prompt

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token over all layers, bf16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


#: Where each constant of the model comes from (printed with the figures).
SOURCES = {
    "devices": "paper: 2 nodes x 8 NPUs",
    "params": "Qwen2.5-7B parameter count",
    "layers": "Qwen2.5-7B config",
    "q_heads": "Qwen2.5-7B config (num_attention_heads)",
    "kv_heads": "Qwen2.5-7B config (GQA)",
    "head_dim": "Qwen2.5-7B config",
    "prompts": "paper's GRPO setting, G",
    "responses_per_prompt": "paper's GRPO setting, N",
    "prompt_len": "paper's maximum prompt length",
    "response_mean": "assumed: log-normal, mean of the paper's lengths",
    "response_sigma": "assumed spread (sigma of log length) of the log-normal lengths",
    "response_max": "paper's maximum response length",
    "peak_flops": "assumed bf16 dense peak of one Ascend 910B (DEVICES)",
    "hbm_bytes_per_s": "assumed HBM bandwidth of one Ascend 910B (DEVICES)",
    "hbm_efficiency": "assumed share of HBM bandwidth a decode step reaches",
    "mfu": "assumed MFU of training and forward passes",
    "prefill_mfu": "assumed MFU of prefill",
    "decode_mfu": "assumed MFU of a decode step's FLOPs (binds only where they outlast its reads)",
    "reward_ms": "assumed rule-based reward per response",
    "reward_workers": "assumed CPU reward workers",
    "host_bytes_per_s": "paper: host <-> device",
    "inter_host_mb_per_s": "paper: between servers",
    "warehouses": "one TD warehouse per node",
    "rollout_devices": "disaggregated default: one node of 8 generates",
    "transfer_mb_per_s": "paper's between-server figure, for the weight hand-over",
    "device_memory_gb": "Ascend 910B HBM (the live sequences' KV cache is capped by it)",
    "kv_memory_share": "vLLM's default gpu_memory_utilization",
    "long_cot_mean": "long-CoT lengths (verl / AReaL reasoning runs), mean",
    "long_cot_max": "long-CoT lengths, max",
    "seed": "response-length sampler",
}


#: The accelerators the long-CoT comparison is also simulated on: what each sets in the
#: model (bf16 dense peak FLOP/s, HBM bytes/s, HBM GB) and where the figures come from.
DEVICES: dict[str, tuple[dict[str, float], str]] = {
    "910b": (
        {"peak_flops": 313e12, "hbm_bytes_per_s": 1.6e12, "device_memory_gb": 64.0},
        "Ascend 910B: 64 GB HBM2e; ~1.6 TB/s and ~313 TFLOPS bf16 are the commonly quoted "
        "figures (assumed: Huawei publishes no full datasheet)",
    ),
    "h100": (
        {"peak_flops": 989e12, "hbm_bytes_per_s": 3.35e12, "device_memory_gb": 80.0},
        "NVIDIA H100 SXM5 datasheet: 989 TFLOPS dense bf16, 3.35 TB/s HBM3, 80 GB",
    ),
    "h200": (
        {"peak_flops": 989e12, "hbm_bytes_per_s": 4.8e12, "device_memory_gb": 141.0},
        "NVIDIA H200 SXM datasheet: 989 TFLOPS dense bf16, 4.8 TB/s HBM3e, 141 GB",
    ),
}


def response_lengths(m: ClusterModel) -> np.ndarray:
    """Log-normal lengths with mean ``response_mean`` (``response_sigma``), capped at the
    max."""
    rng = np.random.default_rng(m.seed)
    sigma = m.response_sigma
    mu = np.log(m.response_mean) - sigma**2 / 2
    return np.clip(rng.lognormal(mu, sigma, m.samples), 1, m.response_max).astype(np.int64)


def generation_ready_times(m: ClusterModel, lengths: np.ndarray, devices: int) -> np.ndarray:
    """Seconds after generation starts at which each response is complete: TP1 replicas,
    each decoding its share of the batch with as many sequences live as its KV cache
    holds (:func:`kv_slots`), the rest admitted as sequences end, as vLLM schedules a
    batch larger than its cache (:func:`decode_replica`)."""
    ready = np.empty(len(lengths))
    slots = kv_slots(m, lengths)
    for replica in range(devices):
        mine = np.arange(replica, len(lengths), devices)
        ready[mine] = decode_replica(m, lengths[mine], slots)
    return ready


def kv_slots(m: ClusterModel, lengths: np.ndarray) -> int:
    """Sequences one replica's KV cache holds at once, each at the mean live context
    (the prompt + half a response, length-biased: long responses are live longer)."""
    live_context = m.prompt_len + float((lengths**2).mean() / lengths.mean()) / 2
    kv_budget = m.device_memory_gb * 1e9 * m.kv_memory_share - 2 * m.params
    return max(1, int(kv_budget // (live_context * m.kv_bytes_per_token)))


def decode_replica(m: ClusterModel, lengths: np.ndarray, slots: int) -> np.ndarray:
    """When each of ``lengths`` (in admission order) ends on one replica that keeps up
    to ``slots`` sequences decoding and admits the next one as one ends (its prefill
    costs that moment). Every step gives each live sequence one token and reads the
    weights plus the live sequences' KV cache (prompt and tokens so far; an ended
    sequence's cache is freed): the weight read is the same for 1 live sequence as for
    200, so a step's cost is nearly flat in the live count until the KV reads dominate,
    and a drain with few sequences live pays the whole weight read per token of each.
    Where the step's FLOPs (``2P`` per live token for the matmuls, ``4 x layers x q_heads
    x head_dim`` per token of context for attention) take longer at ``decode_mfu`` the
    step is compute-bound and costs that instead. Steps between two ends hold the same
    sequences, so they are summed in closed form (the slower of the two sums, per run of
    steps): O(sequences log sequences)."""
    prefill = 2 * m.params * m.prompt_len / (m.peak_flops * m.prefill_mfu)
    flops = m.peak_flops * m.decode_mfu
    bandwidth = m.hbm_bytes_per_s * m.hbm_efficiency
    kv = m.kv_bytes_per_token
    attention = 4 * m.layers * m.q_heads * m.head_dim  # FLOPs per token per context token
    ends: list[tuple[int, int, int]] = []  # (step it ends at, its position, step it started)
    ready = np.empty(len(lengths))
    queue = iter(enumerate(lengths.tolist()))
    live = started_sum = step = 0
    clock = 0.0

    def admit(count: int) -> None:
        nonlocal live, started_sum, clock
        for position, length in itertools.islice(queue, count):
            heapq.heappush(ends, (step + length, position, step))
            live, started_sum, clock = live + 1, started_sum + step, clock + prefill

    admit(slots)
    while ends:
        k = ends[0][0] - step  # steps until the next end
        # The context at step j (0-based) is live * (prompt + 1) + live * j - started_sum.
        base = live * (m.prompt_len + 1) - started_sum
        tokens = k * base + live * (k * step + k * (k - 1) // 2)
        memory = (k * 2 * m.params + kv * tokens) / bandwidth  # bf16 weights: 2 B/param
        compute = (k * live * 2 * m.params + attention * tokens) / flops
        clock += max(memory, compute)
        step += k
        ended = 0
        while ends and ends[0][0] == step:
            _, position, started = heapq.heappop(ends)
            ready[position] = clock
            live, started_sum, ended = live - 1, started_sum - started, ended + 1
        admit(ended)
    return ready


def served(arrivals: np.ndarray, cost_s: np.ndarray, start: float | None = None) -> float:
    """When a first-come first-served stage finishes (``start``: sync, all at once)."""
    order = np.argsort(arrivals)
    clock = 0.0 if start is None else start
    for i in order:
        clock = max(clock, arrivals[i] if start is None else start) + cost_s[i]
    return clock


def stage_seconds(m: ClusterModel, lengths: np.ndarray) -> dict[str, Any]:
    """Per-response costs of the model stages and the fixed per-iteration costs."""
    tokens = m.prompt_len + lengths.astype(float)
    forward = 2 * m.params * tokens / (m.peak_flops * m.mfu)  # device-seconds per response
    update = 6 * m.params * tokens / (m.peak_flops * m.mfu)
    reward = np.full(len(lengths), m.reward_ms / 1e3 / m.reward_workers)
    swap = 2 * 16 * m.params / m.devices / m.host_bytes_per_s  # out and back
    flow = sample_flow(m.prompts, m.responses_per_prompt, m.prompt_len,
                       int(lengths.max()), 5, m.warehouses, 6)  # fmt: skip
    dock = dispatch_seconds(flow.dock_endpoint_bytes, m.inter_host_mb_per_s)
    return {"forward": forward, "update": update, "reward": reward, "fixed": swap + dock,
            "swap_s": swap, "dock_s": dock}  # fmt: skip


def weight_transfer_seconds(m: ClusterModel) -> float:
    """The new bf16 weights (2 B/param) from the trainer to the rollout workers, once per
    update, at ``transfer_mb_per_s`` (MB = 2^20 B, as the paper's dispatch figures)."""
    return dispatch_seconds(2 * m.params, m.transfer_mb_per_s)


def disaggregated_iteration(
    generation_s: float, serial_s: float, update_s: float, max_staleness: int
) -> tuple[float, float]:
    """A disaggregated iteration's seconds in steady state and the generation seconds
    hidden behind the update. On-policy every stage waits for the one before; one batch
    ahead (``max_staleness >= 1``), the next batch generates while this one's update runs,
    starting as mindrl's runner starts it: after this batch's ``serial_s`` (reward, weight
    transfer, reference pass, dock) -- so the period is ``serial_s + max(generation, update)``."""
    if max_staleness == 0:
        return serial_s + generation_s + update_s, 0.0
    return serial_s + max(generation_s, update_s), min(generation_s, update_s)


def collocated_row(
    m: ClusterModel, lengths: np.ndarray, costs: dict, stream: bool, ref_devices: int
) -> dict[str, Any]:
    """Generation and update on the same devices (the reference too, or on ``ref_devices``
    of its own); with ``stream`` the reward workers take responses as they finish."""
    gen_devices = m.devices - ref_devices
    ready = generation_ready_times(m, lengths, gen_devices)
    gen_end = float(ready.max())
    reward_end = served(ready, costs["reward"], None if stream else gen_end)
    ref_total = costs["forward"].sum() / (ref_devices or m.devices)
    if ref_devices:  # the reference streams on its own devices
        ref_end = served(ready, costs["forward"] / ref_devices)
        after_generation = max(gen_end, reward_end, ref_end)
    else:  # takes turns with the actor on the same devices, after the rewards
        after_generation = max(gen_end, reward_end) + ref_total
    update = costs["update"].sum() / gen_devices
    return {
        "iteration_s": costs["fixed"] + after_generation + update,
        "devices": f"{m.devices} shared" if not ref_devices else f"{gen_devices}+{ref_devices} ref",
        "generation_s": gen_end,
        "reward_tail_s": max(reward_end - gen_end, 0.0),
        "ref_logp_busy_s": ref_total,
        "update_s": update,
        "reshard_swap_s": costs["swap_s"],
        "weight_transfer_s": 0.0,
        "generation_hidden_s": 0.0,
    }


def disaggregated_row(
    m: ClusterModel, lengths: np.ndarray, costs: dict, rollout_devices: int, max_staleness: int
) -> dict[str, Any]:
    """Generation on ``rollout_devices`` of its own, reference and update on the rest; no
    swap (nothing else lives on either side), a weight transfer per update; the reward
    scores a batch once it is collected (``disaggregated_iteration``)."""
    train = m.devices - rollout_devices
    gen_end = float(generation_ready_times(m, lengths, rollout_devices).max())
    reward = float(costs["reward"].sum())
    ref = float(costs["forward"].sum()) / train
    update = float(costs["update"].sum()) / train
    transfer = weight_transfer_seconds(m)
    serial = reward + transfer + ref + costs["dock_s"]
    iteration, hidden = disaggregated_iteration(gen_end, serial, update, max_staleness)
    return {
        "iteration_s": iteration,
        "devices": f"{rollout_devices} gen+{train} train",
        "rollout_devices": rollout_devices,
        "generation_s": gen_end,
        "reward_tail_s": reward,
        "ref_logp_busy_s": ref,
        "update_s": update,
        "reshard_swap_s": 0.0,
        "weight_transfer_s": transfer,
        "generation_hidden_s": hidden,
    }


def continuous_replica_rate(m: ClusterModel, lengths: np.ndarray, slots: int) -> float:
    """Sequences per second one TP1 replica completes in steady state, decoding up to
    ``slots`` at once and refilling a slot the moment its sequence ends
    (:func:`decode_replica` over a stream drawn from ``lengths``): measured between the
    ``slots``-th and the ``3 slots``-th end, so neither the start nor the drain counts."""
    stream = np.random.default_rng(m.seed + 1).choice(lengths, size=4 * slots)
    ends = np.sort(decode_replica(m, stream, slots))
    return 2 * slots / (ends[3 * slots - 1] - ends[slots - 1])


def continuous_row(
    m: ClusterModel, lengths: np.ndarray, costs: dict, rollout_devices: int
) -> dict[str, Any]:
    """Continuous generation on ``rollout_devices`` (trainers/driver/continuous.py): the
    rollout devices never wait for a batch's longest response; reward and reference
    score finished groups while they decode; the weight transfer runs beside the next
    reference pass. In steady state an iteration is the slower side: generation's
    ``G x N`` sequences at the replicas' continuous rate, or the training devices'
    update plus the longer of the reference pass and the transfer (the actor sends the
    weights after its update; the reference scores meanwhile), or the reward workers."""
    train = m.devices - rollout_devices
    slots = min(kv_slots(m, lengths), -(-m.samples // rollout_devices))
    rate = rollout_devices * continuous_replica_rate(m, lengths, slots)
    generation = m.samples / rate
    ref = float(costs["forward"].sum()) / train
    update = float(costs["update"].sum()) / train
    transfer = weight_transfer_seconds(m)
    reward = float(costs["reward"].sum())
    training = update + max(transfer, ref)
    iteration = max(training, generation, reward) + costs["dock_s"]
    return {
        "iteration_s": iteration,
        "devices": f"{rollout_devices} gen+{train} train",
        "rollout_devices": rollout_devices,
        "slots_per_device": slots,
        "generation_s": generation,
        "reward_tail_s": 0.0,
        "ref_logp_busy_s": ref,
        "update_s": update,
        "reshard_swap_s": 0.0,
        "weight_transfer_s": transfer,
        "generation_hidden_s": min(generation, iteration),
    }


def overlap_ceiling(m: ClusterModel, lengths: np.ndarray, costs: dict) -> dict[str, float]:
    """What no placement of the same work beats: every device busy all the time, the
    generation at its continuous (full-slot) rate, the reference and the update at their
    FLOPs, spread over all ``devices`` (the dock dispatch added). Beside it the share of
    sync's generation that is the drain (its generation over the same work at the
    full-slot rate on the same devices)."""
    rate = continuous_replica_rate(m, lengths, kv_slots(m, lengths))  # per device
    generation = m.samples / rate  # device-seconds
    train = float(costs["forward"].sum() + costs["update"].sum())
    return {
        "iteration_s": (generation + train) / m.devices + costs["dock_s"],
        "full_slot_generation_s": generation / m.devices,
    }


def best_continuous_split(m: ClusterModel, lengths: np.ndarray, costs: dict) -> dict[str, Any]:
    rows = [continuous_row(m, lengths, costs, d) for d in range(1, m.devices)]
    return min(rows, key=lambda row: row["iteration_s"])


def best_async_split(m: ClusterModel, lengths: np.ndarray, costs: dict) -> dict[str, Any]:
    """The async row at the split (generating devices) with the shortest iteration; memory
    is not checked (one training device would hold all 16 B/param of training state)."""
    rows = [disaggregated_row(m, lengths, costs, d, 1) for d in range(1, m.devices)]
    return min(rows, key=lambda row: row["iteration_s"])


def simulate_lengths(m: ClusterModel) -> dict[str, Any]:
    """Iteration time, TPS (paper Eq. 5) and stage times of every simulated mode, with
    ``m``'s response lengths."""
    lengths = response_lengths(m)
    costs = stage_seconds(m, lengths)
    rows = {
        "sync": collocated_row(m, lengths, costs, stream=False, ref_devices=0),
        "stream": collocated_row(m, lengths, costs, stream=True, ref_devices=0),
        "stream, ref on own devices": collocated_row(m, lengths, costs, True, m.devices // 4),
        "disagg-sync": disaggregated_row(m, lengths, costs, m.rollout_devices, 0),
        "async": disaggregated_row(m, lengths, costs, m.rollout_devices, 1),
        "async, best split": best_async_split(m, lengths, costs),
        "continuous async": continuous_row(m, lengths, costs, m.rollout_devices),
        "continuous async, best split": best_continuous_split(m, lengths, costs),
    }
    tokens = m.samples * (m.prompt_len + lengths.mean())
    ceiling = overlap_ceiling(m, lengths, costs)
    for row in rows.values():
        row |= {
            "tps": tokens / (m.devices * row["iteration_s"]),
            "speedup": rows["sync"]["iteration_s"] / row["iteration_s"],
            "throughput_vs_sync": rows["sync"]["iteration_s"] / row["iteration_s"],
            "reward_busy_s": float(costs["reward"].sum()),
            "dock_dispatch_s": costs["dock_s"],
        }
    return {
        "mean_response_len": float(lengths.mean()),
        "rows": rows,
        "ceiling_vs_sync": rows["sync"]["iteration_s"] / ceiling["iteration_s"],
        "sync_generation_vs_full_slots": rows["sync"]["generation_s"]
        / ceiling["full_slot_generation_s"],
    }


def simulate(m: ClusterModel) -> dict[str, Any]:
    """Every simulated mode with the paper's lengths and with long-CoT lengths
    (``long-cot: `` rows; the same cluster and model)."""
    long_cot = replace(m, response_mean=m.long_cot_mean, response_max=m.long_cot_max)
    paper, cot = simulate_lengths(m), simulate_lengths(long_cot)
    rows = paper["rows"] | {f"long-cot: {name}": row for name, row in cot["rows"].items()}
    return {
        "model": asdict(m),
        "sources": SOURCES,
        "mean_response_len": paper["mean_response_len"],
        "long_cot_mean_response_len": cot["mean_response_len"],
        "rows": rows,
        "ceiling_vs_sync": {"paper": paper["ceiling_vs_sync"], "long-cot": cot["ceiling_vs_sync"]},
        "sync_generation_vs_full_slots": {
            "paper": paper["sync_generation_vs_full_slots"],
            "long-cot": cot["sync_generation_vs_full_slots"],
        },
        "by_device": by_device(long_cot),
        "by_scale": by_scale(long_cot),
    }


def by_device(m: ClusterModel) -> dict[str, dict[str, Any]]:
    """The long-CoT comparison with each of ``DEVICES``' figures in ``m`` (the rest as
    ``m`` has it): continuous async vs sync at ``m.rollout_devices`` and at its best
    split, the overlap ceiling, and how much longer sync's generation takes than the
    same work at the full-slot rate."""
    out = {}
    for name, (figures, source) in DEVICES.items():
        sim = simulate_lengths(replace(m, **figures))
        rows = sim["rows"]
        out[name] = {
            **figures,
            "source": source,
            "slots_per_device": rows["continuous async"]["slots_per_device"],
            "sync_iteration_s": rows["sync"]["iteration_s"],
            "continuous_vs_sync": rows["continuous async"]["throughput_vs_sync"],
            "best_split": rows["continuous async, best split"]["devices"],
            "best_split_vs_sync": rows["continuous async, best split"]["throughput_vs_sync"],
            "ceiling_vs_sync": sim["ceiling_vs_sync"],
            "sync_generation_vs_full_slots": sim["sync_generation_vs_full_slots"],
        }
    return out


#: Cluster sizes the long-CoT comparison is also simulated at (half of each generates in
#: the fixed split; the best split searched), the same G x N batch spread over more devices.
SCALES = (16, 32, 64, 128)


def by_scale(m: ClusterModel) -> dict[int, dict[str, Any]]:
    """The long-CoT comparison at each of ``SCALES`` devices (the rest as ``m`` has it):
    continuous async vs sync at half the devices generating and at its best split, the
    overlap ceiling, sync's drain, and how long the iteration's work takes with every
    device busy at the full-slot rate (the floor no placement goes under) against the
    iteration a 2x gain over sync would need."""
    out = {}
    for devices in SCALES:
        scaled = replace(m, devices=devices, rollout_devices=devices // 2)
        sim = simulate_lengths(scaled)
        rows = sim["rows"]
        sync_s = rows["sync"]["iteration_s"]
        best = rows["continuous async, best split"]
        out[devices] = {
            "slots_per_device": rows["continuous async"]["slots_per_device"],
            "sequences_per_device": -(-m.samples // devices),
            "sync_iteration_s": sync_s,
            "continuous_vs_sync": rows["continuous async"]["throughput_vs_sync"],
            "best_split": best["devices"],
            "best_split_vs_sync": best["throughput_vs_sync"],
            "ceiling_vs_sync": sim["ceiling_vs_sync"],
            "work_floor_s": sync_s / sim["ceiling_vs_sync"],
            "twice_sync_s": sync_s / 2,
            "sync_generation_vs_full_slots": sim["sync_generation_vs_full_slots"],
        }
    return out


# ---------------------------------------------------------------- report


def print_measured(report: dict[str, Any]) -> None:
    world, rollout = report["world"], report["rollout_devices"]
    print(
        f"\nmeasured on {report['machine']}: {report['config']} {' '.join(report['overrides'])}"
        f"; training roles at TP {report['train_tp']}; {report['samples_per_iteration']} "
        f"samples per iteration; collocated modes generate and train on all {world} devices, "
        f"disaggregated ones generate on {rollout} and train on {world - rollout}"
    )
    print(
        f"  {'mode':<11} {'iter(med)':>9} {'TPS(med)':>9} {'samples/s':>9} {'groups/s':>8} "
        f"{'reward(final)':>13} {'resp/prompt':>11} {'stale':>7} {'staleness':<12}  "
        "stage wall s / busy s / overlap s"
    )
    for mode, s in report["modes"].items():
        stages = ", ".join(
            f"{k} {s['stage_s'].get(k, 0):.3f}/{s['busy_s'].get(k, 0):.3f}"
            + (f"/{s['overlap_s'][k]:.3f}" if k in s["overlap_s"] else "")
            for k in s["busy_s"]
        )
        overhead = s["overhead_s"]
        stages += "; " + ", ".join(
            f"{k.removesuffix('_s').replace('_', ' ')} {overhead[k]:.3f}"
            for k in ("dock_s", "dock_beside_s", "reshard_s", "scheduling_s")
            if k in overhead
        )
        stale = (
            f"{s['staleness_mean']:.2f} (max {s['staleness_max']})" if "staleness_max" in s else "-"
        )
        lengths = f"{s['response_length_mean']:.1f}/{s['prompt_length_mean']:.1f}"
        refused = f"{s['dropped_stale_groups']}/{s['drawn_groups']}" if "drawn_groups" in s else "-"
        print(
            f"  {mode:<11} {s['iteration_s']:>8.3f}s {s['tps']:>9.0f} {s['samples_per_s']:>9.1f} "
            f"{s['groups_per_s']:>8.2f} {s['reward_final']:>13.3f} {lengths:>11} {refused:>7} "
            f"{stale:<12}  {stages}"
        )
    print(
        "  median iteration s of each repeat: "
        + "; ".join(
            f"{mode} " + " ".join(f"{x:.3f}" for x in s["run_iteration_s"])
            for mode, s in report["modes"].items()
        )
    )
    for pair, r in report["ratios"].items():
        print(
            f"  {pair}: iteration time {r['iteration_time']:.3f}x, TPS {r['throughput']:.3f}x, "
            f"samples/s {r['samples_per_s']:.3f}x, trained groups/s {r['groups_per_s']:.3f}x "
            f"(per repeat {', '.join(f'{x:.3f}x' for x in r['groups_per_s_per_repeat'])}; "
            f"median {r['groups_per_s_median_repeat']:.3f}x)"
        )
    print(
        f"  reward(final): mean reward of each run's last {FINAL_REWARD_ITERATIONS} iterations; "
        "resp/prompt: mean response / prompt tokens of the trained samples; stale: groups "
        "refused past the staleness bound / groups drawn (timed iterations)"
    )
    if {"sync", "stream"} <= set(report["modes"]):
        print(
            f"  stream and sync trained on the same samples (every metric but timings equal): "
            f"{report['same_samples']}; the disaggregated modes train on other samples "
            "(generation is split differently, and async trains on samples one update old), "
            "so only their times compare"
        )


def print_partial(report: dict[str, Any]) -> None:
    print(
        f"\nmeasured on {report['machine']}: {report['config']} {' '.join(report['overrides'])}; "
        f"partial: rollout.partial_rollout_budget={report['budget']}, refill missing / pool"
    )
    warm = report.get("warm_start")
    if warm:
        print(
            f"  both start from a supervised warm start ({warm['steps']} steps on the task's "
            f"right answers, loss {warm['loss_first']:.3f} -> {warm['loss_last']:.4f}): "
            f"{warm['hf_path']}"
        )
    print(
        f"  {'rollout':<12} {'p50':>8} {'p90':>8} {'max':>8} {'trained tok/s':>14} "
        f"{'groups/s':>9} groups/it rounds/it stale reward  mean stage wall s"
    )
    for kind, s in report["partial"].items():
        stages = ", ".join(f"{name} {sec:.3f}" for name, sec in s["stage_s"].items())
        print(
            f"  {kind:<12} {s['p50_s']:>7.3f}s {s['p90_s']:>7.3f}s {s['max_s']:>7.3f}s "
            f"{s['trained_tokens_per_s']:>14.1f} {s['trained_groups_per_s']:>9.2f} "
            f"{s['groups_per_iteration']:>9.2f} {s['rounds_per_iteration']:>9.2f} "
            f"{s['staleness_mean']:>5.2f} {s['reward_mean']:.3f}  {stages}"
        )
    for kind, r in report["partial_ratios"].items():
        print(
            f"  {kind} / whole: p50 {r['p50_s']:.3f}x, p90 {r['p90_s']:.3f}x, max "
            f"{r['max_s']:.3f}x iteration time; trained throughput {r['throughput']:.3f}x "
            f"tokens/s, {r['groups_per_s']:.3f}x groups/s"
        )


def print_simulated(sim: dict[str, Any]) -> None:
    m = sim["model"]
    print(
        f"\nsimulated: {m['devices']} devices, {m['params'] / 1e9:.1f}B params, G={m['prompts']} "
        f"N={m['responses_per_prompt']}, L_p={m['prompt_len']}; response mean "
        f"{sim['mean_response_len']:.0f} (max {m['response_max']}), long-cot rows mean "
        f"{sim['long_cot_mean_response_len']:.0f} (max {m['long_cot_max']}); cost model "
        "(module docstring). Every constant and where it comes from:"
    )
    for key, value in m.items():
        print(f"    {key} = {value:g}  ({sim['sources'].get(key, '')})")
    for name, row in sim["rows"].items():
        slots = f", {row['slots_per_device']} slots/device" if "slots_per_device" in row else ""
        print(
            f"  {name:<39} {row['devices']:<15} iteration {row['iteration_s']:7.1f}s  TPS "
            f"{row['tps']:6.1f}  x{row['speedup']:.3f}  (generation {row['generation_s']:.1f}s "
            f"of it hidden {row['generation_hidden_s']:.1f}s{slots}, reward tail "
            f"{row['reward_tail_s']:.2f}s, ref_logp {row['ref_logp_busy_s']:.1f}s, update "
            f"{row['update_s']:.1f}s, swap {row['reshard_swap_s']:.2f}s, weight transfer "
            f"{row['weight_transfer_s']:.1f}s, dock {row['dock_dispatch_s']:.2f}s)"
        )
    rows = sim["rows"]
    for prefix in ("", "long-cot: "):
        alone = rows[prefix + "async"]["iteration_s"] / rows[prefix + "disagg-sync"]["iteration_s"]
        print(
            f"  {prefix}async / disagg-sync (asynchrony alone, same placement): iteration time "
            f"{alone:.3f}x"
        )
    for lengths, ceiling in sim["ceiling_vs_sync"].items():
        drain = sim["sync_generation_vs_full_slots"][lengths]
        print(
            f"  {lengths} lengths: sync's generation takes {drain:.2f}x the same work at the "
            f"full-slot rate (the drain); overlap ceiling (every device busy) x{ceiling:.3f}"
        )
    print(f"  long-cot by device ({m['devices']} devices; the other constants as above):")
    for name, d in sim["by_device"].items():
        print(
            f"    {name:<5} {d['peak_flops'] / 1e12:.0f} TFLOPS, {d['hbm_bytes_per_s'] / 1e12:.2f} "
            f"TB/s, {d['device_memory_gb']:.0f} GB ({d['source']}): {d['slots_per_device']} "
            f"slots/device, sync {d['sync_iteration_s']:.0f}s, continuous async "
            f"x{d['continuous_vs_sync']:.3f} at {m['rollout_devices']} gen, "
            f"x{d['best_split_vs_sync']:.3f} at {d['best_split']}, ceiling "
            f"x{d['ceiling_vs_sync']:.3f}; sync generation "
            f"{d['sync_generation_vs_full_slots']:.2f}x full-slot"
        )
    print(
        "  long-cot by cluster size (the same G x N batch; the floor is the iteration's work "
        "with every device busy at the full-slot rate, 2x needs the iteration in half sync's):"
    )
    for devices, d in sim["by_scale"].items():
        print(
            f"    {devices:>3} devices: sync holds {d['sequences_per_device']} sequences a "
            f"device, continuous decodes {d['slots_per_device']}; sync "
            f"{d['sync_iteration_s']:.0f}s (generation "
            f"{d['sync_generation_vs_full_slots']:.2f}x full-slot), continuous "
            f"async x{d['continuous_vs_sync']:.3f} at half, x{d['best_split_vs_sync']:.3f} "
            f"at {d['best_split']}, ceiling x{d['ceiling_vs_sync']:.3f}; floor "
            f"{d['work_floor_s']:.0f}s vs {d['twice_sync_s']:.0f}s for 2x"
        )
    reached = [n for n, d in sim["by_scale"].items() if d["best_split_vs_sync"] >= 2]
    print(
        "  continuous async reaches 2x sync from "
        + (f"{reached[0]} devices" if reached else f"none of {list(sim['by_scale'])} devices")
        + " (long-cot, best split)"
    )


def json_report(report: dict[str, Any]) -> dict[str, Any]:
    """``--json``: ``measured`` (mode -> its summary, ``groups_per_s`` among it),
    ``simulated`` (row -> its figures, ``throughput_vs_sync`` among them) and what
    both were run with."""
    out = {k: v for k, v in report.items() if k not in ("modes", "simulated")}
    out["measured"] = report.get("modes", {})
    out["simulated"] = report["simulated"]["rows"]
    out["simulation"] = {k: v for k, v in report["simulated"].items() if k != "rows"}
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="async", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny.yaml")
    parser.add_argument("--set", nargs="*", default=[], help="dotted overrides for both modes")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--simulate-only", action="store_true")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=list(MODES),
        default=list(MODES),
        help="the measured modes (default: all)",
    )
    parser.add_argument(
        "--rollout-devices",
        type=int,
        default=None,
        help="devices that generate in the disaggregated modes (default: half the world)",
    )
    parser.add_argument(
        "--train-tp",
        type=int,
        default=1,
        help="tensor parallelism of the training roles in every mode (the disaggregated "
        "modes train on world - rollout devices: it must divide that)",
    )
    parser.add_argument(
        "--continuous-slots",
        type=int,
        default=None,
        help="sequences the continuous mode's rollout worker decodes at once "
        "(rollout.continuous_slots; default: one batch's samples)",
    )
    parser.add_argument(
        "--partial-budget",
        type=int,
        default=None,
        help="measure whole vs partial rollout with this budget (new tokens per iteration) "
        "instead of the four modes",
    )
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=0,
        help="with --partial-budget: first train the policy this many supervised steps on "
        "the task's right answers and run both kinds from it (0: from the config's model)",
    )
    for name, default in asdict(ClusterModel()).items():
        parser.add_argument(f"--sim-{name.replace('_', '-')}", type=type(default), default=default)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.iterations <= args.warmup or args.repeats < 1:
        print("async: error: --iterations must exceed --warmup, --repeats >= 1", file=sys.stderr)
        return 2
    if args.partial_budget is not None and args.partial_budget < 1:
        print("async: error: --partial-budget must be >= 1 (tokens)", file=sys.stderr)
        return 2
    if not args.config.is_file():
        print(f"async: error: --config {args.config} is not a file", file=sys.stderr)
        return 2
    model = ClusterModel(**{k: getattr(args, f"sim_{k}") for k in asdict(ClusterModel())})
    report: dict[str, Any] = {"machine": machine(), "simulated": simulate(model)}
    if not args.simulate_only:
        from mindrl.config import ConfigError
        from trainers.driver.setup import RunSetupError

        partial = args.partial_budget is not None
        try:
            report |= measure_partial(args) if partial else measure(args)
        except (ConfigError, RunSetupError, RuntimeError) as error:  # e.g. no Ray here
            print(f"async: error: {error}", file=sys.stderr)
            return 1
        (print_partial if partial else print_measured)(report)
    print_simulated(report["simulated"])
    if args.json:
        args.json.write_text(json.dumps(json_report(report), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
