"""Core attention on torch's fused kernels, in place of Megatron's unfused local one.

Megatron-core's local ``DotProductAttention`` (its spec without TransformerEngine)
materialises the ``[b, heads, s, s]`` scores, masks and softmaxes them and multiplies
by the values: memory and time quadratic in the sequence, and on one H200 a dense 1B
model's bf16 step at sequence 2048 reached 14.5 % MFU with it. :class:`TorchCoreAttention`
has the same interface (Megatron builds it from the layer spec and calls it with
``query [sq, b, np, hn]``, ``key`` / ``value [sk, b, ng, hn | hv]`` and an
``attention_mask``) and runs one of torch's fused kernels instead:

* ``attention_mask=None``: causal rows, ``scaled_dot_product_attention(is_causal=True)``
  (flash / memory-efficient / cuDNN on a GPU, the fused flash kernel on the CPU);
* a Megatron mask (bool ``[b, 1, sq, sk]``, True = hidden): SDPA with that mask;
* a :class:`PackedMask` (its integer ``ids``): rows of packed documents (the engine's
  packed micro-batches, ``packing.py``), where a token sees the earlier tokens of its own
  document only, and inside a document that shares a prompt a response sees the prompt
  and its own earlier tokens only. Each document runs as its own SDPA call (causal, or
  with its small mask when it shares a prompt), so nothing is computed between
  documents; on a CUDA GPU the whole row runs as one compiled FlexAttention call whose
  ``BlockMask`` skips every block no query of it may see (:func:`packed_kernel`).

Grouped-query heads are SDPA's / Flex's ``enable_gqa``; MLA's q / k head width may
differ from its value width (DeepSeek-V3: 192 and 128), and MLA passes its own softmax
scale. Under tensor parallelism each rank gets its own heads (the mask is per token, the
same on every rank); with sequence parallelism attention sees the whole sequence, as in
Megatron. No dropout (the engine's configs have none; RL fine-tuning uses none).
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

#: (start, end, shares_a_prompt) of each document of one row, in order, covering the row.
Spans = tuple[tuple[int, int, bool], ...]


@dataclass(frozen=True, eq=False)
class PackedMask:
    """Who sees whom in rows of packed documents.

    Token ``q`` sees token ``k`` of the same row when ``k <= q``, both belong to the same
    document, and ``k`` is shared (member 0: a document's prompt, or the whole of a
    document without one) or belongs to ``q``'s own member (its response).

    Megatron gets it as :attr:`ids`, an integer tensor, in its ``attention_mask``
    argument: activation recompute saves that argument with ``save_for_backward`` and
    hands the layers a ``detach()``-ed copy in backward, so it must be a tensor. The core
    attention finds this object again from the tensor's storage (:meth:`of_ids`: the same
    storage, as long as this object holds it), with the spans and kernel masks made once.

    Attributes:
        ids: ``[2, b, s]``: the document of each token (a document's tokens are
            contiguous), then its member: 0 for tokens every later token of the document
            sees, ``m > 0`` for the tokens of response ``m``.
        spans: per row, its documents as host integers (:func:`spans_of`), so the
            per-document kernel cuts the row without reading the device.
    """

    ids: torch.Tensor
    spans: tuple[Spans, ...]
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, document: torch.Tensor, member: torch.Tensor) -> PackedMask:
        """The mask of rows whose tokens belong to ``document`` / ``member`` (``[b, s]``)."""
        if document.shape != member.shape or document.dim() != 2:
            shapes = f"document {tuple(document.shape)} and member {tuple(member.shape)}"
            raise ValueError(f"{shapes} must both be [b, s]")
        return cls._kept(torch.stack([document.long(), member.long()]))

    @classmethod
    def of_ids(cls, ids: torch.Tensor) -> PackedMask:
        """The mask whose :attr:`ids` share ``ids``' storage, else one made from its values."""
        return _LIVE.get(_storage_key(ids)) or cls._kept(ids)

    @classmethod
    def _kept(cls, ids: torch.Tensor) -> PackedMask:
        document, member = ids.cpu()
        spans = tuple(spans_of(document[row], member[row]) for row in range(document.shape[0]))
        mask = cls(ids, spans)
        _LIVE[_storage_key(ids)] = mask
        return mask

    @property
    def document(self) -> torch.Tensor:
        return self.ids[0]

    @property
    def member(self) -> torch.Tensor:
        return self.ids[1]

    def to(self, device: torch.device | str) -> PackedMask:
        mask = PackedMask(self.ids.to(device), self.spans)
        _LIVE[_storage_key(mask.ids)] = mask
        return mask

    def visible(self) -> torch.Tensor:
        """``[b, s, s]`` True where query ``q`` (dim 1) sees key ``k`` (dim 2)."""
        return _visible(self.document, self.member)

    def megatron_mask(self) -> torch.Tensor:
        """``[b, 1, s, s]`` in Megatron's convention (True = hidden), for its local attention."""
        return ~self.visible().unsqueeze(1)

    def document_masks(self, device: torch.device) -> dict[tuple[int, int], torch.Tensor]:
        """``(row, start) -> [n, n]`` visibility of each document that shares a prompt
        (the others are causal), made once per mask and device and reused by every layer."""
        key = ("documents", str(device))
        if key not in self._cache:
            masks = {}
            for row, spans in enumerate(self.spans):
                for start, end, shared in spans:
                    if shared:
                        part = slice(row, row + 1), slice(start, end)
                        visible = _visible(self.document[part], self.member[part])
                        masks[(row, start)] = visible[0].to(device)
            self._cache[key] = masks
        return self._cache[key]

    def block_mask(self, device: torch.device) -> Any:
        """The FlexAttention ``BlockMask`` of these rows (made once per mask and device)."""
        key = ("block", str(device))
        if key not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask

            document, member = self.document.to(device), self.member.to(device)

            def sees(b, h, q, k):
                return (
                    (k <= q)
                    & (document[b, q] == document[b, k])
                    & ((member[b, k] == 0) | (member[b, k] == member[b, q]))
                )

            rows, length = document.shape
            self._cache[key] = create_block_mask(
                sees, rows, None, length, length, device=device, _compile=device.type != "cpu"
            )
        return self._cache[key]


