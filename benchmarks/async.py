"""Sync vs streaming iterations (``dock.pipeline``): measured here, and simulated on the
paper's 16-device cluster; with ``--partial-budget``, whole vs partial rollout measured.

**Measured.** One process, one Ray session: the same config (``--config``, tiny by
default) trains ``--iterations`` iterations with ``dock.pipeline=sync`` and then with
``dock.pipeline=stream``, ``--repeats`` times in alternating order so a shift in machine
load hits both alike. Per mode: median iteration time and TPS after ``--warmup``
iterations, each stage's wall time (a streamed stage: only its tail after generation),
busy time and overlap, and whether the two modes trained on the same samples (every
non-timing metric equal). Ratios are stream / sync.

**Simulated.** The paper's 16-device setup (2 nodes x 8 NPUs, 128 GB each; GRPO on
Qwen2.5-7B, G=256 prompts x N=16 responses; host<->device 50 GB/s, 300 MB/s between
servers; MindSpeed RL paper, "Experiments"). The paper gives no per-stage times, so
they come from this cost model (every constant is a flag, printed with the result):

* generation: vLLM, TP1 x DP16, all of a replica's responses decoded together; a
  decode step reads the weights and the live KV cache from HBM,
  ``t_step = (2P + kv_bytes) / (HBM_BW * eff)``, a prefill costs
  ``2P * L_p / (peak * mfu)`` per prompt; response lengths are log-normal (mean
  ``--sim-response-mean``, capped at ``--sim-response-max``) -- the long tail the paper
  and AReaL describe. A response is ready when its replica has decoded its last token.
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
the actor's devices and still take turns. A what-if row puts the reference on 4 devices
of its own (generation and update on the other 12): a placement mindrl does not build
yet (issue 15, disaggregation), shown to say where streaming pays.

**Partial rollout** (``--partial-budget B``): instead of sync vs stream, the same config
trains with every response generated to its end (``whole``) and with
``rollout.partial_rollout_budget=B`` (``partial``), ``--repeats`` times in alternating
order in one Ray session. Per run kind: p50 / p90 / max iteration time after ``--warmup``
iterations, the trained throughput (trained tokens / wall seconds, the records' ``tps``
times their seconds; and trained groups / wall seconds), groups trained and generation
rounds per iteration, each stage's mean wall time (where the time goes); ratios are
partial / whole. Use a task with long-tailed response lengths,
``data.source=synthetic:longtail`` (1 prompt in 8 asks for a 12-digit answer) with room
for it, ``rollout.max_response_length=16``.

    .venv/bin/python benchmarks/async.py                       # tiny, 12 iterations x 1
    .venv/bin/python benchmarks/async.py --partial-budget 4 --iterations 30 --warmup 5 \
        --repeats 2 --set data.source=synthetic:longtail rollout.max_response_length=16
    .venv/bin/python benchmarks/async.py --iterations 20 --repeats 2 --json out.json
    .venv/bin/python benchmarks/async.py --simulate-only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindrl.planner.sample_flow import dispatch_seconds, sample_flow  # noqa: E402

MODES = ("sync", "stream")
#: Partial rollout's comparison: label -> what the run adds to the config (and the budget).
PARTIAL_KINDS = ("whole", "partial")
#: Record keys that are timings or memory; every other metric must match across modes.
MEASURED = {"tps", "iteration_time_s", "time", "busy", "overlap", "overhead"}


# ---------------------------------------------------------------- measured


def train_once(
    config_path: Path, mode: str, iterations: int, run_dir: Path, extra: list[str]
) -> list[dict]:
    """Train in this process (Ray already up); the run's metrics records. ``mode`` is a
    ``dock.pipeline`` (sync, stream); ``extra`` the run's overrides."""
    from mindrl.config import load_config
    from mindrl.metrics import read_metrics
    from trainers.driver.train import train
    from trainers.registry import get_algorithm

    overrides = [
        *extra,
        f"iterations={iterations}",
        f"dock.pipeline={mode}",
        f"logging.dir={run_dir}",
        "logging.backends=[]",
        "logging.progress_bar=false",
        "checkpoint.every=0",
    ]
    config = load_config(config_path, overrides, algorithm=get_algorithm("grpo"))
    if train(config, "grpo", device="cpu") != 0:
        raise RuntimeError(f"the {mode} run failed; see its output above")
    return read_metrics(run_dir / "metrics.jsonl")


