"""What every worker stage reports besides its metrics: time, dock time and memory peaks.

Each stage call closes a memory window: the device's peak (allocator statistics on
GPU / NPU, the ledger on CPU) and the process's peak resident size since the last call,
both in MiB. Before the next window starts, the C allocator hands freed heap pages back
to the kernel (``host_memory`` says why), so a worker's resident size tracks what it
holds instead of climbing with every iteration's transients.
"""

from __future__ import annotations

import time

from backends.device import Device, host_memory
from mindrl.metrics.memory import MEMORY_KEYS
from mindrl.workers.timed_dock import TimedDockClient

__all__ = ["MEMORY_KEYS", "memory_window", "stage_report"]

MIB = 2**20


def stage_report(
    start: float, dock: TimedDockClient, device: Device | None = None
) -> dict[str, float]:
    """``busy_s`` since ``start``, ``dock_s`` spent in the dock, and the memory window."""
    return {
        "busy_s": time.perf_counter() - start,
        "dock_s": dock.take_seconds(),
        **memory_window(device),
    }


def memory_window(device: Device | None = None) -> dict[str, float]:
    """Peaks since the previous call (MiB); then freed heap is returned and both peaks reset.

    ``device`` None (a CPU-only worker) reports the host peak alone.
    """
    report = {"host_peak_mib": host_memory.peak_resident_bytes() / MIB}
    if device is not None:
        report["device_peak_mib"] = device.max_memory_allocated() / MIB
        device.reset_peak_memory_stats()
    host_memory.release_free_heap()
    host_memory.reset_peak_resident()
    return report
