"""Shared fixtures. One Ray session per test run: a local 3-node cluster.

The cluster is started lazily by the first test that asks for ``ray_cluster`` and shut
down at the end of the run; every Ray test shares it. Nodes carry a custom resource
``mindrl_node_<i>`` so a test can pin an actor to a node, and each has 2 CPUs worth of
logical slots (Ray's CPU counts here are scheduling slots, not cores).
"""

from __future__ import annotations

import os

import pytest

NUM_NODES = 3
CPUS_PER_NODE = 4


@pytest.fixture(scope="session")
def ray_cluster():
    """A running 3-node local Ray cluster with this process connected as the driver."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": CPUS_PER_NODE,
            "resources": {"mindrl_node_0": 1},
            "include_dashboard": False,
            "object_store_memory": 400 * 2**20,
        },
    )
    for i in range(1, NUM_NODES):
        cluster.add_node(
            num_cpus=CPUS_PER_NODE,
            resources={f"mindrl_node_{i}": 1},
            object_store_memory=400 * 2**20,
        )
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()
