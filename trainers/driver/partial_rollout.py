"""Iterations with partial rollout (issue 15, ``rollout.partial_rollout_budget``).

Each iteration generates at most ``budget`` new tokens per response, so the longest
responses no longer hold the batch. The dock keeps ``G`` groups in flight: the groups not
trained yet, and fresh prompts in the slots the last update freed. A response still
unfinished when its budget runs out is paused: its tokens and their log-probs stay in the
dock (``paused_ids`` / ``paused_logprob``, mindrl/workers/generation.py) and the next
iteration continues it from exactly that prefix with the weights of that iteration. A
group trains once all its responses finished; the scoring stages claim whole groups
only, so a group with a paused response waits in the dock, its finished responses too.

Every token's ``rollout_logprob`` is the one of the weights that sampled it, so a response
continued across updates mixes policies token by token and the loss corrects each token
for its lag (trainers/core.py, ``behaviour_weights``; the update's behaviour log-probs are
the rollout's whenever partial rollout is on, mindrl/config/placement.py,
``tokens_may_lag``).

With a budget no response reaches (``>= rollout.max_response_length``) nothing pauses and
a run trains exactly as without partial rollout: the same prompts, calls and seeds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mindrl.data import PromptBatch
from mindrl.workers.generation import PartialRollout
from trainers.driver.iteration import IterationRunner, Ledger, Sampled
from trainers.driver.setup import RunState


class PartialRolloutRunner(IterationRunner):
    """Runs iterations whose generation stops at a token budget (module docstring)."""

    whole_group_claims = True

    def __init__(self, run: RunState) -> None:
        super().__init__(run)
        self.budget: int = self.config.rollout.partial_rollout_budget
        #: Group slots whose prompts are in the dock and not trained yet, ascending.
        self.pending: list[int] = []
        #: Sample indexes whose response is paused in the dock.
        self.paused = np.zeros(0, dtype=np.int64)
        self.prompt_length: dict[int, int] = {}  # slot -> its prompt's tokens

    def _sample(self, iteration: int, ledger: Ledger) -> Sampled:
        """Fill the free slots with prompts, generate one budget's worth for every response
        that needs it, score the groups that finished."""
        sampled = Sampled(draws=1)
        fresh = [slot for slot in range(self.G) if slot not in self.pending]
        if fresh:
            batch = self.run.dataset.next_batch(len(fresh))
            self._put_prompts(ledger, self._indexes(fresh), batch, sampled)
            self._remember_prompts(fresh, batch)
            self.pending = sorted(self.pending + fresh)
        reports = self._stage(ledger, "rollout", self._generate, self._indexes(fresh), iteration, 0)
        self.paused = np.unique(np.concatenate([r["paused"] for r in reports]))
        waiting = set((self.paused // self.N).tolist())
        sampled.kept = [slot for slot in self.pending if slot not in waiting]
        self.pending = [slot for slot in self.pending if slot in waiting]
        if sampled.kept:
            indexes = self._indexes(sampled.kept)
            scored = self._stage(ledger, "reward", self._score_stage, "reward", indexes)
            sampled.samples = len(indexes)
            sampled.reward_sum = sum(r["reward_sum"] for r in scored)
            sampled.response_tokens = sum(r["response_tokens"] for r in scored)
        # Per trained sample, as the record's means are: prompts put now may train later.
        sampled.prompt_tokens = float(sum(self.prompt_length.pop(s) for s in sampled.kept) * self.N)
        return sampled

    def _remember_prompts(self, slots: list[int], batch: PromptBatch) -> None:
        self.prompt_length |= {
            slot: len(ids) for slot, ids in zip(slots, batch.prompt_ids, strict=True)
        }

    def _generation_args(self, indexes: np.ndarray, iteration: int, draw: int) -> list[tuple]:
        """The fresh prompts as the rollout stage splits them, plus the paused responses
        dealt round-robin over the generation ranks; each rank's ``generate`` arguments."""
        ranks = len(set(self.run.gen_dp_ranks))
        if len(indexes):
            parts = self._claim_prompts(len(indexes))
        else:
            parts = [np.zeros(0, dtype=np.int64)] * ranks
        parts = [np.sort(np.concatenate([p, self.paused[r::ranks]])) for r, p in enumerate(parts)]
        partial = PartialRollout(self.budget, self.config.rollout.max_response_length, self.paused)
        params = self._sampling_params(iteration, draw)
        return [(parts[r], params, partial) for r in self.run.gen_dp_ranks]

    def _release(self, ledger: Ledger, trained: np.ndarray) -> None:
        """Free only the trained groups' slots: the waiting groups stay in the dock."""
        if len(trained):
            self._timed_dock(ledger, self.run.dock.recycle, trained)

    def _record(
        self, metrics: dict[str, Any], sampled: Sampled, ledger: Ledger, seconds: float
    ) -> dict[str, Any]:
        return super()._record(metrics, sampled, ledger, seconds) | {
            "trained_groups": len(sampled.kept),
            "paused_responses": len(self.paused),
        }
