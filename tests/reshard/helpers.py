"""Shared pieces of the reshard tests: tiny models, an independent slicer, a rank worker."""

from __future__ import annotations

import functools
import gc

import torch

from backends.device import get_device
from backends.layout import ParamLayout
from mindrl.config import ModelConfig

DENSE = ModelConfig(
    num_layers=4,
    hidden_size=16,
    num_attention_heads=8,
    num_kv_heads=4,
    ffn_hidden_size=32,
    vocab_size=64,
    qkv_bias=True,
)
MOE = ModelConfig(
    num_layers=2,
    hidden_size=16,
    num_attention_heads=4,
    num_kv_heads=2,
    ffn_hidden_size=32,
    vocab_size=64,
    num_experts=8,
    moe_ffn_hidden_size=8,
    num_shared_experts=1,
)
BUCKET_BYTES = 4096


def reference_shard(
    full: torch.Tensor, layout: ParamLayout, parts: int, index: int
) -> torch.Tensor:
    """Shard ``index`` of ``parts`` by explicit reshaping (independent of mindrl.reshard)."""
    dim = layout.partition_dim
    if dim is None or parts == 1:
        return full
    moved = full.movedim(dim, 0)
    length, rest = moved.shape[0], moved.shape[1:]
    pieces = layout.fused_pieces
    chunks = moved.reshape(pieces, parts, length // (pieces * parts), *rest)
    return chunks[:, index].reshape(length // parts, *rest).movedim(0, dim)


def expected_generation_shard(full, layout, gen, rank):
    if layout.is_expert:
        return reference_shard(full, layout, gen.etp, gen.etp_rank(rank))
    return reference_shard(full, layout, gen.tp, gen.tp_rank(rank))


def storage_bytes(tensors) -> int:
    return sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}.values())


def check_pair(rank: int, model: ModelConfig, train, gen) -> dict:
    """Run two allgather–swap iterations for one layout pair on this rank; report facts."""
    from benchmarks.harness.synthetic_model import stage_of, synthetic_weights
    from mindrl.reshard import (
        AllgatherSwapResharder,
        ModelShape,
        local_training_shards,
    )
    from mindrl.reshard.plan import build_table

    device = get_device()
    gc.collect()
    baseline = device.memory_allocated()
    full, layouts = synthetic_weights(model, seed=7)
    where = functools.partial(stage_of, m=model, pp=train.pp)
    table = build_table((n, layouts[n], t.dtype, where(n)) for n, t in full.items())
    params = local_training_shards(full, table, train, rank, device)
    before = {n: t.clone() for n, t in params.items()}
    resharder = AllgatherSwapResharder(
        params, layouts, train, gen, model=ModelShape.from_config(model), bucket_bytes=BUCKET_BYTES
    )
    train_bytes = storage_bytes(params.values())
    out = resharder.reshard()
    facts = {
        "mismatched": [
            n
            for n, t in out.items()
            if not torch.equal(t, expected_generation_shard(full[n], layouts[n], gen, rank))
        ],
        "missing": sorted(
            n
            for n in full
            if n not in out
            and (
                not layouts[n].is_expert or gen.ep_rank(rank) == _gen_owner(n, layouts, model, gen)
            )
        ),
        "generation_names": len(out),
        "train_bytes": train_bytes,
        "train_bytes_after_swap_out": storage_bytes(params.values()),
        "ledger_after_reshard": device.memory_allocated() - baseline,
        "generation_bytes": storage_bytes(out.values()),
        "swapped_bytes": resharder.swapped_bytes,
        "timeline": list(resharder.timeline.steps),
    }
    resharder.swap_in()
    facts["bit_exact_after_swap_in"] = all(torch.equal(params[n], before[n]) for n in params)
    allocations, pointers = resharder.host.host_allocations, _host_pointers(resharder)
    resharder.reshard(out)
    resharder.swap_in()
    facts["second_iteration_allocations"] = resharder.host.host_allocations - allocations
    facts["host_buffers_reused"] = pointers == _host_pointers(resharder)
    facts["bit_exact_after_second_iteration"] = all(
        torch.equal(params[n], before[n]) for n in params
    )
    return facts


def _gen_owner(name, layouts, model, gen):
    return layouts[name].expert_index // (model.num_experts // gen.ep)


def _host_pointers(resharder) -> list[int]:
    return sorted(b.data_ptr() for b in resharder.host._host.values())


def check_pairs(rank: int, world: int, cases: list) -> list[dict]:
    """Worker for ``run_ranks``: every (model, train, gen) case in one spawn."""
    return [check_pair(rank, model, train, gen) for model, train, gen in cases]
