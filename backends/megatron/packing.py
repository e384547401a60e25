"""A micro-batch as one packed row of documents: no padding between rows, each prompt once.

A :class:`~backends.megatron.batch.ResponseBatch` is right-padded ``prompt_i + response_i``
rows; run as they are, every row computes up to the micro-batch's longest row, and a
group of N responses to one prompt (GRPO's samples) runs that prompt N times, forward and
backward. :func:`pack_micro_batch` lays the micro-batch out as one row instead:

* each *document* is a group of rows that share a prompt (``share_prompts``): the prompt
  once, then each response; or one row, prompt then response. Documents follow each
  other with no padding between them;
* a :class:`~backends.megatron.attention.PackedMask` lets a token see the earlier tokens
  of its own document only, and a response the prompt and its own earlier tokens only;
* each token keeps the position it has in its unpacked row (RoPE rotates by it,
  :func:`rope_at`): a response's positions continue from its prompt's end;
* only the row's tail is padded, to the multiple sequence parallelism needs (TP), and
  the pad is a document of its own that no real token sees.

Every response token therefore gets exactly the hidden states, logits and gradients of
its unpacked row (a prompt's gradient is the sum over its responses, as the unpacked rows'
is), from ``sum(prompts once) + sum(responses)`` positions instead of ``rows x longest row``
(``tests/megatron/test_packing.py`` checks log-probs, entropy, values, loss and every
gradient against plain rows in float64). On SmolLM2's maths task a prompt is ~60 tokens
and a response ~15, so sharing alone saves three quarters of an update's FLOPs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from backends.megatron.attention import PackedMask
from backends.megatron.batch import ResponseBatch


@dataclass(frozen=True)
class PackedRow:
    """A micro-batch of ``B`` rows packed into one row of ``T`` positions.

    Attributes:
        input_ids: ``[1, T]`` the documents, then the tail pad (id 0).
        position_ids: ``[1, T]`` each token's position in its unpacked row (pads: 0).
        mask: who sees whom (:class:`~backends.megatron.attention.PackedMask`).
        logit_positions: ``[1, B * W]``: row ``i`` of the batch owns columns
            ``i * W .. i * W + W - 1``, the outputs that score its response tokens (those
            of ``ResponseBatch.response_window``, moved into the packed row); on a
            context-parallel shard only the :attr:`held` slots' columns, ``[1, held]``.
        width: ``W``, the longest response of the micro-batch (at least 1).
        real_tokens: ``T`` without the tail pad.
        held: ``[1, B * W]`` on a context-parallel shard (:meth:`ContextSplit.shard`):
            True for the slots whose scoring position this rank holds, the slots
            :attr:`logit_positions` lists (the other ranks score the rest); None for a
            whole row.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: PackedMask
    logit_positions: torch.Tensor
    width: int
    real_tokens: int
    held: torch.Tensor | None = None

    def unpack(self, per_slot: torch.Tensor) -> torch.Tensor:
        """Outputs ``[1, B * W, ...]`` at :attr:`logit_positions` -> ``[B, W, ...]``."""
        return per_slot.reshape(-1, self.width, *per_slot.shape[2:])


