"""Multi-turn rollouts as the environment's step time grows: episodes per second and the
engine's share of the iteration, concurrent stepping against one-at-a-time.

One process, one Ray session: the tiny recall recipe (``configs/tiny_env.yaml``, at 32
episodes per iteration unless ``--set`` says otherwise) trains ``--iterations`` GRPO
iterations per cell, each cell a step delay (``--delays-ms``, 0, 10
and 100 by default) and a stepping mode (benchmarks/harness/slow_env.py):

* ``async``: ``async def step`` awaiting the delay; the worker's event loop overlaps
  every episode's wait.
* ``threads``: a blocking ``step`` sleeping the delay; the worker runs it on a thread, so
  waits overlap as far as the worker's threads go.
* ``one-at-a-time``: the blocking step, its class declaring ``max_concurrent_steps = 1``:
  with ``env.workers`` 1, one step at a time (the baseline).

Per cell, after ``--warmup`` iterations: median iteration seconds, episodes per second
(episodes per iteration / median iteration), the engine's share of the iteration
(``env_engine_s``: the rollout's wall seconds generating turns, slowest rank), the share
spent waiting on steps (``env_wait_share``), the mean seconds inside the environment's
step (``env_step_s_mean``: the delay itself in every mode) and the mean seconds a step
waited for its turn before it (``env_step_queue_s_mean``: one-at-a-time's queue, which
grows with the episodes ahead of it). Ratios:
each mode's episodes/s over one-at-a-time's at the same delay, and each delay's over the
same mode at 0 ms. Cells run in alternating order (forwards, then backwards on the next
repeat) so a drift in machine load hits all alike.

    python benchmarks/env.py                       # 3 delays x 3 modes, 5 iterations each
    python benchmarks/env.py --json env.json --delays-ms 0 100 --modes async one-at-a-time
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.report import finish_report, machine  # noqa: E402  (after the path)

MODES = {
    "async": "AsyncSlowRecallEnv",
    "threads": "ThreadSlowRecallEnv",
    "one-at-a-time": "SerialSlowRecallEnv",
}
BASELINE_MODE = "one-at-a-time"
# 32 episodes per iteration (the recipe has 256): one-at-a-time at 100 ms is then 6.4 s of
# steps per iteration instead of 51 s.
DEFAULT_SET = ["data.global_batch_size=4", "data.n_samples_per_prompt=8"]


def cell_overrides(mode: str, delay_ms: float, workers: int) -> list[str]:
    """What a cell adds to the recipe: its environment class, delay and worker count."""
    return [
        f"env.cls=benchmarks.harness.slow_env:{MODES[mode]}",
        f"env.kwargs={{delay_s: {delay_ms / 1000}}}",
        f"env.workers={workers}",
    ]


def train_once(config_path: Path, overrides: list[str], iterations: int, run_dir: Path):
    """Train one cell in this process (Ray already up); its metrics records."""
    from mindrl.config import load_config
    from mindrl.metrics import read_metrics
    from trainers.driver.train import train
    from trainers.registry import get_algorithm

    config = load_config(
        config_path,
        [
            *overrides,
            f"iterations={iterations}",
            f"logging.dir={run_dir}",
            "logging.backends=[]",
            "logging.progress_bar=false",
            "checkpoint.every=0",
        ],
        algorithm=get_algorithm("grpo"),
    )
    if train(config, "grpo", device="cpu") != 0:
        raise RuntimeError(f"the run {' '.join(overrides)} failed; see its output above")
    return read_metrics(run_dir / "metrics.jsonl")


def summarize(records: list[dict], episodes_per_iteration: int) -> dict[str, float]:
    """Medians over the timed iterations of one cell."""
    iteration_s = statistics.median(r["iteration_time_s"] for r in records)
    return {
        "iterations_timed": len(records),
        "iteration_s": iteration_s,
        "episodes_per_s": episodes_per_iteration / iteration_s,
        "engine_share": statistics.median(
            r["env_engine_s"] / r["iteration_time_s"] for r in records
        ),
        "wait_share": statistics.median(r["env_wait_share"] for r in records),
        "step_s_mean": statistics.fmean(r["env_step_s_mean"] for r in records),
        "step_queue_s_mean": statistics.fmean(r["env_step_queue_s_mean"] for r in records),
        "turns_mean": statistics.fmean(r["env_turns_mean"] for r in records),
        "reward_mean": statistics.fmean(r["reward_mean"] for r in records),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every cell, ``--repeats`` times in alternating order, in one Ray session."""
    import ray

    from mindrl.config import load_config
    from mindrl.run_plan import build_run_plan
    from trainers.driver.setup import _connect_ray  # the CPU slots a run's devices need
    from trainers.registry import get_algorithm

    grpo = get_algorithm("grpo")
    cells = [(mode, delay) for delay in args.delays_ms for mode in args.modes]
    for mode, delay in cells:  # a cell the config cannot run stops here, in one line
        load_config(args.config, [*args.set, *cell_overrides(mode, delay, args.workers)], grpo)
    config = load_config(args.config, args.set, algorithm=grpo)
    episodes = config.data.global_batch_size * config.data.n_samples_per_prompt
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mindrl-env-"))
    # The environment classes live in benchmarks/: the workers import them from PYTHONPATH.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    _connect_ray(config, "cpu", build_run_plan(grpo, config))
    runs: dict[tuple[str, float], list[dict]] = {cell: [] for cell in cells}
    try:
        for repeat in range(args.repeats):
            for mode, delay in cells if repeat % 2 == 0 else cells[::-1]:
                print(f"env: {mode} {delay:g} ms, run {repeat + 1}/{args.repeats} ...", flush=True)
                overrides = [*args.set, *cell_overrides(mode, delay, args.workers)]
                run_dir = work / f"{mode}-{delay:g}ms-{repeat}"
                records = train_once(args.config, overrides, args.iterations, run_dir)
                runs[mode, delay] += records[args.warmup :]
    finally:
        ray.shutdown()
    rows = [
        {"mode": mode, "delay_ms": delay, **summarize(runs[mode, delay], episodes)}
        for mode, delay in cells
    ]
    return {
        "config": str(args.config),
        "overrides": args.set,
        "env_workers": args.workers,
        "episodes_per_iteration": episodes,
        "rows": rows,
        "ratios": ratios(rows),
        "work_dir": str(work),
    }


