"""Which record keys are measured (wall-clock, rates, memory) rather than decided by the
samples: a refactoring, a resume or another pipeline mode must leave every other key of a
seeded CPU run exactly as it was, and these change from one run to the next anyway.
scripts/compare_metrics.py and the tests that compare runs read this one rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Keys whose values are, or are derived from, wall-clock time or measured memory; and
#: ``handover_bytes``, which follows where the weight hand-overs fall, not the samples (a
#: resumed run hands its whole base over again, a disaggregated one at start-up).
MEASURED_KEYS = frozenset(
    {"time", "busy", "overlap", "overhead", "memory", "tps", "weight_transfer", "handover_bytes"}
)
#: Key endings of a duration, a rate or a memory figure (``iteration_time_s``,
#: ``val/time_s``, ``samples_per_s``, ``reward_fn/math/latency_p99_s``, ``host_peak_mib``).
MEASURED_SUFFIXES = ("_s", "_time", "per_s", "_tps", "_mib")


def is_measured(key: str) -> bool:
    """Whether a record key (one part of a dotted path) measures wall-clock or memory."""
    name = key.rsplit("/", 1)[-1]
    return name in MEASURED_KEYS or name.startswith("time") or name.endswith(MEASURED_SUFFIXES)


def outcomes(record: Mapping[str, Any]) -> dict[str, float]:
    """A record's top-level numbers the samples decide (no timing, rate or memory)."""
    return {
        k: v
        for k, v in record.items()
        if not is_measured(k) and isinstance(v, int | float) and not isinstance(v, bool)
    }
