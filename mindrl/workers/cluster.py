"""Joining an existing Ray cluster or starting a local one.

With ``resources.ray_address`` or ``$RAY_ADDRESS`` set, mindrl joins that cluster (nodes
started with ``ray start``, accelerators exposed under the device layer's Ray resource
name). Otherwise it starts a local single-node Ray with enough logical CPU slots for
every worker: on a 2-core machine the workers still share the 2 cores, but Ray must
not refuse to schedule them.
"""

from __future__ import annotations

import os

import ray

from backends.device import Device


def connect(address: str | None, device: Device, workers: int, extra_cpu_slots: int = 4) -> None:
    """Connect this driver to Ray (idempotent)."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="ERROR", log_to_driver=True)
        return
    cpu_slots = max(os.cpu_count() or 1, workers + extra_cpu_slots)
    ray.init(
        num_cpus=cpu_slots,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=True,
        runtime_env={"env_vars": {"RAY_DEDUP_LOGS": "0", "TOKENIZERS_PARALLELISM": "false"}},
    )


def node_ids() -> list[str]:
    """IDs of the alive nodes, head first, in a stable order."""
    alive = [n for n in ray.nodes() if n["Alive"]]
    alive.sort(
        key=lambda n: (not n.get("Resources", {}).get("node:__internal_head__"), n["NodeID"])
    )
    return [n["NodeID"] for n in alive]
