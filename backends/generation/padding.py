"""Left padding of token rows, the one layout both transformers decode paths feed the
model (``generate``'s own rule): every row's next token sits in the last column."""

from __future__ import annotations

import torch

#: Left-padding id; any valid id works since padded positions are masked out.
PAD_ID = 0


def left_padded(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows right-aligned in one ``[rows, longest]`` tensor with their attention mask
    (pads on the left, so every row's next token is the last column), on ``device``."""
    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, longest - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, longest - len(row) :] = 1
    return ids.to(device), mask.to(device)
