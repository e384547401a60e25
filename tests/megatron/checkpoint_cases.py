"""Checkpoint scenarios run inside spawned ranks by ``test_checkpoint_layouts.py``."""

from __future__ import annotations

import dataclasses
import errno
import time
from pathlib import Path

import torch
import torch.distributed as dist

from backends.megatron import (
    GPTSpec,
    MegatronEngine,
    OptimSpec,
    ParallelSpec,
    checkpoint,
    sharded_state,
    sharded_store,
)
from backends.megatron.builder import destroy_parallel
from backends.megatron.checkpoint import CheckpointError
from backends.megatron.optim import lr_factor
from tests.megatron.cases import DENSE, MICRO, MOE, data_stream, full_weights_for, policy_loss

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


def _engine(
    parallel: ParallelSpec, seed: int, spec: GPTSpec = DENSE, optim: OptimSpec = OPTIM
) -> MegatronEngine:
    full = full_weights_for(spec)  # builds a one-rank model: before this layout's engine
    engine = MegatronEngine(spec, parallel, optim, seed=seed)
    engine.load_full_state_dict(
        {k: v.to(engine.model.config.params_dtype) for k, v in full.items()}
    )
    return engine


def _finish() -> None:
    destroy_parallel()
    dist.barrier()


DISTRIBUTED = dataclasses.replace(OPTIM, distributed_optimizer=True)
BF16 = dataclasses.replace(DENSE, dtype="bfloat16")
SPECS = {"dense": DENSE, "moe": MOE, "bf16": BF16}
OPTIMS = {"adamw": OPTIM, "distributed": DISTRIBUTED}


@dataclasses.dataclass(frozen=True)
class Move:
    """A checkpoint written at one layout and optimizer, resumed at another."""

    spec: str
    saved_at: dict
    saved_with: str
    loaded_at: dict
    loaded_with: str


#: Written and resumed on two ranks (DP is what TP / PP / EP leave of the two).
ON_TWO_RANKS = {
    "tp2_to_tp1": Move("dense", {"tp": 2}, "adamw", {}, "distributed"),
    "pp2_to_pp1": Move("dense", {"pp": 2}, "distributed", {}, "adamw"),
    "ep2_to_ep1": Move("moe", {"ep": 2}, "adamw", {}, "adamw"),
    "same_dp2": Move("dense", {}, "distributed", {}, "distributed"),
    "same_tp2": Move("dense", {"tp": 2}, "adamw", {"tp": 2}, "adamw"),
    "bf16_dp2_to_tp2": Move("bf16", {}, "distributed", {"tp": 2}, "distributed"),
    "cp2_to_cp1": Move("dense", {"cp": 2}, "adamw", {}, "adamw"),
}
#: Written on one rank (``ONE_RANK_SAVES``), resumed on two.
BACK_ON_TWO_RANKS = {
    "tp1_to_tp2": Move("dense", {}, "adamw", {"tp": 2}, "adamw"),
    "pp1_to_pp2": Move("dense", {}, "adamw", {"pp": 2}, "distributed"),
    "ep1_to_ep2": Move("moe", {}, "adamw", {"ep": 2}, "adamw"),
    "dp1_to_dp2": Move("dense", {}, "adamw", {}, "distributed"),
    "cp1_to_cp2": Move("dense", {}, "adamw", {"cp": 2}, "distributed"),
}
ONE_RANK_SAVES = ("dense", "moe")


def _write(root: str, spec: str, layout: dict, optim: str) -> list[float]:
    """Train 2 steps at ``layout`` and save under ``root``; the 2 steps after (the
    uninterrupted run's)."""
    engine = _engine(ParallelSpec(**layout), 1, SPECS[spec], OPTIMS[optim])
    _losses(engine, 0, 2)
    engine.save_checkpoint(root, data_position={"next_step": 2})
    after = _losses(engine, 2, 4)
    _finish()
    return after


def _resume(saved: str, resaved: str, spec: str, layout: dict, optim: str) -> dict:
    """A fresh engine (other init) at ``layout`` loads ``saved``, saves it again under
    ``resaved`` before any step, and trains the 2 steps after."""
    engine = MegatronEngine(SPECS[spec], ParallelSpec(**layout), OPTIMS[optim], seed=99)
    position = engine.load_checkpoint(saved)
    engine.save_checkpoint(resaved, data_position=position)
    lr = engine.optim.lr * lr_factor(engine.step, engine.optim)
    if engine.scheduler is not None:
        lr = engine.optimizer.param_groups[0]["lr"]
    result = {"position": position, "step": engine.step, "lr": lr}
    result["resumed"] = _losses(engine, position["next_step"], 4)
    _finish()
    return result


def moves_on_two_ranks(rank: int, world: int, root: str) -> dict:
    """Every :data:`ON_TWO_RANKS` move: the uninterrupted losses, the resumed ones, and the
    folders ``<root>/<move>/saved`` and ``<root>/<move>/resaved``."""
    out = {}
    for name, move in ON_TWO_RANKS.items():
        uninterrupted = _write(f"{root}/{name}/saved", move.spec, move.saved_at, move.saved_with)
        resumed = _resume(
            f"{root}/{name}/saved",
            f"{root}/{name}/resaved",
            move.spec,
            move.loaded_at,
            move.loaded_with,
        )
        out[name] = {"uninterrupted": uninterrupted, **resumed}
    return out


def one_rank(rank: int, world: int, root: str) -> dict:
    """DP2 -> DP1 (the two-rank distributed optimizer's checkpoint resumed on one rank),
    and the one-rank checkpoints :data:`BACK_ON_TWO_RANKS` resumes."""
    saved = f"{root}/same_dp2/saved"
    out = {"dp2_to_dp1": _resume(saved, f"{root}/dp2_to_dp1/resaved", "dense", {}, "distributed")}
    for spec in ONE_RANK_SAVES:
        out[f"one_{spec}"] = _write(f"{root}/one_{spec}/saved", spec, {}, "adamw")
    return out


