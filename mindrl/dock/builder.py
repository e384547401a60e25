"""Creating a dock: one TD controller per stage (a node's in one process), one TD
warehouse per node that puts and claims (by default every alive node)."""

from __future__ import annotations

import itertools

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from mindrl.dock.central import CentralBuffer
from mindrl.dock.controller import StageController, TDControllers
from mindrl.dock.errors import DockError
from mindrl.dock.handle import DockHandle, WarehouseInfo
from mindrl.dock.schema import FieldSpec
from mindrl.dock.warehouse import TDWarehouse

#: Deadline for the dock's actors to start (a fresh Ray worker process each).
STARTUP_TIMEOUT_S = 180.0


def alive_node_ids() -> list[str]:
    """Alive Ray nodes, the driver's node first (controllers live there by default)."""
    here = ray.get_runtime_context().get_node_id()
    others = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)
    return [here, *others]


def group_aligned_shares(n_samples: int, group_size: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[first, last)`` index ranges, whole groups each, as even as possible."""
    if group_size < 1 or n_samples % group_size:
        raise DockError(f"{n_samples} samples are not whole groups of {group_size}")
    groups = n_samples // group_size
    if parts > groups:
        raise DockError(
            f"{parts} warehouses for {groups} groups: use at most one warehouse per group"
        )
    bounds = [round(i * groups / parts) * group_size for i in range(parts + 1)]
    return list(itertools.pairwise(bounds))


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def create_dock(
    schema: dict[str, FieldSpec],
    stages: list[str] | dict[str, list[str]],
    n_samples: int,
    group_size: int = 1,
    warehouses: int | None = None,
    kind: str = "distributed",
    timeout_s: float = 120.0,
    controller_nodes: dict[str, str] | None = None,
    group_ids: np.ndarray | None = None,
    nodes: list[str] | None = None,
) -> DockHandle:
    """Start the dock's actors, wait until they are up, and return the handle.

    Args:
        schema: fields that may be put.
        stages: one controller per stage; as a dict, stage -> the fields it reads, so
            warehouses only broadcast a put to the controllers that track its fields.
        n_samples: sample indexes per iteration (G * N).
        group_size: N; index // N is the group, and whole groups stay in one warehouse.
        warehouses: how many; default one per node of ``nodes``. More than the nodes
            are placed round-robin (for single-node benchmarks).
        kind: ``"distributed"`` or ``"central"`` (the baseline).
        timeout_s: default deadline of waits and actor calls made through clients.
        controller_nodes: stage -> node id to place that stage's controller with its
            workers; default the driver's node.
        group_ids: optional explicit group id per index (``[n_samples]``) for
            whole-group claims, instead of index // group_size.
        nodes: the nodes whose workers put and claim, in the order their warehouses take
            the index ranges; default every alive node, the driver's first. A warehouse
            on a node without such a worker would only ever be reached over the network.

    Raises:
        DockError: bad shape of the dock, unknown kind, or an actor that did not start.
    """
    reads = stages if isinstance(stages, dict) else {stage: list(schema) for stage in stages}
    _check_reads(reads, schema)
    if kind == "central":
        # On the driver's node, pinned: every byte of every stage goes through this node.
        here = ray.get_runtime_context().get_node_id()
        central = CentralBuffer.options(scheduling_strategy=on_node(here)).remote(
            n_samples, group_size, schema, reads, group_ids
        )
        only = WarehouseInfo(central, here, 0, n_samples)
        handle = DockHandle(
            schema, n_samples, group_size, [only], central=central, timeout_s=timeout_s
        )
    elif kind == "distributed":
        handle = _start_distributed(
            schema,
            reads,
            n_samples,
            group_size,
            warehouses,
            timeout_s,
            controller_nodes or {},
            group_ids,
            nodes or alive_node_ids(),
        )
    else:
        raise DockError(f"unknown dock kind '{kind}': use 'distributed' or 'central'")
    _wait_started(handle)
    return handle


def _check_reads(reads: dict[str, list[str]], schema: dict[str, FieldSpec]) -> None:
    for stage, fields in reads.items():
        unknown = sorted(set(fields) - set(schema))
        if unknown:
            raise DockError(
                f"stage '{stage}' reads unknown field(s) {unknown}; "
                f"the dock schema has {sorted(schema)}"
            )


def _start_distributed(
    schema: dict[str, FieldSpec],
    reads: dict[str, list[str]],
    n_samples: int,
    group_size: int,
    warehouses: int | None,
    timeout_s: float,
    controller_nodes: dict[str, str],
    group_ids: np.ndarray | None,
    nodes: list[str],
) -> DockHandle:
    controllers = _start_controllers(
        reads, n_samples, group_size, group_ids, controller_nodes, nodes[0]
    )
    listeners = {s: (controllers[s], reads[s]) for s in reads}
    infos = []
    for w, (first, last) in enumerate(
        group_aligned_shares(n_samples, group_size, warehouses or len(nodes))
    ):
        node = nodes[w % len(nodes)]
        actor = TDWarehouse.options(scheduling_strategy=on_node(node)).remote(
            w, first, last, schema, listeners, timeout_s
        )
        infos.append(WarehouseInfo(actor, node, first, last))
    return DockHandle(schema, n_samples, group_size, infos, controllers, timeout_s=timeout_s)


def _start_controllers(
    reads: dict[str, list[str]],
    n_samples: int,
    group_size: int,
    group_ids: np.ndarray | None,
    controller_nodes: dict[str, str],
    default_node: str,
) -> dict[str, StageController]:
    """Stage -> its controller: one :class:`TDControllers` actor per node, holding the
    controllers of the stages placed there (mindrl/dock/controller.py says why)."""
    by_node: dict[str, dict[str, list[str]]] = {}
    for stage, fields in reads.items():
        by_node.setdefault(controller_nodes.get(stage, default_node), {})[stage] = fields
    controllers = {}
    for node, stages in by_node.items():
        actor = TDControllers.options(scheduling_strategy=on_node(node)).remote(
            stages, n_samples, group_size, group_ids
        )
        controllers.update({stage: StageController(actor, stage) for stage in stages})
    return controllers


def _wait_started(handle: DockHandle) -> None:
    """Block until every actor answers, so later deadlines time requests, not start-up."""
    named = handle.actors()
    refs = {name: actor.node_id.remote() for name, actor in named.items()}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=STARTUP_TIMEOUT_S)
    late = [name for name, ref in refs.items() if ref not in ready]
    if late:
        shutdown_dock(handle)
        raise DockError(f"{', '.join(late)} did not start within {STARTUP_TIMEOUT_S:g} s")
    try:
        ray.get(list(refs.values()))
    except ray.exceptions.RayActorError as exc:
        shutdown_dock(handle)
        raise DockError(f"a dock actor died while starting: {exc}") from None


def shutdown_dock(handle: DockHandle) -> None:
    """Kill every actor of the dock (its payloads go with it)."""
    for actor in handle.actors().values():
        ray.kill(actor, no_restart=True)
