"""Slice rules: which rows/columns of a full parameter a training or generation rank holds.

Along the partition dim a full tensor is ``fused_pieces`` equal pieces; each piece is
split into ``parts`` contiguous chunks and rank ``i`` holds chunk ``i`` of every piece,
concatenated (``fused_pieces = 1`` for plain column/row/vocab parameters; Megatron's
qkv is already group-contiguous, so a contiguous split by query groups is right).
Replicated parameters are whole on every rank. Expert parameters use the expert split
(ETP) and are held only by the ranks that own their expert.
"""

from __future__ import annotations

import torch

from backends.layout import ParamLayout


def shard_shape(layout: ParamLayout, parts: int) -> tuple[int, ...]:
    """Shape of one of ``parts`` shards of the full parameter."""
    shape = list(layout.full_shape)
    if layout.partition_dim is not None:
        shape[layout.partition_dim] //= parts
    return tuple(shape)


def take_shard(full: torch.Tensor, layout: ParamLayout, parts: int, index: int) -> torch.Tensor:
    """Shard ``index`` of ``parts`` of ``full`` (a new contiguous tensor)."""
    dim = layout.partition_dim
    if dim is None or parts == 1:
        return full.clone()
    pieces = full.chunk(layout.fused_pieces, dim=dim)
    return torch.cat([piece.chunk(parts, dim=dim)[index] for piece in pieces], dim=dim)


def copy_overlap(
    dst: torch.Tensor,
    dst_parts: int,
    dst_index: int,
    src_shards: list[torch.Tensor],
    layout: ParamLayout,
) -> None:
    """Fill shard ``dst_index`` of ``dst_parts`` from all ``len(src_shards)`` source shards.

    Works whichever split is finer: each destination chunk copies the overlapping rows
    of every source chunk, piece by piece, without materialising the full tensor.
    """
    dim = layout.partition_dim
    if dim is None:
        dst.copy_(src_shards[0])
        return
    src_parts = len(src_shards)
    piece_len = layout.full_shape[dim] // layout.fused_pieces
    src_len, dst_len = piece_len // src_parts, piece_len // dst_parts
    dst_lo, dst_hi = dst_index * dst_len, (dst_index + 1) * dst_len
    for piece in range(layout.fused_pieces):
        for src_index, src in enumerate(src_shards):
            lo = max(dst_lo, src_index * src_len)
            hi = min(dst_hi, (src_index + 1) * src_len)
            if lo >= hi:
                continue
            dst_view = dst.narrow(dim, piece * dst_len + lo - dst_lo, hi - lo)
            dst_view.copy_(src.narrow(dim, piece * src_len + lo - src_index * src_len, hi - lo))


def experts_per_rank(num_experts: int, ep: int) -> int:
    return num_experts // ep


def expert_owner(expert_index: int, num_experts: int, ep: int) -> int:
    """Expert-parallel rank holding ``expert_index`` (contiguous blocks, as Megatron/vLLM)."""
    return expert_index // experts_per_rank(num_experts, ep)
