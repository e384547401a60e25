"""Run inside spawned ranks by test_shared_prompt.py: the same rows trained with and
without packing by prompt, from the same full weights."""

from __future__ import annotations

import torch

from backends.megatron import GPTSpec, MegatronEngine, ParallelSpec, ResponseBatch
from backends.megatron.builder import destroy_parallel
from backends.megatron.sharding import gather_full_state_dict
from tests.megatron.cases import DENSE, NO_CLIP, named_weights, policy_loss


def grpo_like_batch(vocab: int) -> ResponseBatch:
    """Prompt A (5 tokens) x 3 responses of 4, 2 and 3 tokens, prompt B (3 tokens) x 2
    responses of 1 and 4 tokens, and a lone prompt C (4 tokens) with 2; rows interleaved
    so that groups are not contiguous."""
    gen = torch.Generator().manual_seed(11)
    a, b, c = (torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (5, 3, 4))
    return _batch([(a, 4), (b, 1), (a, 2), (c, 2), (b, 4), (a, 3)], vocab, gen)


def short_responses_batch(vocab: int) -> ResponseBatch:
    """A 2-token prompt x 5 responses of 1, 1, 3, 1, 1 tokens: the packed row (9 tokens)
    is shorter than its members' score columns (5 x 3), as on the tiny recipe."""
    gen = torch.Generator().manual_seed(12)
    prompt = torch.randint(1, vocab, (2,), generator=gen).tolist()
    return _batch([(prompt, n) for n in (1, 1, 3, 1, 1)], vocab, gen)


def _batch(rows: list[tuple[list[int], int]], vocab: int, gen: torch.Generator) -> ResponseBatch:
    """Rows of (prompt, response length) with random response tokens and advantages."""
    width = max(n for _, n in rows)
    length = max(len(p) + width for p, _ in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    for i, (prompt, n) in enumerate(rows):
        row = prompt + torch.randint(1, vocab, (n,), generator=gen).tolist()
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, :n] = 1.0
    start = torch.tensor([len(p) for p, _ in rows])
    advantages = torch.randn(len(rows), width, generator=gen)
    return ResponseBatch(ids, start, mask, {"advantages": advantages})


def one_step(
    spec: GPTSpec, parallel: ParallelSpec, share: bool, value_head: bool, make=grpo_like_batch
) -> dict:
    """Scores, then one train step, of the batch ``make`` builds."""
    engine = MegatronEngine(spec, parallel, NO_CLIP, value_head=value_head, share_prompts=share)
    engine.load_full_state_dict(named_weights(engine.param_layouts()))
    batch = make(spec.vocab_size)
    scored = engine.forward(batch, micro_batch_size=None, with_entropy=not value_head)
    loss = _value_loss if value_head else policy_loss
    metrics = engine.train_step(batch, loss, micro_batch_size=None, with_entropy=not value_head)
    result = {
        "shares": engine.share_prompts,
        "scored": scored,
        "loss": metrics["loss"],
        "tokens": (metrics["computed_tokens"], metrics["real_tokens"]),
        "grads": gather_full_state_dict(engine.model, grads=True),
    }
    destroy_parallel()
    return result


def _value_loss(outputs: dict, batch: ResponseBatch, counts=None) -> torch.Tensor:
    return (outputs["values"] - batch.fields["advantages"]) ** 2


def packed_and_plain(rank: int, world: int) -> dict:
    """Both ways, policy and critic, at each layout the world allows: one rank; or TP2
    (sequence parallel: the packed rows are padded to a multiple of 2) and PP2."""
    import torch.distributed as dist

    layouts = (
        {"one": ParallelSpec()}
        if world == 1
        else {"tp2": ParallelSpec(tp=2), "pp2": ParallelSpec(pp=2)}
    )
    out = {}
    if world == 1:
        for share in (True, False):
            out["short", "policy", share] = one_step(
                DENSE, ParallelSpec(), share, False, short_responses_batch
            )
    for name, parallel in layouts.items():
        for head in ("policy", "critic"):
            for share in (True, False):
                out[name, head, share] = one_step(DENSE, parallel, share, head == "critic")
                dist.barrier()
    return out
