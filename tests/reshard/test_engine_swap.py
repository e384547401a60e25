"""Allgather–swap of a live training engine between two optimizer steps (2 gloo ranks).

What the actor does every iteration: train, release the step's grads, reshard into the
generation layout and park weights, grads and optimizer state on the host, generate,
swap back, train again. Checked for torch AdamW and for Megatron's distributed
optimizer, whose weights and grads are views of DDP's contiguous buffers and whose
moments and main weights are this DP rank's shard: every training storage is released,
the generation shards are the trained weights, and the next steps equal a run that
never swapped, bit for bit.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from backends.megatron import MegatronEngine, OptimSpec, ParallelSpec
from backends.megatron.builder import destroy_parallel
from mindrl.reshard import AllgatherSwapResharder, GenLayout, ModelShape, TrainLayout, grad_tensors
from tests.megatron.cases import (
    DENSE,
    MICRO,
    data_stream,
    full_weights_for,
    micro_batch,
    policy_loss,
)
from tests.reshard.helpers import storage_bytes
from tests.support.spawn import run_ranks

ADAMW = OptimSpec(lr=1e-2, clip_grad=1.0)


def _optimizer_tensors(engine: MegatronEngine) -> list[torch.Tensor]:
    """The optimizer's state read directly (not through the engine's swap list): Megatron's
    chained optimizer maps (index, param) -> state, torch AdamW param -> state."""
    states = [state for _, state in engine.optimizer.state.items()]
    return [value for state in states for value in state.values() if torch.is_tensor(value)]


def _step(engine: MegatronEngine, position: int) -> float:
    micro = micro_batch(data_stream(DENSE, position), engine.data_parallel_rank())
    return engine.train_step(micro, policy_loss, MICRO, with_entropy=True)["loss"]


def _train(optim: OptimSpec, swap: bool) -> dict:
    """3 steps at DP=2; with ``swap`` an allgather–swap round trip after each of the first two."""
    engine = MegatronEngine(DENSE, ParallelSpec(), optim)
    engine.load_full_state_dict(full_weights_for(DENSE))
    params = engine.named_parameters()
    resharder = AllgatherSwapResharder(
        params,
        engine.param_layouts(),
        TrainLayout(2),
        GenLayout(2, tp=1),
        model=ModelShape(DENSE.num_attention_heads, DENSE.num_query_groups),
        swap_extra=lambda: grad_tensors(params.values()) + engine.optimizer_state_tensors(),
    )
    facts: dict = {"losses": []}
    for position in range(3):
        facts["losses"].append(_step(engine, position))
        engine.release_gradients()
        if swap and position < 2:
            trained = engine.full_state_dict()
            training = [*params.values(), *grad_tensors(params.values())]
            training += _optimizer_tensors(engine)
            facts["training_bytes"] = storage_bytes(training)
            generation = resharder.reshard()
            facts["bytes_after_swap_out"] = storage_bytes(training)
            facts["swapped_bytes"] = resharder.swapped_bytes
            facts["generation_is_trained"] = all(
                torch.equal(generation[name], trained[name]) for name in trained
            )
            resharder.swap_in()
    facts["weights"] = engine.full_state_dict()
    destroy_parallel()
    dist.barrier()
    return facts


def swap_runs(rank: int, world: int) -> dict:
    distributed = dataclasses.replace(ADAMW, distributed_optimizer=True)
    return {
        (kind, swap): _train(optim, swap)
        for kind, optim in (("adamw", ADAMW), ("distributed", distributed))
        for swap in (False, True)
    }


@pytest.fixture(scope="module")
def runs():
    return run_ranks(swap_runs, 2)


@pytest.mark.parametrize("kind", ["adamw", "distributed"])
def test_swap_releases_every_training_storage_and_hands_over_the_trained_weights(runs, kind):
    for rank in range(2):
        facts = runs[rank][(kind, True)]
        assert facts["training_bytes"] > 0
        assert facts["bytes_after_swap_out"] == 0
        assert facts["swapped_bytes"] == facts["training_bytes"]  # grads were released
        assert facts["generation_is_trained"]


@pytest.mark.parametrize("kind", ["adamw", "distributed"])
def test_training_after_swap_round_trips_equals_training_without_them(runs, kind):
    for rank in range(2):
        swapped, straight = runs[rank][(kind, True)], runs[rank][(kind, False)]
        assert swapped["losses"] == straight["losses"]
        for name, weight in straight["weights"].items():
            assert torch.equal(swapped["weights"][name], weight), name
