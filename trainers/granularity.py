"""Embodied RL at every granularity: the chunk, its actions, their tokens.

A vision-language-action policy answers one observation with a *chunk* of ``C`` actions
of ``A`` dimensions each, emitted as ``C * A`` action tokens (token ``j`` is dimension
``j % A`` of action ``j // A``); the environment gives every atomic action its own
reward and a ``valid`` flag (false after its episode's first done: the action was not
applied). One sample is one chunk step. The algorithms work at three levels:

* ``reward_level``: where advantages live. ``chunk``: one reward per chunk, the sum of
  its valid actions' rewards; ``action``: one per action.
* ``logprob_level``: the probability ratio's unit. ``chunk``: the sum of the chunk's
  token log-probs; ``action``: the sum over each action's ``A`` tokens; ``token``: each
  token's own.
* An advantage is spread from its level to the log-prob level (a chunk's advantage
  weighs each of its actions or tokens); it can never be finer than the log-prob it
  weighs, so ``reward_level: action`` with ``logprob_level: chunk`` is refused at load
  (``embodied_level_problems`` in mindrl/config/validate.py): one ratio for the chunk
  cannot carry one advantage per action.

The valid-action mask follows the log-prob level (a chunk counts while any of its
actions is valid, a token while its action is), and the loss is the mean over the valid
units of the whole batch: each unit weighs ``1 / T`` with ``T`` the batch's valid count
(``aggregate_loss``'s ``token-mean`` with that mask and count), so actions after a done,
which the environment never applied, neither move the policy nor dilute the others.

Identities the tests pin: with ``C = 1`` the chunk level is the action level; with
``A = 1`` the token level is the action level.
"""

from __future__ import annotations

import torch

from mindrl.config.schema import EMBODIED_LEVELS as LEVELS
from mindrl.config.schema import REWARD_LEVELS


def width(level: str, chunk_size: int, action_dims: int) -> int:
    """Units per chunk at ``level``: 1 chunk, ``C`` actions or ``C * A`` tokens."""
    return {"chunk": 1, "action": chunk_size, "token": chunk_size * action_dims}[_known(level)]


def logprobs_at(token_logprobs: torch.Tensor, level: str, action_dims: int) -> torch.Tensor:
    """``[..., C * A]`` token log-probs -> ``[..., width]`` at ``level`` (sums: the log of
    the joint probability of the unit's tokens)."""
    if level == "token":
        return token_logprobs
    per_action = token_logprobs.unflatten(-1, (-1, action_dims)).sum(-1)
    return per_action if _known(level) == "action" else per_action.sum(-1, keepdim=True)


def rewards_at(action_rewards: torch.Tensor, valid: torch.Tensor, level: str) -> torch.Tensor:
    """``[..., C]`` rewards of the actions -> ``[..., 1]`` (chunk: the sum over its valid
    actions) or ``[..., C]`` (action: each valid action's, 0 where not valid)."""
    if level not in REWARD_LEVELS:
        raise ValueError(f"rewards live at a chunk or an action, not at {level!r}")
    kept = torch.where(valid, action_rewards, 0.0)
    return kept if level == "action" else kept.sum(-1, keepdim=True)


def valid_at(valid: torch.Tensor, level: str, action_dims: int) -> torch.Tensor:
    """``[..., C]`` valid actions -> the ``[..., width]`` mask at ``level``: a chunk counts
    while any of its actions is valid, a token while its action is."""
    if _known(level) == "chunk":
        return valid.any(-1, keepdim=True)
    return valid if level == "action" else valid.repeat_interleave(action_dims, dim=-1)


def spread(
    values: torch.Tensor, from_level: str, to_level: str, chunk_size: int, action_dims: int
) -> torch.Tensor:
    """``[..., width(from_level)]`` (advantages) -> ``[..., width(to_level)]``: each
    unit's value copied to the finer units it contains.

    Raises:
        ValueError: ``to_level`` is coarser than ``from_level``.
    """
    if LEVELS.index(_known(to_level)) < LEVELS.index(_known(from_level)):
        raise ValueError(f"cannot spread {from_level} values onto coarser {to_level} units")
    copies = width(to_level, chunk_size, action_dims) // width(from_level, chunk_size, action_dims)
    return values.repeat_interleave(copies, dim=-1)


def _known(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; known: {', '.join(LEVELS)}")
    return level
