"""Prompt + response rows as the training engine wants them, and back.

The dock stores prompts and responses unpadded; the engine takes right-padded
``input_ids [B, S]`` where row ``i`` is ``prompt_i + response_i``. Per-token RL fields
(log-probs, advantages, values) live in the dock *response-aligned*, ``[B, R]`` with
column ``j`` the ``j``-th response token. ``logprobs[:, t]`` of the engine scores token
``t`` given ``[:t]``, so response token ``j`` of row ``i`` sits at position
``prompt_len_i + j``.
"""

from __future__ import annotations

import torch


def pack_rows(
    prompt_ids: torch.Tensor,
    prompt_len: torch.Tensor,
    response_ids: torch.Tensor,
    response_len: torch.Tensor,
    pad_id: int = 0,
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids [B, S]`` and ``loss_mask [B, S]`` (1 on response tokens).

    Args:
        prompt_ids: ``[B, P]`` right-padded prompts; ``prompt_len`` ``[B]`` their lengths.
        response_ids: ``[B, R]`` right-padded responses; ``response_len`` ``[B]``.
        pad_id: id written into the padding.

    Returns:
        ``input_ids``, ``loss_mask`` and ``response_start`` ``[B]`` (= ``prompt_len``).
    """
    batch = prompt_ids.shape[0]
    width = int((prompt_len + response_len).max()) if batch else 0
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(batch, width)
    for row in range(batch):
        p, r = int(prompt_len[row]), int(response_len[row])
        input_ids[row, :p] = prompt_ids[row, :p]
        input_ids[row, p : p + r] = response_ids[row, :r]
        loss_mask[row, p : p + r] = 1.0
    return {"input_ids": input_ids, "loss_mask": loss_mask, "response_start": prompt_len.long()}


def response_columns(response_start: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, width]`` positions of each response token in its packed row (clamped)."""
    return response_start.unsqueeze(1) + torch.arange(width, device=response_start.device)


def to_response_aligned(
    per_position: torch.Tensor, response_start: torch.Tensor, width: int
) -> torch.Tensor:
    """``[B, S]`` (packed positions) -> ``[B, width]`` (response tokens); pads read as 0."""
    columns = response_columns(response_start, width)
    inside = columns < per_position.shape[1]
    gathered = per_position.gather(1, columns.clamp(max=per_position.shape[1] - 1))
    return gathered * inside


def response_mask(response_len: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, width]`` float mask, 1 on the first ``response_len[i]`` tokens of row ``i``."""
    return (torch.arange(width).unsqueeze(0) < response_len.unsqueeze(1)).float()


def unpadded(rows: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    """The first ``lengths[i]`` entries of each row (what the dock stores)."""
    return [rows[i, : int(lengths[i])] for i in range(rows.shape[0])]
