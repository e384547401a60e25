"""GRPO on the tiny recipe across 4 namespaced nodes on shaped links, against the same run
on one host, with the bytes each iteration puts on each link.

One actor rank per node (``resources.nodes=4 resources.devices_per_node=1``, TP 1, so 4
data-parallel ranks), a TD warehouse per node, each stage's controller beside the first
worker serving it, the reward worker and the driver on node 0. While the run trains, the
dock's actors are found in Ray's actor table and their ports classified on every link
(benchmarks/cluster/netns.py), so the links' counters split each iteration's bytes into
the dock's (payloads, metadata, claims), collectives (gloo: the gradients' all-reduce),
Ray's object transfers and the rest of Ray. The dock's bytes per link are compared with
the sample-flow model of ``--dry-run`` for this layout (mindrl/planner/sample_flow.py),
at the config's maximum lengths and at the lengths the run measured.

    flock /tmp/mindrl-heavy.lock .venv/bin/python -m benchmarks.cluster.grpo \\
        --iterations 30 --out runs/cluster-grpo --json cluster_grpo.json

``--single-host`` also runs the same command on this host without namespaces (a local Ray
instance with 4 CPU slots), and compares the two runs' metrics in every non-timing field
(scripts/compare_metrics.py) and their reward curves. With ``dock.local_claims=false``
each rank gets the samples it gets on one host and the runs are identical; by default
each rank takes its own node's samples, so the sample stream (and the curve) differs as
another seed's would.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.cluster.netns import (
    PYTHON,
    REPORT_MARKER,
    ROOT,
    LinkBytes,
    ShapedCluster,
    dock_endpoints,
    refused_in_one_line,
    report_line,
)

NODES = 4
#: The tiny recipe laid out with one device (one actor rank) per node.
LAYOUT = [
    f"resources.nodes={NODES}",
    "resources.devices_per_node=1",
    "actor.parallel.tp=1",
    "reference.parallel.tp=1",
    "critic.parallel.tp=1",
    "logging.progress_bar=false",
    "logging.backends=[]",
]
POLL_S = 0.05


def train_argv(args: argparse.Namespace, run_dir: Path) -> list[str]:
    return [str(PYTHON.parent / "mindrl-train"), "--trainer", "grpo", "--config",
            str(args.config), *LAYOUT, f"iterations={args.iterations}",
            f"checkpoint.every={args.iterations + 1}", f"logging.dir={run_dir}",
            *args.set]  # fmt: skip


def wait_for_dock(stages: int, timeout_s: float = 300.0) -> list[tuple[str, int]]:
    """Inside node 0, as a second driver: the dock's endpoints once its ``NODES``
    warehouses and ``stages`` controllers are all alive."""
    import ray

    ray.init(logging_level="ERROR", log_to_driver=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        endpoints = dock_endpoints()
        if len(endpoints) == NODES + stages:
            return endpoints
        time.sleep(0.5)
    raise SystemExit("error: the dock's actors did not all start")


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip() and line.endswith("}")]


def watch(cluster: ShapedCluster, train: subprocess.Popen, metrics: Path, stages: int) -> dict:
    """Classify the dock's traffic once it is up, then read every link's counters each
    time an iteration's record appears; until the run ends."""
    finder = cluster.popen(0, [str(PYTHON), "-m", "benchmarks.cluster.grpo", "--endpoints",
                               str(stages)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    out, _ = finder.communicate(timeout=600)
    endpoints = report_line(out)
    if endpoints is None:
        raise SystemExit("error: could not read the dock's endpoints from Ray's actor table")
    cluster.classify_dock([tuple(e) for e in endpoints])
    counters, seen = [], 0
    while True:
        records = read_records(metrics)
        if len(records) > seen:
            seen = len(records)
            counters.append({"iteration": seen - 1, "links": cluster.link_bytes().as_dict()})
        if train.poll() is not None and len(read_records(metrics)) == seen:
            break
        time.sleep(POLL_S)
    return {"endpoints": endpoints, "counters": counters}


def per_iteration(counters: list[dict]) -> list[dict]:
    """Bytes per link, direction and class between consecutive records."""
    return [
        {"iteration": after["iteration"],
         **(LinkBytes(**after["links"]) - LinkBytes(**before["links"])).as_dict()}
        for before, after in itertools.pairwise(counters)
    ]  # fmt: skip


def run_on_cluster(args: argparse.Namespace) -> dict:
    run_dir = args.out / "cluster"
    cpus = [2] + [1] * (NODES - 1)  # node 0: the actor rank and the reward worker
    with ShapedCluster(NODES, args.link_mb_per_s, cpus=cpus) as cluster:
        log = open(args.out / "cluster.log", "w")  # noqa: SIM115
        train = cluster.popen(0, train_argv(args, run_dir), stdout=log, stderr=subprocess.STDOUT)
        try:
            stages = len(run_config(args)[1].stages)
            watched = watch(cluster, train, run_dir / "metrics.jsonl", stages)
        finally:
            train.wait(timeout=60)
            log.close()
    if train.returncode != 0:
        tail = (args.out / "cluster.log").read_text().strip().splitlines()[-3:]
        raise SystemExit(f"error: the cluster run failed: {' | '.join(tail)}")
    return watched | {"iterations": per_iteration(watched["counters"]), "run_dir": str(run_dir)}


def run_single_host(args: argparse.Namespace) -> Path:
    run_dir = args.out / "single"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RAY_")}
    with open(args.out / "single.log", "w") as log:
        done = subprocess.run(train_argv(args, run_dir), cwd=ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"error: the single-host run failed (see {args.out / 'single.log'})")
    return run_dir


def mean_links(iterations: list[dict], skip: int) -> dict:
    """Bytes per iteration on each link, per direction and class, averaged over the
    iterations from ``skip`` on. The counters are read as each iteration's record
    appears, while the next iteration may already be moving bytes: one window can take
    some of the next one's, so only an average over many is one iteration's worth."""
    kept = [it for it in iterations if it["iteration"] >= skip]
    nodes = len(kept[0]["up"])
    out: dict = {"iterations": len(kept), "up": {}, "down": {}}
    for direction in ("up", "down"):
        for cls in kept[0][f"{direction}_classes"][0]:
            out[direction][cls] = [
                statistics.mean(it[f"{direction}_classes"][i][cls] for it in kept)
                for i in range(nodes)
            ]
        out[direction]["total"] = [statistics.mean(it[direction][i] for it in kept)
                                   for i in range(nodes)]  # fmt: skip
    return out


def run_config(args: argparse.Namespace):
    """The config and run plan of the cluster run, as mindrl-train builds them."""
    from mindrl.config import load_config
    from mindrl.run_plan import build_run_plan
    from trainers.registry import get_algorithm

    algorithm = get_algorithm("grpo")
    config = load_config(args.config, [*LAYOUT, *args.set], algorithm)
    return config, build_run_plan(algorithm, config)


def predicted_vs_measured(args: argparse.Namespace, cluster: dict, measured: dict) -> dict:
    """The dock's bytes per link and direction, measured (``mean_links``) against the
    sample-flow model of this layout at the config's maximum lengths (what ``--dry-run``
    prints) and at the lengths the run measured (the mean prompt and response; fetches
    pad responses to the longest of a request, taken as the maximum)."""
    from mindrl.planner.report import layout_link_flow

    config, plan = run_config(args)
    records = read_records(Path(cluster["run_dir"]) / "metrics.jsonl")[args.warmup :]
    prompt_len = statistics.mean(r["prompt_length_mean"] for r in records)
    response_len = statistics.mean(r["response_length_mean"] for r in records)
    dry = layout_link_flow(config, plan)
    at_run = layout_link_flow(config, plan, prompt_len, response_len,
                              fetched_response_len=config.rollout.max_response_length)  # fmt: skip
    out = {"prompt_len": prompt_len, "response_len": response_len, "links": []}
    for node in range(NODES):
        for direction in ("up", "down"):
            bytes_ = measured[direction]["dock"][node]
            predicted = getattr(at_run, direction)[node]
            out["links"].append({
                "node": node, "direction": direction, "measured": bytes_,
                "predicted": predicted, "dry_run": getattr(dry, direction)[node],
                "error": predicted / bytes_ - 1 if bytes_ else None,
            })  # fmt: skip
    errors = [abs(link["error"]) for link in out["links"] if link["error"] is not None]
    out["worst_error"] = max(errors, default=None)
    return out


def reward_curves(cluster_dir: Path, single_dir: Path) -> dict:
    """Both runs' reward per iteration and where each first holds 0.9 (10-iteration mean)."""

    def first_at(rewards: list[float], level: float = 0.9, window: int = 10) -> int | None:
        for end in range(window, len(rewards) + 1):
            if statistics.mean(rewards[end - window : end]) >= level:
                return end - 1
        return None

    out = {}
    for name, folder in (("cluster", cluster_dir), ("single_host", single_dir)):
        rewards = [r["reward_mean"] for r in read_records(folder / "metrics.jsonl")]
        out[name] = {"reward": rewards, "first_mean_0.9": first_at(rewards),
                     "last_10_mean": statistics.mean(rewards[-10:])}  # fmt: skip
    return out


def same_metrics(single: Path, cluster: Path) -> str:
    """scripts/compare_metrics.py's verdict on the two runs (every non-timing field)."""
    done = subprocess.run([str(PYTHON), str(ROOT / "scripts" / "compare_metrics.py"),
                           str(single), str(cluster)], capture_output=True, text=True)  # fmt: skip
    return (done.stdout.strip() or done.stderr.strip()).split(": ", 1)[-1]


def plot_rewards(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, label in (("single_host", "one host"), ("cluster", f"{NODES} shaped nodes")):
        ax.plot(curves[name]["reward"], label=label, lw=1.2)
    ax.set(xlabel="iteration", ylabel="mean reward", title="tiny GRPO, same seed, TP1 x DP4")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def render(comparison: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="dock bytes per iteration on each link: measured (mean) vs the sample-flow "
        f"model at the run's lengths (prompt {comparison['prompt_len']:.2f}, response "
        f"{comparison['response_len']:.2f} tokens) and at the config's maxima (--dry-run)"
    )
    for col in ("node", "direction", "measured", "predicted", "error", "--dry-run"):
        table.add_column(col, justify="right")
    for link in comparison["links"]:
        error = "-" if link["error"] is None else f"{link['error']:+.1%}"
        sizes = (f"{link[k]:,.0f} B" for k in ("measured", "predicted", "dry_run"))
        measured, predicted, dry_run = sizes
        table.add_row(str(link["node"]), link["direction"], measured, predicted, error, dry_run)
    console = Console(width=max(Console().width, 120))
    console.print(table)
    console.print(f"worst error: {comparison['worst_error']:.1%}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny.yaml")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3, help="iterations left out of medians")
    parser.add_argument("--link-mb-per-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "cluster-grpo")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--single-host", action="store_true",
                        help="also run on one host and compare the metrics")  # fmt: skip
    parser.add_argument("--plot", type=Path, help="with --single-host: the reward curves (PNG)")
    parser.add_argument("--set", nargs="*", default=[], help="more config overrides")
    parser.add_argument("--endpoints", type=int, metavar="STAGES", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.endpoints:
        print(REPORT_MARKER + json.dumps(wait_for_dock(args.endpoints)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    with refused_in_one_line():
        cluster = run_on_cluster(args)
    report = {"cluster": cluster, "mean": mean_links(cluster["iterations"], args.warmup)}
    (args.out / "measured.json").write_text(json.dumps(report, indent=2))
    report["flow"] = predicted_vs_measured(args, cluster, report["mean"])
    if args.single_host:
        single = run_single_host(args)
        curves = reward_curves(Path(cluster["run_dir"]), single)
        report["rewards"] = curves
        report["same_metrics"] = same_metrics(single, Path(cluster["run_dir"]))
        if args.plot:
            plot_rewards(curves, args.plot)
    (args.json or args.out / "report.json").write_text(json.dumps(report, indent=2))
    render(report["flow"])
    if "same_metrics" in report:
        print(f"every non-timing metric, one host vs the cluster: {report['same_metrics']}")
    for name, curve in report.get("rewards", {}).items():
        print(f"{name}: reward first holds 0.9 (10-iteration mean) at iteration "
              f"{curve['first_mean_0.9']}, last 10 mean {curve['last_10_mean']:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