def back_on_two_ranks(rank: int, world: int, root: str) -> dict:
    """Every :data:`BACK_ON_TWO_RANKS` move from the one-rank checkpoints, and the format-2
    checkpoints resumed (:func:`format2_resumes`)."""
    moves = {
        name: _resume(
            f"{root}/one_{move.spec}/saved",
            f"{root}/{name}/resaved",
            move.spec,
            move.loaded_at,
            move.loaded_with,
        )
        for name, move in BACK_ON_TWO_RANKS.items()
    }
    return {**moves, "format2": format2_resumes()}


def format2_resumes() -> dict:
    """The format-2 checkpoints (``format2/``): AdamW's written at TP2, resumed at TP1 x
    DP2; the distributed optimizer's written at DP2, resumed there and refused at TP2."""
    from tests.megatron.format2 import make_fixtures as written

    def resume(name: str, parallel: ParallelSpec, optim: OptimSpec) -> list[float] | str:
        engine = MegatronEngine(written.SPEC, parallel, optim, seed=99)
        try:
            position = engine.load_checkpoint(written.HERE / name / "actor")
            return _losses(engine, position["next_step"], 4)
        except CheckpointError as exc:
            return str(exc)
        finally:
            _finish()

    return {
        "adamw_tp2_at_dp2": resume("adamw_tp2", ParallelSpec(), written.ADAMW),
        "distributed_dp2": resume("distributed_dp2", ParallelSpec(), written.DISTRIBUTED),
        "distributed_dp2_at_tp2": resume(
            "distributed_dp2", ParallelSpec(tp=2), written.DISTRIBUTED
        ),
    }


def trained_and_saved(rank: int, world: int, root: str) -> dict:
    """2 steps at TP = world from the shared weights, save (each rank its part), then the
    engine's own HF state dict and response log-probs of a batch (what an export must
    reproduce)."""
    engine = _engine(ParallelSpec(tp=world), seed=1)
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


def background_saves(rank: int, world: int, root: str) -> dict:
    """At TP2: a synchronous save of step 2 (``sync``) and a background one
    (``background``), written slowly while 2 more steps train; then a background save of
    step 4 whose rank-1 shard write fails, a synchronous one whose rank-1 RNG file fails
    (before DCP runs), and the same save once the disk is back."""
    original = sharded_store.PiecesWriter.write_data
    original_tree = checkpoint.save_tree

    def slow(writer, plan, planner):
        time.sleep(1.0)  # the steps below run while the tensors are written
        return original(writer, plan, planner)

    def failing(writer, plan, planner):
        if dist.get_rank() == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(writer, plan, planner)

    def failing_tree(stem, obj):
        if dist.get_rank() == 1 and "rng" in str(stem):
            raise PermissionError(errno.EACCES, "Permission denied", str(stem))
        return original_tree(stem, obj)

    engine = _engine(ParallelSpec(tp=2), seed=1)
    _losses(engine, 0, 2)
    engine.save_checkpoint(f"{root}/sync", data_position={"next_step": 2})
    tensors = [*engine.model.parameters(), *engine.optimizer_state_tensors()]
    resizable = all(t.untyped_storage().resizable() for t in tensors)
    sharded_store.PiecesWriter.write_data = slow
    engine.save_checkpoint(f"{root}/background", data_position={"next_step": 2}, background=True)
    published_at_return = checkpoint.latest_dir(f"{root}/background") is not None
    _losses(engine, 2, 4)
    published = engine.finish_checkpoint()
    sharded_store.PiecesWriter.write_data = failing
    engine.save_checkpoint(f"{root}/background", data_position={"next_step": 4}, background=True)
    try:
        engine.finish_checkpoint()
        error = None
    except CheckpointError as exc:
        error = str(exc)
    sharded_store.PiecesWriter.write_data = original
    left_after_failures = []
    checkpoint.save_tree = failing_tree
    try:
        engine.save_checkpoint(f"{root}/background", data_position={"next_step": 4})
        sync_error = None
    except CheckpointError as exc:
        sync_error = str(exc)
    checkpoint.save_tree = original_tree
    left_after_failures = sorted(p.name for p in Path(root, "background").iterdir())
    dist.barrier()  # every rank has looked before the retry writes step 4
    retried = engine.save_checkpoint(f"{root}/background", data_position={"next_step": 4})
    _finish()
    return {
        "resizable_after_save": resizable,
        "published_at_return": published_at_return,
        "published": published,
        "error": error,
        "sync_error": sync_error,
        "left_after_failures": left_after_failures,
        "retried": retried,
    }


def padding_rows_written_through(rank: int, world: int) -> dict:
    """At TP2 a 95-token vocabulary pads rank 1's (tied) embedding with one row:
    what ``vocab_padding`` hands out is written through to the weights (loading zeroes
    the padding that way)."""
    engine = MegatronEngine(dataclasses.replace(DENSE, vocab_size=95), ParallelSpec(tp=2), OPTIM)
    rows = sharded_state.vocab_padding(engine.model, 95)
    for piece in rows:
        piece.fill_(7.0)
    last_rows = [
        param.detach()[-1]
        for name, param in sharded_state.canonical_parameters(engine.model).items()
        if name in sharded_state.VOCAB_PARAMS
    ]
    out = {"pieces": len(rows), "last_rows_are_7": [bool((r == 7.0).all()) for r in last_rows]}
    _finish()
    return out