def summarize(records: list[dict], warmup: int) -> dict[str, Any]:
    """Medians over the timed iterations; stage times, busy and overlap as means."""
    timed = records[warmup:] or records

    def mean_of(key: str) -> dict[str, float]:
        stages = sorted({s for r in timed for s in r.get(key, {})})
        return {s: statistics.fmean(r.get(key, {}).get(s, 0.0) for r in timed) for s in stages}

    return {
        "iterations_timed": len(timed),
        "iteration_s": statistics.median(r["iteration_time_s"] for r in timed),
        "tps": statistics.median(r["tps"] for r in timed),
        "stage_s": mean_of("time"),
        "busy_s": mean_of("busy"),
        "overlap_s": mean_of("overlap"),
    }


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
    args: argparse.Namespace, kinds: dict[str, tuple[str, list[str]]]
) -> tuple[dict[str, list[list[dict]]], Path]:
    """Every run kind (label -> pipeline, overrides), ``--repeats`` times in alternating
    order so a shift in machine load hits all alike, in one Ray session."""
    import ray

    from mindrl.config import load_config
    from trainers.driver.setup import _connect_ray  # the CPU slots a run's roles need
    from trainers.registry import get_algorithm

    config = load_config(args.config, args.set, algorithm=get_algorithm("grpo"))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mindrl-async-"))
    _connect_ray(config, "cpu")
    labels = list(kinds)
    runs: dict[str, list[list[dict]]] = {label: [] for label in labels}
    try:
        for repeat in range(args.repeats):
            for label in labels if repeat % 2 == 0 else labels[::-1]:
                print(f"async: {label} run {repeat + 1}/{args.repeats} ...", flush=True)
                mode, extra = kinds[label]
                run_dir = work / f"{label}-{repeat}"
                records = train_once(args.config, mode, args.iterations, run_dir, extra)
                runs[label].append(records)
    finally:
        ray.shutdown()
    return runs, work


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Both modes, ``--repeats`` times in alternating order, in one Ray session."""
    runs, work = run_alternating(args, {mode: (mode, args.set) for mode in MODES})
    summaries = {
        mode: summarize([r for run in runs[mode] for r in run[args.warmup :]], 0) for mode in MODES
    }
    same = all(same_samples(runs["sync"][0], run) for run in runs["stream"])
    return {"config": str(args.config), "overrides": args.set, "modes": summaries,
            "same_samples": same, "ratios": ratios(summaries), "work_dir": str(work)}  # fmt: skip


def ratios(summaries: dict[str, dict]) -> dict[str, float]:
    sync, stream = summaries["sync"], summaries["stream"]
    return {
        "iteration_time": stream["iteration_s"] / sync["iteration_s"],
        "throughput": stream["tps"] / sync["tps"],
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
    groups trained and generation rounds per iteration, and each stage's mean wall time
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
        "stage_s": {
            stage: statistics.fmean(r.get("time", {}).get(stage, 0.0) for r in records)
            for stage in stages
        },
    }


def measure_partial(args: argparse.Namespace) -> dict[str, Any]:
    """Whole vs partial rollout on one config, ``--repeats`` times, one Ray session."""
    from mindrl.config import load_config
    from trainers.registry import get_algorithm

    budget = [f"rollout.partial_rollout_budget={args.partial_budget}"]
    kinds = {"whole": ("sync", args.set), "partial": ("sync", [*args.set, *budget])}
    runs, work = run_alternating(args, kinds)
    groups = load_config(args.config, args.set, get_algorithm("grpo")).data.global_batch_size
    summaries = {
        kind: summarize_partial([r for run in runs[kind] for r in run[args.warmup :]], groups)
        for kind in PARTIAL_KINDS
    }
    whole, partial = summaries["whole"], summaries["partial"]
    ratios = {key: partial[key] / whole[key] for key in ("p50_s", "p90_s", "max_s")}
    ratios["throughput"] = partial["trained_tokens_per_s"] / whole["trained_tokens_per_s"]
    ratios["groups_per_s"] = partial["trained_groups_per_s"] / whole["trained_groups_per_s"]
    return {"config": str(args.config), "overrides": args.set, "budget": args.partial_budget,
            "partial": summaries, "partial_ratios": ratios, "work_dir": str(work)}  # fmt: skip


# ---------------------------------------------------------------- simulated


@dataclass(frozen=True)
class ClusterModel:
    """The cost model's constants (module docstring); every one is a flag."""

    devices: int = 16
    params: float = 7.6e9  # Qwen2.5-7B
    layers: int = 28
    kv_heads: int = 4
    head_dim: int = 128
    prompts: int = 256
    responses_per_prompt: int = 16
    prompt_len: int = 2048
    response_mean: float = 2048.0
    response_max: int = 8192
    peak_flops: float = 313e12  # assumed bf16 peak of one NPU
    hbm_bytes_per_s: float = 1.6e12  # assumed HBM bandwidth of one NPU
    hbm_efficiency: float = 0.6
    mfu: float = 0.35  # training and forward passes
    prefill_mfu: float = 0.5
    reward_ms: float = 20.0
    reward_workers: int = 16
    host_bytes_per_s: float = 50e9  # paper: H2D / D2H
    inter_host_mb_per_s: float = 300.0  # paper: between servers
    warehouses: int = 2
    seed: int = 0

    @property
    def samples(self) -> int:
        return self.prompts * self.responses_per_prompt


