"""Run inside spawned ranks by test_context_parallel.py: a packed row split over context-
parallel ranks scores and trains like the whole row on one rank, in float64."""

from __future__ import annotations

import torch
import torch.distributed as dist

from backends.megatron.attention import (
    PackedMask,
    attend,
    context_parallel_attention,
    context_parallel_positions,
    ulysses_divides,
)

#: A shared-prompt group (prompt 3, responses 4 and 2), a plain document of 10, a shared
#: group (prompt 2, responses 1 and 1) and a 1-token pad: 24 positions, so at cp 2 and 4
#: (contiguous or 2 * cp chunks) documents cross every shard boundary.
ROW_DOCUMENTS = [0] * 9 + [1] * 10 + [2] * 4 + [3]
ROW_MEMBERS = [0, 0, 0, 1, 1, 1, 1, 2, 2] + [0] * 10 + [0, 0, 1, 2] + [0]
HEADS, WIDTH = 4, 8


def crossing_mask() -> PackedMask:
    return PackedMask.of(torch.tensor([ROW_DOCUMENTS]), torch.tensor([ROW_MEMBERS]))


def attention_shards(rank: int, world: int, kv_heads: int) -> dict:
    """This CP rank's attention output and q / k / v grads at its positions, and the whole
    row's on one rank (the reference), for ``kv_heads`` key / value heads."""
    mask, length = crossing_mask(), len(ROW_DOCUMENTS)
    gen = torch.Generator().manual_seed(5)
    shapes = [(length, 1, HEADS, WIDTH)] + [(length, 1, kv_heads, WIDTH)] * 2
    whole = [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in shapes]
    upstream = torch.randn(length, 1, HEADS, WIDTH, generator=gen, dtype=torch.float64)

    leaves = [t.clone().requires_grad_() for t in whole]
    out = attend(*(t.permute(1, 2, 0, 3) for t in leaves), mask, WIDTH**-0.5).permute(2, 0, 1, 3)
    out.backward(upstream)
    reference = {"out": out.detach(), "grads": [t.grad for t in leaves]}

    balanced = not ulysses_divides(kv_heads, world)
    positions = context_parallel_positions(length, world, rank, balanced)
    shards = [t[positions].clone().requires_grad_() for t in whole]
    out = context_parallel_attention(*shards, mask, WIDTH**-0.5, dist.group.WORLD)
    out.backward(upstream[positions])
    return {
        "positions": positions,
        "out": out.detach(),
        "grads": [t.grad for t in shards],
        "reference": reference,
    }


def attention_on_cp_ranks(rank: int, world: int) -> dict:
    """Ulysses (kv heads divide over the ranks) and the K / V gather (they do not)."""
    kv_choices = {2: (2, 1), 4: (4, 2)}[world]
    return {kv: attention_shards(rank, world, kv) for kv in kv_choices}


# ---- the engine ---------------------------------------------------------------------------

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _aggregated(mode: str):
    """A clipped-ratio policy loss with an entropy bonus, aggregated as ``mode`` over the
    global counts (what the algorithms hand the engine)."""
    from trainers.core import aggregate_loss

    def loss_fn(outputs: dict, batch, counts) -> torch.Tensor:
        per_token = -outputs["logprobs"].exp() * batch.fields["advantages"]
        per_token = per_token - 0.01 * outputs["entropy"]
        mask = batch.response_mask
        return aggregate_loss(per_token, mask, mode, counts.tokens, num_seqs=counts.sequences)

    return loss_fn


def _value_loss(outputs: dict, batch, counts) -> torch.Tensor:
    return (outputs["values"] - batch.fields["advantages"]) ** 2


def long_prompt_batch(vocab: int):
    """One 20-token prompt with a 3-token response: at cp 2 the first shard holds no
    position that scores a response token."""
    from tests.megatron.packing_cases import _batch

    gen = torch.Generator().manual_seed(13)
    return _batch([(torch.randint(1, vocab, (20,), generator=gen).tolist(), 3)], vocab, gen)


