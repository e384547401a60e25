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
from trainers.driver.iteration import (
    TIMING_KEYS,
    BatchSource,
    IterationRunner,
    Ledger,
    Sampled,
)
from trainers.driver.state import RunState


class OfflinePairs(BatchSource):
    """An offline run's batch: the next G stored pairs put into the dock, nothing generated."""

    def draw(self, iteration: int, ledger: Ledger) -> Sampled:
        """Put the next G pairs (chosen at even indexes, rejected after them)."""
        runner = self.runner
        batch = runner.run.dataset.next_pairs()
        prompts, responses = [], []
        for prompt, chosen, rejected in zip(
            batch.prompt_ids, batch.chosen_ids, batch.rejected_ids, strict=True
        ):
            prompts += [np.asarray(prompt, dtype=np.int64)] * 2
            responses += [np.asarray(chosen, dtype=np.int64), np.asarray(rejected, dtype=np.int64)]
        records = np.repeat([runner.record_of[u] for u in batch.uids], 2).astype(np.int64)
        fields = {"prompt_ids": prompts, "response_ids": responses, "record_id": records}
        slots = list(range(runner.G))
        runner.timed_dock(ledger, runner.run.dock.put, runner.indexes(slots), fields)
        tokens = float(sum(len(r) for r in responses))
        return Sampled(kept=slots, samples=len(responses), response_tokens=tokens)


class OfflineIterationRunner(IterationRunner):
    """Runs iterations of a started offline run (see module docstring): the stored pairs
    as the batch, and no advantages, critic or KL controller, so its own iteration."""

    def __init__(self, run: RunState) -> None:
        super().__init__(run, OfflinePairs, pair_size=run.plan.group_size)

    def run_iteration(self, iteration: int) -> dict[str, Any]:
        """One iteration on the next G pairs; returns its metrics record."""
        start = time.perf_counter()
        ledger = Ledger()
        sampled = self.source.draw(iteration, ledger)
        indexes = self.indexes(sampled.kept)
        self._score_stages(indexes, ledger)
        updates = self.stage(ledger, "update", self._update, indexes)
        self.source.release(ledger, indexes)
        seconds = time.perf_counter() - start
        return {
            **mean_by_key(updates, skip=TIMING_KEYS),
            "pairs": self.G,
            "response_length_mean": sampled.response_tokens / len(indexes),
            "iteration_time_s": seconds,
            "time": ledger.stages,
            "busy": ledger.busy,
            "overhead": ledger.overhead(seconds),
            MEMORY_RECORD_KEY: self._memory_record(ledger),
        }
