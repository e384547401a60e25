"""A LoRA adapter merged into its weight: ``weight + scale * B @ A``, the one formula the
training engine's merged policy (``backends/megatron/lora.py``) and the generation
engines' hand-over (``backends/generation``) both use, so the two agree bit for bit.

The sum is taken in float32 at least and cast back to the weight's dtype once. Merged
into a 16-bit weight and taken out again each iteration instead, every round trip rounds
twice and the weight drifts from its base (docs/architecture.md §13): a merge always
starts from the base as loaded.
"""

from __future__ import annotations

import torch


def merged_weight(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float
) -> torch.Tensor:
    """``weight + scale * b @ a`` in ``weight``'s dtype, summed in float32 at least, on
    ``a``'s device (``a`` ``[rank, in]``, ``b`` ``[out, rank]``, ``weight`` ``[out, in]``)."""
    wide = torch.promote_types(weight.dtype, torch.float32)
    delta = scale * b.to(a.device, wide) @ a.to(wide)
    return (weight.to(a.device, wide) + delta).to(weight.dtype)
