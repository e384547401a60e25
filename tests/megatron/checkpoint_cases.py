"""Checkpoint scenarios run inside spawned ranks by ``test_checkpoint_layouts.py``."""

from __future__ import annotations

import torch
import torch.distributed as dist

from backends.megatron import MegatronEngine, OptimSpec, ParallelSpec
from backends.megatron.builder import destroy_parallel
from tests.megatron.cases import DENSE, MICRO, data_stream, full_weights_for, policy_loss

OPTIM = OptimSpec(lr=1e-2, lr_schedule="cosine", lr_warmup_steps=1, total_steps=4, clip_grad=0.5)


def _dp_share(engine: MegatronEngine, position: int):
    batch = data_stream(engine.spec, position)
    rows = len(batch) // engine.data_parallel_size()
    first = engine.data_parallel_rank() * rows
    return batch.rows(slice(first, first + rows))


def _losses(engine: MegatronEngine, start: int, stop: int) -> list[float]:
    return [
        engine.train_step(_dp_share(engine, pos), policy_loss, MICRO, with_entropy=True)["loss"]
        for pos in range(start, stop)
    ]


def _engine(parallel: ParallelSpec, seed: int) -> MegatronEngine:
    full = full_weights_for(DENSE)  # builds a one-rank model: before this layout's engine
    engine = MegatronEngine(DENSE, parallel, OPTIM, seed=seed)
    engine.load_full_state_dict(full)
    return engine


def _finish() -> None:
    destroy_parallel()
    dist.barrier()


def tp2_then_dp2(rank: int, world: int, root: str) -> dict:
    """Train 2 steps at TP2 and save; go on 2 steps at TP2 (uninterrupted); a fresh
    engine at TP1 x DP2 (other init) loads the checkpoint and trains the same 2 steps."""
    first = _engine(ParallelSpec(tp=2), seed=1)
    _losses(first, 0, 2)
    saved_dir = first.save_checkpoint(root, data_position={"next_step": 2})
    saved_weights = first.full_state_dict()
    saved_moments = first._full_optimizer_state()["state"]
    uninterrupted = _losses(first, 2, 4)
    _finish()

    resumed = MegatronEngine(DENSE, ParallelSpec(), OPTIM, seed=99)  # DP2: world 2, TP1
    position = resumed.load_checkpoint(root)
    loaded_weights = resumed.full_state_dict()
    loaded_moments = resumed._full_optimizer_state()["state"]
    step, lr = resumed.step, resumed.optimizer.param_groups[0]["lr"]
    after_resume = _losses(resumed, position["next_step"], 4)
    _finish()
    return {
        "saved_dir": str(saved_dir),
        "same_weights": all(torch.equal(loaded_weights[k], v) for k, v in saved_weights.items()),
        "same_moments": sorted(saved_moments) == sorted(loaded_moments)
        and all(
            torch.equal(loaded_moments[name][key], value)
            for name, moments in saved_moments.items()
            for key, value in moments.items()
        ),
        "moment_keys": sorted(next(iter(saved_moments.values()))),
        "step_and_lr": (step, lr),
        "position": position,
        "uninterrupted": uninterrupted,
        "resumed": after_resume,
    }


def trained_and_saved(rank: int, world: int, root: str) -> dict:
    """One rank: 2 steps at the shared weights, save, then the engine's own HF state dict
    and response log-probs of a batch (what an export must reproduce)."""
    engine = _engine(ParallelSpec(), seed=1)
    _losses(engine, 0, 2)
    engine.save_checkpoint(root, data_position={"next_step": 2})
    batch = data_stream(DENSE, 9)
    result = {
        "hf": engine.hf_state_dict(),
        "input_ids": batch.input_ids,
        "logprobs": engine.forward(batch)["logprobs"],
        "mask": batch.response_mask,
    }
    _finish()
    return result


def value_loss(outputs: dict, batch, counts=None) -> torch.Tensor:
    """Per-token squared error of the values to a target (the batch's advantages)."""
    return (outputs["values"] - batch.fields["advantages"]) ** 2


def critic_trained_and_saved(rank: int, world: int, root: str) -> dict:
    """One rank: a critic (value head) trained 2 steps and saved, then its HF state dict,
    its value head and response values of a batch (what a critic export must reproduce)."""
    engine = MegatronEngine(DENSE, ParallelSpec(), OPTIM, value_head=True, seed=1)
    for position in range(2):
        engine.train_step(_dp_share(engine, position), value_loss, MICRO)
    engine.save_checkpoint(root, data_position={"next_step": 2})
    batch = data_stream(DENSE, 9)
    result = {
        "hf": engine.hf_state_dict(),
        "value_head": engine.full_state_dict()["output_layer.weight"],
        "input_ids": batch.input_ids,
        "values": engine.forward(batch)["values"],
        "mask": batch.response_mask,
    }
    _finish()
    return result
