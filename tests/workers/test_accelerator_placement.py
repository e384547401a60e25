"""Collocated roles share their devices: one placement group of one bundle per device.

PPO with a reference (actor, reference, critic, reward) is placed for the cuda and the
npu device layers on a node with FAKE accelerators: the test session's one Ray cluster
(tests/conftest.py) gains, for this module only, a node whose Ray resources say 4 GPUs
and 4 NPUs (``Cluster.add_node(num_gpus=4, resources={"NPU": 4})``); it has neither, so
no engine is built there. The workers are stand-ins started through the very code path
start-up uses (``DevicePlacement.start``), each reporting what Ray gave it: its bundle's
accelerator ids, its resource shares and the visible-devices variable Ray set.
"""

from __future__ import annotations

import os
import time

import pytest

from backends.device.cuda import CudaDevice
from mindrl.config import load_config
from mindrl.run_plan import build_run_plan
from mindrl.workers.embodied_setup import env_worker_place
from mindrl.workers.group import WorkerGroup
from mindrl.workers.placement import DevicePlacement, PlacementError
from mindrl.workers.vector_env_worker import reserve_env_workers
from trainers.registry import get_algorithm

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]

DEVICES = 4
#: PPO with a KL penalty on 4 devices at TP1: actor, reference and critic on every device.
PPO_WITH_REFERENCE = [
    f"resources.devices_per_node={DEVICES}",
    "resources.cpus_per_worker=0.5",
    "algorithm.kl_coef=0.001",
    *(f"{role}.parallel.tp=1" for role in ("actor", "reference", "critic")),
]


def stand_in_class():
    """A worker in a model role's place that reports where Ray put it (defined here, so
    Ray ships it by value: the tests package is not importable in a worker)."""

    class StandIn:
        def __init__(self, rank: int, size: int, role: str, env: str | None) -> None:
            self.rank, self.size, self.role, self.env = rank, size, role, env

        def report(self) -> dict:
            import ray

            context = ray.get_runtime_context()
            return {
                "role": self.role,
                "rank": self.rank,
                "node": context.get_node_id(),
                "accelerators": context.get_accelerator_ids(),
                "resources": context.get_assigned_resources(),
                "visible": os.environ.get(self.env) if self.env else None,
            }

        def start_env_worker(self, place) -> dict:
            """A stand-in environment worker started as this rank starts its real one
            (the real options, computed in the rank's process), and its report."""
            import ray

            from mindrl.workers.vector_env_worker import env_worker_options

            worker = (
                ray.remote(type(self))
                .options(**env_worker_options(place))
                .remote(self.rank, self.size, "env", self.env)
            )
            return ray.get(worker.report.remote())

    return StandIn


@pytest.fixture(scope="module")
def fake_accelerator_node(ray_cluster):
    """A node of the session's cluster with 4 FAKE GPUs and 4 FAKE NPUs, for this module."""
    node = ray_cluster.add_node(
        num_cpus=8, num_gpus=DEVICES, resources={"NPU": DEVICES}, object_store_memory=80 * 2**20
    )
    ray_cluster.wait_for_nodes()
    yield node
    ray_cluster.remove_node(node)


def npu_device(monkeypatch):
    """The npu device layer on a machine without torch_npu: its constructor's import of
    torch_npu is FAKED (placement reads only its Ray resource and options)."""
    from backends.device import npu

    monkeypatch.setattr(npu, "_import_torch_npu", lambda: None)
    return npu.NpuDevice()


def place_ppo_with_reference(device, overrides: list[str] = ()) -> tuple[list[dict], object]:
    """Every model role of PPO + reference through start-up's placement, and a reward
    worker beside them; what each worker reports, and the plan."""
    return place(device, "ppo", [*PPO_WITH_REFERENCE, *overrides], with_reward=True)