#: Live masks by their ids' storage. An entry lives as long as its mask (weak values), and
#: the mask holds that storage, so no other tensor can have the same key meanwhile.
_LIVE: weakref.WeakValueDictionary[tuple, PackedMask] = weakref.WeakValueDictionary()


def _storage_key(ids: torch.Tensor) -> tuple:
    storage = ids.untyped_storage()
    return (ids.device, storage.data_ptr(), ids.storage_offset(), tuple(ids.shape))


def _visible(document: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """``[b, s, s]``: the :class:`PackedMask` rule on dense tensors."""
    length = document.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=document.device).tril()
    same_document = document.unsqueeze(2) == document.unsqueeze(1)
    key_member, query_member = member.unsqueeze(1), member.unsqueeze(2)
    return causal & same_document & ((key_member == 0) | (key_member == query_member))


def spans_of(document: torch.Tensor, member: torch.Tensor) -> Spans:
    """One row's documents as ``(start, end, shares_a_prompt)``; a document id that comes
    back after another document is refused (the per-document kernel cuts by span)."""
    ids = document.tolist()
    starts = [0] + [i for i in range(1, len(ids)) if ids[i] != ids[i - 1]]
    bounds = list(zip(starts, [*starts[1:], len(ids)], strict=True))
    if len({ids[start] for start, _ in bounds}) != len(bounds):
        raise ValueError("a packed row's documents must be contiguous spans of tokens")
    return tuple((start, end, bool(member[start:end].any())) for start, end in bounds)


