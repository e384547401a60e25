"""Host memory of a worker process: freed heap handed back, peak windows, stage reports."""

from __future__ import annotations

import time

import torch

from backends.device import get_device, host_memory
from mindrl.workers.stage_report import MEMORY_KEYS, memory_window, stage_report

MIB = 2**20


def _fragment_heap(count: int = 4096) -> torch.Tensor:
    """Free ``count`` 64 KiB tensors (below any mmap threshold, so they sit in the heap)
    except the last, which pins the heap's top so glibc cannot trim it on its own."""
    tensors = [torch.ones(16384) for _ in range(count)]
    return tensors[-1]


def test_freed_heap_chunks_stay_resident_until_released():
    before = host_memory.resident_bytes()
    pin = _fragment_heap()
    retained = host_memory.resident_bytes() - before
    assert host_memory.release_free_heap()
    after_release = host_memory.resident_bytes() - before
    assert retained > 200 * MIB  # 256 MiB freed, yet still resident
    assert after_release < 32 * MIB
    del pin


def test_peak_resident_covers_a_transient_and_resets_to_the_current_size():
    host_memory.release_free_heap()
    host_memory.reset_peak_resident()
    start = host_memory.resident_bytes()
    transient = torch.ones(128 * MIB // 4)
    del transient
    assert host_memory.peak_resident_bytes() - start > 120 * MIB
    host_memory.reset_peak_resident()
    assert host_memory.peak_resident_bytes() - host_memory.resident_bytes() < 16 * MIB


def test_memory_window_reports_the_ledger_peak_and_starts_a_new_window():
    device = get_device("cpu")
    memory_window(device)
    buffer = torch.empty(32 * MIB // 4)
    device.track(buffer)
    del buffer
    first = memory_window(device)
    second = memory_window(device)
    assert set(first) == MEMORY_KEYS
    assert first["device_peak_mib"] >= 32
    assert second["device_peak_mib"] < 32
    assert first["host_peak_mib"] > 0


def test_a_cpu_only_worker_reports_its_host_peak_alone():
    class Dock:
        def take_seconds(self) -> float:
            return 0.25

    report = stage_report(time.perf_counter() - 1.0, Dock())
    assert report["busy_s"] >= 1.0
    assert report["dock_s"] == 0.25
    assert set(report) - {"busy_s", "dock_s"} == {"host_peak_mib"}
