"""The transformers engine's continuous batch: a decode loop of its own, with slot refill.

Why not ``model.generate``: it decodes one batch to its longest response, so no sequence
can join a running batch. Why not transformers' own continuous batching
(``generate_batch`` / ``ContinuousBatchingManager``, transformers 5.x): it runs its
scheduler in a thread of its own with a paged cache, takes its log-probs from the
*processed* scores (after temperature, top-k and top-p; this engine reports the raw
model's, docs/generation.md), samples from the process's global RNG, and has no way to
load new weights between two of its steps while the requests stay live. Here every
live row keeps its KV cache in one :class:`~transformers.DynamicCache`, left-padded to a
common length with an attention mask and per-row position ids (``generate``'s own rule
for left padding), so each step is one forward of the model over the live rows:

* a new sequence's context is prefilled (each distinct context once; GRPO's ``N``
  copies of a prompt share it) and its cache rows joined to the batch's, the shorter
  side padded on the left;
* a sequence that ends leaves the batch (its rows dropped), and the columns no live row
  needs any more are cut from the left, so the cache spans the longest live context;
* weights loaded between two steps (``GenerationEngine.load_weights``) take effect at
  the next step; the rows' cache stays.

Only full-attention caches are joined this way (a sliding-window layer's cache is cut to
its window by transformers, which left padding would break): such a model is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from backends.generation.base import (
    ContinuousBatch,
    SamplingParams,
    SequenceOutput,
    SequenceRequest,
    ends_with_stop,
)
from backends.generation.padding import left_padded

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class SlotHost(Protocol):
    """What the slots take from their engine: its model and its two checks (prompts that
    fit, weights present), so the engine's rules are not written twice."""

    model: PreTrainedModel

    def validate_prompts(self, prompts: list[list[int]]) -> None: ...

    def check_ready(self) -> None: ...


