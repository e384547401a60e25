"""Validation (``data.val_every``): held-out prompts through the rollout and the reward
workers, beside the iteration, never through the dock.

Every ``val_every`` iterations and after the last one, the actor ranks reshard the
current weights into their generation engines and answer ``data.val_source``'s prompts
(``val_n`` responses each at ``val_temperature``, the rollout's top-p / top-k and length
otherwise), and the reward workers score them with the run's verifiers. Prompts and
responses travel as call arguments and results, not dock fields, so no stage can claim
and train on them. The training data position is untouched (the held-out prompts are
their own list) and so are its random streams: sampling is seeded per call from a
stream of its own, and both engines seed a call without touching the process's RNG
(the hf engine forks torch's, vLLM seeds each request). On CPU with a fixed seed a run
with validation trains exactly like one without (tests/trainers/test_validation.py).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.generation import SamplingParams
from mindrl.data import PromptDataset, PromptRecord, load_tokenizer
from mindrl.data.run_prompts import validation_records
from mindrl.metrics.validation import VAL_PREFIX, validation_metrics
from trainers.driver.setup import RunSetupError
from trainers.driver.state import RunState

#: The last word of a validation seed's SeedSequence entropy; training's words there are
#: its draw counts (0, 1, ...), so the two streams never meet.
VALIDATION_STREAM = 2**32 - 1


@dataclass(frozen=True)
class HeldOut:
    """The validation prompts, tokenized like the training prompts, and their records (the
    rewards score a response with its record, as in training)."""

    prompt_ids: list[list[int]]
    records: list[PromptRecord]


class Validator:
    """Runs validation after the iterations it is due (see the module docstring)."""

    def __init__(self, run: RunState, held_out: HeldOut | None) -> None:
        self.run, self.held_out = run, held_out
        self.data = run.config.data

    @classmethod
    def for_run(cls, run: RunState) -> Validator:
        """The run's validator (a no-op with ``data.val_every: 0``); reads and tokenizes
        the held-out prompts now, so a bad source stops the run before any worker starts.

        Raises:
            RunSetupError: an unreadable or empty source, or a prompt that is too long.
        """
        config = run.config
        if not config.data.val_every:
            return cls(run, None)
        try:
            records = validation_records(config)
            if not records:
                raise ValueError("holds no prompts")
            prompts = PromptDataset(
                records,
                load_tokenizer(config.model.tokenizer),
                batch_size=len(records),
                shuffle=False,
                max_prompt_length=config.rollout.max_prompt_length,
                chat=config.data.chat_template,
            )
        except ValueError as exc:
            raise RunSetupError(f"data.val_source {config.data.val_source!r}: {exc}") from None
        return cls(run, HeldOut(prompts.prompt_ids, records))

    def after(self, iteration: int) -> dict[str, Any]:
        """``val/...`` metrics when validation is due after ``iteration``, else nothing."""
        every = self.data.val_every
        last = iteration + 1 == self.run.config.iterations
        if self.held_out is None or not ((iteration + 1) % every == 0 or last):
            return {}
        return self.validate(iteration)

    def validate(self, iteration: int) -> dict[str, Any]:
        """Generate, score and summarise the held-out prompts with the current weights."""
        start = time.perf_counter()
        responses = self._generate(self._params(iteration))
        rewards, passed = self._score(responses)
        metrics = validation_metrics(rewards, passed, self.data.val_n)
        lengths = [len(r) for r in responses]
        metrics[f"{VAL_PREFIX}response_length_mean"] = sum(lengths) / len(lengths)
        metrics[f"{VAL_PREFIX}time_s"] = time.perf_counter() - start
        return metrics

    def _params(self, iteration: int) -> SamplingParams:
        rollout = self.run.config.rollout
        entropy = [self.run.config.seed, iteration, VALIDATION_STREAM]
        return SamplingParams(
            n=self.data.val_n,
            temperature=self.data.val_temperature,
            top_p=rollout.top_p,
            top_k=max(rollout.top_k, 0),
            max_tokens=rollout.max_response_length,
            stop_token_ids=(self.run.dataset_eos,),
            seed=int(np.random.SeedSequence(entropy).generate_state(1)[0]),
        )

    def _generate(self, params: SamplingParams) -> list[list[int]]:
        """Every response, prompt-major: one contiguous share of the prompts per
        generation replica; its TP peers sample the same, the first one's are kept."""
        run = self.run
        replicas = sorted(set(run.gen_dp_ranks))
        shares = _shares(self.held_out.prompt_ids, len(replicas))
        args = [(shares[replicas.index(d)], params) for d in run.gen_dp_ranks]
        group = run.groups[run.plan.stage("rollout").role]  # the ranks that generate
        results = group.call_each(
            "generate_held_out", args, stage="validation", timeout_s=run.plan.stage_deadline_s
        )
        first_rank = [run.gen_dp_ranks.index(d) for d in replicas]
        return [response for rank in first_rank for response in results[rank]]

    def _score(self, responses: list[list[int]]) -> tuple[list[float], list[bool] | None]:
        n, group = self.data.val_n, self.run.groups["reward"]
        prompts = [p for p in self.held_out.prompt_ids for _ in range(n)]
        records = [r for r in self.held_out.records for _ in range(n)]
        args = list(
            zip(*(_shares(rows, group.size) for rows in (prompts, responses, records)), strict=True)
        )
        results = group.call_each(
            "score_held_out", args, stage="validation", timeout_s=self.run.plan.stage_deadline_s
        )
        rewards = [reward for part, _ in results for reward in part]
        if any(passed is None for _, passed in results):
            return rewards, None
        return rewards, [p for _, passed in results for p in passed]


def _shares(rows: list, parts: int) -> list[list]:
    """``rows`` in ``parts`` contiguous, near-equal shares, in order."""
    bounds = np.linspace(0, len(rows), parts + 1).round().astype(int).tolist()
    return [rows[a:b] for a, b in itertools.pairwise(bounds)]