def prompt_groups(batch: ResponseBatch) -> list[list[int]]:
    """The batch's rows grouped by identical prompt, each group in row order, groups in
    the order of their first row."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, start in enumerate(batch.response_start.tolist()):
        groups.setdefault(tuple(batch.input_ids[row, :start].tolist()), []).append(row)
    return list(groups.values())


class _Builder:
    """Appends tokens to the packed row: ids, positions, document and member of each."""

    def __init__(self) -> None:
        self.ids: list[torch.Tensor] = []
        self.positions: list[torch.Tensor] = []
        self.documents: list[torch.Tensor] = []
        self.members: list[torch.Tensor] = []
        self.length = 0

    def add(self, ids: torch.Tensor, first_position: int, document: int, member: int) -> int:
        """Append ``ids`` at positions ``first_position ..``; where they start in the row."""
        n, start = len(ids), self.length
        self.ids.append(ids)
        self.positions.append(torch.arange(first_position, first_position + n))
        self.documents.append(torch.full((n,), document))
        self.members.append(torch.full((n,), member))
        self.length += n
        return start

    def row(self) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.cat(parts).unsqueeze(0)
            for parts in (self.ids, self.positions, self.documents, self.members)
        )


def pack_micro_batch(
    batch: ResponseBatch, share_prompts: bool, multiple: int = 1, length: int = 0
) -> PackedRow:
    """The micro-batch as one packed row (module docstring), its length padded at the
    tail to a multiple of ``multiple`` and to at least ``length`` (itself a multiple);
    rows that share a prompt share one document when ``share_prompts``, else every row is
    a document of its own."""
    groups = prompt_groups(batch) if share_prompts else [[row] for row in range(len(batch))]
    starts, lengths = batch.response_start.tolist(), batch.response_len.tolist()
    width = max(max(lengths, default=0), 1)  # W, as response_window's
    ids = batch.input_ids.cpu()
    built = _Builder()
    scoring = torch.zeros(len(batch), width, dtype=torch.long)
    for document, group in enumerate(groups):
        prompt = starts[group[0]]
        prompt_end = built.add(ids[group[0], :prompt], 0, document, 0) + prompt
        shared = len(group) > 1  # a lone row's response sees its prompt causally anyway
        for index, row in enumerate(group):
            n = lengths[row]
            at = built.add(ids[row, prompt : prompt + n], prompt, document, index + shared)
            # Token j is scored by the output before it: the prompt's last for j = 0.
            scored_by = torch.tensor([prompt_end - 1, *range(at, at + n - 1)])
            scoring[row] = scored_by[-1]  # columns past the response: masked later
            scoring[row, : len(scored_by)] = scored_by[:width]
    real = built.length
    # Sequence parallelism splits the row evenly over TP ranks; ``length``: other ranks'.
    pad = max(-real % multiple, length - real)
    if pad:
        built.add(torch.zeros(pad, dtype=ids.dtype), 0, len(groups), 0)
    input_ids, positions, documents, members = built.row()
    device = batch.input_ids.device
    return PackedRow(
        input_ids.to(device),
        positions.to(device),
        PackedMask.of(documents, members).to(device),
        scoring.reshape(1, -1).to(device),
        width,
        real,
    )


@dataclass(frozen=True)
class ContextSplit:
    """How a packed row is split over the ``size`` ranks of a context-parallel group.

    The row is built whole first (mask, each token's position in its document, the
    positions that score each response token: labels shift on the whole row, so a token
    scored by the previous shard's last output is scored there), then each rank keeps its
    own positions (:func:`~backends.megatron.attention.context_parallel_positions`:
    contiguous for Ulysses, ``2 * size`` balanced chunks for the K / V gather).

    Attributes:
        size: ranks of the CP group.
        rank: this rank's index in it.
        balanced: the K / V all-gather's chunks (the kv heads do not divide over ``size``).
    """

    size: int
    rank: int
    balanced: bool

    @property
    def parts(self) -> int:
        """Equal parts the row is cut into (what its length must be a multiple of)."""
        return 2 * self.size if self.balanced else self.size

    def shard(self, row: PackedRow) -> PackedRow:
        """This rank's positions of ``row``: ids, positions and scoring slots; the mask
        stays the whole row's (the attention needs every token's document)."""
        from backends.megatron.attention import context_parallel_positions

        length = row.input_ids.shape[1]
        positions = context_parallel_positions(length, self.size, self.rank, self.balanced)
        positions = positions.to(row.input_ids.device)
        local = torch.full((length,), -1, dtype=torch.long, device=positions.device)
        local[positions] = torch.arange(len(positions), device=positions.device)
        at = local[row.logit_positions]
        held = at >= 0
        return PackedRow(
            row.input_ids[:, positions],
            row.position_ids[:, positions],
            row.mask,
            at[held].unsqueeze(0),  # logits only where this rank scores: they divide by cp
            row.width,
            row.real_tokens,
            held=held,
        )


@contextlib.contextmanager
def rope_at(model: nn.Module, position_ids: torch.Tensor | None) -> Iterator[None]:
    """While active, every rotary embedding of ``model`` rotates token ``(b, s)`` by
    ``position_ids[b, s]`` instead of by ``s``.

    Megatron's ``GPTModel`` reads ``position_ids`` only for learned position embeddings;
    RoPE takes positions ``0 .. s-1`` from a ``RotaryEmbedding`` (``[s, 1, 1, d]``
    frequencies, shared by the batch): the model's own, or one per multi-latent attention
    layer, whose YaRN variant returns ``(frequencies, mscale)``. The hook picks each token's
    row of those frequencies, ``[s, b, 1, d]``, which Megatron's unfused RoPE broadcasts
    over heads as it broadcast the shared ones over the batch. No-op for ``None``.
    """
    rotaries = _rotary_embeddings(model)
    if position_ids is None or not rotaries:
        yield
        return
    index = position_ids.t().contiguous()  # [s, b]
    # A context-parallel shard's positions run past its own length: the frequencies must
    # reach the largest position, not the shard's length Megatron asks for.
    needed = int(position_ids.max()) + 1

    def long_enough(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (max(args[0], needed), *args[1:]), kwargs
        return args, {**kwargs, "max_seq_len": max(kwargs["max_seq_len"], needed)}

    def per_token(module: nn.Module, args: tuple, output):
        freqs, *rest = output if isinstance(output, tuple) else (output,)
        freqs = freqs[:, 0, 0, :][index.to(freqs.device)].unsqueeze(2)
        return (freqs, *rest) if isinstance(output, tuple) else freqs

    handles = [rotary.register_forward_hook(per_token) for rotary in rotaries]
    handles += [
        rotary.register_forward_pre_hook(long_enough, with_kwargs=True) for rotary in rotaries
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _rotary_embeddings(model: nn.Module) -> list[nn.Module]:
    """Every Megatron ``RotaryEmbedding`` (YaRN's included) inside ``model``."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    return [module for module in model.modules() if isinstance(module, RotaryEmbedding)]
