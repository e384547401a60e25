"""Memory per role in every iteration's record: the largest peak any of its workers saw.

Workers close a memory window at the end of every stage call (``device_peak_mib``: the
device layer's peak, allocator statistics on GPU / NPU and the ledger on CPU;
``host_peak_mib``: the process's peak resident size). The driver keeps the largest of
each over a role's workers and stages, so ``record["memory"]["actor"]["host_peak_mib"]``
is the biggest actor process at its worst moment of the iteration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The memory keys of a worker's stage report (MiB), booked here rather than as metrics.
MEMORY_KEYS = frozenset({"device_peak_mib", "host_peak_mib"})
MEMORY_RECORD_KEY = "memory"  # record["memory"] = {role: {key: MiB}}

Peaks = dict[str, dict[str, float]]


def book_peaks(peaks: Peaks, name: str, reports: Iterable[Mapping[str, Any]]) -> None:
    """Raise ``peaks[name]`` to the largest of each memory key over ``reports``."""
    booked = peaks.setdefault(name, {})
    for report in reports:
        for key in MEMORY_KEYS & report.keys():
            booked[key] = max(booked.get(key, 0.0), float(report[key]))
    if not booked:
        del peaks[name]


def peaks_by_role(stage_peaks: Peaks, stage_roles: Mapping[str, str]) -> Peaks:
    """Fold per-stage peaks into per-role peaks (a stage with no known role keeps its name)."""
    roles: Peaks = {}
    for stage, peaks in stage_peaks.items():
        book_peaks(roles, stage_roles.get(stage, stage), [peaks])
    return roles


def format_memory(peaks: Mapping[str, Mapping[str, float]]) -> str:
    """``actor 4.61G (device 0.52G), reward 0.48G``: host peak, then device peak if any."""
    parts = []
    for role, peak in peaks.items():
        text = f"{role} {peak.get('host_peak_mib', 0.0) / 1024:.2f}G"
        if "device_peak_mib" in peak:
            text += f" (device {peak['device_peak_mib'] / 1024:.2f}G)"
        parts.append(text)
    return ", ".join(parts)
