"""Per-token log-probs and entropy from vocab-parallel logits, without a full-vocab gather.

Each TP rank holds logits for a contiguous slice of the (padded) vocabulary. The max
and the sum of exponentials are all-reduced over the TP group; the target logit is
picked on the rank that owns the target id and summed in (zeros elsewhere). Megatron's
``vocab_parallel_cross_entropy`` implements exactly that with a matching backward.
Padded vocabulary rows (ids >= ``vocab_size``) are masked out first.
"""

from __future__ import annotations

import torch


def at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32, or as it is when it is float64 (the exactness tests)."""
    return tensor if tensor.dtype == torch.float64 else tensor.float()


def _tp_info() -> tuple[int, int, object]:
    from megatron.core import parallel_state

    return (
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_tensor_model_parallel_group(),
    )


def mask_vocab_padding(logits_local: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Set logits of padded ids (>= ``vocab_size``) to the dtype's minimum on this shard."""
    rank, _, _ = _tp_info()
    width = logits_local.shape[-1]
    first = rank * width
    if first + width <= vocab_size:
        return logits_local
    ids = torch.arange(first, first + width, device=logits_local.device)
    return logits_local.masked_fill(ids >= vocab_size, torch.finfo(logits_local.dtype).min)


def vocab_parallel_logprobs(
    logits_local: torch.Tensor, targets: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """``log softmax(logits)[target]`` with logits split over TP ranks along the last dim.

    Args:
        logits_local: ``[b, s, vocab_padded / tp]`` this rank's logits (fp32 recommended).
        targets: ``[b, s]`` token ids in ``[0, vocab_size)``.
        vocab_size: the real vocabulary size (padded ids are excluded).

    Returns:
        ``[b, s]`` log-probs, identical on every TP rank, differentiable.
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = mask_vocab_padding(at_least_float32(logits_local), vocab_size)
    # Megatron's kernel wants [s, b, v] and returns the cross entropy (= -log p). It turns
    # its input into the softmax in place (kept for its backward), so it gets a copy of
    # its own: contiguous() alone hands over the caller's tensor when b == 1 (one packed
    # row, a context-parallel shard), whose entropy was then taken of probabilities.
    own = logits.transpose(0, 1).clone(memory_format=torch.contiguous_format)
    loss_sb = vocab_parallel_cross_entropy(own, targets.t().contiguous())
    return -loss_sb.t()


def vocab_parallel_entropy(logits_local: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Entropy ``logsumexp(z) - sum softmax(z) * z`` per position, ``[b, s]``, differentiable."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    _, world, group = _tp_info()
    logits = mask_vocab_padding(at_least_float32(logits_local), vocab_size)
    shift = logits.detach().amax(dim=-1, keepdim=True)
    if world > 1:
        torch.distributed.all_reduce(shift, op=torch.distributed.ReduceOp.MAX, group=group)
    exp = torch.exp(logits - shift)
    # Padded ids have exp == 0, so their (huge negative) logits drop out of sum(p * z).
    weighted_terms = torch.where(exp > 0, exp * (logits - shift), torch.zeros_like(exp))
    parts = torch.stack([exp.sum(-1), weighted_terms.sum(-1)])
    parts = reduce_from_tensor_model_parallel_region(parts) if world > 1 else parts
    total, weighted = parts[0], parts[1]
    return torch.log(total) - weighted / total
