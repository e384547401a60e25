"""Transfer dock vs centralized buffer as nodes are added, on shaped links.

For each N in ``--nodes``: builds an N-node shaped cluster (benchmarks/cluster/netns.py),
runs the GRPO sample flow of benchmarks/cluster/flow.py through the dock and the
centralized buffer (alternating, ``--iterations`` timed after ``--warmup``), then
unshapes the links and runs the flow again without the emulated compute: the CPU-only
time of the same moves. Per system and
N: throughput per node (samples / s), linearity = throughput(N) / (N x throughput(1)),
the bytes each link carried, the busiest link's share of all bytes between nodes, and
which bound the time hit: the links (the shaped dispatch outlasts the unshaped one by more
than the unshaped one takes) or the CPUs (the unshaped run's time). A table, a plot
(``--plot``) and ``--json OUT``:

    {"td": {"1": {"throughput_per_node": ..., "linearity": ...}, ...}, "central": {...},
     "link_mb_per_s": ..., "bound": ...}

    flock /tmp/mindrl-heavy.lock .venv/bin/python -m benchmarks.cluster.linearity \\
        --nodes 1,2,4,8 --link-mb-per-s 12.5 --json linearity.json \\
        --plot docs/figures/cluster_linearity.png

Needs root, ``ip netns`` and tc (refused in one line otherwise). Results and what they
mean: docs/guide/benchmarks.md, "A shaped cluster on one machine"; docs/pipeline.md,
"Scaling on links".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.cluster.netns import (
    DOCK_KINDS,
    PYTHON,
    ShapedCluster,
    refused_in_one_line,
    report_line,
)

SYSTEMS = tuple(DOCK_KINDS)
#: An iteration is its emulated compute plus its dispatch (the sample flow's moves). A
#: dispatch is link-bound when the links add more to it than the cores take (shaped minus
#: unshaped dispatch over the unshaped one): bytes a link carries spread over the
#: iteration (Ray's periodic reports) may need longer at the rate without delaying it,
#: so the busiest link's time alone does not say. The report's ``bound`` is
#: ``cpu`` if any dispatch over this share of its iteration is core-bound, else ``link``.
CORES_MATTER = 0.1
LABELS = {
    "td": "transfer dock",
    "central": "centralized buffer",
}


def run_flow(
    cluster: ShapedCluster, args: argparse.Namespace, nodes: int, compute_ratio: float
) -> dict:
    """The flow driver inside node 0; its JSON report."""
    argv = [str(PYTHON), "-m", "benchmarks.cluster.flow", "--nodes", str(nodes),
            "--token", cluster.token, "--link-mb-per-s", str(args.link_mb_per_s),
            "--compute-ratio", str(compute_ratio), "--prompts", str(args.prompts),
            "--responses", str(args.responses), "--prompt-len", str(args.prompt_len),
            "--response-len", str(args.response_len), "--iterations", str(args.iterations),
            "--warmup", str(args.warmup), "--systems", args.systems]  # fmt: skip
    done = cluster.run_on(0, argv, timeout_s=args.timeout_s)
    report = report_line(done.stdout)
    if done.returncode != 0 or report is None:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise SystemExit(f"error: the flow driver failed on {nodes} node(s): {tail}")
    return report


def measure(args: argparse.Namespace) -> dict[int, dict]:
    """Per N: the shaped and the unshaped (CPU-only) reports (``--raw``: written as they
    come, so an interrupted sweep keeps what it measured)."""
    out = {}
    for nodes in args.node_counts:
        with ShapedCluster(nodes, args.link_mb_per_s, object_store_mb=256) as cluster:
            print(f"{nodes} node(s): cluster up, shaped run", file=sys.stderr)
            shaped = run_flow(cluster, args, nodes, args.compute_ratio)
            cluster.shape(None)
            print(f"{nodes} node(s): unshaped (CPU-only) run", file=sys.stderr)
            unshaped = run_flow(cluster, args, nodes, 0.0)  # the sample flow alone
        out[nodes] = {"shaped": shaped, "unshaped": unshaped}
        if args.raw:
            args.raw.write_text(json.dumps(out, indent=2))
    return out


def link_totals(run: dict) -> tuple[list[int], list[int]]:
    """Median bytes per iteration up and down each link."""
    ups = [r["links"]["up"] for r in run]
    downs = [r["links"]["down"] for r in run]
    return (
        [int(statistics.median(col)) for col in zip(*ups, strict=True)],
        [int(statistics.median(col)) for col in zip(*downs, strict=True)],
    )


def summarize(measured: dict[int, dict], mb_per_s: float) -> dict:
    """The issue's JSON: per system and N, throughput per node and linearity, with the
    bytes per link, the busiest link's share and the bound behind each."""
    systems = [s for s in SYSTEMS if s in next(iter(measured.values()))["shaped"]["runs"]]
    report: dict = {system: {} for system in systems}
    bounds = []
    for nodes, both in sorted(measured.items()):
        shaped, unshaped = both["shaped"], both["unshaped"]
        compute = sum(shaped["compute_s"].values())
        for system in systems:
            seconds = shaped["median_s"][system]
            up, down = link_totals(shaped["runs"][system])
            crossed = sum(up)  # every byte between nodes leaves one node's uplink
            busiest = max(max(up), max(down))
            link_s = busiest / (mb_per_s * 2**20)
            cpu_s = unshaped["median_s"][system]
            dispatch = seconds - compute
            bound = "link" if dispatch - cpu_s > cpu_s else "cpu"
            if dispatch > CORES_MATTER * seconds:
                bounds.append(bound)
            per_link = [u + d for u, d in zip(up, down, strict=True)]
            report[system][str(nodes)] = {
                "throughput_per_node": shaped["samples_per_node"] / seconds,
                "iteration_s": seconds,
                "compute_s": compute,
                "dispatch_s": dispatch,
                "busiest_link_s": link_s,
                "cpu_only_dispatch_s": cpu_s,
                "bound": bound,
                "link_bytes_up": up,
                "link_bytes_down": down,
                # A byte between two nodes leaves one uplink and enters one downlink:
                # the share of them the busiest link carries (one node: no such bytes).
                "busiest_link_share": max(per_link) / crossed if nodes > 1 else 0.0,
            }
    for system in systems:
        base = report[system].get("1", {}).get("throughput_per_node")
        for entry in report[system].values():
            entry["linearity"] = entry["throughput_per_node"] / base if base else None
    report["link_mb_per_s"] = mb_per_s
    report["bound"] = "cpu" if "cpu" in bounds else "link"
    return report


