"""Rewards that take time: a reward of ``--seconds`` (0.5) per sample over the tiny batch,
scored one at a time against the reward pool, and in a run the iteration against
generation and reward back to back.

Two measurements, one process:

* ``pool``: the tiny batch's inputs (``data.global_batch_size`` x ``n_samples_per_prompt``
  of ``configs/tiny.yaml``: 128) through benchmarks/harness/slow_reward.py, first one call
  after the other in this process (the baseline: how a reward loop without a pool scores),
  then through :class:`mindrl.rewards.pool.RewardPool` at each ``--processes``. Seconds,
  samples per second, and each pool's speed-up over one at a time.
* ``run``: GRPO on the tiny recipe with that reward (``reward.processes_per_worker`` =
  the largest ``--processes``) for ``--iterations`` iterations, ``dock.pipeline: sync``
  (generation, then the reward stage: back to back) against ``stream`` (the reward
  workers score each chunk as it is generated). Generation must hand over chunks and take
  some time for there to be anything to overlap: a rank puts its samples ~64 at a time
  (mindrl/workers/chunks.py) and the tiny batch is one chunk per rank, its 4-token
  responses a tenth of the reward's time. So the run takes ``--prompts`` (64) prompts per
  batch, 4 chunks per rank, and responses of up to ``--response-length`` tokens (48; the
  untrained policy mostly runs to the cap). Per mode the median iteration, the rollout and
  reward stages' wall seconds, the reward seconds that ran during generation, and
  stream's iteration over sync's.

    python benchmarks/reward.py                        # both, --seconds 0.5
    python benchmarks/reward.py --json reward.json --only pool --processes 2 8 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.report import finish_report, machine  # noqa: E402  (after the path)

TARGET = "benchmarks.harness.slow_reward:slow_digits"
CONFIG = ROOT / "configs" / "tiny.yaml"


def tiny_inputs() -> list:
    """The tiny recipe's first batch as reward inputs: each prompt's N samples answering
    with the right digit (what is scored does not change what a call costs)."""
    from mindrl.config import load_config
    from mindrl.data.run_prompts import prompt_records
    from mindrl.rewards.inputs import RewardInput

    config = load_config(CONFIG, [])
    data = config.data
    records = prompt_records(config)[: data.global_batch_size]
    return [
        RewardInput.of(record, record.answer)
        for record in records
        for _ in range(data.n_samples_per_prompt)
    ]


def measure_pool(seconds: float, processes: list[int]) -> dict[str, Any]:
    """One call at a time in this process, then the pool at each size."""
    from mindrl.rewards.functions import FunctionSpec, load_function
    from mindrl.rewards.pool import RewardPool

    inputs = tiny_inputs()
    spec = FunctionSpec("slow", TARGET, {"seconds": seconds}, timeout_s=60 * seconds + 10)
    function = load_function(spec)
    start = time.perf_counter()
    for inp in inputs:
        function(inp)
    serial_s = time.perf_counter() - start
    rows = [{"mode": "one at a time", "processes": 1, "seconds": serial_s}]
    for size in processes:
        with RewardPool(size, preload=[TARGET]) as pool:
            pool.score(spec, inputs[:size])  # every process started and warm
            start = time.perf_counter()
            outcomes = pool.score(spec, inputs)
            took = time.perf_counter() - start
        if any(o.status != "ok" for o in outcomes):
            raise RuntimeError(f"the pool of {size} did not score every sample")
        rows.append({"mode": "pool", "processes": size, "seconds": took})
    for row in rows:
        row["samples_per_s"] = len(inputs) / row["seconds"]
        row["speedup"] = serial_s / row["seconds"]
    return {"samples": len(inputs), "reward_s_per_sample": seconds, "rows": rows}


def measure_run(
    seconds: float, processes: int, iterations: int, shape: tuple[int, int], work: Path
) -> dict[str, Any]:
    """The tiny recipe with the slow reward, sync against stream, in one Ray session."""
    import ray

    from mindrl.config import load_config
    from mindrl.metrics import read_metrics
    from mindrl.run_plan import build_run_plan
    from trainers.driver.setup import _connect_ray
    from trainers.driver.train import train
    from trainers.registry import get_algorithm

    grpo = get_algorithm("grpo")
    reward = [
        f"reward.functions={{slow: {{fn: '{TARGET}', kwargs: {{seconds: {seconds}}}, "
        f"timeout_s: {60 * seconds + 10}}}}}",
        "reward.routes={default: [slow]}",
        f"reward.processes_per_worker={processes}",
        f"data.global_batch_size={shape[0]}",
        f"rollout.max_response_length={shape[1]}",
        f"iterations={iterations}",
        "logging.backends=[]",
        "logging.progress_bar=false",
        "checkpoint.every=0",
    ]
    # The reward function lives in benchmarks/: the workers import it from PYTHONPATH.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    config = load_config(CONFIG, reward, grpo)
    _connect_ray(config, "cpu", build_run_plan(grpo, config))
    modes = {}
    try:
        for mode in ("sync", "stream"):
            print(f"reward: tiny GRPO, dock.pipeline {mode} ...", flush=True)
            overrides = [*reward, f"dock.pipeline={mode}", f"logging.dir={work / mode}"]
            if train(load_config(CONFIG, overrides, grpo), "grpo", device="cpu") != 0:
                raise RuntimeError(f"the {mode} run failed; see its output above")
            modes[mode] = summarize(read_metrics(work / mode / "metrics.jsonl")[1:])
    finally:
        ray.shutdown()
    return {
        "processes_per_worker": processes,
        "prompts_per_batch": shape[0],
        "max_response_length": shape[1],
        "iterations_timed": iterations - 1,
        "modes": modes,
        "stream_over_sync": modes["stream"]["iteration_s"] / modes["sync"]["iteration_s"],
    }


def summarize(records: list[dict]) -> dict[str, float]:
    """Medians over the timed iterations (the first, with start-up effects, left out)."""
    return {
        "iteration_s": statistics.median(r["iteration_time_s"] for r in records),
        "rollout_s": statistics.median(r["time"]["rollout"] for r in records),
        "reward_s": statistics.median(r["time"]["reward"] for r in records),
        "reward_overlap_s": statistics.median(r["overlap"].get("reward", 0.0) for r in records),
        "reward_mean": statistics.fmean(r["reward_mean"] for r in records),
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"\nmeasured on {report['machine']}")
    if "pool" in report:
        pool = report["pool"]
        print(
            f"  {pool['samples']} samples x {pool['reward_s_per_sample']:g} s reward "
            f"(the tiny batch):"
        )
        for row in pool["rows"]:
            print(
                f"  {row['mode']:<14} {row['processes']:>3} process(es) {row['seconds']:>7.2f} s "
                f"{row['samples_per_s']:>7.1f} samples/s  {row['speedup']:>5.1f}x one at a time"
            )
    if "run" in report:
        run = report["run"]
        print(
            f"  tiny GRPO, {run['prompts_per_batch']} prompts x 8, responses up to "
            f"{run['max_response_length']} tokens, "
            f"{run['processes_per_worker']} reward processes, median of "
            f"{run['iterations_timed']} iterations:"
        )
        for mode, row in run["modes"].items():
            print(
                f"  {mode:<6} iteration {row['iteration_s']:>6.2f} s  rollout "
                f"{row['rollout_s']:.2f} s  reward {row['reward_s']:.2f} s (overlapped "
                f"{row['reward_overlap_s']:.2f} s)  reward_mean {row['reward_mean']:.3f}"
            )
        print(f"  stream / sync iteration: {run['stream_over_sync']:.2f}x")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reward", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="reward time per sample")
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--only", choices=("pool", "run"), default=None)
    parser.add_argument("--iterations", type=int, default=4, help="per run (first untimed)")
    parser.add_argument("--response-length", type=int, default=48, help="run: most tokens")
    parser.add_argument("--prompts", type=int, default=64, help="run: prompts per batch")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.seconds <= 0 or args.iterations < 2 or min(args.processes) < 1:
        print("reward: error: --seconds > 0, --iterations >= 2, --processes >= 1",
              file=sys.stderr)  # fmt: skip
        return 2
    report: dict[str, Any] = {"machine": machine()}
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mindrl-reward-"))
    try:
        if args.only in (None, "pool"):
            report["pool"] = measure_pool(args.seconds, args.processes)
        if args.only in (None, "run"):
            largest = max(args.processes)
            report["run"] = measure_run(
                args.seconds, largest, args.iterations, (args.prompts, args.response_length), work
            )
    except RuntimeError as error:
        print(f"reward: error: {error}", file=sys.stderr)
        return 1
    return finish_report(report, print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
