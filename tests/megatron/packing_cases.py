"""Run inside spawned ranks by test_packing.py: the same rows scored and trained as plain
right-padded rows and packed (each row a document, or rows sharing a prompt one
document), from the same full weights, in float64."""

from __future__ import annotations

from dataclasses import replace

import torch

from backends.megatron import GPTSpec, MegatronEngine, ParallelSpec, ResponseBatch
from backends.megatron.builder import destroy_parallel
from backends.megatron.sharding import gather_full_state_dict
from tests.megatron.cases import DENSE, MOE, NO_CLIP, named_weights, policy_loss

#: How a micro-batch runs: (pack, share_prompts).
MODES = {"rows": (False, False), "packed": (True, False), "shared": (True, True)}
DENSE64 = replace(DENSE, dtype="float64")


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
    spec: GPTSpec,
    parallel: ParallelSpec,
    share: bool,
    value_head: bool,
    make=grpo_like_batch,
    pack: bool = True,
) -> dict:
    """Scores, then one train step, of the batch ``make`` builds."""
    engine = MegatronEngine(
        spec, parallel, NO_CLIP, value_head=value_head, share_prompts=share, pack=pack
    )
    engine.load_full_state_dict(named_weights(engine.param_layouts()))
    batch = make(spec.vocab_size)
    scored = engine.forward(batch, micro_batch_size=None, with_entropy=not value_head)
    loss = _value_loss if value_head else policy_loss
    metrics = engine.train_step(batch, loss, micro_batch_size=None, with_entropy=not value_head)
    result = {
        "layout": (engine.packs, engine.share_prompts),
        "scored": scored,
        "loss": metrics["loss"],
        "tokens": (metrics["computed_tokens"], metrics["real_tokens"]),
        "grads": gather_full_state_dict(engine.model, grads=True),
    }
    destroy_parallel()
    return result


def in_every_mode(spec: GPTSpec, parallel: ParallelSpec, value_head: bool, **kwargs) -> dict:
    import torch.distributed as dist

    out = {}
    for mode, (pack, share) in MODES.items():
        out[mode] = one_step(spec, parallel, share, value_head, pack=pack, **kwargs)
        dist.barrier()
    return out


def _value_loss(outputs: dict, batch: ResponseBatch, counts=None) -> torch.Tensor:
    return (outputs["values"] - batch.fields["advantages"]) ** 2


def packed_and_plain(rank: int, world: int) -> dict:
    """Every mode, policy and critic, at each layout the world allows: one rank; or TP2
    (sequence parallel: packed rows padded at the tail to a multiple of 2) and PP2. On
    two ranks also the MoE model and the tiny DeepSeek-V3 (MLA: each layer's YaRN rotary
    takes the packed positions) at TP2, policy only."""
    from tests.megatron.deepseek_cases import tiny_spec

    out = {}
    if world == 1:
        out["short"] = in_every_mode(DENSE64, ParallelSpec(), False, make=short_responses_batch)
        layouts = {"one": ParallelSpec()}
    else:
        layouts = {"tp2": ParallelSpec(tp=2), "pp2": ParallelSpec(pp=2)}
        for name, spec in (("moe", MOE), ("deepseek", tiny_spec())):
            out[name] = in_every_mode(replace(spec, dtype="float64"), ParallelSpec(tp=2), False)
    for name, parallel in layouts.items():
        for head in ("policy", "critic"):
            out[name, head] = in_every_mode(DENSE64, parallel, head == "critic")
    return out
