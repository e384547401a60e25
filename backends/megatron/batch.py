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
        size = size or max(len(self), 1)
        return [self.rows(slice(first, first + size)) for first in range(0, len(self), size)]

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
