"""Functions run inside spawned ranks by ``test_distributed_optimizer.py``.

Every run starts from the shared per-name weights of ``cases`` and trains a few steps on
the same global batches (each DP rank takes its share), so a layout with Megatron's
distributed optimizer can be compared step by step with one rank running torch AdamW.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from backends.megatron import GPTSpec, MegatronEngine, OptimSpec, ParallelSpec, ResponseBatch
from backends.megatron.builder import destroy_parallel
from tests.megatron.cases import (
    DENSE,
    MICRO,
    MOE,
    data_stream,
    full_weights_for,
    policy_loss,
)

STEPS = 3
#: Warm-up + cosine (the lr changes every step), weight decay on, and a clip that some
#: steps' grad norms exceed and some do not (the test checks both happen). Adam divides
#: each grad by its own magnitude + eps, so a near-zero grad turns the fp32 rounding
#: noise of a different layout (~1e-7) into weight noise of up to lr / eps times that:
#: eps = 1e-3 keeps it ~1e-6, under the tolerance, instead of up to lr with 1e-8.
ADAMW = OptimSpec(
    lr=1e-2,
    lr_schedule="cosine",
    lr_warmup_steps=1,
    total_steps=4,
    weight_decay=0.1,
    adam_eps=1e-3,
    clip_grad=7.0,
)
DISTRIBUTED = dataclasses.replace(ADAMW, distributed_optimizer=True)
#: Qwen3-style q/k layernorms: shared by the heads split over TP, so their grads are
#: partial on each TP rank and must be summed over TP.
QK_NORM = dataclasses.replace(DENSE, family="qwen3", qk_layernorm=True, add_qkv_bias=False)


def _dp_share(engine: MegatronEngine, batch: ResponseBatch) -> ResponseBatch:
    rows = len(batch) // engine.data_parallel_size()
    first = engine.data_parallel_rank() * rows
    return batch.rows(slice(first, first + rows))


def train_from_shared_weights(
    parallel: ParallelSpec, optim: OptimSpec, spec: GPTSpec = DENSE, steps: int = STEPS
) -> list[dict]:
    """Per step: loss, grad norm, lr, the full weights after the step, the Adam moments'
    element count on this rank and the model's."""
    full = full_weights_for(spec)
    engine = MegatronEngine(spec, parallel, optim)
    engine.load_full_state_dict(full)
    records = []
    for position in range(steps):
        micro = _dp_share(engine, data_stream(spec, position))
        metrics = engine.train_step(micro, policy_loss, MICRO, with_entropy=True)
        records.append({**metrics, "weights": engine.full_state_dict()})
    # Chained Megatron optimizers expose (index, param) -> state; torch AdamW param -> state.
    moments = sum(state["exp_avg"].numel() for _, state in engine.optimizer.state.items())
    records[-1]["moments"] = moments
    records[-1]["params"] = sum(p.numel() for p in engine.model.parameters())
    destroy_parallel()
    dist.barrier()
    return records


def _losses(engine: MegatronEngine, start: int, stop: int) -> list[float]:
    return [
        engine.train_step(
            _dp_share(engine, data_stream(engine.spec, pos)), policy_loss, MICRO, with_entropy=True
        )["loss"]
        for pos in range(start, stop)
    ]


def resume(checkpoint_root: str) -> dict:
    """4 uninterrupted steps vs 2 steps, save, a fresh engine (other init), load, 2 steps.

    MoE at EP=2: two chained optimizers, dense parameters sharded over DP=2, experts
    (expert-DP=1) not. The first loss after the resume only reads the loaded weights;
    the second one also depends on the restored moments, steps and fp32 main weights.
    Torch AdamW resumes the same checkpoint too (``with_adamw``).
    """
    parallel = ParallelSpec(ep=2)
    straight = MegatronEngine(MOE, parallel, DISTRIBUTED, seed=1)
    uninterrupted = _losses(straight, 0, 4)
    final = straight.full_state_dict()
    first = MegatronEngine(MOE, parallel, DISTRIBUTED, seed=1)
    _losses(first, 0, 2)
    first.save_checkpoint(checkpoint_root, data_position={"next_step": 2})
    resumed = MegatronEngine(MOE, parallel, DISTRIBUTED, seed=99)
    position = resumed.load_checkpoint(checkpoint_root)
    after_resume = _losses(resumed, position["next_step"], 4)
    same_weights = all(
        torch.equal(weight, final[name]) for name, weight in resumed.full_state_dict().items()
    )
    adamw = MegatronEngine(MOE, parallel, ADAMW, seed=99)  # the same state, torch AdamW
    position = adamw.load_checkpoint(checkpoint_root)
    with_adamw = _losses(adamw, position["next_step"], 4)
    destroy_parallel()
    dist.barrier()
    return {
        "uninterrupted": uninterrupted,
        "resumed": after_resume,
        "same_weights": same_weights,
        "with_adamw": with_adamw,
    }


def bf16_keeps_loaded_weights() -> bool:
    """bf16 keeps fp32 main weights apart: a zero-lr step must keep the loaded weights."""
    spec = dataclasses.replace(DENSE, dtype="bfloat16")
    optim = OptimSpec(lr=0.0, distributed_optimizer=True)
    engine = MegatronEngine(spec, ParallelSpec(), optim, seed=5)
    loaded = {k: v.to(torch.bfloat16) for k, v in full_weights_for(spec).items()}
    engine.load_full_state_dict(loaded)
    engine.train_step(
        _dp_share(engine, data_stream(spec, 0)), policy_loss, MICRO, with_entropy=True
    )
    after = engine.full_state_dict()
    destroy_parallel()
    dist.barrier()
    return all(torch.equal(after[name], weight) for name, weight in loaded.items())


def distributed_on_two_ranks(rank: int, world: int, checkpoint_root: str) -> dict:
    """The distributed optimizer at DP=2, TP=2 and PP=2 (tied embeddings on both stages),
    q/k norms at TP=2, MoE at EP=2 (dense and expert optimizers); resume; bf16 weights."""
    return {
        "dp2": train_from_shared_weights(ParallelSpec(), DISTRIBUTED),
        "tp2": train_from_shared_weights(ParallelSpec(tp=2), DISTRIBUTED),
        "pp2": train_from_shared_weights(ParallelSpec(pp=2), DISTRIBUTED),
        "qk_tp2": train_from_shared_weights(ParallelSpec(tp=2), DISTRIBUTED, QK_NORM),
        "moe_ep2": train_from_shared_weights(ParallelSpec(ep=2), DISTRIBUTED, MOE),
        "resume": resume(checkpoint_root),
        "bf16": bf16_keeps_loaded_weights(),
    }


def adamw_on_one_rank(rank: int, world: int) -> dict[str, list[dict]]:
    """The references: the same steps with torch AdamW on one rank."""
    return {
        "dense": train_from_shared_weights(ParallelSpec(), ADAMW),
        "qk": train_from_shared_weights(ParallelSpec(), ADAMW, QK_NORM),
        "moe": train_from_shared_weights(ParallelSpec(), ADAMW, MOE),
    }