#: The narrowest query / key / value head Inductor's FlexAttention kernel compiles for (it
#: raises "NYI: embedding dimension ... must be at least 16", torch 2.11 on an H100).
FLEX_MIN_HEAD_WIDTH = 16


def packed_kernel(device: torch.device, head_widths: tuple[int, ...] = ()) -> str:
    """``flex`` (one compiled FlexAttention call per row) on a CUDA GPU with Triton, where
    FlexAttention compiles, for heads of at least :data:`FLEX_MIN_HEAD_WIDTH`; ``sdpa``
    (one fused SDPA call per document) elsewhere: torch has no FlexAttention backward on
    the CPU, and compiling it there took ~50 s."""
    if device.type != "cuda" or min(head_widths, default=FLEX_MIN_HEAD_WIDTH) < FLEX_MIN_HEAD_WIDTH:
        return "sdpa"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "sdpa"
    return "flex"


@functools.cache
def _compiled_flex_attention() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: PackedMask | torch.Tensor | None,
    scale: float,
    kernel: str | None = None,
) -> torch.Tensor:
    """Attention of ``query [b, np, s, hn]`` over ``key [b, ng, s, hn]`` / ``value [b, ng,
    s, hv]`` (``ng`` dividing ``np``): ``[b, np, s, hv]``.

    ``mask``: None (causal), a Megatron bool mask ``[b, 1, s, s]`` (True = hidden), a
    :class:`PackedMask` or its integer :attr:`~PackedMask.ids`; ``kernel`` picks how a
    packed mask runs (``sdpa`` / ``flex``; None: :func:`packed_kernel`). FlexAttention is
    eager (unfused) on the CPU, forward only: the tests use it to check the ``BlockMask``
    against the others.
    """
    gqa = query.shape[1] != key.shape[1]
    if isinstance(mask, torch.Tensor) and not mask.is_floating_point() and mask.dtype != torch.bool:
        mask = PackedMask.of_ids(mask)  # a packed row's ids, as Megatron passed them on
    if mask is None:
        return F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, enable_gqa=gqa
        )
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=~mask, scale=scale, enable_gqa=gqa
        )
    kernel = kernel or packed_kernel(query.device, (query.shape[-1], value.shape[-1]))
    if kernel == "flex":
        flex = _compiled_flex_attention() if query.device.type != "cpu" else _eager_flex()
        block = mask.block_mask(query.device)
        return flex(query, key, value, block_mask=block, scale=scale, enable_gqa=gqa)
    return _per_document(query, key, value, mask, scale, gqa)


def _eager_flex() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


def _per_document(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: PackedMask,
    scale: float,
    gqa: bool,
) -> torch.Tensor:
    """One SDPA call per document, outputs concatenated back into the rows: no score of
    a query for another document's key is computed."""
    shared = mask.document_masks(query.device)
    rows = []
    for row, spans in enumerate(mask.spans):
        parts = []
        for start, end, shares_prompt in spans:
            q, k, v = (t[row : row + 1, :, start:end] for t in (query, key, value))
            document_mask = shared[(row, start)] if shares_prompt else None
            attention = F.scaled_dot_product_attention(
                q, k, v, attn_mask=document_mask, is_causal=not shares_prompt,
                scale=scale, enable_gqa=gqa,
            )  # fmt: skip
            parts.append(attention)
        rows.append(torch.cat(parts, dim=2) if len(parts) > 1 else parts[0])
    return torch.cat(rows) if len(rows) > 1 else rows[0]


