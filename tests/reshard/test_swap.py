"""Swap and single-process behaviour: optimizer exactness, pinned reuse, simulation, naive."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from backends.device import get_device
from backends.megatron.optim import optimizer_state_tensors
from benchmarks.harness.synthetic_model import stage_of, synthetic_weights
from mindrl.config import ParallelConfig
from mindrl.planner.memory import redundant_bytes
from mindrl.reshard import (
    AllgatherSwapResharder,
    GenLayout,
    HostSwap,
    NaiveResharder,
    TrainLayout,
    grad_tensors,
)
from tests.reshard.helpers import DENSE, MOE, expected_generation_shard, storage_bytes


def _simulated(cls, model, train, gen, rank, **kwargs):
    full, layouts = synthetic_weights(model, seed=3)
    where = functools.partial(stage_of, m=model, pp=train.pp)
    return full, cls.simulated(full, layouts, where, train, gen, rank, bucket_bytes=2048, **kwargs)


def _adam_with_state(params: list[torch.Tensor]) -> torch.optim.Adam:
    for p in params:
        p.requires_grad_(True)
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.Adam(params, lr=0.1)
    optimizer.step()  # creates exp_avg / exp_avg_sq / step
    for p in params:
        p.grad = torch.randn_like(p)
    return optimizer


def test_optimizer_step_after_swap_in_equals_step_without_swap():
    train, gen = TrainLayout(4, tp=2, pp=2), GenLayout(4, tp=1)
    _, resharder = _simulated(AllgatherSwapResharder, DENSE, train, gen, rank=1)
    params = list(resharder.params.values())
    optimizer = _adam_with_state(params)
    twin_params = [p.detach().clone().requires_grad_(True) for p in params]
    for twin, p in zip(twin_params, params, strict=True):
        twin.grad = p.grad.clone()
    twin = torch.optim.Adam(twin_params, lr=0.1)
    twin.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    resharder.swap_extra = lambda: grad_tensors(params) + optimizer_state_tensors(optimizer)

    resharder.reshard()
    state = optimizer_state_tensors(optimizer)
    assert storage_bytes(params + grad_tensors(params) + state) == 0
    resharder.swap_in()
    optimizer.step()
    twin.step()
    for p, t in zip(params, twin_params, strict=True):
        assert torch.equal(p, t)


def test_host_swap_reuses_one_pinned_buffer_per_storage_across_iterations():
    swap = HostSwap(get_device())
    base = torch.randn(64)
    views = [base[:32].view(4, 8), base[32:]]  # two views of one storage
    other = torch.randn(3, 5)
    original = [base.clone(), other.clone()]
    for _ in range(3):
        moved = swap.swap_out([*views, other])
        assert moved == (64 + 15) * 4
        assert base.untyped_storage().nbytes() == 0 and other.untyped_storage().nbytes() == 0
        swap.swap_in()
        assert torch.equal(base, original[0]) and torch.equal(other, original[1])
        assert torch.equal(views[1], original[0][32:])
    assert swap.host_allocations == 2


def test_reshard_refuses_to_run_while_training_state_is_on_host():
    _, resharder = _simulated(AllgatherSwapResharder, DENSE, TrainLayout(2, tp=2), GenLayout(2), 0)
    resharder.reshard()
    with pytest.raises(RuntimeError, match="swap_in"):
        resharder.reshard()


@pytest.mark.parametrize(
    ("model", "train", "gen"),
    [
        (DENSE, TrainLayout(4, tp=2, pp=2), GenLayout(4, tp=4)),
        (MOE, TrainLayout(4, tp=2, ep=2), GenLayout(4, tp=1, ep=4)),
    ],
    ids=["dense", "moe-fig3"],
)
def test_single_process_simulation_gives_every_rank_its_shards(model, train, gen):
    for rank in range(train.world):
        full, resharder = _simulated(AllgatherSwapResharder, model, train, gen, rank)
        out = resharder.reshard()
        for name, shard in out.items():
            expected = expected_generation_shard(full[name], resharder.layouts[name], gen, rank)
            assert torch.equal(shard, expected), (rank, name)
        assert resharder.timeline.bytes_at("swap_out") >= storage_bytes(out.values())
        resharder.swap_in()


def test_naive_keeps_training_weights_and_its_redundancy_matches_equation_3():
    train, gen = TrainLayout(2, tp=2), GenLayout(2, tp=1)
    full, naive = _simulated(NaiveResharder, DENSE, train, gen, rank=0)
    out = naive.reshard()
    for name, shard in out.items():
        assert torch.equal(shard, full[name])
    train_bytes = storage_bytes(naive.params.values())
    assert train_bytes > 0
    shared = {t.untyped_storage()._cdata for t in out.values()}
    redundant = sum(
        t.untyped_storage().nbytes()
        for t in naive.params.values()
        if t.untyped_storage()._cdata not in shared
    )
    assert redundant == redundant_bytes(DENSE, ParallelConfig(tp=2), gen_ep=1)


def test_whole_vocab_generation_ranks_get_full_embedding_and_output_layer_and_split_the_rest():
    train, gen = TrainLayout(4, tp=2, pp=2), GenLayout(4, tp=2, whole_vocab=True)
    vocab_seen = 0
    for rank in range(train.world):
        full, resharder = _simulated(AllgatherSwapResharder, DENSE, train, gen, rank)
        out = resharder.reshard()
        for name, shard in out.items():
            layout = resharder.layouts[name]
            if layout.kind == "vocab":
                vocab_seen += 1
                assert torch.equal(shard, full[name]), (rank, name)
            else:
                expected = expected_generation_shard(full[name], layout, gen, rank)
                assert torch.equal(shard, expected), (rank, name)
        resharder.swap_in()
    assert vocab_seen >= 4  # every rank held at least one whole vocabulary tensor


def test_cp_ranks_hold_the_same_weights_and_gather_exactly_what_dp_replicas_gather():
    gen = GenLayout(4, tp=2)
    at_cp2, at_dp2 = TrainLayout(4, tp=2, cp=2), TrainLayout(4, tp=2)
    for rank in range(gen.world):
        full, cp = _simulated(AllgatherSwapResharder, DENSE, at_cp2, gen, rank)
        _, dp = _simulated(AllgatherSwapResharder, DENSE, at_dp2, gen, rank)
        # Each rank gathers over its own TP group only: a CP replica's copy never moves.
        assert [len(b.rows) for b in cp.buckets] == [at_cp2.tp] * len(cp.buckets)
        assert [b.row_numel for b in cp.buckets] == [b.row_numel for b in dp.buckets]
        out = cp.reshard()
        for name, shard in out.items():
            expected = expected_generation_shard(full[name], cp.layouts[name], gen, rank)
            assert torch.equal(shard, expected), (rank, name)
        cp.swap_in()
