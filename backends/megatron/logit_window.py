"""Vocabulary logits only where a loss reads them.

An RL batch is mostly prompt: with SmolLM2's maths prompts ~160 tokens precede ~16
response tokens, yet the output layer (a ``hidden x vocab`` matmul, a fifth of a small
model's FLOPs) and the log-softmax / entropy after it ran over every position. Here
the output layer sees only the positions whose logits score a response token
(``ResponseBatch.response_window`` picks them): :func:`logits_at` makes the model's
output layer compute ``[b, W, vocab / tp]`` logits at those positions only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def output_layer_of(model: nn.Module) -> nn.Module | None:
    """The vocabulary output layer of a (wrapped) GPTModel; None off the last stage."""
    while not hasattr(model, "output_layer") and hasattr(model, "module"):
        model = model.module
    return getattr(model, "output_layer", None)


@contextlib.contextmanager
def logits_at(model: nn.Module, positions: torch.Tensor | None) -> Iterator[None]:
    """While active, ``model``'s forward returns logits ``[b, W, vocab / tp]`` at the
    sequence ``positions`` ``[b, W]`` instead of ``[b, s, vocab / tp]``.

    Under sequence parallelism the hidden states reach the output layer split over TP
    ranks; they are gathered first (backward: each rank keeps its own slice of the
    already TP-reduced gradient) and the layer runs unsplit, as Megatron's own
    last-token inference path does. No-op for ``positions=None`` or off the last stage.
    """
    layer = output_layer_of(model)
    if positions is None or layer is None:
        yield
        return
    index = positions.t().contiguous()  # [W, b], the layer works in [s, b, h]
    sequence_parallel = layer.sequence_parallel

    def select(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        hidden = args[0]
        if sequence_parallel:
            from megatron.core.tensor_parallel.mappings import (
                gather_from_sequence_parallel_region,
            )

            hidden = gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=False, group=module.tp_group
            )
        rows = index.to(hidden.device).unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        return (hidden.gather(0, rows), *args[1:]), kwargs

    handle = layer.register_forward_pre_hook(select, with_kwargs=True)
    layer.sequence_parallel = False
    try:
        yield
    finally:
        handle.remove()
        layer.sequence_parallel = sequence_parallel
