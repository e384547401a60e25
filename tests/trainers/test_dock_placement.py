"""Where a run's dock keeps its payloads on the shared three-node cluster: beside the
run's devices (model ranks, rollout workers), one warehouse per node they use (the
session's tiny run with a reference places its devices on fewer nodes than the cluster
has). Reward workers, placed wherever a CPU is free, add none: which rank claims which
samples must not change with where they land."""

from __future__ import annotations

import json

import pytest

from trainers.driver.setup import PLACEMENT_FILE

pytestmark = [pytest.mark.ray]


def test_a_run_keeps_one_warehouse_on_each_node_of_its_devices_and_none_elsewhere(
    sync_run, ray_cluster
):
    placement = json.loads((sync_run / PLACEMENT_FILE).read_text())
    ranks = placement["ranks"]
    device_nodes = {node for role in ("actor", "reference") for node in ranks[role]}
    assert sorted(placement["warehouses"]) == sorted(device_nodes)
    assert len(device_nodes) < len(ray_cluster.list_all_nodes())  # so "elsewhere" exists
