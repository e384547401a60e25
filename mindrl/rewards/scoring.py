"""Scoring a batch: every sample through its domain's route, outcomes combined, failures
named (docs/guide/rewards.md).

A sample's reward is the weighted sum of the scores of its route's functions that did not
abstain. It *failed* when one of them ended ``error``, ``timeout`` or ``invalid``, or when
every one abstained; a failed sample's reward is 0 and the run's failure policy
(``reward.on_failure``) decides what becomes of it (the driver's: drop its group, train it
at 0, or stop). The report says, per function, how its calls ended and how long they took,
and per domain the reward sum, so the record can show both.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mindrl.rewards.functions import LoadedFunction, first_line, load_function
from mindrl.rewards.inputs import ABSTAIN, ERROR, FAILURES, RewardInput, RewardOutcome, outcome_of
from mindrl.rewards.pool import Job, RewardPool
from mindrl.rewards.routing import RewardSpec, Route

#: The pseudo-function a failure names when every function of a route abstained.
EVERY_FUNCTION = "every function"
#: Failures a report describes in full (the driver names one in its stop line).
REPORTED_FAILURES = 3


@dataclass(frozen=True)
class Failure:
    """Why one sample failed: the function, its status, the prompt and the first line of
    the error (what the stop line and the logs show)."""

    index: int
    uid: str
    function: str
    status: str
    error: str

    def line(self) -> str:
        return f"reward function {self.function!r} {self.status} on {self.uid}: {self.error}"


@dataclass
class FunctionStats:
    """How one function's calls ended over some samples."""

    routed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)

    def book(self, outcome: RewardOutcome) -> None:
        self.routed += 1
        self.statuses[outcome.status] = self.statuses.get(outcome.status, 0) + 1
        self.latencies_s.append(outcome.latency_s)

    def as_report(self) -> dict[str, Any]:
        return {"routed": self.routed, "statuses": self.statuses, "latency_s": self.latencies_s}


@dataclass
class ScoredBatch:
    """The rewards of a batch and what the record and the failure policy read of it.

    Attributes:
        rewards: per sample, float32 (0 where the sample failed).
        failed: per sample, whether it failed.
        passed: per sample, whether every function that scored it gave full credit (1.0 or
            more): what validation's pass@k counts.
        failures: the first failure of each failed sample, in sample order.
        functions: each function's call outcomes over the batch.
    """

    rewards: np.ndarray
    failed: np.ndarray
    passed: np.ndarray
    failures: list[Failure]
    functions: dict[str, FunctionStats]


