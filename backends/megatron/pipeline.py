"""Forward/backward over micro-batches, with or without pipeline parallelism.

On the CPU Megatron's pipeline schedules cannot run (they hard-code CUDA streams and
devices), so this is a plain loop: for each micro-batch, stage ``i`` receives the
hidden states ``[s, b, h]`` from stage ``i-1``, runs its layers, sends them on; the
last stage computes the loss and backward runs the same path in reverse, one
micro-batch at a time (no overlap between stages: correct, not fast). With PP == 1 it
is ordinary gradient accumulation. Accelerators with PP > 1 use Megatron's 1F1B
schedule instead (:func:`megatron_schedule`).

Under sequence parallelism a micro-batch's length is a multiple of TP (the engine pads
the tail of a packed row, or right-pads plain rows: :func:`pad_to_multiple`); stages
exchange ``[s / tp, b, h]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from backends.megatron.logit_window import logits_at
from backends.megatron.packing import PackedRow, rope_at


@dataclass(frozen=True)
class MicroBatch:
    """What a stage needs of a micro-batch (the engine's subclass adds what ``head`` reads)."""

    input_ids: torch.Tensor  # [b, s], s a multiple of sequence_multiple(model)
    #: [b, W]: the last stage computes logits at these positions only (None: everywhere).
    logit_positions: torch.Tensor | None
    #: The micro-batch packed into one row (packing.py): its positions and attention
    #: mask; None: plain right-padded rows, positions 0 .. s-1 and the causal mask.
    packed: PackedRow | None


#: head(output of the last stage, micro-batch) -> (scalar loss or None, results to keep)
Head = Callable[[torch.Tensor, MicroBatch], tuple[torch.Tensor | None, Any]]


def positions_for(input_ids: torch.Tensor) -> torch.Tensor:
    """Position ids ``[b, s]`` for right-padded sequences that start at position 0."""
    b, s = input_ids.shape
    return torch.arange(s, device=input_ids.device).unsqueeze(0).expand(b, s)


def sequence_multiple(model: nn.Module) -> int:
    """What the sequence length must be a multiple of: TP under sequence parallelism
    (Megatron splits the sequence dim evenly over TP ranks), else 1."""
    config = model.config
    return config.tensor_model_parallel_size if config.sequence_parallel else 1


def pad_to_multiple(input_ids: torch.Tensor, multiple: int) -> torch.Tensor:
    """``[b, s]`` ids right-padded with id 0 to ``[b, ceil(s / multiple) * multiple]``.

    Attention is causal, so no real position attends to a pad and their outputs are
    unchanged (MoE routing is dropless; pads only enter an aux load-balancing loss,
    like the response padding already does).
    """
    pad = -input_ids.shape[1] % multiple
    return torch.nn.functional.pad(input_ids, (0, pad)) if pad else input_ids


def _stage_ranks() -> tuple[bool, bool, int | None, int | None]:
    from megatron.core import parallel_state as ps

    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    prev = None if first else ps.get_pipeline_model_parallel_prev_rank()
    nxt = None if last else ps.get_pipeline_model_parallel_next_rank()
    return first, last, prev, nxt


def _stage_forward(
    model: nn.Module, ids: torch.Tensor, batch: MicroBatch, recv_shape, dtype, prev, train: bool
):
    received = None
    if prev is not None:
        received = torch.empty(recv_shape, dtype=dtype, device=ids.device)
        dist.recv(received, src=prev)
        received.requires_grad_(train)
        model.set_input_tensor(received)
    with torch.set_grad_enabled(train):
        output = _forward(model, ids, batch)
    return received, output


def _forward(model: nn.Module, ids: torch.Tensor, batch: MicroBatch) -> torch.Tensor:
    """The stage's forward; on the last stage, logits only in the batch's window. A packed
    row brings its own positions (for RoPE too) and attention mask."""
    if batch.packed is None:
        with logits_at(model, batch.logit_positions):
            return model(ids, positions_for(ids), None)
    positions = batch.packed.position_ids
    with logits_at(model, batch.logit_positions), rope_at(model, positions):
        return model(ids, positions, batch.packed.mask.ids)  # a tensor: see PackedMask


def run_micro_batches(
    model: nn.Module, micro_batches: list[MicroBatch], head: Head, hidden_size: int, train: bool
) -> list[Any]:
    """Forward (and backward when ``train``) every micro-batch; the last stage's results.

    Args:
        model: this rank's ``GPTModel`` stage.
        micro_batches: ``input_ids [b, s]`` and the logit window, plus what ``head`` reads.
        head: on the last stage, turns the model output into (loss, results).
        hidden_size: width of the hidden states passed between stages.
        train: run backward and accumulate gradients into ``param.grad``.

    Returns:
        ``head``'s results per micro-batch on the last stage, an empty list elsewhere.
    """
    _, last, prev, nxt = _stage_ranks()
    dtype = model.config.pipeline_dtype or torch.float32
    multiple = sequence_multiple(model)
    results = []
    for batch in micro_batches:
        ids = batch.input_ids
        recv_shape = (ids.shape[1] // multiple, ids.shape[0], hidden_size)
        received, output = _stage_forward(model, ids, batch, recv_shape, dtype, prev, train)
        if last:
            loss, result = head(output, batch)
            results.append(result)
            if train:
                loss.backward()
        else:
            dist.send(output.detach().contiguous(), dst=nxt)
            if train:
                grad = torch.empty_like(output)
                dist.recv(grad, src=nxt)
                torch.autograd.backward(output, grad)
        if train and received is not None:
            dist.send(received.grad.contiguous(), dst=prev)
    return results


def megatron_schedule(
    model: nn.Module, micro_batches: list[MicroBatch], head: Head, train: bool
) -> list[Any]:
    """Megatron's own pipeline schedule (1F1B) for accelerators; same contract as above."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    results: list[Any] = []
    iterator = iter(micro_batches)
    b, s = micro_batches[0].input_ids.shape

    def forward_step(data_iterator, stage):
        batch = next(data_iterator)
        output = _forward(stage, batch.input_ids, batch)

        def loss_func(output_tensor):
            loss, result = head(output_tensor, batch)
            results.append(result)
            # The engine already divides by the global normaliser: a 3-tuple with
            # calculate_per_token_loss stops Megatron dividing again.
            loss = output_tensor.sum() * 0 if loss is None else loss
            return loss, torch.ones((), dtype=torch.int64, device=loss.device), {}

        return output, loss_func

    model.config.calculate_per_token_loss = True
    # Packed rows differ in length from micro-batch to micro-batch: the stages exchange
    # each tensor's shape before it (seq_length / micro_batch_size are then unused).
    model.config.variable_seq_lengths = True
    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iterator,
        model=[model],
        num_microbatches=len(micro_batches),
        seq_length=s,
        micro_batch_size=b,
        forward_only=not train,
    )
    return results