@dataclass
class _Row:
    """One live sequence: its request and what it produced so far."""

    request: SequenceRequest
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class HFContinuousBatch(ContinuousBatch):
    """Continuous batching on a transformers model (module docstring)."""

    def __init__(
        self, engine: SlotHost, params: SamplingParams, device: torch.device, seed: int
    ) -> None:
        self.engine, self.params = engine, params
        self.model = engine.model
        self.device = device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.queue: list[SequenceRequest] = []
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.pending = torch.zeros(0, dtype=torch.long, device=self.device)

    # ---- the interface ----------------------------------------------------------------
    def add(self, requests: list[SequenceRequest]) -> None:
        if not requests:
            return
        self.engine.validate_prompts([r.context for r in requests])
        short = [r.key for r in requests if r.max_tokens < 1]
        if short:
            raise ValueError(f"sequences {short[:4]} have no room for a token (max_tokens < 1)")
        self.queue.extend(requests)

    @torch.no_grad()
    def step(self) -> list[SequenceOutput]:
        self.engine.check_ready()
        if self.rows:
            self._decode()
        if self.queue:
            self._admit(self.queue)
            self.queue = []
        return self._retire()

    def progress(self) -> dict[int, int]:
        counts = {row.request.key: len(row.token_ids) for row in self.rows}
        return counts | {request.key: 0 for request in self.queue}

    def interrupt(self) -> list[SequenceOutput]:
        outputs = [self._output(row, "interrupted") for row in self.rows]
        outputs += [SequenceOutput(r.key, [], [], "interrupted") for r in self.queue]
        self.queue, self.rows, self.cache = [], [], None
        self._select(torch.zeros(0, dtype=torch.long, device=self.device))
        return outputs

    # ---- decoding ---------------------------------------------------------------------
    def _decode(self) -> None:
        """One token for every row: its pending token goes through the model."""
        ones = torch.ones((len(self.rows), 1), dtype=self.mask.dtype, device=self.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        logits = self.model(
            input_ids=self.pending[:, None],
            attention_mask=self.mask,
            position_ids=self.positions[:, None],
            past_key_values=self.cache,
            use_cache=True,
        ).logits[:, -1]
        self.positions = self.positions + 1
        self.pending = self._sample(logits, self.rows)

    def _admit(self, requests: list[SequenceRequest]) -> None:
        """Prefill ``requests`` (each distinct context once), sample their first tokens
        and join their cache rows to the batch's."""
        contexts = [tuple(r.context) for r in requests]
        distinct = list(dict.fromkeys(contexts))
        copy_of = torch.tensor([distinct.index(c) for c in contexts], device=self.device)
        ids, mask = left_padded([list(c) for c in distinct], self.device)
        cache = DynamicCache(config=self.model.config)
        logits = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        _check_full_attention(cache)
        cache.batch_select_indices(copy_of)
        rows = [_Row(r) for r in requests]
        first = self._sample(logits[copy_of], rows)
        self._join(cache, mask[copy_of], rows, first)

    def _join(
        self, cache: DynamicCache, mask: torch.Tensor, rows: list[_Row], first: torch.Tensor
    ) -> None:
        """Append rows (their cache, mask, first tokens) to the batch, left-padding the
        shorter of the two to the longer's length."""
        if self.cache is None or not self.rows:
            self.cache, self.mask = cache, mask
        else:
            width = max(self.mask.shape[1], mask.shape[1])
            for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
                mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)])
                mine.values = torch.cat(
                    [_pad_left(mine.values, width), _pad_left(theirs.values, width)]
                )
            self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(mask, width, 1)])
        self.positions = torch.cat([self.positions, mask.sum(-1)])
        self.pending = torch.cat([self.pending, first])
        self.rows += rows

    def _retire(self) -> list[SequenceOutput]:
        """The rows whose last token ended them leave; columns no row needs are cut."""
        ended, keep = [], []
        for i, row in enumerate(self.rows):
            if ends_with_stop(row.token_ids, self.params):
                ended.append(self._output(row, "stop"))
            elif len(row.token_ids) >= row.request.max_tokens:
                reason = "context_limit" if row.request.room_limited else "length"
                ended.append(self._output(row, reason))
            else:
                keep.append(i)
        if ended:
            self.rows = [self.rows[i] for i in keep]
            self._select(torch.tensor(keep, dtype=torch.long, device=self.device))
        return ended

    def _select(self, keep: torch.Tensor) -> None:
        """Keep the rows ``keep``; drop the leading columns every kept row has padded."""
        self.mask, self.positions, self.pending = (
            self.mask[keep],
            self.positions[keep],
            self.pending[keep],
        )
        if self.cache is None:
            return
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else self.mask.shape[1]
        for layer in self.cache.layers:
            layer.keys = layer.keys[keep, :, start:]
            layer.values = layer.values[keep, :, start:]
        self.mask = self.mask[:, start:]

    # ---- sampling -----------------------------------------------------------------------
    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        """Each row's next token (temperature, top-k, top-p) and its raw log-prob."""
        logits = logits.float()
        raw = torch.log_softmax(logits, dim=-1)
        params = self.params
        if params.greedy:
            tokens = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(_filtered(logits / params.temperature, params), dim=-1)
            tokens = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
        logprobs = raw.gather(-1, tokens[:, None]).squeeze(-1)
        for row, token, logprob in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
            row.token_ids.append(token)
            row.logprobs.append(logprob)
        return tokens

    @staticmethod
    def _output(row: _Row, reason: str) -> SequenceOutput:
        return SequenceOutput(row.request.key, row.token_ids, row.logprobs, reason)


def _filtered(scores: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``scores`` with the tokens outside top-k and the top-p nucleus set to -inf."""
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1:
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        # Drop a token once the ones more likely than it already hold top_p of the mass.
        outside = probs.cumsum(dim=-1) - probs > params.top_p
        ordered = ordered.masked_fill(outside, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, order, ordered)
    return scores


def _pad_left(tensor: torch.Tensor, width: int, dim_from_end: int = 2) -> torch.Tensor:
    """``tensor`` left-padded with zeros to ``width`` along its sequence dim (keys and
    values: ``[B, H, T, D]``, the third from the end; a mask ``[B, T]``: the last)."""
    dim = tensor.dim() - dim_from_end
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _check_full_attention(cache: DynamicCache) -> None:
    kinds = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    if kinds:
        raise NotImplementedError(
            f"continuous batching in the 'hf' engine joins full-attention caches only; this "
            f"model's cache has {sorted(kinds)} layers: use the 'vllm' engine for it"
        )
