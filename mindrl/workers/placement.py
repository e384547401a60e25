"""The run plan's placement made real: one Ray placement group of one bundle per device.

``RunLayout.bundles()`` says which worker processes sit on which devices: one of every
model role on each training device (rank ``r`` of the actor, reference and critic on
device ``r``), a rollout worker alone on the devices of its generation TP group.
:class:`DevicePlacement` reserves them as one placement group, one bundle per training
device and per rollout worker, and gives each process ``1 / k`` of its bundle's device
(``k`` processes share it; a rollout worker takes all of its own): Ray schedules the
roles of rank ``r`` into bundle ``r`` and sets the same visible device for all of them,
as verl and OpenRLHF place collocated roles. A cluster with fewer devices than the plan
needs is refused at once, in one line naming both counts, before anything waits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import ray
from ray.actor import ActorClass
from ray.util.placement_group import (
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from backends.device import Device
from mindrl.config.layout import DeviceBundle, RunLayout
from mindrl.workers.group import WorkerGroup, on_bundle, wait_for_placement

#: Ray keeps resource amounts in units of 1e-4; a share is rounded down to one, so k
#: shares of a bundle's device never add up to more than the one device it holds.
RAY_RESOURCE_UNIT = 1e-4


class PlacementError(RuntimeError):
    """The cluster cannot hold the plan's devices; the message names both counts."""


def device_share(processes: int) -> float:
    """Each of ``processes`` processes' share of one device, rounded down to Ray's unit."""
    units = math.floor(1 / (processes * RAY_RESOURCE_UNIT))
    return units * RAY_RESOURCE_UNIT


def bundle_share(bundle: DeviceBundle) -> float:
    """Each process's share of ``bundle``'s devices (all of them, for one alone in it)."""
    return device_share(len(bundle.processes)) * bundle.devices


def cluster_devices(device: Device) -> float:
    """Devices the connected Ray cluster has: its total of the device's Ray resource."""
    return ray.cluster_resources().get(device.ray_resource, 0.0)


def check_capacity(layout: RunLayout, device: Device, available: float) -> None:
    """Refuse a plan that needs more devices than the cluster has, naming both counts."""
    if layout.devices <= available:
        return
    what = f"{layout.train_devices} training"
    if layout.rollout_devices:
        what += f" + {layout.rollout_devices} generating"
    if layout.env_devices:
        what += f" + {layout.env_devices} simulating (env.device=accelerator)"
    raise PlacementError(
        f"the plan needs {layout.devices} {device.name} devices ({what}; "
        f"resources.nodes x resources.devices_per_node), the Ray cluster has "
        f"{available:g} ({device.ray_resource}); lower resources.devices_per_node or "
        "resources.nodes, or add devices to the cluster"
    )


class DevicePlacement:
    """The run's devices as one placement group, one bundle per device.

    Args:
        device: the device layer (its Ray resource and actor options).
        layout: the plan's layout: which processes share each device.
        cpus_per_worker: Ray CPU slots each process reserves beside its device share.
        ready_timeout_s: how long the cluster may take to grant the bundles.
        strategy: ``"PACK"`` fills a node's devices before the next node's, ``"SPREAD"``
            puts each device's bundle on another node while it can.

    Raises:
        PlacementError: the cluster has fewer devices than the plan (a user's mistake).
        StageTimeoutError: the cluster has them but did not grant the bundles within
            ``ready_timeout_s`` (other jobs hold them).
    """

    def __init__(
        self,
        device: Device,
        layout: RunLayout,
        cpus_per_worker: float = 1.0,
        ready_timeout_s: float = 300.0,
        strategy: str = "PACK",
    ) -> None:
        check_capacity(layout, device, cluster_devices(device))
        self.device, self.cpus_per_worker = device, cpus_per_worker
        self.bundles = layout.bundles()
        bundles = [
            device.ray_bundle(len(bundle.processes), cpus_per_worker, bundle.devices)
            for bundle in self.bundles
        ]
        self.group = placement_group(bundles, strategy=strategy)
        wait_for_placement(
            self.group,
            ready_timeout_s,
            f"the cluster did not grant the plan's {len(bundles)} devices as bundles "
            f"of {bundles[0]} within {ready_timeout_s:.0f} s; check `ray status` for "
            "resources other jobs hold",
        )

    def bundles_of(self, role: str) -> list[int]:
        """The bundle of each rank of ``role``, in rank order."""
        return [index for index, bundle in enumerate(self.bundles) if role in bundle.processes]

    def nodes_of(self, role: str) -> list[str]:
        """The node of each rank of ``role`` (its bundle's), known as soon as the group is
        granted: before the ranks' processes have started."""
        nodes = placement_group_table(self.group)["bundles_to_node_id"]
        return [nodes[index] for index in self.bundles_of(role)]

    def actor_options(self, role: str) -> list[dict]:
        """Ray actor options for each rank of ``role``: its bundle and its share of the
        bundle's devices (every device of it, for a process alone in a bundle)."""
        options = []
        for index in self.bundles_of(role):
            share = bundle_share(self.bundles[index])
            options.append(
                on_bundle(
                    self.group, index, self.device.ray_actor_options(self.cpus_per_worker, share)
                )
            )
        return options

    def start(self, role: str, worker_cls: ActorClass, args: Sequence[Any] = ()) -> WorkerGroup:
        """The worker group of ``role``: rank ``r`` on its device's bundle, with its share
        (``worker_cls`` a ``@ray.remote`` class taking ``(rank, size, *args)``)."""
        options = self.actor_options(role)
        return WorkerGroup(role, worker_cls, len(options), args=args, actor_options=options)

    def remove(self) -> None:
        remove_placement_group(self.group)