def engine_steps(spec, parallel, value_head: bool = False, long_prompt: bool = True) -> dict:
    """One engine: scores of a GRPO-like batch (documents crossing every shard boundary),
    then one train step per aggregation mode (a critic: one value step), each with its
    loss, grad norm and full grads; then (``long_prompt``) the same of a long prompt, whose
    first cp 2 shard scores nothing; the weights after the last step."""
    from backends.megatron import MegatronEngine, OptimSpec
    from backends.megatron.builder import destroy_parallel
    from backends.megatron.sharding import gather_full_state_dict
    from tests.megatron.cases import full_weights_for, named_weights
    from tests.megatron.packing_cases import grpo_like_batch

    # A pipeline stage holds only its own layers: the full names come from a one-stage model.
    full = full_weights_for(spec) if parallel.pp > 1 else None
    engine = MegatronEngine(spec, parallel, OptimSpec(lr=1e-3, clip_grad=0.0), value_head)
    engine.load_full_state_dict(full or named_weights(engine.param_layouts()))
    losses = {"value": _value_loss} if value_head else {m: _aggregated(m) for m in AGG_MODES}
    batches = {"grpo": grpo_like_batch, "long_prompt": long_prompt_batch}
    result = {"dp": (engine.data_parallel_rank(), engine.data_parallel_size())}
    for name, make in batches.items() if long_prompt else [("grpo", grpo_like_batch)]:
        batch = make(spec.vocab_size)
        result[name] = {"scored": engine.forward(batch, with_entropy=not value_head)}
        for mode, loss_fn in losses.items():
            metrics = engine.train_step(batch, loss_fn, with_entropy=not value_head)
            result[name][mode] = {
                "loss": metrics["loss"],
                "grad_norm": metrics["grad_norm"],
                "tokens": (metrics["computed_tokens"], metrics["real_tokens"]),
                "grads": gather_full_state_dict(engine.model, grads=True),
            }
    result["weights"] = engine.full_state_dict()
    destroy_parallel()
    dist.barrier()
    return result


def _specs() -> dict:
    from dataclasses import replace

    from tests.megatron.cases import DENSE, MOE

    return {"dense": replace(DENSE, dtype="float64"), "moe": replace(MOE, dtype="float64")}


def engine_scenarios(parallel, critic: bool = True) -> dict:
    """Policy (and critic) at ``parallel`` (dense GQA: 4 heads, 2 kv heads)."""
    dense = _specs()["dense"]
    out = {"policy": engine_steps(dense, parallel)}
    if critic:
        out["critic"] = engine_steps(dense, parallel, value_head=True, long_prompt=False)
    return out


def reference_on_one_rank(rank: int, world: int) -> dict:
    from backends.megatron import ParallelSpec

    return {
        "dense": engine_scenarios(ParallelSpec()),
        "moe": engine_steps(_specs()["moe"], ParallelSpec(), long_prompt=False),
    }


def on_two_ranks(rank: int, world: int) -> dict:
    """The attention at cp 2; the engine at tp1 cp2 (Ulysses), MoE at ep2 cp2, and tp2 at
    cp 1 (the reference of tp2 cp2: TP alone is not float64-exact against one rank)."""
    from backends.megatron import ParallelSpec

    return {
        "attention": attention_on_cp_ranks(rank, world),
        "cp2": engine_scenarios(ParallelSpec(cp=2)),
        "moe_ep2_cp2": engine_steps(_specs()["moe"], ParallelSpec(cp=2, ep=2), long_prompt=False),
        "tp2": engine_scenarios(ParallelSpec(tp=2), critic=False),
    }


def on_four_ranks(rank: int, world: int) -> dict:
    """The attention at cp 4; the engine at tp1 cp4 and tp2 cp2 (both the K / V gather:
    2 kv heads), pp2 cp2 (Ulysses)."""
    from backends.megatron import ParallelSpec

    return {
        "attention": attention_on_cp_ranks(rank, world),
        "cp4": engine_scenarios(ParallelSpec(cp=4), critic=False),  # cp2 runs the critic
        "tp2_cp2": engine_scenarios(ParallelSpec(tp=2, cp=2), critic=False),
        "pp2_cp2": engine_scenarios(ParallelSpec(pp=2, cp=2), critic=False),
    }
