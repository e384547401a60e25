"""Creating a dock: one TD controller per stage, one TD warehouse per node."""

from __future__ import annotations

import itertools

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from mindrl.dock.central import CentralBuffer
from mindrl.dock.client import DockHandle, WarehouseInfo
from mindrl.dock.controller import TDController
from mindrl.dock.schema import DockError, FieldSpec
from mindrl.dock.warehouse import TDWarehouse


def alive_node_ids() -> list[str]:
    """Alive Ray nodes, the driver's node first (controllers live there by default)."""
    here = ray.get_runtime_context().get_node_id()
    others = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)
    return [here, *others]


def group_aligned_shares(n_samples: int, group_size: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[first, last)`` index ranges, whole groups each, as even as possible."""
    if n_samples % group_size:
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
    stages: list[str],
    n_samples: int,
    group_size: int = 1,
    warehouses: int | None = None,
    kind: str = "distributed",
    timeout_s: float = 120.0,
    controller_nodes: dict[str, str] | None = None,
) -> DockHandle:
    """Start the dock's actors and return the handle clients are built from.

    Args:
        schema: fields that may be put.
        stages: one controller per stage.
        n_samples: sample indexes per iteration (G * N).
        group_size: N; whole groups stay in one warehouse.
        warehouses: how many; default one per alive node. More than the nodes are
            placed round-robin (for single-node benchmarks).
        kind: ``"distributed"`` or ``"central"`` (the baseline).
        controller_nodes: stage -> node id to place that stage's controller with its
            workers; default the driver's node.
    """
    if kind == "central":
        central = CentralBuffer.remote(n_samples, group_size, schema, stages)
        only = WarehouseInfo(central, ray.get_runtime_context().get_node_id(), 0, n_samples)
        return DockHandle(
            schema, n_samples, group_size, [only], central=central, timeout_s=timeout_s
        )
    nodes = alive_node_ids()
    controllers = {
        stage: TDController.options(
            scheduling_strategy=on_node((controller_nodes or {}).get(stage, nodes[0]))
        ).remote(stage, n_samples, group_size, list(schema))
        for stage in stages
    }
    shares = group_aligned_shares(n_samples, group_size, warehouses or len(nodes))
    infos = []
    for w, (first, last) in enumerate(shares):
        node = nodes[w % len(nodes)]
        actor = TDWarehouse.options(scheduling_strategy=on_node(node)).remote(
            w, first, last, schema, list(controllers.values())
        )
        infos.append(WarehouseInfo(actor, node, first, last))
    return DockHandle(schema, n_samples, group_size, infos, controllers, timeout_s=timeout_s)


def shutdown_dock(handle: DockHandle) -> None:
    actors = (
        [handle.central]
        if handle.central is not None
        else [*handle.controllers.values(), *(w.actor for w in handle.warehouses)]
    )
    for actor in actors:
        ray.kill(actor, no_restart=True)
