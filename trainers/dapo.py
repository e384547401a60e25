"""DAPO (Yu et al. 2025): GRPO with decoupled clip, dynamic sampling, overlong shaping.

Defaults: ``clip_low`` 0.2 and ``clip_high`` 0.28 ("clip-higher"), no KL (so no
reference model), token-mean loss, dynamic sampling on.

* Dynamic sampling: a group whose sequence rewards are all equal has advantage 0 and
  gives no gradient, so it is dropped; the pipeline keeps drawing prompt batches until
  the batch is full or ``max_sample_batches`` is reached (0 = no limit). A group of one
  is kept (as verl does): GRPO gives it mean 0 and std 1, a non-zero advantage.
* Soft overlong penalty per response of length ``L`` (valid tokens), added to its last
  valid token: ``min(-(L - (L_max - buffer)) / buffer * factor, 0)``, i.e. 0 up to
  ``L_max - buffer`` tokens, then falling linearly to ``-factor`` at ``L_max``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from mindrl.config.schema import AlgorithmConfig
from trainers.grpo import GRPO, GroupIds, group_index


def filter_groups(
    rewards: torch.Tensor, group_ids: GroupIds, keep_singletons: bool = True
) -> torch.Tensor:
    """Keep-mask ``[batch]`` (bool): True where the sample's group rewards are not all equal.

    Args:
        rewards: ``[batch]`` sequence rewards.
        group_ids: ``[batch]`` group ids (tensor, or a list of any hashable).
        keep_singletons: keep groups of one (their GRPO advantage is not 0).
    """
    index, n_groups = group_index(group_ids, rewards.shape[0], rewards.device)
    # include_self=False: the zeros are placeholders; every group number has a member.
    placeholder = rewards.new_zeros(n_groups)
    lowest = placeholder.scatter_reduce(0, index, rewards, "amin", include_self=False)
    highest = placeholder.scatter_reduce(0, index, rewards, "amax", include_self=False)
    keep = (highest > lowest)[index]
    if keep_singletons:
        count = torch.bincount(index, minlength=n_groups)
        keep = keep | (count[index] == 1)
    return keep


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer: int, factor: float
) -> torch.Tensor:
    """Soft overlong penalty ``[batch]`` (formula in the module docstring).

    Args:
        lengths: ``[batch]`` response lengths in tokens.
        max_len: the maximum response length ``L_max``.
        buffer: tokens before ``L_max`` where the penalty ramps; 0 disables (all 0).
        factor: the penalty at ``L_max``.

    Raises:
        ValueError: ``buffer`` is negative or longer than ``max_len``.
    """
    if not 0 <= buffer <= max_len:
        raise ValueError(f"overlong buffer must be in [0, max_len={max_len}], got {buffer}")
    lengths = torch.as_tensor(lengths)
    if not lengths.is_floating_point():
        lengths = lengths.to(torch.get_default_dtype())
    if buffer == 0:
        return torch.zeros_like(lengths)
    excess = lengths - (max_len - buffer)
    return torch.clamp(-excess / buffer * factor, max=0.0)


def add_at_last_token(
    token_rewards: torch.Tensor, mask: torch.Tensor, per_seq: torch.Tensor
) -> torch.Tensor:
    """``token_rewards`` ``[batch, T]`` with ``per_seq`` ``[batch]`` added at each row's
    last valid token (rows without valid tokens are unchanged)."""
    valid = mask.bool()
    positions = torch.arange(valid.shape[-1], device=valid.device)
    last = torch.where(valid, positions, -1).amax(-1)  # [batch], -1 for empty rows
    at_last = positions == last.unsqueeze(-1)
    return token_rewards + torch.where(at_last, per_seq.to(token_rewards.dtype)[:, None], 0.0)


class DAPO(GRPO):
    """GRPO advantages + clip-higher, dynamic sampling, overlong shaping, no KL."""

    name = "dapo"
    needs_reference = False
    defaults: ClassVar[dict[str, object]] = {
        "kl_coef": 0.0,
        "clip_high": 0.28,
        "loss_agg_mode": "token-mean",
        "dynamic_sampling": True,
    }
    own_options = frozenset({"dynamic_sampling", "overlong_buffer"})

    def keep_mask(
        self, seq_rewards: torch.Tensor, group_ids: GroupIds, options: AlgorithmConfig
    ) -> torch.Tensor:
        """Dynamic sampling: drop groups with all-equal rewards (when switched on)."""
        if not options.dynamic_sampling:
            return super().keep_mask(seq_rewards, group_ids, options)
        return filter_groups(seq_rewards, group_ids)

    def shape_rewards(
        self,
        token_rewards: torch.Tensor,
        mask: torch.Tensor,
        max_response_len: int,
        options: AlgorithmConfig,
    ) -> torch.Tensor:
        """Adds the overlong penalty at each response's last valid token."""
        if options.overlong_buffer == 0:
            return token_rewards
        lengths = mask.bool().sum(-1).to(token_rewards.dtype)
        penalty = overlong_penalty(
            lengths, max_response_len, options.overlong_buffer, options.overlong_factor
        )
        return add_at_last_token(token_rewards, mask, penalty)
