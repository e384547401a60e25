"""Where a run's dock keeps its payloads on the shared three-node cluster: beside the
workers that put and claim them, one warehouse per node they use (the session's tiny
run with a reference places its workers on fewer nodes than the cluster has)."""

from __future__ import annotations

import json

import pytest

from trainers.driver.setup import PLACEMENT_FILE

pytestmark = [pytest.mark.ray]


def test_a_run_keeps_one_warehouse_on_each_node_of_its_workers_and_none_elsewhere(
    sync_run, ray_cluster
):
    placement = json.loads((sync_run / PLACEMENT_FILE).read_text())
    worker_nodes = {node for ranks in placement["ranks"].values() for node in ranks}
    assert sorted(placement["warehouses"]) == sorted(worker_nodes)
    assert len(worker_nodes) < len(ray_cluster.list_all_nodes())  # so "elsewhere" exists
