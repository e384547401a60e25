"""Reductions of metric records: micro-batches into a step, steps and workers into an iteration."""

from __future__ import annotations

from typing import Any


def mean_by_key(
    records: list[dict[str, Any]],
    additive: frozenset = frozenset(),
    skip: frozenset = frozenset(),
) -> dict[str, float]:
    """Each key averaged over the records that have it (summed if in ``additive``).

    Keys are the union over records: a micro-batch, a step or a worker may lack some
    (with pipeline parallelism only last-stage ranks compute the loss metrics).
    """
    keys = {k for r in records for k in r} - skip
    combined = {}
    for key in sorted(keys):
        values = [float(r[key]) for r in records if key in r]
        combined[key] = sum(values) if key in additive else sum(values) / len(values)
    return combined
