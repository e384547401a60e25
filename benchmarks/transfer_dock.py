"""Transfer dock vs centralized replay buffer on one simulated GRPO iteration.

Starts its own local multi-node Ray cluster (one raylet per simulated node), places one
stage worker per node, and runs the sample flow of a GRPO iteration (prompts ->
rollout -> reward -> ref/old log-probs -> advantages -> update) through the centralized
buffer and through the dock with W = 1, 2, 4 warehouses. Reports wall time per stage and
per iteration, bytes through the busiest endpoint, metadata bytes, the paper's analytic
Table-1 figures, and a same-node get of a 1024 x 4096 int64 field against a raw numpy
object-store get of the same bytes. All measured on this machine, in this run.

    .venv/bin/python benchmarks/transfer_dock.py            # ~2 min on 2 cores
    .venv/bin/python benchmarks/transfer_dock.py --json     # the report as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindrl.dock import RL_FIELDS, DockClient, create_dock, shutdown_dock
from mindrl.planner.sample_flow import central_volume_bytes, dispatch_seconds

STAGES = [  # (stage, fields read, fields written, whole groups)
    ("rollout", ["prompt_ids"], ["response_ids", "rollout_logprob"], True),
    ("reward", ["prompt_ids", "response_ids"], ["reward"], False),
    ("ref_logp", ["prompt_ids", "response_ids"], ["ref_logprob"], False),
    ("old_logp", ["prompt_ids", "response_ids"], ["old_logprob"], False),
    ("advantage", ["reward"], ["advantages"], True),
    ("update", ["prompt_ids", "response_ids", "old_logprob", "ref_logprob", "advantages"], [], 0),
]
READS = {stage: reads for stage, reads, _, _ in STAGES}
RESPONSE_FIELDS = 5  # response ids, rollout/ref/old log-probs, advantages: the paper's n_l
TABLE1_ROWS = [(256, 8, 2048, 5, 8192), (8192, 64, 4096, 8, 65536)]
GET_SHAPE = (1024, 4096)  # the same-node get: int64, 32 MiB


@ray.remote(num_cpus=0)
class StageWorker:
    """Plays every stage on its node: claims a share (local samples first), reads its
    fields straight from the warehouses, writes its results back."""

    def __init__(self, response_len: int, seed: int) -> None:
        self.client: DockClient | None = None
        self.response_len = response_len
        self.rng = torch.Generator().manual_seed(seed)

    def attach(self, handle) -> None:
        self.client = DockClient(handle)

    def feed(self, indexes: np.ndarray, prompt_len: int) -> None:
        prompts = torch.randint(0, 32000, (len(indexes), prompt_len), generator=self.rng)
        self.client.put(indexes, {"prompt_ids": prompts})

    def run_stage(self, stage: str, reads: list, writes: list, share: int, groups: bool) -> int:
        indexes, _batch = self.client.get(stage, reads, share, whole_groups=bool(groups))
        if writes:
            self.client.put(indexes, self._results(writes, len(indexes)))
        return len(indexes)

    def _results(self, writes: list[str], n: int) -> dict[str, torch.Tensor]:
        # Responses of varied length: the dock stores them unpadded.
        lengths = torch.randint(self.response_len // 2, self.response_len + 1, (n,))
        out: dict[str, torch.Tensor] = {}
        for name in writes:
            if name == "reward":
                out[name] = torch.rand(n, generator=self.rng)
            elif name == "response_ids":
                out[name] = torch.randint(0, 32000, (n, self.response_len), generator=self.rng)
            else:
                out[name] = torch.randn(n, self.response_len, generator=self.rng)
            if RL_FIELDS[name].variable:
                out[f"{name}_lengths"] = lengths
        return out


@ray.remote(num_cpus=0)
class RawHolder:
    """A plain actor returning a numpy array: the raw object-store path a get races."""

    def __init__(self, rows: int, cols: int) -> None:
        self.array = np.random.default_rng(0).integers(0, 1 << 40, (rows, cols), dtype=np.int64)

    def get(self) -> np.ndarray:
        return self.array


def start_cluster(nodes: int):
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 2, "resources": {"bench_node_0": 1}, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head | {"object_store_memory": 1 << 30})
    for i in range(1, nodes):
        cluster.add_node(num_cpus=2, resources={f"bench_node_{i}": 1}, object_store_memory=1 << 30)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster


def one_iteration(workers: list, args: argparse.Namespace) -> dict[str, float]:
    """Prompts in, then every stage on every worker at once; seconds per stage."""
    share = args.prompts * args.responses // len(workers)
    times = {}
    start = time.perf_counter()
    ray.get(
        [
            w.feed.remote(np.arange(i * share, (i + 1) * share), args.prompt_len)
            for i, w in enumerate(workers)
        ]
    )
    times["prompts"] = time.perf_counter() - start
    for stage, reads, writes, groups in STAGES:
        t0 = time.perf_counter()
        ray.get([w.run_stage.remote(stage, reads, writes, share, groups) for w in workers])
        times[stage] = time.perf_counter() - t0
    times["iteration"] = time.perf_counter() - start
    return times


def measure_systems(
    systems: dict[str, tuple[str, int]], workers: list, args: argparse.Namespace
) -> dict:
    """Per system: a warm-up iteration, then ``args.repeats`` timed ones, the systems
    taking turns each round so shifts in machine load hit them alike."""
    n_samples = args.prompts * args.responses
    handles = {
        name: create_dock(RL_FIELDS, READS, n_samples, args.responses, w, kind, 120.0)
        for name, (kind, w) in systems.items()
    }
    runs: dict[str, list] = {name: [] for name in systems}
    before, stats = {}, {}
    for round_ in range(args.repeats + 1):
        for name, handle in handles.items():
            ray.get([w.attach.remote(handle) for w in workers])
            client = DockClient(handle)
            times = one_iteration(workers, args)
            stats[name] = client.stats()
            client.clear()  # resets the metadata count, not the cumulative byte counters
            if round_ == 0:
                before[name] = stats[name]  # warm-up: not timed, not counted
            else:
                runs[name].append(times)
    for handle in handles.values():
        shutdown_dock(handle)
    return {
        name: summarize(runs[name], before[name], stats[name], args.repeats) for name in systems
    }


def summarize(runs: list[dict], before: dict, after: dict, repeats: int) -> dict:
    """Median seconds per stage; bytes per endpoint and metadata of one iteration."""
    endpoint_bytes = [
        (e["bytes_in"] + e["bytes_out"] - b["bytes_in"] - b["bytes_out"]) // repeats
        for e, b in zip(after["endpoints"], before["endpoints"], strict=True)
    ]
    return {
        "times_s": {s: statistics.median(r[s] for r in runs) for s in runs[0]},
        "iteration_s_all": [r["iteration"] for r in runs],
        "endpoint_bytes": endpoint_bytes,
        "payload_bytes": sum(endpoint_bytes),
        "metadata_bytes": after["metadata_bytes"],
    }


def same_node_get(repeats: int) -> dict:
    """Dock get (claim + fetch) and fetch of one int64 field vs a raw numpy object-store
    get of the same bytes; the holder, the warehouse and this driver share the head node.
    The three are timed in turn each repeat, so shifts in machine load hit them alike."""
    rows, cols = GET_SHAPE
    holder = RawHolder.options(resources={"bench_node_0": 0.01}).remote(rows, cols)
    array = ray.get(holder.get.remote())
    handle = create_dock(RL_FIELDS, {"update": ["response_ids"]}, rows, warehouses=1)
    client = DockClient(handle)
    field = torch.from_numpy(array.copy())
    raw, get, fetch = [], [], []
    for _ in range(repeats):
        client.clear()
        client.put(np.arange(rows), {"response_ids": field})
        raw.append(timed(lambda: ray.get(holder.get.remote())))
        get.append(timed(lambda: client.get("update", ["response_ids"], rows)))
        fetch.append(timed(lambda: client.fetch(np.arange(rows), ["response_ids"])))
    check = client.fetch(np.arange(rows), ["response_ids"])["response_ids"]
    if not torch.equal(check, field):
        raise SystemExit("same-node get returned different bytes")
    shutdown_dock(handle)
    ray.kill(holder)
    return {
        "bytes": rows * cols * 8,
        "repeats": repeats,
        "raw_get_s": statistics.median(raw),
        "dock_get_s": statistics.median(get),
        "dock_fetch_s": statistics.median(fetch),
    }


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def analytic_rows(args: argparse.Namespace) -> list[dict]:
    """Paper Table 1 (Eq. 2, 100 MB/s) for its two check rows and this run's shape."""
    rows = [
        *TABLE1_ROWS,
        (args.prompts, args.responses, args.prompt_len, RESPONSE_FIELDS, args.response_len),
    ]
    out = []
    for g, n, lp, nl, lr in rows:
        volume = central_volume_bytes(g, n, lp, nl, lr)
        out.append(
            {"G": g, "N": n, "L_p": lp, "n_l": nl, "L_r": lr, "central_GB": volume / 2**30,
             "dispatch_s_at_100MBps": dispatch_seconds(volume)}
        )  # fmt: skip
    return out