# ---- context parallelism ----------------------------------------------------------------
#
# Under context parallelism (CP) a packed row of ``T`` positions is split over the ``cp``
# ranks of the CP group and each runs the model on its own positions only. Attention is the
# one place a token needs the others: the mask is the whole row's, built before the split.
#
# * Ulysses (the kv heads of a TP rank divide over CP): the row is split contiguously, an
#   all-to-all turns sequence shards into head shards, each rank attends the whole row for
#   ``1 / cp`` of the heads with the ordinary packed kernel, and a second all-to-all turns
#   the output back into sequence shards.
# * All-gather K / V (the heads do not divide: e.g. 2 kv heads at tp 2, cp 2): every rank
#   gathers the whole row's keys and values and attends its own queries over them; the
#   backward reduce-scatters dK / dV to their owners. The row is cut into ``2 * cp`` chunks
#   and rank ``r`` takes chunks ``r`` and ``2cp - 1 - r``: causal work grows along the row,
#   so each rank gets one cheap and one expensive chunk.


def ulysses_divides(kv_heads_per_rank: int, cp: int) -> bool:
    """Whether Ulysses splits the heads of a TP rank over ``cp`` ranks (else K / V gather)."""
    return kv_heads_per_rank % cp == 0


def context_parallel_positions(length: int, cp: int, rank: int, balanced: bool) -> torch.Tensor:
    """The positions of a row of ``length`` that CP rank ``rank`` holds, in row order:
    the ``rank``-th of ``cp`` contiguous parts, or (``balanced``) chunks ``rank`` and
    ``2cp - 1 - rank`` of ``2 * cp``."""
    parts = 2 * cp if balanced else cp
    if length % parts:
        raise ValueError(f"a row of {length} positions does not split into {parts} equal parts")
    size = length // parts
    chunks = (rank, parts - 1 - rank) if balanced else (rank,)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks])


