"""Prompt + response rows as the training engine wants them.

The dock stores prompts and responses unpadded; the engine takes right-padded
``input_ids [B, S]`` where row ``i`` is ``prompt_i + response_i``, and where each
response starts, and computes on neither that padding nor any between rows: it packs
each micro-batch into one row of documents (``backends/megatron/packing.py``). Per-token
RL fields (log-probs, advantages, values) live in the dock and in the engine
*response-aligned*, ``[B, R]`` with column ``j`` the ``j``-th response token
(``backends.megatron.batch.ResponseBatch``).
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
    """Right-padded ``input_ids [B, S]`` and where each row's response starts.

    Args:
        prompt_ids: ``[B, P]`` right-padded prompts; ``prompt_len`` ``[B]`` their lengths.
        response_ids: ``[B, R]`` right-padded responses; ``response_len`` ``[B]``.
        pad_id: id written into the padding.

    Returns:
        ``input_ids`` and ``response_start`` ``[B]`` (= ``prompt_len``).
    """
    batch = prompt_ids.shape[0]
    width = int((prompt_len + response_len).max()) if batch else 0
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    for row in range(batch):
        p, r = int(prompt_len[row]), int(response_len[row])
        input_ids[row, :p] = prompt_ids[row, :p]
        input_ids[row, p : p + r] = response_ids[row, :r]
    return {"input_ids": input_ids, "response_start": prompt_len.long()}


def response_mask(response_len: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, width]`` float mask, 1 on the first ``response_len[i]`` tokens of row ``i``."""
    return (torch.arange(width).unsqueeze(0) < response_len.unsqueeze(1)).float()


def unpadded(rows: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
    """The first ``lengths[i]`` entries of each row (what the dock stores)."""
    return [rows[i, : int(lengths[i])] for i in range(rows.shape[0])]


def loss_mask(
    response_len: torch.Tensor, width: int, trajectory_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, width]`` float mask of the tokens a loss counts: the response tokens, and of
    a multi-turn trajectory only the model's (``trajectory_mask``, the dock's ``loss_mask``:
    0 on the environment's observations)."""
    mask = response_mask(response_len, width)
    if trajectory_mask is None:
        return mask
    return mask * trajectory_mask[:, :width].float()


def last_counted(mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` column of each row's last counted token, where its sequence reward goes: the
    response's last token (a trajectory ends with a model token); 0 for an empty row."""
    columns = torch.arange(mask.shape[1], device=mask.device)
    return (
        torch.where(mask > 0, columns, 0).amax(1)
        if mask.shape[1]
        else mask.new_zeros(mask.shape[0], dtype=torch.long)
    )