def goals(results: dict, raw: dict) -> list[tuple[str, bool, str]]:
    checks = []
    for name, r in results.items():
        if name == "central":
            continue
        ratio = r["metadata_bytes"] / max(r["payload_bytes"], 1)
        checks.append((f"{name}: metadata <= 1% of payload", ratio <= 0.01, f"{ratio:.3%}"))
        w = len(r["endpoint_bytes"])
        busiest = max(r["endpoint_bytes"]) / (r["payload_bytes"] / w)
        checks.append((f"{name}: busiest endpoint <= 1.1 x total/W", busiest <= 1.1,
                       f"{busiest:.3f} x"))  # fmt: skip
    if "dock_W1" in results:
        central, dock = (results[k]["times_s"]["iteration"] for k in ("central", "dock_W1"))
        checks.append(("dock W=1 no slower than centralized", dock <= central,
                       f"dock {dock:.3f} s vs central {central:.3f} s"))  # fmt: skip
    ratio = raw["dock_get_s"] / raw["raw_get_s"]
    checks.append(("same-node dock get within 2x of raw numpy get", ratio <= 2.0, f"{ratio:.2f} x"))
    return checks


def render(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]transfer dock benchmark[/bold] on {report['machine']}")
    console.print(f"shape: {report['shape']}")
    results = report["results"]
    systems = list(results)
    table = Table(title="one GRPO iteration, median seconds")
    table.add_column("stage")
    for name in systems:
        table.add_column(name, justify="right")
    for stage in results["central"]["times_s"]:
        table.add_row(stage, *(f"{results[s]['times_s'][stage]:.3f}" for s in systems))
    table.add_row(
        "busiest endpoint MiB/iter",
        *(f"{max(results[s]['endpoint_bytes']) / 2**20:.2f}" for s in systems),
    )
    table.add_row(
        "all endpoints MiB/iter", *(f"{results[s]['payload_bytes'] / 2**20:.2f}" for s in systems)
    )
    table.add_row("metadata KiB/iter",
                  *(f"{results[s]['metadata_bytes'] / 2**10:.1f}" for s in systems))  # fmt: skip
    console.print(table)
    raw = report["same_node_get"]
    console.print(
        f"same-node get of {GET_SHAPE[0]}x{GET_SHAPE[1]} int64 ({raw['bytes'] / 2**20:.0f} MiB): "
        f"raw numpy {raw['raw_get_s'] * 1e3:.1f} ms, dock get {raw['dock_get_s'] * 1e3:.1f} ms "
        f"(fetch alone {raw['dock_fetch_s'] * 1e3:.1f} ms)"
    )
    table = Table(title="paper Eq. 2 / Table 1: centralized volume, dispatch at 100 MB/s")
    for col in ("G", "N", "L_p", "n_l", "L_r", "GB", "seconds"):
        table.add_column(col, justify="right")
    for row in report["analytic"]:
        shape = (str(row[k]) for k in ("G", "N", "L_p", "n_l", "L_r"))
        volume, seconds = row["central_GB"], row["dispatch_s_at_100MBps"]
        table.add_row(*shape, f"{volume:,.3f}", f"{seconds:,.2f}")
    console.print(table)
    for name, ok, value in report["goals"]:
        console.print(f"{'[green]PASS' if ok else '[red]FAIL'}[/] {name}: {value}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32, help="G: prompts per iteration")
    parser.add_argument("--responses", type=int, default=8, help="N: responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=1024, help="tokens per prompt")
    parser.add_argument("--response-len", type=int, default=4096, help="max response tokens")
    parser.add_argument("--warehouses", default="1,2,4", help="comma-separated W values")
    parser.add_argument("--repeats", type=int, default=5, help="timed iterations per system")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        args.warehouse_counts = [int(w) for w in args.warehouses.split(",")]
    except ValueError:
        parser.error(f"--warehouses must be comma-separated integers, got {args.warehouses!r}")
    if any(w < 1 for w in args.warehouse_counts):
        parser.error("--warehouses must be positive integers")
    if args.prompts % max(args.warehouse_counts):
        parser.error("--prompts must split evenly over the largest W (one worker per node)")
    return args


def machine(nodes: int) -> str:
    return (f"{platform.node()} ({platform.platform()}, {platform.machine()}, "
            f"{os.cpu_count()} CPU cores), {nodes} local Ray nodes")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nodes = max(args.warehouse_counts)
    cluster = start_cluster(nodes)
    try:
        workers = [
            StageWorker.options(resources={f"bench_node_{i}": 0.01}).remote(args.response_len, i)
            for i in range(nodes)
        ]
        systems = {"central": ("central", 1)}
        systems |= {f"dock_W{w}": ("distributed", w) for w in args.warehouse_counts}
        results = measure_systems(systems, workers, args)
        raw = same_node_get(repeats=11)
    finally:
        ray.shutdown()
        cluster.shutdown()
    report = {
        "machine": machine(nodes),
        "shape": {k: v for k, v in vars(args).items() if k not in ("json", "warehouses")},
        "results": results,
        "same_node_get": raw,
        "analytic": analytic_rows(args),
    }
    report["goals"] = goals(results, raw)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        render(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
