"""What a reward stage reports, and the record keys the driver makes of an iteration's
reports.

A worker's report (:func:`scoring_report`) is plain data: per domain the reward sum and
count of the samples that did not fail, per function how its calls ended and their
latencies, the failed samples' indexes and the first few failures in full. The driver's
:class:`RewardBook` adds an iteration's reports up into flat record keys:
``reward/<domain>`` (the domain's mean reward), ``reward_fn/<name>/<status>_rate`` over the
samples routed to the function, ``reward_fn/<name>/latency_p50_s`` and ``..._p99_s``, and
``reward/failed_share`` (the share of the scored samples whose reward failed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mindrl.metrics.rewards import DOMAIN_PREFIX, DROPPED_GROUPS, FAILED_SHARE, FUNCTION_PREFIX
from mindrl.rewards.inputs import ABSTAIN, ERROR, INVALID, TIMEOUT, RewardInput
from mindrl.rewards.scoring import REPORTED_FAILURES, Failure, ScoredBatch

#: The statuses whose rate the record shows per function (``ok`` is the rest).
RATED_STATUSES = (ERROR, TIMEOUT, ABSTAIN, INVALID)


def scoring_report(
    batch: ScoredBatch, indexes: np.ndarray, inputs: Sequence[RewardInput]
) -> dict[str, Any]:
    """The reward-specific part of a reward stage's report for the samples ``indexes``."""
    domains: dict[str, list[float]] = {}
    for inp, reward, failed in zip(inputs, batch.rewards.tolist(), batch.failed, strict=True):
        if not failed:
            total = domains.setdefault(inp.domain, [0.0, 0])
            total[0] += reward
            total[1] += 1
    failures = [
        dataclasses.asdict(dataclasses.replace(f, index=int(indexes[f.index])))
        for f in batch.failures[:REPORTED_FAILURES]
    ]
    return {
        "domain_rewards": domains,
        "reward_fn": {name: stats.as_report() for name, stats in batch.functions.items()},
        "failed": np.asarray(indexes)[batch.failed],
        "failures": failures,
    }


@dataclass
class RewardBook:
    """One iteration's reward reports, added up."""

    scored: int = 0
    domains: dict[str, list[float]] = field(default_factory=dict)
    routed: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failed: list[np.ndarray] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    dropped_groups: int = 0  # booked by the driver, which drops them

    def add(self, reports: Iterable[dict[str, Any]]) -> None:
        """Book the reward stage's reports (a report without reward figures, an
        environment's, adds its sample count only)."""
        for report in reports:
            self.scored += int(report.get("count", 0))
            for domain, (total, count) in report.get("domain_rewards", {}).items():
                mine = self.domains.setdefault(domain, [0.0, 0])
                mine[0] += total
                mine[1] += count
            for name, stats in report.get("reward_fn", {}).items():
                self.routed[name] = self.routed.get(name, 0) + stats["routed"]
                mine = self.statuses.setdefault(name, {})
                for status, count in stats["statuses"].items():
                    mine[status] = mine.get(status, 0) + count
                self.latencies.setdefault(name, []).extend(stats["latency_s"])
            if "failed" in report:
                self.failed.append(np.asarray(report["failed"], dtype=np.int64))
            self.failures += [Failure(**f) for f in report.get("failures", [])]

    @property
    def failed_indexes(self) -> np.ndarray:
        """Every sample whose reward failed, as booked."""
        return np.concatenate(self.failed) if self.failed else np.zeros(0, dtype=np.int64)

    def metrics(self) -> dict[str, float]:
        """The record's reward keys (none before anything was booked)."""
        record: dict[str, float] = {}
        for domain, (total, count) in sorted(self.domains.items()):
            if count:
                record[f"{DOMAIN_PREFIX}{domain}"] = total / count
        for name, routed in sorted(self.routed.items()):
            statuses = self.statuses.get(name, {})
            for status in RATED_STATUSES:
                rate = statuses.get(status, 0) / routed if routed else 0.0
                record[f"{FUNCTION_PREFIX}{name}/{status}_rate"] = rate
            latencies = self.latencies.get(name) or [0.0]
            p50, p99 = np.percentile(latencies, [50, 99]).tolist()
            record[f"{FUNCTION_PREFIX}{name}/latency_p50_s"] = p50
            record[f"{FUNCTION_PREFIX}{name}/latency_p99_s"] = p99
        if self.routed:
            record[FAILED_SHARE] = len(self.failed_indexes) / max(self.scored, 1)
            record[DROPPED_GROUPS] = float(self.dropped_groups)
        return record


class RewardsFailed(RuntimeError):
    """The run stops on a reward failure (``reward.on_failure: stop``, or more failed than
    ``reward.max_failure_fraction`` allows); the message is the one line it ends with."""


#: Iterations ``reward.max_failure_fraction`` looks back over.
FAILURE_WINDOW = 20


@dataclass
class FailureWindow:
    """The run's reward failures over the last :data:`FAILURE_WINDOW` iterations, against
    its policy: ``stop`` ends the run on the first one, and any policy ends it once more
    than ``max_fraction`` of the window's samples failed (a function that fails that
    often is broken, and training on what is left would hide it)."""

    on_failure: str
    max_fraction: float
    iterations: list[tuple[int, int]] = field(default_factory=list)  # (failed, scored)

    def check(self, book: RewardBook) -> None:
        """Book one iteration's reward figures.

        Raises:
            RewardsFailed: the policy stops the run; the line names a failed sample's
                function, status, prompt and error.
        """
        failed = len(book.failed_indexes)
        self.iterations = [*self.iterations, (failed, book.scored)][-FAILURE_WINDOW:]
        if not failed:
            return
        latest = book.failures[0].line() if book.failures else "no detail reported"
        if self.on_failure == "stop":
            raise RewardsFailed(f"{latest} (reward.on_failure: stop)")
        total_failed = sum(f for f, _ in self.iterations)
        total = max(sum(s for _, s in self.iterations), 1)
        if total_failed / total > self.max_fraction:
            raise RewardsFailed(
                f"{total_failed} of the {total} samples of the last {len(self.iterations)} "
                f"iteration(s) failed their reward, more than reward.max_failure_fraction="
                f"{self.max_fraction}; the latest: {latest}"
            )
