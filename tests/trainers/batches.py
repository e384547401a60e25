"""Random ``[batch, T]`` inputs whose masks include every padding shape we meet."""

from __future__ import annotations

import torch


def padded_mask(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """Rows cycle through: right padding, left padding, a hole inside, all padding, full."""
    mask = torch.zeros(batch, length, dtype=torch.float64)
    for i in range(batch):
        size = int(torch.randint(1, length + 1, (1,), generator=generator))
        kind = i % 5
        if kind == 0:
            mask[i, :size] = 1
        elif kind == 1:
            mask[i, length - size :] = 1
        elif kind == 2:
            mask[i] = (torch.rand(length, generator=generator) < 0.6).double()
            mask[i, 0] = 1
        elif kind == 4:
            mask[i] = 1
    return mask


def random_inputs(seed: int, batch: int = 10, length: int = 8, count: int = 3):
    """``(mask, [tensor] * count)``, all float64, the tensors standard normal."""
    generator = torch.Generator().manual_seed(seed)
    mask = padded_mask(batch, length, generator)
    tensors = [
        torch.randn(batch, length, generator=generator, dtype=torch.float64) for _ in range(count)
    ]
    return mask, tensors