def response_lengths(m: ClusterModel) -> np.ndarray:
    """Log-normal lengths with mean ``response_mean`` (sigma 0.8), capped at the max."""
    rng = np.random.default_rng(m.seed)
    sigma = 0.8
    mu = np.log(m.response_mean) - sigma**2 / 2
    return np.clip(rng.lognormal(mu, sigma, m.samples), 1, m.response_max).astype(np.int64)


def generation_ready_times(m: ClusterModel, lengths: np.ndarray, devices: int) -> np.ndarray:
    """Seconds after generation starts at which each response is complete (TP1 replicas,
    each decoding its share together; a step reads weights + live KV cache)."""
    kv_per_token = 2 * m.layers * m.kv_heads * m.head_dim * 2  # K and V, bf16
    ready = np.empty(len(lengths))
    for replica in range(devices):
        mine = np.arange(replica, len(lengths), devices)
        own = lengths[mine]
        prefill = 2 * m.params * m.prompt_len * len(own) / (m.peak_flops * m.prefill_mfu)
        steps = np.arange(1, own.max() + 1)
        live = (own[None, :] >= steps[:, None]).sum(axis=1)  # sequences still decoding
        context = live * m.prompt_len + np.minimum(own[None, :], steps[:, None]).sum(axis=1)
        step_s = (2 * m.params + kv_per_token * context) / (m.hbm_bytes_per_s * m.hbm_efficiency)
        clock = prefill + np.cumsum(step_s)
        ready[mine] = clock[own - 1]
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


def simulate(m: ClusterModel) -> dict[str, Any]:
    """Iteration time, TPS (paper Eq. 5) and stage times: sync, stream, and the what-if."""
    lengths = response_lengths(m)
    costs = stage_seconds(m, lengths)
    rows = {}
    for name, ref_devices in (("sync", 0), ("stream", 0), ("stream, ref on 4 own devices", 4)):
        gen_devices = m.devices - ref_devices
        ready = generation_ready_times(m, lengths, gen_devices)
        gen_end = float(ready.max())
        stream = name != "sync"
        reward_end = served(ready, costs["reward"], None if stream else gen_end)
        ref_total = costs["forward"].sum() / (ref_devices or m.devices)
        if ref_devices:  # the reference streams on its own devices
            ref_end = served(ready, costs["forward"] / ref_devices)
            after_generation = max(gen_end, reward_end, ref_end)
        else:  # takes turns with the actor on the same devices, after the rewards
            after_generation = max(gen_end, reward_end) + ref_total
        update = costs["update"].sum() / gen_devices
        iteration = costs["fixed"] + after_generation + update
        tps = m.samples * (m.prompt_len + lengths.mean()) / (m.devices * iteration)
        rows[name] = {
            "iteration_s": iteration,
            "tps": tps,
            "generation_s": gen_end,
            "reward_busy_s": float(costs["reward"].sum()),
            "reward_tail_s": max(reward_end - gen_end, 0.0),
            "ref_logp_busy_s": ref_total,
            "update_s": update,
            "reshard_swap_s": costs["swap_s"],
            "dock_dispatch_s": costs["dock_s"],
        }
    base = rows["sync"]
    for row in rows.values():
        row["speedup"] = base["iteration_s"] / row["iteration_s"]
    return {"model": asdict(m), "mean_response_len": float(lengths.mean()), "rows": rows}


# ---------------------------------------------------------------- report


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{platform.machine()} CPU, {os.cpu_count()} cores, load average {load:.1f} at start, "
        f"Python {platform.python_version()}"
    )


