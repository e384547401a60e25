"""What the engine scores and trains on: packed rows and the response span of each.

A :class:`ResponseBatch` holds right-padded ``input_ids [B, S]`` (row ``i`` is
``prompt_i + response_i``), where each row's response starts (``response_start [B]``,
at least 1: a prompt has a token) and ``response_mask [B, R]``: 1 on the response
tokens a loss counts, by default the first ``len_i`` columns. A multi-turn trajectory's
"response" is every turn and every observation after the prompt; its mask is 0 on the
observations (their tokens are context, never trained on), so ``response_lengths``
then gives each row's span explicitly. Everything the engine returns and every
``fields`` tensor a loss reads is *response-aligned*: ``[B, R]`` with column ``j`` the
``j``-th response token.

:meth:`ResponseBatch.response_window` is the one place where packed positions and
response tokens meet, shift included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class GlobalCounts:
    """Sizes of the whole global batch (all micro-batches, all DP ranks) of one step:
    the denominators that keep micro-batching and DP from changing a loss."""

    tokens: float  # response tokens (the token-mean denominator)
    sequences: int  # rows (the seq-mean denominator)


@dataclass(frozen=True)
class ResponseBatch:
    """Packed prompt + response rows; see the module docstring for the shapes."""

    input_ids: torch.Tensor
    response_start: torch.Tensor
    response_mask: torch.Tensor
    #: response-aligned ``[B, R]`` tensors a loss reads (advantages, old log-probs, ...).
    fields: dict[str, torch.Tensor] = field(default_factory=dict)
    #: ``[B]`` tokens after each row's prompt; None: the mask's count (no hole in it).
    response_lengths: torch.Tensor | None = None

    @classmethod
    def continuation(
        cls, input_ids: torch.Tensor, start: int = 1, fields: dict | None = None
    ) -> ResponseBatch:
        """Every token of ``input_ids [B, S]`` from column ``start`` on as the response
        (``start=1``: score each token after the first)."""
        rows, length = input_ids.shape
        start_column = torch.full((rows,), start, dtype=torch.long)
        return cls(input_ids, start_column, torch.ones(rows, length - start), fields or {})

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def width(self) -> int:
        """``R``: the response columns."""
        return self.response_mask.shape[1]

    @property
    def response_len(self) -> torch.Tensor:
        """``[B]`` response tokens per row (a multi-turn row's observations included)."""
        if self.response_lengths is not None:
            return self.response_lengths.long()
        return self.response_mask.sum(1).long()

    def _lengths(self, change) -> torch.Tensor | None:
        return None if self.response_lengths is None else change(self.response_lengths)

    def rows(self, index: slice) -> ResponseBatch:
        """The rows ``index`` (same ``R``)."""
        return ResponseBatch(
            self.input_ids[index],
            self.response_start[index],
            self.response_mask[index],
            {name: value[index] for name, value in self.fields.items()},
            self._lengths(lambda lengths: lengths[index]),
        )

    def split(self, size: int | None) -> list[ResponseBatch]:
        """Micro-batches of ``size`` rows (the last may be smaller); ``None``: one."""
        return [self.rows(rows) for rows in rows_by_count(len(self), size)]

    def to(self, device: torch.device | str) -> ResponseBatch:
        return ResponseBatch(
            self.input_ids.to(device),
            self.response_start.to(device),
            self.response_mask.to(device),
            {name: value.to(device) for name, value in self.fields.items()},
            self._lengths(lambda lengths: lengths.to(device)),
        )

    def loss_inputs(self) -> dict[str, torch.Tensor]:
        """What a loss reads besides the model outputs: ``response_mask`` and ``fields``."""
        return {"response_mask": self.response_mask, **self.fields}

    def response_window(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positions, tokens)``, ``[B, W]`` each, ``W`` the longest response here.

        Response token ``j`` of row ``i`` is ``input_ids[i, start_i + j]``; the model
        output that scores it sits one position earlier, at ``start_i + j - 1``: the
        logits there give ``log p(token | everything before it)`` and the critic's value
        there is the value of the state the token was drawn in. Columns past a row's
        response point at clamped positions and are masked by :meth:`spread`.
        """
        longest = int(self.response_len.max()) if len(self) else 0
        offsets = torch.arange(max(longest, 1), device=self.input_ids.device)
        columns = self.response_start.unsqueeze(1) + offsets  # where the tokens sit
        last = self.input_ids.shape[1] - 1
        return (columns - 1).clamp(0, last), self.input_ids.gather(1, columns.clamp(max=last))

    def spread(self, per_window: torch.Tensor) -> torch.Tensor:
        """``[B, W]`` values of :meth:`response_window` -> ``[B, R]``, 0 wherever the mask
        is (past each response, and on a trajectory's observations)."""
        padded = torch.nn.functional.pad(per_window, (0, self.width - per_window.shape[1]))
        return torch.where(self.response_mask > 0, padded, torch.zeros_like(padded))


@dataclass(frozen=True)
class MicroBatching:
    """How a stage cuts its rows into micro-batches: ``size`` rows each (``None``: all at
    once), or, with ``max_tokens``, whole rows up to that many tokens each as the forward
    computes them (the budget wins over ``size``; :func:`rows_by_tokens`)."""

    size: int | None = None
    max_tokens: int | None = None

    @classmethod
    def of(cls, plan: MicroBatching | int | None) -> MicroBatching:
        """``plan`` itself, or a row count (``None``: one micro-batch) as a plan."""
        return plan if isinstance(plan, MicroBatching) else cls(size=plan)


@dataclass(frozen=True)
class _Unit:
    """Rows that travel together into one micro-batch and the tokens they cost."""

    rows: list[int]
    tokens: int


def rows_by_count(total: int, size: int | None) -> list[slice]:
    """Consecutive slices of ``size`` of ``total`` rows; ``None``: one slice."""
    size = size or max(total, 1)
    return [slice(first, first + size) for first in range(0, total, size)]


def rows_by_tokens(
    groups: Sequence[Sequence[int]],
    prompt_tokens: Sequence[int],
    response_tokens: Sequence[int],
    max_tokens: int,
) -> list[list[int]]:
    """Rows in micro-batches of at most ``max_tokens`` tokens each (a row longer than that
    alone in its own), counted as a packed row (``packing.py``) counts them.

    A micro-batch costs the sum of its documents: a group of ``groups`` (rows sharing a
    prompt, or one row) its prompt once plus each response. A group stays in one
    micro-batch where it fits the budget; a longer one is cut into consecutive runs of
    rows, each with its own copy of the prompt. First-fit decreasing: the costliest units
    first, each into the first micro-batch with room, so a step runs few micro-batches.
    Each micro-batch lists its rows in ascending order.
    """
    units = [
        unit
        for group in groups
        for unit in _group_units(list(group), prompt_tokens, response_tokens, max_tokens)
    ]
    bins: list[list[_Unit]] = []
    loads: list[int] = []
    for unit in sorted(units, key=lambda u: -u.tokens):  # stable: ties keep row order
        home = next((i for i, load in enumerate(loads) if load + unit.tokens <= max_tokens), None)
        if home is None:
            bins.append([unit])
            loads.append(unit.tokens)
        else:
            bins[home].append(unit)
            loads[home] += unit.tokens
    return [sorted(row for unit in b for row in unit.rows) for b in bins]


def _group_units(
    group: list[int], prompt_tokens: Sequence[int], response_tokens: Sequence[int], budget: int
) -> list[_Unit]:
    """``group`` (rows sharing one prompt) whole, or cut into consecutive runs that fit."""
    prompt = int(prompt_tokens[group[0]])
    units: list[_Unit] = []
    rows: list[int] = []
    for row in group:
        responses = sum(int(response_tokens[r]) for r in rows)
        if rows and prompt + responses + int(response_tokens[row]) > budget:
            units.append(_shared(rows, prompt, response_tokens))
            rows = []
        rows.append(row)
    units.append(_shared(rows, prompt, response_tokens))
    return units


def _shared(rows: list[int], prompt: int, response_tokens: Sequence[int]) -> _Unit:
    return _Unit(rows, prompt + sum(int(response_tokens[r]) for r in rows))


def split_to_count(micro_batches: list[list[int]], count: int) -> list[list[int]]:
    """``micro_batches`` cut until there are ``count``: the one with the most rows is
    halved each time (fewer tokens each, so every budget still holds); for ranks that
    must run the same number of micro-batches (an expert-parallel all-to-all joins them
    at every forward).

    Raises:
        ValueError: fewer rows than ``count``.
    """
    parts = [list(rows) for rows in micro_batches]
    while len(parts) < count:
        widest = max(range(len(parts)), key=lambda i: len(parts[i]))
        rows = parts[widest]
        if len(rows) < 2:
            raise ValueError(f"{sum(map(len, parts))} rows cannot fill {count} micro-batches")
        half = len(rows) // 2
        parts[widest : widest + 1] = [rows[:half], rows[half:]]
    return parts
