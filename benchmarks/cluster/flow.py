"""The sample flow of GRPO iterations on a shaped cluster, as mindrl's trainer runs it;
the driver of ``benchmarks.cluster.linearity``, run inside node 0's namespace.

Per node ``prompts x responses`` samples; the stages, the fields each reads and writes and
the role serving each come from the run plan (GRPO with a reference model and two
mini-batches, so old log-probs too: the paper's n_l = 5 per-token fields). The driver
puts the prompts (each group's once, ``repeat``) and claims each stage's batch from its
controller (the centralized buffer: from the buffer), split over the stage's workers as
the trainer splits it (``dp_parts``, balanced by length, each part what its node's
warehouse stores while it can be); each worker fetches its part, computes, and puts what
the stage writes. Roles as the all-colocated layout places them with one device per
node: an actor, reference and reward worker on every node; GRPO's group-local advantages
on the reward worker beside each warehouse, on the groups it stores (the centralized
buffer: reward rank 0), as trainers/driver/iteration.py runs them. Responses run to the
maximum length (paper Eq. 2).

Devices are not on this machine: a model stage's compute is emulated by a wait that uses
no CPU, ``compute_ratio`` x the time that stage's samples of one node would take to cross
one link at the link rate (0: the sample flow alone). Reward scoring and advantages are
CPU work here too, and take what they take.

Prints one JSON object: per system, per iteration, the seconds, the compute waited and the
bytes each link carried.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import ray

from benchmarks.cluster.netns import DOCK_KINDS, REPORT_MARKER, ShapedCluster
from mindrl.config import load_config
from mindrl.data.records import PromptRecord, record_fields
from mindrl.dock import DockClient, create_dock, shutdown_dock
from mindrl.run_plan import RunPlan, build_run_plan
from trainers.driver.setup import FIELDS
from trainers.registry import get_algorithm

#: The stage split by warehouse, whole groups each, not balanced (the trainer's
#: ``_advantage_parts``).
BY_WAREHOUSE = "advantage"
#: Roles whose work runs on the devices (emulated here); the others are CPU work.
DEVICE_ROLES = frozenset({"actor", "reference", "critic"})
#: Stages the trainer claims in whole groups.
WHOLE_GROUPS = frozenset({"rollout", "advantage"})
VOCAB = 32000


@dataclass(frozen=True)
class Shape:
    """One iteration's sample flow per node."""

    prompts: int
    responses: int
    prompt_len: int
    response_len: int

    @property
    def samples(self) -> int:
        return self.prompts * self.responses

    def sample_bytes(self, field: str) -> int:
        """Bytes of one sample's ``field`` as the dock stores it (no length entry)."""
        spec = FIELDS[field]
        per_item = np.dtype(spec.dtype).itemsize * int(np.prod(spec.shape, dtype=np.int64))
        if not spec.variable:
            return per_item
        return per_item * (self.prompt_len if field == "prompt_ids" else self.response_len)


def grpo_plan() -> RunPlan:
    """GRPO with a reference model and two mini-batches: every stage of the paper's flow."""
    config = load_config(
        None, ["algorithm.kl_coef=0.001", "actor.mini_batch_size=1", "data.global_batch_size=2"]
    )
    return build_run_plan(get_algorithm("grpo"), config)


def compute_seconds(plan: RunPlan, shape: Shape, ratio: float, mb_per_s: float) -> dict:
    """Emulated device seconds per stage per node (module docstring)."""
    out = {}
    for stage in plan.stages:
        if stage.role not in DEVICE_ROLES:
            out[stage.name] = 0.0
            continue
        moved = sum(shape.sample_bytes(f) for f in (*stage.reads, *stage.writes))
        out[stage.name] = ratio * moved * shape.samples / (mb_per_s * 2**20)
    return out


@ray.remote(num_cpus=0)
class StageWorker:
    """Every role of one node: fetches its part, computes (a wait), puts the writes."""

    def __init__(self, shape: Shape, seed: int) -> None:
        self.shape = shape
        self.rng = np.random.default_rng(seed)
        self.client: DockClient | None = None

    def attach(self, handle) -> None:
        self.client = DockClient(handle)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def stage(self, indexes: np.ndarray, reads: list, writes: list, compute_s: float) -> float:
        start = time.perf_counter()
        if len(indexes):
            self.client.fetch(indexes, reads)
            time.sleep(compute_s * len(indexes) / self.shape.samples)
            if writes:
                self.client.put(indexes, self._results(writes, len(indexes)))
        return time.perf_counter() - start

    def _results(self, writes: list, n: int) -> dict[str, np.ndarray]:
        out = {}
        for name in writes:
            spec = FIELDS[name]
            if name == "response_ids":
                out[name] = self.rng.integers(0, VOCAB, (n, self.shape.response_len))
            elif spec.variable:
                out[name] = self.rng.standard_normal((n, self.shape.response_len), np.float32)
            else:
                out[name] = self.rng.random(n, np.float32).astype(spec.dtype)
        return out