def ratios(rows: list[dict]) -> dict[str, float]:
    """Episodes/s of each mode over one-at-a-time's at the same delay, and of each delay
    over the same mode's at the smallest delay."""
    by_cell = {(r["mode"], r["delay_ms"]): r["episodes_per_s"] for r in rows}
    first_delay = min(r["delay_ms"] for r in rows)
    out = {}
    for (mode, delay), rate in by_cell.items():
        if mode != BASELINE_MODE and (BASELINE_MODE, delay) in by_cell:
            out[f"{mode} / {BASELINE_MODE} at {delay:g} ms"] = rate / by_cell[BASELINE_MODE, delay]
        if delay != first_delay:
            out[f"{mode} {delay:g} ms / {first_delay:g} ms"] = rate / by_cell[mode, first_delay]
    return out


def print_report(report: dict[str, Any]) -> None:
    print(
        f"\nmeasured on {report['machine']}: {report['config']} {' '.join(report['overrides'])}"
        f"; {report['episodes_per_iteration']} episodes per iteration, "
        f"env.workers {report['env_workers']}"
    )
    print(
        f"  {'mode':<14} {'delay':>6} {'iter(med)':>9} {'episodes/s':>10} {'engine':>7} "
        f"{'wait':>6} {'step(mean)':>10} {'queue(mean)':>11} {'turns':>5} {'reward':>6}"
    )
    for r in report["rows"]:
        print(
            f"  {r['mode']:<14} {r['delay_ms']:>4g}ms {r['iteration_s']:>8.3f}s "
            f"{r['episodes_per_s']:>10.1f} {r['engine_share']:>7.1%} {r['wait_share']:>6.1%} "
            f"{r['step_s_mean'] * 1000:>8.1f}ms {r['step_queue_s_mean'] * 1000:>9.1f}ms "
            f"{r['turns_mean']:>5.2f} {r['reward_mean']:>6.3f}"
        )
    for name, value in report["ratios"].items():
        print(f"  episodes/s {name}: {value:.2f}x")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="env", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny_env.yaml")
    parser.add_argument(
        "--set",
        nargs="*",
        default=DEFAULT_SET,
        help=f"dotted overrides for every cell (default: {' '.join(DEFAULT_SET)})",
    )
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[0.0, 10.0, 100.0])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--workers", type=int, default=1, help="env.workers of every cell")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.iterations <= args.warmup or args.repeats < 1 or args.workers < 1:
        print("env: error: --iterations must exceed --warmup, --repeats and --workers >= 1",
              file=sys.stderr)  # fmt: skip
        return 2
    if any(delay < 0 for delay in args.delays_ms):
        print("env: error: --delays-ms must be >= 0", file=sys.stderr)
        return 2
    if not args.config.is_file():
        print(f"env: error: --config {args.config} is not a file", file=sys.stderr)
        return 2
    from mindrl.config import ConfigError
    from trainers.driver.setup import RunSetupError

    report: dict[str, Any] = {"machine": machine()}
    try:
        report |= measure(args)
    except (ConfigError, RunSetupError, RuntimeError) as error:
        print(f"env: error: {error}", file=sys.stderr)
        return 1
    return finish_report(report, print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