def place(
    device,
    trainer: str,
    overrides: list[str],
    roles: tuple[str, ...] = (),
    with_reward: bool = False,
) -> tuple[list[dict], object]:
    """Stand-ins for ``roles`` (default: the plan's model roles) placed as start-up
    places them, and a reward worker if asked; what each reports, and the plan."""
    import ray

    algorithm = get_algorithm(trainer)
    config = load_config("configs/tiny.yaml", overrides, algorithm)
    plan = build_run_plan(algorithm, config)
    placement = DevicePlacement(device, plan.layout, config.resources.cpus_per_worker, 60)
    stand_in = ray.remote(stand_in_class())
    groups = [
        placement.start(role, stand_in, (role, device.visible_devices_env))
        for role in roles or plan.model_roles
    ]
    if with_reward:
        groups.append(WorkerGroup("reward", stand_in, 1, None, args=("reward", None)))
    try:
        reports = [r for g in groups for r in g.call("report", stage="probe", timeout_s=60)]
    finally:
        for group in groups:
            group.shutdown()
        placement.remove()
    return reports, plan


def by_rank(reports: list[dict]) -> dict[int, list[dict]]:
    ranks: dict[int, list[dict]] = {}
    for report in reports:
        if report["role"] != "reward":
            ranks.setdefault(report["rank"], []).append(report)
    return ranks


@pytest.mark.parametrize("layer", ["cuda", "npu"])
def test_ppo_with_a_reference_shares_world_size_devices_one_bundle_per_device(
    fake_accelerator_node, monkeypatch, layer
):
    device = CudaDevice() if layer == "cuda" else npu_device(monkeypatch)
    resource = device.ray_resource
    reports, plan = place_ppo_with_reference(device)
    assert plan.model_roles == ("actor", "reference", "critic")
    ranks = by_rank(reports)
    assert sorted(ranks) == list(range(DEVICES))
    devices_used = set()
    for rank, roles in ranks.items():
        assert sorted(r["role"] for r in roles) == ["actor", "critic", "reference"]
        # The roles of rank r share one accelerator: the same id, the same visible device.
        ids = {tuple(r["accelerators"][resource]) for r in roles}
        assert len(ids) == 1, (rank, ids)
        (device_ids,) = ids
        assert len(device_ids) == 1
        devices_used.add(device_ids[0])
        assert {r["visible"] for r in roles} == {device_ids[0]}
        # Each holds a third of it (Ray's resource unit, rounded down) beside its CPUs.
        for role in roles:
            assert role["resources"][resource] == pytest.approx(0.3333)
            assert role["resources"]["CPU"] == pytest.approx(0.5)
            assert role["node"] == fake_accelerator_node.node_id
    assert len(devices_used) == DEVICES  # exactly world-size devices, one per rank
    (reward,) = [r for r in reports if r["role"] == "reward"]
    assert resource not in reward["resources"]  # the reward worker holds no device


def test_a_rollout_worker_at_generation_tp_2_holds_two_devices_of_its_own(
    fake_accelerator_node,
):
    overrides = [
        f"resources.devices_per_node={DEVICES}", "resources.cpus_per_worker=0.5",
        "rollout.placement=disaggregated", "rollout.devices=2", "rollout.tp=2",
        "rollout.engine=vllm", "actor.parallel.tp=1", "rollout.max_staleness=1",
    ]  # fmt: skip
    reports, _ = place(CudaDevice(), "grpo", overrides, ("actor", "rollout"))
    actors = [r for r in reports if r["role"] == "actor"]
    (rollout,) = [r for r in reports if r["role"] == "rollout"]
    assert len(actors) == 2 and all(len(r["accelerators"]["GPU"]) == 1 for r in actors)
    gpus = rollout["accelerators"]["GPU"]
    assert len(gpus) == 2 and rollout["resources"]["GPU"] == pytest.approx(2.0)
    assert rollout["visible"] == ",".join(gpus)  # vLLM's two ranks see both
    held = {g for r in actors for g in r["accelerators"]["GPU"]} | set(gpus)
    assert len(held) == DEVICES  # no device shared between the sides


