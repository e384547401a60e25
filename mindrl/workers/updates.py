"""Optimizer steps of the actor and the critic over one iteration's samples.

The loss maths comes from the ``Algorithm`` object the trainer handed to the worker
(``actor_loss`` / ``critic_loss``); this module only slices the samples into epochs and
mini-batches and hands each mini-batch to ``engine.train_step``, which cuts it into
micro-batches and gives the loss the response-aligned outputs. Each micro-batch loss is
normalised by the *global* mini-batch token and sequence counts the engine counted once
per step (docs/architecture.md §6), so micro-batching and DP never change the step.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Protocol

import torch

from backends.megatron import GlobalCounts, MegatronEngine, MicroBatching, ResponseBatch
from mindrl.algorithm import Algorithm
from mindrl.config.schema import AlgorithmConfig, RoleConfig
from mindrl.metrics.reduce import mean_by_key
from mindrl.workers.context import StageContext

Rows = dict[str, torch.Tensor]


class Learner(Protocol):
    """The worker an update trains: its engine, its role's section (epochs, micro-batch
    size), its share of the run plan, and the algorithm with the options of this update
    (the driver may adapt the KL coefficient between updates)."""

    role: str
    section: RoleConfig
    engine: MegatronEngine
    context: StageContext
    algorithm: Algorithm
    options: AlgorithmConfig


def minibatch_slices(total: int, parts: int) -> list[slice]:
    """``parts`` contiguous slices covering ``total`` rows as evenly as possible."""
    bounds = [round(i * total / parts) for i in range(parts + 1)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def micro_batching(section: RoleConfig) -> MicroBatching:
    """How a role cuts a step into micro-batches: its token budget when set (it wins),
    else ``micro_batch_size`` sequences."""
    return MicroBatching(section.micro_batch_size, section.max_tokens_per_micro_batch)


def step_metrics(
    collected: list[dict[str, torch.Tensor]], additive: frozenset[str], dp_size: int
) -> dict[str, float]:
    """One step's metrics from its micro-batches' records: the ``additive`` ones (each a
    micro-batch's share of the global batch's figure, ``Algorithm.additive_metrics``)
    summed, the others averaged. The driver averages the ranks' reports, so a rank reports
    its sum times ``dp_size``: the mean over the data-parallel ranks is then the sum of
    their shares, the global batch's exact figure, however unequal the micro-batches."""
    metrics = mean_by_key(collected, additive)
    return {key: value * dp_size if key in additive else value for key, value in metrics.items()}


def _run_steps(
    worker: Learner, rows: ResponseBatch, num_minibatches: int, make_loss: Callable
) -> dict:
    """Epochs x mini-batches of ``engine.train_step``; metrics averaged over all steps, and
    ``train_tokens_per_real_token``: the positions the update's forward passes computed
    (pads included) per real token they hold (each shared prompt once), over all steps."""
    additive, dp_size = worker.algorithm.additive_metrics, worker.engine.data_parallel_size()
    steps = []
    for _ in range(worker.section.ppo_epochs):
        for part in minibatch_slices(len(rows), num_minibatches):
            collected: list[dict[str, torch.Tensor]] = []
            stats = worker.engine.train_step(
                rows.rows(part),
                make_loss(collected),
                micro_batching(worker.section),
                with_entropy=worker.role == "actor",
            )
            steps.append({**stats, **step_metrics(collected, additive, dp_size)})
    metrics = mean_by_key(steps)
    computed, real = metrics.pop("computed_tokens"), metrics.pop("real_tokens")
    metrics["train_tokens_per_real_token"] = computed / max(real, 1.0)  # 1.0: no padding
    if worker.engine.lora is not None:  # what LoRA saves shows in every record
        metrics["trainable_params"] = float(worker.engine.trainable_params())
    return metrics


def actor_update(worker: Learner, rows: ResponseBatch, num_minibatches: int) -> dict[str, float]:
    """Clipped policy-gradient steps with ``worker.algorithm.actor_loss``; when tokens may
    come from older weights (``rollout.max_staleness > 0``, partial rollout) the rollout's
    per-token log-probs are the behaviour policy's (trainers/core.py, ``behaviour_weights``)."""
    off_policy = worker.context.tokens_may_lag

    def make_loss(collected: list) -> Callable:
        def loss_fn(outputs: Rows, micro: ResponseBatch, counts: GlobalCounts) -> torch.Tensor:
            batch, logprob = micro.loss_inputs(), outputs["logprobs"]
            if off_policy:  # samples may be from older weights: correct for the lag
                batch["behaviour_logprob"] = batch["rollout_logprob"]
            loss, metrics = worker.algorithm.actor_loss(
                logprob, batch, worker.options, num_tokens=counts.tokens,
                entropy=outputs["entropy"], num_seqs=counts.sequences,
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


def critic_update(worker: Learner, rows: ResponseBatch, num_minibatches: int) -> dict[str, float]:
    """Clipped value-regression steps with ``worker.algorithm.critic_loss``."""
    rows = dataclasses.replace(rows, fields={**rows.fields, "old_values": rows.fields["values"]})

    def make_loss(collected: list) -> Callable:
        def loss_fn(outputs: Rows, micro: ResponseBatch, counts: GlobalCounts) -> torch.Tensor:
            loss, metrics = worker.algorithm.critic_loss(
                outputs["values"], micro.loss_inputs(), worker.options,
                num_tokens=counts.tokens, num_seqs=counts.sequences,
            )  # fmt: skip
            collected.append(metrics)
            return loss

        return loss_fn

    metrics = _run_steps(worker, rows, num_minibatches, make_loss)
    return {f"critic_{k}": v for k, v in metrics.items()}
