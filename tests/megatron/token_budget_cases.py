"""Run inside spawned ranks by test_token_budget.py: the same rows scored and trained with
micro-batches of a fixed row count and with a token budget, from the same full weights,
in float64."""

from __future__ import annotations

from dataclasses import replace

import torch

from backends.megatron import MegatronEngine, MicroBatching, ParallelSpec, ResponseBatch
from backends.megatron.builder import destroy_parallel
from backends.megatron.sharding import gather_full_state_dict
from tests.megatron.cases import DENSE, NO_CLIP, named_weights, policy_loss

DENSE64 = replace(DENSE, dtype="float64")
#: Packed tokens per micro-batch: cuts :func:`groups_batch`'s 7-response group in two.
BUDGET = MicroBatching(size=2, max_tokens=24)  # the budget wins over size
ROWS = 2


def groups_batch(vocab: int, seed: int) -> ResponseBatch:
    """Three GRPO groups (prompts of 6, 3 and 4 tokens with 7, 3 and 2 responses of 1 to 6
    tokens), rows shuffled so no group is contiguous, random advantages."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (6, 3, 4)]
    members = [prompts[0]] * 7 + [prompts[1]] * 3 + [prompts[2]] * 2
    order = torch.randperm(len(members), generator=gen).tolist()
    rows = [(members[i], int(torch.randint(1, 7, (), generator=gen))) for i in order]
    width = max(n for _, n in rows)
    ids = torch.zeros(len(rows), max(len(p) for p, _ in rows) + width, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    for i, (prompt, n) in enumerate(rows):
        ids[i, : len(prompt) + n] = torch.tensor(
            prompt + torch.randint(1, vocab, (n,), generator=gen).tolist()
        )
        mask[i, :n] = 1.0
    start = torch.tensor([len(p) for p, _ in rows])
    advantages = torch.randn(len(rows), width, generator=gen)
    return ResponseBatch(ids, start, mask, {"advantages": advantages})


def sequence_mean_loss(outputs: dict, batch: ResponseBatch, counts) -> torch.Tensor:
    """A scalar loss: each row's token mean, summed and divided by the global row count."""
    per_token = policy_loss(outputs, batch) * batch.response_mask
    per_row = per_token.sum(1) / batch.response_mask.sum(1).clamp(min=1)
    return per_row.sum() / counts.sequences


def steps(
    parallel: ParallelSpec, value_head: bool, losses: dict, pack: bool = True, budget=BUDGET
) -> dict:
    """Scores, then one train step, of this data-parallel rank's batch with each loss of
    ``losses`` and each plan, every step from the same weights (``pack=False``: the
    right-padded rows TransformerEngine's attention takes)."""
    engine = MegatronEngine(DENSE64, parallel, NO_CLIP, value_head=value_head, pack=pack)
    batch = groups_batch(DENSE64.vocab_size, seed=20 + engine.data_parallel_rank())
    out = {}
    for name, loss_fn in losses.items():
        for plan in (ROWS, budget):
            engine.load_full_state_dict(named_weights(engine.param_layouts()))
            scored = engine.forward(batch, plan, with_entropy=not value_head)
            metrics = engine.train_step(batch, loss_fn, plan, with_entropy=not value_head)
            out[name, plan == budget] = {
                "scored": scored,
                "loss": metrics["loss"],
                "grad_norm": metrics["grad_norm"],
                "grads": gather_full_state_dict(engine.model, grads=True),
                "micro_batches": len(engine._micro_batch_rows(batch, MicroBatching.of(plan))),
            }
    destroy_parallel()
    return out


def value_loss(outputs: dict, batch: ResponseBatch, counts=None) -> torch.Tensor:
    return (outputs["values"] - batch.fields["advantages"]) ** 2


def budget_and_rows(rank: int, world: int) -> dict:
    """Each case with ``ROWS`` rows per micro-batch and with ``BUDGET``: two
    data-parallel ranks (policy with a per-token and a scalar loss, critic, right-padded
    rows) and a two-stage pipeline."""
    import torch.distributed as dist

    out = steps(ParallelSpec(), False, {"dp2": policy_loss, "dp2_scalar": sequence_mean_loss})
    dist.barrier()
    out |= steps(ParallelSpec(), True, {"dp2_critic": value_loss})
    dist.barrier()
    # Padded rows run at the batch's width (at most 12): three or more to 36 tokens.
    padded = MicroBatching(max_tokens=36)
    out |= steps(ParallelSpec(), False, {"dp2_padded": policy_loss}, pack=False, budget=padded)
    dist.barrier()
    return out | steps(ParallelSpec(pp=2), False, {"pp2": policy_loss})