class RewardScorer:
    """Scores batches of :class:`RewardInput` as ``spec`` routes them.

    The verifiers (``spec.inline``) run in this process, as they always did; every other
    function in a :class:`RewardPool` of ``processes`` processes (synchronous ones) or on
    its event loop (``async`` ones), under its timeout. Functions are loaded, and so
    checked, when the scorer is made: a worker with a broken function fails at start-up.
    """

    def __init__(self, spec: RewardSpec, processes: int) -> None:
        self.spec = spec
        self.functions = {name: load_function(s) for name, s in spec.functions.items()}
        pooled = [s.target for s in spec.pooled() if not self.functions[s.name].is_async]
        self.pool = RewardPool(processes, preload=pooled) if spec.pooled() else None

    def score(self, inputs: Sequence[RewardInput], groups: np.ndarray | None = None) -> ScoredBatch:
        """Every sample's reward. ``groups``: each sample's group id (needed where a route
        has a ``group: true`` function: it is called once per group of a domain)."""
        routes = [self.spec.route(inp.domain) for inp in inputs]
        outcomes = self._outcomes(inputs, routes, groups)
        return self._combined(inputs, routes, outcomes)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    # ---- calls ------------------------------------------------------------------------------
    def _outcomes(
        self,
        inputs: Sequence[RewardInput],
        routes: list[tuple[Route, ...] | None],
        groups: np.ndarray | None,
    ) -> dict[tuple[int, str], RewardOutcome]:
        """(sample, function) -> the outcome of that function's call for that sample."""
        outcomes: dict[tuple[int, str], RewardOutcome] = {}
        jobs: list[Job] = []
        owners: list[list[int]] = []  # each job's samples, in its inputs' order
        grouped: dict[tuple[str, int], list[int]] = {}
        for i, (inp, route) in enumerate(zip(inputs, routes, strict=True)):
            for name in dict.fromkeys(r.function for r in route or ()):
                function = self.functions[name]
                if name in self.spec.inline:
                    outcomes[i, name] = _call_inline(function, inp)
                elif function.group:
                    group = -1 if groups is None else int(groups[i])
                    grouped.setdefault((name, group), []).append(i)
                else:
                    jobs.append(Job(function, inp))
                    owners.append([i])
        for (name, _), members in grouped.items():
            jobs.append(Job(self.functions[name], [inputs[i] for i in members]))
            owners.append(members)
        if jobs:
            assert self.pool is not None, "a pooled function without a pool"
            for job, members, ended in zip(jobs, owners, self.pool.run(jobs), strict=True):
                name = job.function.name
                for i, outcome in zip(members, ended, strict=True):
                    outcomes[i, name] = outcome
        return outcomes

    # ---- combining ------------------------------------------------------------------------
    def _combined(
        self,
        inputs: Sequence[RewardInput],
        routes: list[tuple[Route, ...] | None],
        outcomes: dict[tuple[int, str], RewardOutcome],
    ) -> ScoredBatch:
        rewards = np.zeros(len(inputs), dtype=np.float32)
        failed = np.zeros(len(inputs), dtype=bool)
        passed = np.zeros(len(inputs), dtype=bool)
        failures: list[Failure] = []
        stats = {name: FunctionStats() for name in self.functions}
        for i, (inp, route) in enumerate(zip(inputs, routes, strict=True)):
            for name in dict.fromkeys(r.function for r in route or ()):
                stats[name].book(outcomes[i, name])
            score, failure = _sample_reward(i, inp, route, outcomes)
            if failure is None:
                rewards[i] = score
                passed[i] = _full_credit(i, route, outcomes)
            else:
                failed[i] = True
                failures.append(failure)
        return ScoredBatch(rewards, failed, passed, failures, stats)


def _call_inline(function: LoadedFunction, inp: RewardInput) -> RewardOutcome:
    start = time.perf_counter()
    try:
        answer = function(inp)
    except Exception as error:  # a function's failure is the sample's status, not the run's
        latency = time.perf_counter() - start
        return RewardOutcome(
            ERROR, error=f"{function.name} raised {first_line(error)}", latency_s=latency
        )
    return outcome_of(answer, function.name, time.perf_counter() - start)


def _sample_reward(
    index: int,
    inp: RewardInput,
    route: tuple[Route, ...] | None,
    outcomes: dict[tuple[int, str], RewardOutcome],
) -> tuple[float, Failure | None]:
    """A sample's weighted sum over its route, or its first failure."""
    if route is None:
        error = f"domain {inp.domain!r} has no route in reward.routes"
        return 0.0, Failure(index, inp.uid, EVERY_FUNCTION, ERROR, error)
    if not route:  # no rule at all (reward.verifiers: [] beside a reward model)
        return 0.0, None
    total, scored = 0, False
    for entry in route:  # in route order: the sum is the verifiers' sum, bit for bit
        outcome = outcomes[index, entry.function]
        if outcome.status in FAILURES:
            return 0.0, Failure(index, inp.uid, entry.function, outcome.status, outcome.error)
        if outcome.status != ABSTAIN:
            total += entry.weight * outcome.score
            scored = True
    if not scored:
        names = ", ".join(dict.fromkeys(r.function for r in route))
        error = f"{names} abstained on a sample of domain {inp.domain!r}"
        return 0.0, Failure(index, inp.uid, EVERY_FUNCTION, ABSTAIN, error)
    return float(total), None


def _full_credit(
    index: int, route: tuple[Route, ...] | None, outcomes: dict[tuple[int, str], RewardOutcome]
) -> bool:
    scored = [outcomes[index, r.function] for r in route or ()]
    scored = [o for o in scored if o.status != ABSTAIN]
    return bool(scored) and all(o.score >= 1.0 for o in scored)