class Flow:
    """The driver's side: prompts in, then every stage claimed, split and served."""

    def __init__(self, plan: RunPlan, shape: Shape, nodes: int, compute: dict) -> None:
        self.plan, self.shape, self.nodes, self.compute = plan, shape, nodes, compute
        self.n = shape.samples * nodes
        self.rng = np.random.default_rng(0)
        self.workers = [
            StageWorker.options(resources={f"cluster_node_{i}": 0.01}).remote(shape, i)
            for i in range(nodes)
        ]
        self.worker_nodes = ray.get([w.node_id.remote() for w in self.workers])

    def iteration(self, client: DockClient) -> None:
        """One iteration as the trainer runs it (module docstring)."""
        beside = [client.warehouse_on(node) for node in self.worker_nodes]
        groups, responses = self.n // self.shape.responses, self.shape.responses
        prompts = self.rng.integers(0, VOCAB, (groups, self.shape.prompt_len))
        records = [PromptRecord(f"g{g}", f"prompt {g}", str(g)) for g in range(groups)]
        fields = {"prompt_ids": prompts, **record_fields(records), "group_id": np.arange(groups)}
        client.put(np.arange(self.n), fields, repeat=responses)
        for stage in self.plan.stages:
            by_warehouse = stage.name == BY_WAREHOUSE
            parts = client.claim(
                stage.name,
                list(stage.reads),
                self.n,
                whole_groups=stage.name in WHOLE_GROUPS,
                dp_parts=1 if by_warehouse else len(self.workers),
                part_warehouses=None if by_warehouse else beside,
            )
            workers = self.workers
            if by_warehouse and len(set(beside)) > 1:  # each group on the node storing it
                owners = client.owner(parts[0])
                parts = [parts[0][owners == w] for w in beside]
            elif by_warehouse:  # one buffer: reward rank 0
                workers = self.workers[:1]
            compute = self.compute[stage.name]
            reads, writes = list(stage.reads), list(stage.writes)
            calls = zip(workers, parts, strict=True)
            ray.get([w.stage.remote(p, reads, writes, compute) for w, p in calls])
        client.clear()


def measure(args: argparse.Namespace) -> dict:
    plan, shape = grpo_plan(), Shape(args.prompts, args.responses, args.prompt_len,
                                     args.response_len)  # fmt: skip
    compute = compute_seconds(plan, shape, args.compute_ratio, args.link_mb_per_s)
    links = ShapedCluster(args.nodes, token=args.token)
    ray.init(logging_level="ERROR", log_to_driver=False)
    flow = Flow(plan, shape, args.nodes, compute)
    handles = {
        system: create_dock(FIELDS, plan.dock_stages(), flow.n, shape.responses, kind=kind)
        for system, kind in DOCK_KINDS.items()
        if system in args.systems
    }
    runs: dict[str, list[dict]] = {system: [] for system in handles}
    for round_ in range(args.warmup + args.iterations):
        for system, handle in handles.items():  # alternate, so load shifts hit both alike
            ray.get([w.attach.remote(handle) for w in flow.workers])
            client = DockClient(handle)
            before, start = links.link_bytes(), time.perf_counter()
            flow.iteration(client)
            seconds = time.perf_counter() - start
            moved = links.link_bytes() - before
            if round_ >= args.warmup:
                runs[system].append({"seconds": seconds, "links": moved.as_dict()})
    for handle in handles.values():
        shutdown_dock(handle)
    return {
        "nodes": args.nodes,
        "shape": asdict(shape),
        "compute_s": compute,
        "samples_per_node": shape.samples,
        "stages": [s.name for s in plan.stages],
        "runs": runs,
        "median_s": {s: statistics.median(r["seconds"] for r in v) for s, v in runs.items()},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--token", required=True, help="the cluster's name token")
    parser.add_argument("--link-mb-per-s", type=float, required=True)
    parser.add_argument("--compute-ratio", type=float, default=1.0)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--responses", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--response-len", type=int, default=4096)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--systems", default=",".join(DOCK_KINDS), help="td, central or both")
    args = parser.parse_args(argv)
    args.systems = args.systems.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    print(REPORT_MARKER + json.dumps(measure(parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
