"""The memory the planner plans against: one device's and one node's host memory.

Both come from the config where it says (planning for a cluster from a laptop), else
from this machine's device layer and operating system. The dry run and the end-of-run
planned-vs-measured line both read them here.
"""

from __future__ import annotations

import os

from backends.device import DeviceUnavailableError, get_device
from mindrl.config import MindRLConfig


class CapacityError(ValueError):
    """The planner cannot learn a device's memory here; the message names the setting."""


def device_bytes(config: MindRLConfig, device_name: str) -> int:
    """One device's memory: ``resources.device_memory_gib``, else this machine's device."""
    if config.resources.device_memory_gib is not None:
        return int(config.resources.device_memory_gib * 2**30)
    try:
        return get_device(device_name).total_memory()
    except DeviceUnavailableError as exc:
        raise CapacityError(
            f"cannot plan for '{device_name}' devices on this machine ({exc}); "
            "set resources.device_memory_gib in the config"
        ) from None


def host_bytes(config: MindRLConfig) -> int:
    """Host memory per node: the config's, else this machine's (plan on a cluster node)."""
    if config.resources.host_memory_gib is not None:
        return int(config.resources.host_memory_gib * 2**30)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
