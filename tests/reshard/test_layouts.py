"""Pure layout maths: Megatron rank numbering, slice rules, buckets, refusals (no processes)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from backends.layout import ParamLayout
from mindrl.reshard import (
    AllgatherSwapResharder,
    GenLayout,
    LayoutError,
    ModelShape,
    TrainLayout,
    check_layout_pair,
)
from mindrl.reshard.plan import build_table, make_buckets
from mindrl.reshard.slicing import copy_overlap, take_shard
from tests.reshard.helpers import reference_shard

ORDER = "tp-cp-ep-dp-pp"
TRAIN_LAYOUTS = [
    TrainLayout(8, tp=2, pp=2, cp=2),
    TrainLayout(8, tp=2, pp=2, ep=2, etp=1),
    TrainLayout(8, tp=4, ep=2, etp=2),
    TrainLayout(16, tp=2, pp=2, cp=1, ep=4, etp=1),
    TrainLayout(24, tp=2, pp=3, cp=2, ep=2, etp=2),
    TrainLayout(4, tp=1, pp=4),
]


@pytest.fixture(scope="module")
def rank_generator():
    pytest.importorskip("megatron.core")
    from megatron.core.parallel_state import RankGenerator

    return RankGenerator


@pytest.mark.parametrize("train", TRAIN_LAYOUTS, ids=str)
def test_rank_numbering_matches_megatron_rank_generator(train, rank_generator):
    dense = rank_generator(tp=train.tp, ep=1, dp=train.dp, pp=train.pp, cp=train.cp, order=ORDER)
    expert = rank_generator(tp=train.etp, ep=train.ep, dp=train.edp, pp=train.pp, cp=1, order=ORDER)
    assert train.tp_groups() == dense.get_ranks("tp")
    assert train.pp_groups() == dense.get_ranks("pp")
    assert train.expert_groups() == expert.get_ranks("tp-ep")
    for group in dense.get_ranks("tp"):
        assert [train.tp_rank(r) for r in group] == list(range(train.tp))
    for stage, ranks in enumerate(zip(*dense.get_ranks("pp"), strict=True)):
        assert {train.pp_rank(r) for r in ranks} == {stage}
    for group in expert.get_ranks("ep"):
        assert [train.ep_rank(r) for r in group] == list(range(train.ep))
    for group in expert.get_ranks("tp"):
        assert [train.etp_rank(r) for r in group] == list(range(train.etp))


def test_generation_ranks_follow_vllm_tp_then_dp():
    gen = GenLayout(8, tp=2, ep=4)
    assert [gen.tp_rank(r) for r in range(8)] == [0, 1] * 4
    assert [gen.ep_rank(r) for r in range(8)] == [0, 1, 2, 3] * 2
    assert gen.dp == 4 and gen.etp == 1
    assert GenLayout(4, tp=2, ep=1).etp == 2  # no EP: experts split like dense weights


LAYOUTS = [
    ParamLayout("column", (24, 6)),
    ParamLayout("column", (48, 4), fused_pieces=2),
    ParamLayout("row", (6, 24)),
    ParamLayout("vocab", (48, 5)),
    ParamLayout("column", (24,)),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay.kind}x{lay.fused_pieces}")
@pytest.mark.parametrize(("src", "dst"), [(1, 2), (2, 1), (4, 2), (2, 4), (3, 6), (6, 4), (4, 6)])
def test_generation_shard_from_training_shards_equals_direct_slice(layout, src, dst):
    full = torch.randn(layout.full_shape)
    if layout.full_shape[layout.partition_dim] % (layout.fused_pieces * max(src, dst) * 2):
        pytest.skip("shape does not split")
    shards = [take_shard(full, layout, src, i) for i in range(src)]
    for i, shard in enumerate(shards):
        assert torch.equal(shard, reference_shard(full, layout, src, i))
    for index in range(dst):
        out = torch.empty_like(reference_shard(full, layout, dst, index))
        copy_overlap(out, dst, index, shards, layout)
        assert torch.equal(out, reference_shard(full, layout, dst, index))


def test_buckets_cover_every_parameter_once_and_respect_the_cap():
    train = TrainLayout(4, tp=2, ep=2)
    entries = [(f"dense.{i}", ParamLayout("column", (8, 4)), torch.float32, 0) for i in range(10)]
    entries += [
        (f"moe.experts.{e}.fc", ParamLayout("row", (4, 8), expert_index=e), torch.float32, 0)
        for e in range(4)
    ]
    entries.append(("huge", ParamLayout("row", (64, 64)), torch.float32, 0))
    table = build_table(entries)
    buckets = make_buckets(table, train, bucket_bytes=400)
    names = [p.name for b in buckets for p in b.params]
    assert sorted(names) == sorted(table)
    for bucket in buckets:
        assert bucket.nbytes <= 400 or len(bucket.params) == 1
        rows = [sum(s.numel for s in row) for row in bucket.rows]
        assert max(rows) - min(rows) <= 32  # owners interleaved: at most one expert apart
    assert table["moe.experts.3.fc"].num_experts == 4


@pytest.mark.parametrize(
    ("train", "gen", "shape", "message"),
    [
        (TrainLayout(4, tp=2), GenLayout(2, tp=1), None, "world 4 != generation world 2"),
        (TrainLayout(4, tp=4), GenLayout(4, tp=1), ModelShape(8, 2), "training tp 4"),
        (TrainLayout(4, tp=2), GenLayout(4, tp=4), ModelShape(8, 2), "generation tp 4"),
        (TrainLayout(4, ep=2), GenLayout(4, ep=4), ModelShape(4, 4, 6), "generation ep 4"),
        (TrainLayout(4, ep=4), GenLayout(4), ModelShape(4, 4, 6), "training ep 4"),
        (TrainLayout(4, ep=2), GenLayout(4), ModelShape(4, 4, 0), "needs a model with experts"),
    ],
)
def test_impossible_pairs_are_refused_with_one_line(train, gen, shape, message):
    with pytest.raises(LayoutError, match=message) as caught:
        check_layout_pair(train, gen, shape)
    assert "\n" not in str(caught.value)


def test_impossible_pair_is_refused_before_any_communication():
    assert not dist.is_initialized()  # any collective would fail with a different error
    params = {"w": torch.zeros(4, 4)}
    layouts = {"w": ParamLayout("column", (8, 4))}
    with pytest.raises(LayoutError, match="num_query_groups"):
        AllgatherSwapResharder(
            params,
            layouts,
            TrainLayout(2, tp=2),
            GenLayout(2, tp=1),
            rank=0,
            model=ModelShape(num_heads=3, num_query_groups=3),
        )


def test_invalid_layout_sizes_are_refused():
    with pytest.raises(LayoutError, match="does not divide world"):
        TrainLayout(6, tp=4)
    with pytest.raises(LayoutError, match="multiple of generation tp"):
        GenLayout(8, tp=4, ep=2)


def test_parameter_that_does_not_split_is_refused():
    from mindrl.reshard.plan import check_table

    table = build_table([("odd", ParamLayout("column", (6, 4)), torch.float32, 0)])
    for train, gen in itertools.product([TrainLayout(4, tp=4)], [GenLayout(4, tp=1)]):
        with pytest.raises(LayoutError, match="parameter 'odd'"):
            check_table(table, train, gen)
