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
            # Megatron's [s, b, heads, width] -> SDPA's [b, heads, s, width] and back.
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            out = attend(q, k, v, attention_mask, self.softmax_scale)
            sq, b = query.shape[:2]
            return out.permute(2, 0, 1, 3).reshape(sq, b, self.heads * value.shape[-1])

    return TorchCoreAttention
