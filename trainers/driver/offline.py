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

from typing import Any

import numpy as np

from mindrl.metrics.memory import MEMORY_RECORD_KEY
from trainers.driver.iteration import BatchSource, IterationRunner, Ledger, Sampled
from trainers.driver.state import RunState


class OfflinePairs(BatchSource):
    """An offline run's batch: the next G stored pairs put into the dock, nothing generated.
    The runner then scores them with the reference and trains (the plan has no advantage
    stage and no critic); the record is the pairs' own."""

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
        fields = {"prompt_ids": prompts, "response_ids": responses}
        slots = list(range(runner.G))
        runner.timed_dock(ledger, runner.run.dock.put, runner.indexes(slots), fields)
        tokens = float(sum(len(r) for r in responses))
        return Sampled(kept=slots, samples=len(responses), response_tokens=tokens)

    def record(
        self, metrics: dict[str, Any], sampled: Sampled, ledger: Ledger, seconds: float
    ) -> dict[str, Any]:
        """The updates' metrics, the pairs trained, their mean response length and the
        stages' times, overhead and memory (no rewards, KL coefficient or throughput)."""
        return {
            **metrics,
            "pairs": self.runner.G,
            "response_length_mean": sampled.response_tokens / sampled.samples,
            "iteration_time_s": seconds,
            "time": ledger.stages,
            "busy": ledger.busy,
            "overhead": ledger.overhead(seconds),
            MEMORY_RECORD_KEY: self.runner.memory_record(ledger),
        }


def offline_runner(run: RunState) -> IterationRunner:
    """The runner of an offline run: the stored pairs as its batches, the update claiming
    whole pairs per data-parallel rank."""
    return IterationRunner(run, OfflinePairs, pair_size=run.plan.group_size)
