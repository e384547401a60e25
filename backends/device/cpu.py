"""CPU device: gloo, Ray ``CPU`` resources, and a ledger for "device" memory."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from backends.device.base import Device
from backends.device.ledger import MemoryLedger


class CpuDevice(Device):
    """The CPU as a device. Streams and events are no-ops; memory comes from a ledger.

    Memory statistics are those of :class:`~backends.device.ledger.MemoryLedger`: the
    bytes of tensors mindrl declared device-resident with :meth:`track`, because on a
    CPU the process RSS mixes "device" and host memory.
    """

    name = "cpu"
    torch_device_type = "cpu"
    dist_backend = "gloo"
    ray_resource = "CPU"
    visible_devices_env = None
    shares_host_memory = True

    def __init__(self) -> None:
        self.ledger = MemoryLedger()

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def device_count(self) -> int:
        return 1

    def device(self, index: int | None = None) -> torch.device:
        return torch.device("cpu")

    def current_index(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        """Nothing to select on CPU."""

    def synchronize(self) -> None:
        """CPU ops are synchronous."""

    def new_stream(self) -> Any:
        return None

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def new_event(self) -> Any:
        return _CpuEvent()

    def pinned_empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        # Page-locking needs an accelerator runtime; a CPU-only torch refuses pin_memory.
        return torch.empty(shape, dtype=dtype)

    def memory_allocated(self) -> int:
        return self.ledger.allocated()

    def max_memory_allocated(self) -> int:
        return self.ledger.peak()

    def reset_peak_memory_stats(self) -> None:
        self.ledger.reset_peak()

    def use_host_threads(self, devices_per_node: int) -> int:
        """A CPU "device" is a share of the node's cores: ``cores // devices_per_node``
        threads (at least 1). Ray starts a 1-CPU worker with one thread (OMP_NUM_THREADS=1),
        which left all but ``devices_per_node`` cores idle: one rank on a 2-core node
        computed on one core. Roles collocated on a device take turns, so they share its
        threads rather than split them."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = max(1, (cores or 1) // max(1, devices_per_node))
        torch.set_num_threads(threads)
        return threads

    def total_memory(self) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def track(self, *tensors: torch.Tensor) -> None:
        self.ledger.track(*tensors)


class _CpuEvent:
    """Event stand-in: CPU work is complete when the call returns."""

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True
