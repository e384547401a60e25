"""One forward over a prompt shared by several responses (GRPO's N samples of a prompt).

A :class:`~backends.megatron.batch.ResponseBatch` row is ``prompt_i + response_i``, so a
group of N responses to one prompt runs that prompt N times, forward and backward. On
SmolLM2's maths task a prompt is ~60 tokens and a response ~15: three quarters of every
update's FLOPs recompute prompts. Here the rows of a micro-batch that share a prompt become
one packed row ``prompt + response_1 + ... + response_n`` where

* each response token attends to the prompt and to the earlier tokens of its own response
  only (an explicit attention mask instead of the causal one), and
* each response's positions restart where the prompt ends (RoPE sees the positions the
  unpacked row has: :func:`rope_at`),

so every response token gets exactly the hidden states, logits and gradients of its
unpacked row (the prompt's gradient is the sum over its responses, as the unpacked rows'
is), from ``len(prompt) + sum(len(responses))`` tokens instead of ``n * len(prompt) +
sum(len(responses))``. ``tests/megatron/test_shared_prompt.py`` checks log-probs and
gradients against the unpacked rows in float64.

It needs an attention that takes an arbitrary mask: the torch core attention
(``attention.py``, every device without TransformerEngine; ``MegatronEngine`` decides).
TransformerEngine's fused kernels are built for the causal mask type and would not apply
this one, so accelerators with TE run unpacked rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from backends.megatron.batch import ResponseBatch


@dataclass(frozen=True)
class SharedPrompts:
    """A micro-batch's rows packed by prompt: ``P`` packed rows of ``S`` tokens, up to
    ``M`` members (responses) each, ``W`` response columns per member.

    Attributes:
        input_ids: ``[P, S]`` the prompt, then each member's response, right-padded with 0.
        position_ids: ``[P, S]`` each token's position in its unpacked row (pads: 0).
        attention_mask: ``[P, 1, S, S]`` True where a query must not see a key
            (Megatron's convention).
        logit_positions: ``[P, M * W]``: member slot ``m`` of a packed row owns columns
            ``m * W .. m * W + W - 1``, the outputs that score its response tokens (those
            of ``ResponseBatch.response_window``, moved into the packed row).
        member_slots: ``[B]`` for each row of the original batch, its slot among the
            ``P * M`` (packed row * M + member).
        members: ``M``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    logit_positions: torch.Tensor
    member_slots: torch.Tensor
    members: int

    def unpack(self, per_slot: torch.Tensor) -> torch.Tensor:
        """Outputs ``[P, M * W, ...]`` at :attr:`logit_positions` -> the batch's
        ``[B, W, ...]`` (row order of the original batch)."""
        packed, columns = per_slot.shape[:2]
        by_slot = per_slot.reshape(
            packed * self.members, columns // self.members, *per_slot.shape[2:]
        )
        return by_slot.index_select(0, self.member_slots.to(per_slot.device))


def prompt_groups(batch: ResponseBatch) -> list[list[int]]:
    """The batch's rows grouped by identical prompt, each group in row order, groups in
    the order of their first row."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, start in enumerate(batch.response_start.tolist()):
        groups.setdefault(tuple(batch.input_ids[row, :start].tolist()), []).append(row)
    return list(groups.values())


def pack_shared_prompts(batch: ResponseBatch) -> SharedPrompts | None:
    """The batch packed by prompt (module docstring); None when no two rows share one,
    so the caller runs the plain rows and pays nothing."""
    groups = prompt_groups(batch)
    if len(groups) == len(batch):
        return None
    lengths = batch.response_len.tolist()
    starts = batch.response_start.tolist()
    width = max(int(batch.response_len.max()), 1)  # W, as response_window's
    members = max(len(g) for g in groups)
    packed_len = max(starts[g[0]] + sum(lengths[r] for r in g) for g in groups)
    ids = torch.zeros(len(groups), packed_len, dtype=batch.input_ids.dtype)
    positions = torch.zeros(len(groups), packed_len, dtype=torch.long)
    segment = torch.full((len(groups), packed_len), -1, dtype=torch.long)  # -1: pad
    logit_positions = torch.zeros(len(groups), members * width, dtype=torch.long)
    member_slots = torch.zeros(len(batch), dtype=torch.long)
    for p, group in enumerate(groups):
        prompt_len = starts[group[0]]
        ids[p, :prompt_len] = batch.input_ids[group[0], :prompt_len]
        positions[p, :prompt_len] = torch.arange(prompt_len)
        segment[p, :prompt_len] = 0
        offset = prompt_len
        for m, row in enumerate(group):
            n = lengths[row]
            ids[p, offset : offset + n] = batch.input_ids[row, prompt_len : prompt_len + n]
            positions[p, offset : offset + n] = torch.arange(prompt_len, prompt_len + n)
            segment[p, offset : offset + n] = m + 1
            # Token j is scored by the output before it: the prompt's last token for j = 0.
            scoring = [prompt_len - 1, *range(offset, offset + n - 1)]
            scoring += [scoring[-1]] * (width - len(scoring))  # past the response: masked
            logit_positions[p, m * width : (m + 1) * width] = torch.tensor(scoring[:width])
            member_slots[row] = p * members + m
            offset += n
    return SharedPrompts(
        ids.to(batch.input_ids.device),
        positions.to(batch.input_ids.device),
        _segment_mask(segment).to(batch.input_ids.device),
        logit_positions.to(batch.input_ids.device),
        member_slots,
        members,
    )


def _segment_mask(segment: torch.Tensor) -> torch.Tensor:
    """``[P, 1, S, S]``, True = hidden: a query sees earlier keys of the prompt
    (segment 0) or of its own response; a pad sees only itself (a softmax row with no
    key at all would be undefined)."""
    length = segment.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    query, key = segment.unsqueeze(2), segment.unsqueeze(1)
    visible = causal & ((key == 0) | (key == query)) & (key >= 0)
    visible |= torch.eye(length, dtype=torch.bool)
    return (~visible).unsqueeze(1)


def pad_packed(packed: SharedPrompts, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids and mask for ``input_ids`` right-padded to ``length`` (sequence
    parallelism pads to a multiple of TP): new pads sit at position 0 and see only
    themselves."""
    pad = length - packed.position_ids.shape[1]
    if pad == 0:
        return packed.position_ids, packed.attention_mask
    positions = nn.functional.pad(packed.position_ids, (0, pad))
    mask = nn.functional.pad(packed.attention_mask, (0, pad, 0, pad), value=True)
    diagonal = torch.arange(length, device=mask.device)
    mask[:, :, diagonal, diagonal] = False
    return positions, mask


@contextlib.contextmanager
def rope_at(model: nn.Module, position_ids: torch.Tensor | None) -> Iterator[None]:
    """While active, ``model``'s rotary embedding rotates token ``(b, s)`` by
    ``position_ids[b, s]`` instead of by ``s``.

    Megatron's ``GPTModel`` reads ``position_ids`` only for learned position embeddings;
    RoPE takes positions ``0 .. s-1`` from its ``RotaryEmbedding`` (``[s, 1, 1, d]``
    frequencies, shared by the batch). The hook picks each token's row of those
    frequencies, ``[s, b, 1, d]``, which Megatron's unfused RoPE broadcasts over heads
    as it broadcast the shared ones over the batch. No-op for ``None``.
    """
    rotary = _rotary_of(model)
    if position_ids is None or rotary is None:
        yield
        return
    index = position_ids.t().contiguous()  # [s, b]

    def per_token(module: nn.Module, args: tuple, freqs: torch.Tensor) -> torch.Tensor:
        return freqs[:, 0, 0, :][index.to(freqs.device)].unsqueeze(2)

    handle = rotary.register_forward_hook(per_token)
    try:
        yield
    finally:
        handle.remove()


def _rotary_of(model: nn.Module) -> nn.Module | None:
    """The (wrapped) GPTModel's ``RotaryEmbedding``; None if it has none."""
    while not hasattr(model, "rotary_pos_emb") and hasattr(model, "module"):
        model = model.module
    return getattr(model, "rotary_pos_emb", None)