def print_measured(report: dict[str, Any]) -> None:
    print(f"\nmeasured on {report['machine']}: {report['config']} {' '.join(report['overrides'])}")
    print(f"  {'mode':<7} {'iter(med)':>9} {'TPS(med)':>9}  stage wall s / busy s / overlap s")
    for mode, s in report["modes"].items():
        stages = ", ".join(
            f"{k} {s['stage_s'].get(k, 0):.3f}/{s['busy_s'].get(k, 0):.3f}"
            + (f"/{s['overlap_s'][k]:.3f}" if k in s["overlap_s"] else "")
            for k in s["busy_s"]
        )
        print(f"  {mode:<7} {s['iteration_s']:>8.3f}s {s['tps']:>9.0f}  {stages}")
    r = report["ratios"]
    print(
        f"  stream / sync: iteration time {r['iteration_time']:.3f}x, throughput "
        f"{r['throughput']:.3f}x; same samples and metrics: {report['same_samples']}"
    )


def print_partial(report: dict[str, Any]) -> None:
    print(
        f"\nmeasured on {report['machine']}: {report['config']} {' '.join(report['overrides'])}; "
        f"partial: rollout.partial_rollout_budget={report['budget']}"
    )
    print(
        f"  {'rollout':<8} {'p50':>8} {'p90':>8} {'max':>8} {'trained tok/s':>14} "
        f"{'groups/s':>9} groups/it rounds/it reward  mean stage wall s"
    )
    for kind, s in report["partial"].items():
        stages = ", ".join(f"{name} {sec:.3f}" for name, sec in s["stage_s"].items())
        print(
            f"  {kind:<8} {s['p50_s']:>7.3f}s {s['p90_s']:>7.3f}s {s['max_s']:>7.3f}s "
            f"{s['trained_tokens_per_s']:>14.1f} {s['trained_groups_per_s']:>9.2f} "
            f"{s['groups_per_iteration']:>9.2f} {s['rounds_per_iteration']:>9.2f} "
            f"{s['reward_mean']:.3f}  {stages}"
        )
    r = report["partial_ratios"]
    print(
        f"  partial / whole: p50 {r['p50_s']:.3f}x, p90 {r['p90_s']:.3f}x, max {r['max_s']:.3f}x "
        f"iteration time; trained throughput {r['throughput']:.3f}x tokens/s, "
        f"{r['groups_per_s']:.3f}x groups/s"
    )


def print_simulated(sim: dict[str, Any]) -> None:
    m = sim["model"]
    print(
        f"\nsimulated: {m['devices']} devices, {m['params'] / 1e9:.1f}B params, G={m['prompts']} "
        f"N={m['responses_per_prompt']}, L_p={m['prompt_len']}, response mean "
        f"{sim['mean_response_len']:.0f} (max {m['response_max']}); cost model: peak "
        f"{m['peak_flops'] / 1e12:.0f} TFLOPS, MFU {m['mfu']}, HBM "
        f"{m['hbm_bytes_per_s'] / 1e12:.1f} TB/s x {m['hbm_efficiency']}, reward "
        f"{m['reward_ms']} ms x {m['reward_workers']} workers (module docstring)"
    )
    for name, row in sim["rows"].items():
        print(
            f"  {name:<29} iteration {row['iteration_s']:7.1f}s  TPS {row['tps']:7.1f}  "
            f"x{row['speedup']:.3f}  (generation {row['generation_s']:.1f}s, reward busy "
            f"{row['reward_busy_s']:.1f}s tail {row['reward_tail_s']:.2f}s, ref_logp "
            f"{row['ref_logp_busy_s']:.1f}s, update {row['update_s']:.1f}s, swap "
            f"{row['reshard_swap_s']:.2f}s, dock {row['dock_dispatch_s']:.2f}s)"
        )


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
        "--partial-budget",
        type=int,
        default=None,
        help="measure whole vs partial rollout with this budget (new tokens per iteration) "
        "instead of sync vs stream",
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
        from trainers.driver.setup import RunSetupError

        partial = args.partial_budget is not None
        try:
            report |= measure_partial(args) if partial else measure(args)
        except (RunSetupError, RuntimeError) as error:  # e.g. Ray could not start here
            print(f"async: error: {error}", file=sys.stderr)
            return 1
        (print_partial if partial else print_measured)(report)
    print_simulated(report["simulated"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