def test_a_plan_needing_more_devices_than_the_cluster_has_is_refused_at_once(
    fake_accelerator_node,
):
    start = time.monotonic()
    with pytest.raises(PlacementError) as err:
        place_ppo_with_reference(CudaDevice(), ["resources.devices_per_node=8"])
    assert time.monotonic() - start < 10  # refused, not waited on
    assert str(err.value) == (
        "the plan needs 8 cuda devices (8 training; resources.nodes x "
        "resources.devices_per_node), the Ray cluster has 4 (GPU); lower "
        "resources.devices_per_node or resources.nodes, or add devices to the cluster"
    )


#: The embodied recipe on 2 devices, its simulators on the accelerators.
EMBODIED_ON_DEVICES = [
    "resources.devices_per_node=2",
    "resources.cpus_per_worker=0.5",
    "env.device=accelerator",
]


def place_env_workers(placement: str) -> tuple[list[dict], list[dict], object]:
    """The embodied recipe's actor ranks placed as start-up places them, each starting
    its environment worker as the real rank does: the ranks' and the workers' reports."""
    import ray
    from ray.util.placement_group import remove_placement_group

    device = CudaDevice()
    config = load_config(
        "configs/embodied_reach.yaml",
        [*EMBODIED_ON_DEVICES, f"env.placement={placement}"],
        get_algorithm("grpo"),
    )
    plan = build_run_plan(get_algorithm("grpo"), config)
    env_group = reserve_env_workers(2, 60, device) if placement == "disaggregated" else None
    placement_group = DevicePlacement(device, plan.layout, config.resources.cpus_per_worker, 60)
    actors = placement_group.start(
        "actor", ray.remote(stand_in_class()), ("actor", device.visible_devices_env)
    )
    try:
        ranks = actors.call("report", stage="probe", timeout_s=60)
        places = [env_worker_place(config, rank, device) for rank in range(2)]
        calls = [w.start_env_worker.remote(p) for w, p in zip(actors.workers, places, strict=True)]
        envs = ray.get(calls, timeout=60)
    finally:
        actors.shutdown()
        placement_group.remove()
        if env_group is not None:
            remove_placement_group(env_group)
    return ranks, envs, plan


def test_hybrid_environment_workers_share_their_actor_ranks_device(fake_accelerator_node):
    ranks, envs, plan = place_env_workers("hybrid")
    assert plan.layout.device_processes() == [("actor", "env")] * 2
    for rank, env in zip(ranks, envs, strict=True):
        # The same accelerator and visible device as its rank, half of it each.
        assert env["accelerators"]["GPU"] == rank["accelerators"]["GPU"]
        assert env["visible"] == rank["visible"] == rank["accelerators"]["GPU"][0]
        assert env["resources"]["GPU"] == rank["resources"]["GPU"] == pytest.approx(0.5)
        assert env["node"] == rank["node"] == fake_accelerator_node.node_id
    assert len({rank["visible"] for rank in ranks}) == 2


def test_disaggregated_environment_workers_hold_devices_of_their_own(fake_accelerator_node):
    ranks, envs, plan = place_env_workers("disaggregated")
    assert plan.layout.devices == 4 and plan.layout.env_devices == 2
    held = [tuple(r["accelerators"]["GPU"]) for r in ranks + envs]
    assert all(len(ids) == 1 for ids in held) and len(set(held)) == 4  # none shared
    assert all(env["resources"]["GPU"] == pytest.approx(1.0) for env in envs)


def test_environment_devices_the_cluster_lacks_are_refused_with_the_actors_at_once(
    fake_accelerator_node,
):
    config = load_config(
        "configs/embodied_reach.yaml",
        [*EMBODIED_ON_DEVICES, "resources.devices_per_node=4", "env.placement=disaggregated"],
        get_algorithm("grpo"),
    )
    plan = build_run_plan(get_algorithm("grpo"), config)
    with pytest.raises(PlacementError, match=r"needs 8 cuda devices \(4 training \+ 4 simulating"):
        DevicePlacement(CudaDevice(), plan.layout, 0.5, 60)