class _AllToAll(torch.autograd.Function):
    """All-to-all over dim 0 (``cp`` equal blocks, block ``j`` to rank ``j``); its own
    adjoint, so the backward is the same exchange of the gradient."""

    @staticmethod
    def forward(ctx, blocks: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        blocks = blocks.contiguous()
        out = torch.empty_like(blocks)
        torch.distributed.all_to_all_single(out, blocks, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _AllToAll.apply(grad, ctx.group), None


def _sequence_to_heads(shard: torch.Tensor, group, cp: int) -> torch.Tensor:
    """``[s, b, h, d]`` (this rank's positions, every head) -> ``[cp * s, b, h / cp, d]``
    (the whole row, this rank's ``h / cp`` heads)."""
    s, b, h, d = shard.shape
    blocks = shard.reshape(s, b, cp, h // cp, d).permute(2, 0, 1, 3, 4)  # by owner of heads
    return _AllToAll.apply(blocks, group).reshape(cp * s, b, h // cp, d)


def _heads_to_sequence(row: torch.Tensor, group, cp: int) -> torch.Tensor:
    """The inverse of :func:`_sequence_to_heads`: ``[cp * s, b, h / cp, d] -> [s, b, h, d]``."""
    length, b, heads, d = row.shape
    blocks = _AllToAll.apply(row.reshape(cp, length // cp, b, heads, d), group)
    return blocks.permute(1, 2, 0, 3, 4).reshape(length // cp, b, cp * heads, d)


class _GatherRow(torch.autograd.Function):
    """``[s, ...]`` shards at ``order`` (every rank's positions, rank by rank) -> the whole
    row ``[cp * s, ...]`` in row order on every rank; backward: each rank's positions get
    the sum of every rank's gradient (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, group, order: torch.Tensor) -> torch.Tensor:
        cp = torch.distributed.get_world_size(group)
        ctx.group, ctx.order = group, order
        gathered = shard.new_empty((cp * shard.shape[0], *shard.shape[1:]))
        torch.distributed.all_gather_single(gathered, shard.contiguous(), group=group)
        row = torch.empty_like(gathered)
        row[order] = gathered
        return row

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cp = torch.distributed.get_world_size(ctx.group)
        by_rank = grad[ctx.order].contiguous()
        shard = grad.new_empty((by_rank.shape[0] // cp, *by_rank.shape[1:]))
        torch.distributed.reduce_scatter_single(shard, by_rank, group=ctx.group)
        return shard, None, None


def context_parallel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: PackedMask,
    scale: float,
    group,
) -> torch.Tensor:
    """Attention of this CP rank's positions of a packed row (Megatron's layout: ``query
    [s, b, np, hn]``, ``key`` / ``value [s, b, ng, hn | hv]``, ``mask`` the whole row's):
    ``[s, b, np, hv]``, what one rank computes at those positions with the whole row.

    Ulysses where ``ng`` divides over the group (contiguous shards), else the K / V
    all-gather (balanced shards, :func:`context_parallel_positions`).
    """
    cp = torch.distributed.get_world_size(group)
    if ulysses_divides(key.shape[2], cp):
        q, k, v = (_sequence_to_heads(t, group, cp) for t in (query, key, value))
        out = attend(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), mask, scale)
        return _heads_to_sequence(out.permute(2, 0, 1, 3), group, cp)
    length, rank = mask.ids.shape[-1], torch.distributed.get_rank(group)
    order = torch.cat(
        [context_parallel_positions(length, cp, r, balanced=True) for r in range(cp)]
    ).to(query.device)
    key, value = (_GatherRow.apply(t, group, order) for t in (key, value))
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
    positions = context_parallel_positions(length, cp, rank, balanced=True)
    out = _local_queries(q, k, v, mask, positions, scale)
    return out.permute(2, 0, 1, 3)


def _local_queries(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: PackedMask,
    positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Queries at row ``positions`` (``[b, np, s, hn]``) over the whole row's keys and
    values: one SDPA call per run of consecutive positions inside one document, against
    that document's keys up to the run's end."""
    gqa = query.shape[1] != key.shape[1]
    rows = []
    for row, pieces in enumerate(_query_pieces(mask, positions, query.device)):
        parts = []
        for (local_start, local_end), (key_start, key_end), visible in pieces:
            q = query[row : row + 1, :, local_start:local_end]
            k, v = (t[row : row + 1, :, key_start:key_end] for t in (key, value))
            parts.append(
                F.scaled_dot_product_attention(
                    q, k, v, attn_mask=visible, scale=scale, enable_gqa=gqa
                )
            )
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows)


def _query_pieces(mask: PackedMask, positions: torch.Tensor, device: torch.device) -> list:
    """Per row, ``((local_start, local_end), (key_start, key_end), visible)`` of each run
    of ``positions`` inside one document (made once per mask, positions and device)."""
    cache_key = ("queries", tuple(positions.tolist()), str(device))
    if cache_key in mask._cache:
        return mask._cache[cache_key]
    per_row = []
    for row, spans in enumerate(mask.spans):
        pieces = []
        for local, first, end in _runs(positions.tolist()):
            for doc_start, doc_end, _ in spans:
                lo, hi = max(first, doc_start), min(end, doc_end)
                if lo < hi:
                    visible = _visible_between(mask, row, (lo, hi), (doc_start, hi))
                    at = local + lo - first
                    pieces.append(((at, at + hi - lo), (doc_start, hi), visible.to(device)))
        per_row.append(pieces)
    mask._cache[cache_key] = per_row
    return per_row


def _runs(held: list[int]) -> list[tuple[int, int, int]]:
    """``(index in held, first position, end position)`` of each run of consecutive
    positions in ``held``."""
    runs, start = [], 0
    for i in range(1, len(held) + 1):
        if i == len(held) or held[i] != held[i - 1] + 1:
            runs.append((start, held[start], held[i - 1] + 1))
            start = i
    return runs


def _visible_between(
    mask: PackedMask, row: int, queries: tuple[int, int], keys: tuple[int, int]
) -> torch.Tensor:
    """``[q, k]``: the :class:`PackedMask` rule for row positions ``queries`` x ``keys``."""
    document, member = mask.document[row].cpu(), mask.member[row].cpu()
    q, k = torch.arange(*queries).unsqueeze(1), torch.arange(*keys).unsqueeze(0)
    q_member, k_member = member[queries[0] : queries[1]].unsqueeze(1), member[keys[0] : keys[1]]
    same_document = document[queries[0] : queries[1]].unsqueeze(1) == document[keys[0] : keys[1]]
    return (k <= q) & same_document & ((k_member == 0) | (k_member == q_member))


def torch_core_attention() -> type:
    """:class:`TorchCoreAttention` (built on first use: Megatron is imported lazily)."""
    return _core_attention_class()


@functools.cache
def _core_attention_class() -> type:
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.utils import divide

    class TorchCoreAttention(MegatronModule):
        """Megatron's core-attention interface on :func:`attend` (module docstring).

        Built by Megatron from the layer spec, for self attention (GQA) and for MLA, which
        also passes ``k_channels`` (q / k head width) and ``v_channels`` (value width).
        """

        def __init__(
            self,
            config,
            layer_number: int,
            attn_mask_type,
            attention_type: str,
            attention_dropout: float | None = None,
            softmax_scale: float | None = None,
            cp_comm_type: str | None = None,
            pg_collection=None,
            k_channels: int | None = None,
            v_channels: int | None = None,
        ) -> None:
            super().__init__(config=config)
            dropout = config.attention_dropout if attention_dropout is None else attention_dropout
            if dropout or config.context_parallel_size != 1 or config.softmax_type != "vanilla":
                raise ValueError(
                    "the torch core attention has no dropout, context parallelism or "
                    f"non-vanilla softmax (attention_dropout={dropout}, context_parallel_size="
                    f"{config.context_parallel_size}, softmax_type={config.softmax_type})"
                )
            if pg_collection is None:
                from megatron.core.process_groups_config import ProcessGroupCollection

                pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
            tp = pg_collection.tp.size()
            self.heads = divide(config.num_attention_heads, tp)
            self.groups = divide(config.num_query_groups, tp)
            head_width = k_channels or config.kv_channels
            self.softmax_scale = softmax_scale or head_width**-0.5
            self.layer_number = max(1, layer_number)
            self.cp_group = _context_parallel_group()

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: PackedMask | torch.Tensor | None,
            attn_mask_type=None,
            attention_bias=None,
            packed_seq_params=None,
        ) -> torch.Tensor:
            if attention_bias is not None or packed_seq_params is not None:
                raise ValueError(
                    "the torch core attention takes its packing as a PackedMask "
                    "attention_mask, not attention_bias / packed_seq_params"
                )
            sq, b = query.shape[:2]
            if self.cp_group is not None:
                mask = _packed_mask_of(attention_mask)
                out = context_parallel_attention(
                    query, key, value, mask, self.softmax_scale, self.cp_group
                )
                return out.reshape(sq, b, self.heads * value.shape[-1])
            # Megatron's [s, b, heads, width] -> SDPA's [b, heads, s, width] and back.
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            out = attend(q, k, v, attention_mask, self.softmax_scale)
            return out.permute(2, 0, 1, 3).reshape(sq, b, self.heads * value.shape[-1])

    return TorchCoreAttention


def _context_parallel_group() -> Any:
    """Megatron's CP group where it has more than one rank (the engine initialises
    ``parallel_state`` with the real cp and keeps the model config at cp 1), else None."""
    from megatron.core import parallel_state as ps

    group = ps.get_context_parallel_group(check_initialized=False)
    if group is None or torch.distributed.get_world_size(group) == 1:
        return None
    return group


def _packed_mask_of(attention_mask: Any) -> PackedMask:
    """The packed row's mask: context parallelism runs packed rows only (the split and the
    whole row's mask are made by the engine before the model runs)."""
    if isinstance(attention_mask, PackedMask):
        return attention_mask
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.long:
        return PackedMask.of_ids(attention_mask)
    raise ValueError("context parallelism runs packed rows only: the attention needs a PackedMask")
