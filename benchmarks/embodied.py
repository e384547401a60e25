"""Embodied rollouts by placement: environment frames per second with the simulators
stepped in the actor's process (collocated) or by an environment worker beside it
(hybrid) split into k = 1, 2, 4 pipeline stages.

One process, one Ray session: the embodied recipe (``configs/embodied_reach.yaml``) on
one actor rank (``resources.devices_per_node=1``), no behaviour cloning, trains
``--iterations`` GRPO iterations per cell. BatchedReach renders at ``--render-scale``
times its image size (``env.kwargs.render_scale``), which sets its step cost: chosen so
that the simulators and generation take about the same time, where pipelining has the
most to gain. Threads per worker: collocated, the rank computes on every core of the
node; hybrid, during the rollout the rank leaves one core to its environment worker
(single-threaded numpy) and trains on all of them (mindrl/workers/embodied.py).

Per cell, after ``--warmup`` iterations, medians over the timed iterations:
``frames_per_s`` (environment frames over the rollout's wall seconds),
``epoch_frames_per_s`` (over the rollout's and update's), and the simulators' and
generation's seconds per rollout, in all and per stage. Ratios: each cell's
``frames_per_s`` over hybrid-1's and over collocated's. Cells run in alternating order
(forwards, then backwards on the next repeat) so a drift in machine load hits all alike.

    python benchmarks/embodied.py                        # 4 cells, 6 iterations each
    python benchmarks/embodied.py --json embodied.json --cells hybrid-1 hybrid-2 --repeats 2
    python benchmarks/embodied.py --config configs/embodied_metaworld.yaml --num-envs 16

Another simulator than BatchedReach (``--config`` naming it) runs at its own step cost:
Meta-World's push-v3 on CPU MuJoCo, 16 environments, from the initial weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.report import finish_report, machine  # noqa: E402  (after the path)

CELLS = {
    "collocated": ("env.placement=collocated",),
    "hybrid-1": ("env.placement=hybrid", "env.pipeline_stages=1"),
    "hybrid-2": ("env.placement=hybrid", "env.pipeline_stages=2"),
    "hybrid-4": ("env.placement=hybrid", "env.pipeline_stages=4"),
}
BASELINE = "hybrid-1"
#: Every cell: one actor rank stepping all the environments, RL from the initial weights.
COMMON = (
    "resources.devices_per_node=1",
    "env.clone_steps=0",
    "checkpoint.every=0",
    "logging.backends=[]",
    "logging.progress_bar=false",
)
#: BatchedReach's default ``render_scale`` here: its simulation then takes about as long
#: as generation on one rank of the 2-core box.
REACH_RENDER_SCALE = 8
#: Per-rollout seconds a record carries (trainers/driver/embodied.py ``stage_seconds``).
SECONDS = ("env_s", "generate_s")


def cell_overrides(cell: str, args: argparse.Namespace) -> list[str]:
    render = [f"env.kwargs.render_scale={args.render_scale}"] if args.render_scale else []
    return [*COMMON, f"env.num_envs={args.num_envs}", *render, *CELLS[cell], *args.set]


def default_render_scale(args: argparse.Namespace) -> None:
    """BatchedReach renders at ``--render-scale`` 8 unless told otherwise; another
    simulator (Meta-World's MuJoCo) has a step cost of its own and no such option."""
    from mindrl.config import load_config
    from trainers.registry import get_algorithm

    env = load_config(args.config, [], algorithm=get_algorithm("grpo")).env
    if args.render_scale is None and (env.cls or "").endswith(":BatchedReach"):
        args.render_scale = REACH_RENDER_SCALE


def train_once(args: argparse.Namespace, overrides: list[str], run_dir: Path) -> list[dict]:
    """Train one cell in this process (Ray already up); its metrics records."""
    from mindrl.config import load_config
    from mindrl.metrics import read_metrics
    from trainers.driver.train import train
    from trainers.registry import get_algorithm

    config = load_config(
        args.config,
        [*overrides, f"iterations={args.iterations}", f"logging.dir={run_dir}"],
        algorithm=get_algorithm("grpo"),
    )
    if train(config, "grpo", device="cpu") != 0:
        raise RuntimeError(f"the run {' '.join(overrides)} failed; see its output above")
    return read_metrics(run_dir / "metrics.jsonl")


def summarize(records: list[dict]) -> dict[str, Any]:
    """Medians over one cell's timed iterations."""

    def median(key: str) -> float:
        return statistics.median(r[key] for r in records)

    stage_keys = sorted(k for k in records[0] if k.startswith(tuple(f"{s}_" for s in SECONDS)))
    return {
        "iterations_timed": len(records),
        "frames_per_s": median("env_frames_per_s"),
        "epoch_frames_per_s": median("epoch_frames_per_s"),
        "rollout_s": statistics.median(r["time"]["rollout"] for r in records),
        "update_s": statistics.median(r["time"]["update"] for r in records),
        **{key: median(key) for key in (*SECONDS, *stage_keys)},
        "success_rate": statistics.fmean(r["success_rate"] for r in records),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every cell, ``--repeats`` times in alternating order, in one Ray session."""
    import ray

    from mindrl.config import load_config
    from mindrl.run_plan import build_run_plan
    from trainers.driver.setup import _connect_ray  # the CPU slots a run needs
    from trainers.registry import get_algorithm

    grpo = get_algorithm("grpo")
    for cell in args.cells:  # a cell the config cannot run stops here, in one line
        load_config(args.config, cell_overrides(cell, args), algorithm=grpo)
    # The widest cell's slots: one device, and under hybrid its environment worker.
    widest = load_config(args.config, cell_overrides("hybrid-1", args), algorithm=grpo)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mindrl-embodied-"))
    _connect_ray(widest, "cpu", build_run_plan(grpo, widest))
    runs: dict[str, list[dict]] = {cell: [] for cell in args.cells}
    try:
        for repeat in range(args.repeats):
            for cell in args.cells if repeat % 2 == 0 else args.cells[::-1]:
                print(f"embodied: {cell}, run {repeat + 1}/{args.repeats} ...", flush=True)
                run_dir = work / f"{cell}-{repeat}"
                records = train_once(args, cell_overrides(cell, args), run_dir)
                runs[cell] += records[args.warmup :]
    finally:
        ray.shutdown()
    bench = {cell: summarize(runs[cell]) for cell in args.cells}
    return {
        "config": str(args.config),
        "overrides": cell_overrides("collocated", args),
        "bench": bench,
        "ratios": ratios(bench),
        "work_dir": str(work),
    }


def ratios(bench: dict[str, dict]) -> dict[str, float]:
    """Each cell's ``frames_per_s`` (and ``epoch_frames_per_s``) over hybrid-1's and
    collocated's."""
    out = {}
    for base in (BASELINE, "collocated"):
        if base not in bench:
            continue
        for cell, row in bench.items():
            if cell != base:
                for key in ("frames_per_s", "epoch_frames_per_s"):
                    out[f"{key} {cell} / {base}"] = row[key] / bench[base][key]
    return out


def print_report(report: dict[str, Any]) -> None:
    print(f"\nmeasured on {report['machine']}: {report['config']} {' '.join(report['overrides'])}")
    print(
        f"  {'cell':<11} {'frames/s':>9} {'epoch f/s':>9} {'rollout':>8} {'update':>7} "
        f"{'env':>7} {'generate':>8}  per stage (env / generate)"
    )
    for cell, r in report["bench"].items():
        stages = "  ".join(
            f"{r[f'env_s_{s}']:.3f}/{r[f'generate_s_{s}']:.3f}"
            for s in range(len([k for k in r if k.startswith("env_s_")]))
        )
        print(
            f"  {cell:<11} {r['frames_per_s']:>9.0f} {r['epoch_frames_per_s']:>9.0f} "
            f"{r['rollout_s']:>7.3f}s {r['update_s']:>6.3f}s {r['env_s']:>6.3f}s "
            f"{r['generate_s']:>7.3f}s  {stages}"
        )
    for name, value in report["ratios"].items():
        print(f"  {name}: {value:.2f}x")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embodied", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "embodied_reach.yaml")
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    parser.add_argument("--num-envs", type=int, default=64, help="env.num_envs (default 64)")
    parser.add_argument(
        "--render-scale",
        type=int,
        default=None,
        help="BatchedReach's render_scale (default 8; none for another simulator)",
    )
    parser.add_argument("--set", nargs="*", default=[], help="dotted overrides for every cell")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.iterations <= args.warmup or args.repeats < 1:
        print("embodied: error: --iterations must exceed --warmup, --repeats >= 1",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.num_envs < 4 or args.num_envs % 4 or (args.render_scale or 1) < 1:
        print("embodied: error: --num-envs must be a multiple of 4 (hybrid-4 splits it), "
              "--render-scale >= 1", file=sys.stderr)  # fmt: skip
        return 2
    if not args.config.is_file():
        print(f"embodied: error: --config {args.config} is not a file", file=sys.stderr)
        return 2
    from mindrl.config import ConfigError
    from trainers.driver.setup import RunSetupError

    report: dict[str, Any] = {"machine": machine()}
    try:
        default_render_scale(args)
        report |= measure(args)
    except (ConfigError, RunSetupError, RuntimeError) as error:
        print(f"embodied: error: {error}", file=sys.stderr)
        return 1
    return finish_report(report, print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
