"""Layout facts of one parameter: how a training shard relates to the full tensor.

The training engine attaches a :class:`ParamLayout` to every parameter it owns; the
resharder (``mindrl.reshard``) reads nothing else to build generation shards. Shapes
are those of the *full* logical tensor (one expert's tensor for expert parameters).

Kinds:
    column: split along dim 0 across tensor-parallel ranks (qkv, fc1, gate/up).
    row: split along dim 1 (attention output projection, fc2).
    vocab: split along dim 0 over the (padded) vocabulary (embedding, output layer).
    replicated: identical on every TP rank (norms, router, biases of row layers).

``fused_pieces`` > 1 means the full tensor is the concatenation of that many equal
pieces along the partition dim and each piece is TP-split on its own, so rank r holds
``[piece_0[r], piece_1[r], ...]`` (Megatron's fused SwiGLU gate/up is 2 pieces).
Megatron's qkv is laid out group by group (q heads of a group, then its k, then its v),
so a plain contiguous split by query groups is right and ``fused_pieces`` stays 1.

``expert_index`` is the global expert id for a routed-expert parameter, else ``None``;
expert parameters are split over expert-parallel ranks by expert and, inside an expert,
over expert-tensor-parallel ranks by ``kind``.
"""

from __future__ import annotations

from dataclasses import dataclass

PARTITION_DIM = {"column": 0, "vocab": 0, "row": 1, "replicated": None}


@dataclass(frozen=True)
class ParamLayout:
    kind: str
    full_shape: tuple[int, ...]
    fused_pieces: int = 1
    expert_index: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in PARTITION_DIM:
            raise ValueError(f"unknown parameter kind '{self.kind}'; known: {list(PARTITION_DIM)}")

    @property
    def partition_dim(self) -> int | None:
        return PARTITION_DIM[self.kind]

    @property
    def is_expert(self) -> bool:
        return self.expert_index is not None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.full_shape:
            n *= d
        return n
