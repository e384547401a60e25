"""Optimizer steps of the actor and the critic over one iteration's samples.

The loss maths comes from the ``Algorithm`` object the trainer handed to the worker
(``actor_loss`` / ``critic_loss``); this module only slices the samples into epochs,
mini-batches and micro-batches and reads the policy's outputs at the response tokens.
Each micro-batch loss is already normalised by the *global* mini-batch token and
sequence counts (DESIGN.md §5), so micro-batching and DP never change the step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from mindrl.metrics.reduce import mean_by_key
from mindrl.workers.sequences import to_response_aligned

Rows = dict[str, torch.Tensor]


def minibatch_slices(total: int, parts: int) -> list[slice]:
    """``parts`` contiguous slices covering ``total`` rows as evenly as possible."""
    bounds = [round(i * total / parts) for i in range(parts + 1)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds) if b > a]


#: Metrics that are each micro-batch's share of the step's loss (normalised by the
#: global counts): they add up over micro-batches instead of averaging.
ADDITIVE = frozenset({"pg_loss"})


def _run_steps(worker: Any, rows: Rows, num_minibatches: int, make_loss: Callable) -> dict:
    """Epochs x mini-batches of ``engine.train_step``; metrics averaged over all steps."""
    engine = worker.engine
    steps = []
    for _ in range(worker.section.ppo_epochs):
        for part in minibatch_slices(rows["input_ids"].shape[0], num_minibatches):
            micro = worker._micro_batches({k: v[part] for k, v in rows.items()})
            num_tokens = engine.global_token_count(micro)
            num_seqs = (part.stop - part.start) * engine.data_parallel_size()
            collected: list[dict[str, torch.Tensor]] = []
            loss_fn = make_loss(num_tokens, num_seqs, collected)
            stats = engine.train_step(micro, loss_fn, with_entropy=worker.role == "actor")
            steps.append({**stats, **mean_by_key(collected, ADDITIVE)})
    return mean_by_key(steps)


def actor_update(worker: Any, rows: Rows, num_minibatches: int) -> dict[str, float]:
    """Clipped policy-gradient steps with ``worker.algorithm.actor_loss``."""

    def make_loss(num_tokens: float, num_seqs: int, collected: list) -> Callable:
        def loss_fn(outputs: Rows, batch: Rows) -> torch.Tensor:
            width, start = batch["response_mask"].shape[1], batch["response_start"]
            logprob = to_response_aligned(outputs["logprobs"], start, width)
            entropy = to_response_aligned(outputs["entropy"], start, width)
            loss, metrics = worker.algorithm.actor_loss(
                logprob, batch, worker.options, num_tokens=num_tokens, entropy=entropy,
                num_seqs=num_seqs,
            )  # fmt: skip
            if "rollout_logprob" in batch:
                metrics["rollout_logprob_diff"] = rollout_mismatch(logprob, batch)
            collected.append(metrics)
            return loss

        return loss_fn

    return _run_steps(worker, rows, num_minibatches, make_loss)


def rollout_mismatch(logprob: torch.Tensor, batch: Rows) -> torch.Tensor:
    """Mean |training - generation| log-prob of the response tokens (before the step).

    Near 0 when the generation engine got exactly the training weights; a jump means
    the weight hand-over (resharder -> engine) is broken or the engines disagree.
    """
    mask = batch["response_mask"]
    diff = (logprob.detach() - batch["rollout_logprob"]).abs() * mask
    return diff.sum() / mask.sum().clamp(min=1)


def critic_update(worker: Any, rows: Rows, num_minibatches: int) -> dict[str, float]:
    """Clipped value-regression steps with ``worker.algorithm.critic_loss``."""
    rows = {**rows, "old_values": rows["values"]}

    def make_loss(num_tokens: float, num_seqs: int, collected: list) -> Callable:
        def loss_fn(outputs: Rows, batch: Rows) -> torch.Tensor:
            width = batch["response_mask"].shape[1]
            # Value of the state before response token j: position start + j - 1.
            values = to_response_aligned(outputs["values"], batch["response_start"] - 1, width)
            loss, metrics = worker.algorithm.critic_loss(
                values, batch, worker.options, num_tokens=num_tokens, num_seqs=num_seqs
            )
            collected.append(metrics)
            return loss

        return loss_fn

    metrics = _run_steps(worker, rows, num_minibatches, make_loss)
    return {f"critic_{k}": v for k, v in metrics.items()}