def render(report: dict, shape: dict, compute_ratio: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    table = Table(
        title=f"GRPO sample flow per node: {shape['prompts']} prompts x {shape['responses']} "
        f"responses, L_p {shape['prompt_len']}, L_r {shape['response_len']}; links "
        f"{report['link_mb_per_s']:g} MB/s; emulated device compute = {compute_ratio:g} x "
        "a node's stage bytes at the link rate"
    )
    for col in ("system", "N", "s / iter", "compute", "dispatch", "busiest link at rate",
                "CPU-only dispatch", "bound", "samples/s/node", "linearity",
                "busiest link MiB", "its share"):  # fmt: skip
        table.add_column(col, justify="right")
    for system in (s for s in SYSTEMS if s in report):
        for nodes, e in report[system].items():
            busiest = max(map(sum, zip(e["link_bytes_up"], e["link_bytes_down"], strict=True)))
            table.add_row(
                LABELS[system], nodes, f"{e['iteration_s']:.2f}", f"{e['compute_s']:.2f}",
                f"{e['dispatch_s']:.2f}", f"{e['busiest_link_s']:.2f}",
                f"{e['cpu_only_dispatch_s']:.2f}", e["bound"],
                f"{e['throughput_per_node']:.1f}", _percent(e["linearity"]),
                f"{busiest / 2**20:.1f}", f"{e['busiest_link_share']:.0%}",
            )  # fmt: skip
    console.print(table)
    console.print(f"bound: {report['bound']}")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


#: The paper's linearity at 192 NPUs (24 nodes of 8), for the plot's reference lines.
PAPER_LINEARITY = {"td": 0.811, "central": 0.619}
STYLES = {"td": "o-", "central": "s-"}


def plot(report: dict, path: Path, before: dict | None = None, before_label: str = "") -> None:
    """Linearity and the busiest link per N; ``before``: an earlier report whose dock is
    drawn dashed beside (``before_label`` names it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for system in (s for s in SYSTEMS if s in report):
        entries = report[system]
        nodes = [int(n) for n in entries]
        line = left.plot(nodes, [e["linearity"] for e in entries.values()], STYLES[system],
                         label=LABELS[system])[0]  # fmt: skip
        if system in PAPER_LINEARITY:
            left.axhline(PAPER_LINEARITY[system], color=line.get_color(), ls=":", lw=1,
                         label=f"paper, 24 nodes: {PAPER_LINEARITY[system]:.1%}")  # fmt: skip
        busiest = [max(map(sum, zip(e["link_bytes_up"], e["link_bytes_down"], strict=True)))
                   / 2**20 for e in entries.values()]  # fmt: skip
        right.plot(nodes, busiest, STYLES[system], label=LABELS[system])
    if before is not None:
        entries, label = before["td"], f"{LABELS['td']}, {before_label or 'before'}"
        earlier = [int(n) for n in entries]
        left.plot(earlier, [e["linearity"] for e in entries.values()], "o--", color="grey",
                  label=label)  # fmt: skip
        busiest = [max(map(sum, zip(e["link_bytes_up"], e["link_bytes_down"], strict=True)))
                   / 2**20 for e in entries.values()]  # fmt: skip
        right.plot(earlier, busiest, "o--", color="grey", label=label)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.minorticks_off()
    left.set(xlabel="nodes", ylabel="linearity", ylim=(0, 1.05),
             title=f"linearity, links {report['link_mb_per_s']:g} MB/s each way")  # fmt: skip
    right.set(xlabel="nodes", ylabel="MiB per iteration", title="busiest link (up + down)")
    # Below the axes: inside, the legend hides the centralized buffer's low points.
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,2,4,8", help="comma-separated node counts")
    parser.add_argument(
        "--link-mb-per-s",
        type=float,
        default=300.0,
        help="each link's rate per direction, MB = 2^20 B (paper: 300)",
    )
    parser.add_argument(
        "--compute-ratio",
        type=float,
        default=1.0,
        help="emulated device compute per stage, in units of the time the "
        "stage's bytes of one node take at the link rate (0: none)",
    )
    parser.add_argument("--prompts", type=int, default=4, help="prompts per node")
    parser.add_argument("--responses", type=int, default=8, help="responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--response-len", type=int, default=4096)
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations per system")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated: td, central or both"
    )
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per flow run")
    parser.add_argument(
        "--before", type=Path, help="an earlier --json report: its dock drawn dashed beside"
    )
    parser.add_argument("--before-label", default="", help="what the earlier report measured")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--plot", type=Path, help="write the plot (PNG) here")
    parser.add_argument("--raw", type=Path, help="write every run's measurements here")
    args = parser.parse_args(argv)
    try:
        args.node_counts = sorted({int(n) for n in args.nodes.split(",")})
    except ValueError:
        parser.error(f"--nodes must be comma-separated integers, got {args.nodes!r}")
    if not args.node_counts or args.node_counts[0] < 1 or args.node_counts[-1] > 64:
        parser.error("--nodes: node counts between 1 and 64")
    if not set(args.systems.split(",")) <= set(SYSTEMS):
        parser.error(f"--systems: a comma-separated subset of {', '.join(SYSTEMS)}")
    if args.link_mb_per_s <= 0:
        parser.error("--link-mb-per-s must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with refused_in_one_line():
        measured = measure(args)
    report = summarize(measured, args.link_mb_per_s)
    shape = next(iter(measured.values()))["shaped"]["shape"]
    render(report, shape, args.compute_ratio)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.plot:
        before = json.loads(args.before.read_text()) if args.before else None
        plot(report, args.plot, before, args.before_label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
