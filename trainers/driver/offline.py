"""One iteration of an offline algorithm (DPO): stored pairs through the dock, no
generation (docs/architecture.md §3, "Offline pairs").

pairs -> ``ref_logp`` (reference ranks) -> ``update`` (actor ranks).

The driver puts each pair as two samples of one dock group: the prompt + chosen response
at the even index, the prompt + rejected response at the odd one after it. The update's
claim keeps that order and the driver cuts it into one run of whole pairs per
data-parallel rank, so each rank's rows alternate chosen / rejected and every (even)
micro-batch holds whole pairs, as the preference loss reads them. As in the online loop,
the driver only claims indexes; the workers move the payloads.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mindrl.metrics import mean_by_key
from mindrl.metrics.memory import MEMORY_RECORD_KEY
from trainers.driver.iteration import TIMING_KEYS, IterationRunner, Ledger
from trainers.driver.state import RunState


class OfflineIterationRunner(IterationRunner):
    """Runs iterations of a started offline run (see module docstring)."""

    def __init__(self, run: RunState) -> None:
        super().__init__(run)
        self.N = self.plan.group_size  # samples per pair, where the RL loop has responses

    def run_iteration(self, iteration: int) -> dict[str, Any]:
        """One iteration on the next G pairs; returns its metrics record."""
        start = time.perf_counter()
        ledger = Ledger()
        indexes = np.arange(self.G * self.plan.group_size, dtype=np.int64)
        tokens = self._put_pairs(ledger, indexes)
        self._score_stages(indexes, ledger)
        updates = self._stage(ledger, "update", self._update, indexes)
        self._timed_dock(ledger, self.run.dock.clear)
        seconds = time.perf_counter() - start
        return {
            **mean_by_key(updates, skip=TIMING_KEYS),
            "pairs": self.G,
            "response_length_mean": tokens / len(indexes),
            "iteration_time_s": seconds,
            "time": ledger.stages,
            "busy": ledger.busy,
            "overhead": ledger.overhead(seconds),
            MEMORY_RECORD_KEY: self._memory_record(ledger),
        }

    def _put_pairs(self, ledger: Ledger, indexes: np.ndarray) -> float:
        """Put the next G pairs (chosen at even indexes, rejected after them); returns the
        response tokens put."""
        batch = self.run.dataset.next_pairs()
        prompts, responses = [], []
        for prompt, chosen, rejected in zip(
            batch.prompt_ids, batch.chosen_ids, batch.rejected_ids, strict=True
        ):
            prompts += [np.asarray(prompt, dtype=np.int64)] * 2
            responses += [np.asarray(chosen, dtype=np.int64), np.asarray(rejected, dtype=np.int64)]
        records = np.repeat([self.record_of[u] for u in batch.uids], 2).astype(np.int64)
        fields = {"prompt_ids": prompts, "response_ids": responses, "record_id": records}
        self._timed_dock(ledger, self.run.dock.put, indexes, fields)
        return float(sum(len(r) for r in responses))

    def _by_dp_rank(self, stage: str, role: str, fields: list[str], n: int) -> list:
        """Whole pairs per data-parallel rank, in pair order (the online claim balances
        single samples by length, which could part a pair)."""
        (taken,) = self.run.dock.claim(stage, fields, n, whole_groups=True, timeout_s=self.timeout)
        parts = split_whole_pairs(taken, self.run.dp_size(role), self.plan.group_size)
        return self.run.per_worker(role, parts)


def split_whole_pairs(indexes: np.ndarray, parts: int, pair_size: int = 2) -> list[np.ndarray]:
    """``indexes`` (pairs adjacent) as ``parts`` contiguous runs of whole pairs, in order.

    Raises:
        ValueError: the pairs do not split evenly (the config check refuses such sizes).
    """
    pairs = len(indexes) // pair_size
    if len(indexes) % pair_size or pairs % parts:
        raise ValueError(f"{len(indexes)} samples are not {parts} equal runs of whole pairs")
    return list(np.split(np.asarray(indexes, dtype=np.int64), parts))
