"""The algorithm contract: what every ``trainers/<name>.py`` fills in and the workers call.

An algorithm is stateless maths over plain tensors plus a few facts the run is built
from (does it need a critic, a reference policy, groups of responses per prompt). Its
options are the config's ``algorithm`` section, :class:`AlgorithmConfig`, the one list
of options: :meth:`Algorithm.resolve` fills the fields a recipe leaves unset (``None``)
with the algorithm's ``defaults``, and refuses options only another algorithm reads.

The shared maths an implementation uses (policy loss, KL estimators, aggregation) lives
with the algorithms in ``trainers/core.py``; this module holds only the contract, so the
workers in ``mindrl/workers`` and the config checks can type it without importing
``trainers`` (imports flow trainers -> mindrl -> backends; docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

import torch

from mindrl.config.schema import AlgorithmConfig, MindRLConfig

#: Fields whose ``None`` is a setting (dual clip off), not "the algorithm's default".
NULLABLE_OPTIONS = frozenset({"clip_c"})
#: The aggregation that divides each response's token-loss sum by a constant length.
SUM_NORM = "seq-mean-token-sum-norm"
#: Where neither the recipe nor the algorithm sets a field that defaults to ``None``.
BASE_DEFAULTS: Mapping[str, object] = {
    "kl_coef": 0.0,
    "clip_low": 0.2,
    "clip_high": 0.2,
    "norm_adv_by_std": True,
    "loss_agg_mode": "token-mean",
    "dynamic_sampling": False,
    "entropy_coef": 0.0,
    "lam": 1.0,
}

Number = int | float | torch.Tensor
Batch = Mapping[str, torch.Tensor]
LossAndMetrics = tuple[torch.Tensor, dict[str, torch.Tensor]]


class Algorithm(ABC):
    """One RL algorithm, as the run driver and the workers see it.

    Class attributes: ``name`` (the ``--trainer`` name); ``needs_critic`` (a value model
    and its update); ``needs_reference`` (a reference policy with the default options;
    :meth:`uses_reference` decides for resolved ones); ``uses_groups`` (advantages compare
    the responses of one prompt, so a prompt needs at least two); ``defaults`` (values for
    :class:`AlgorithmConfig` fields a recipe leaves unset, by field name); ``own_options``
    (options only this algorithm reads; switched on elsewhere they are refused);
    ``reads_options`` (all the options it reads, when only a few); ``offline`` (trains on
    stored data, no generation); ``group_local_advantages`` (below);
    ``supports_partial_rollout`` and ``supports_stale_rollouts`` (what it trains on beside
    fresh samples). The run plan, the config checks and the compatibility matrix
    (mindrl/config/compat.py) read these, never an algorithm's name: adding one is its
    file and a line in ``trainers/registry.py``.
    """

    name: ClassVar[str]
    needs_critic: ClassVar[bool] = False
    needs_reference: ClassVar[bool] = True
    uses_groups: ClassVar[bool] = False
    #: A group's advantages read that group's samples alone (normalised within the group,
    #: no statistic over the batch), so the advantage stage may run on every node on the
    #: groups its warehouse stores (trainers/driver/iteration.py); an estimator that
    #: whitens over the batch (PPO's GAE, REINFORCE++) needs the whole batch on one worker.
    group_local_advantages: ClassVar[bool] = False
    defaults: ClassVar[Mapping[str, object]] = {}
    own_options: ClassVar[frozenset[str]] = frozenset()
    #: Trains on stored data (preference pairs) instead of generating: no rollout,
    #: reward or advantage stage (mindrl/run_plan.py, trainers/driver/offline.py).
    offline: ClassVar[bool] = False
    #: Trains on responses that partial rollout resumed over several iterations, each
    #: token weighted by the policy that sampled it (rollout.partial_rollout_budget).
    supports_partial_rollout: ClassVar[bool] = True
    #: Trains on responses sampled by weights up to ``rollout.max_staleness`` updates old,
    #: corrected by per-token behaviour weights (disaggregated rollout workers).
    supports_stale_rollouts: ClassVar[bool] = True
    #: Trains embodied runs with per-chunk-step credit from a value head shared with the
    #: policy (:meth:`chunk_step_advantages`, PPO's GAE) instead of a group's statistics.
    chunk_value_head: ClassVar[bool] = False
    #: Metrics :meth:`actor_loss` reports as the micro-batch's share of the global batch's
    #: figure (normalised by the global counts, as the loss is): the update sums them over
    #: micro-batches and ranks into the exact figure (mindrl/workers/updates.py), where the
    #: other metrics are averaged.
    additive_metrics: ClassVar[frozenset[str]] = frozenset()
    #: The options this algorithm reads when it reads only a few (an offline loss reads
    #: none of the policy-gradient ones); a set value outside them is refused. None:
    #: every option but those other algorithms own.
    reads_options: ClassVar[frozenset[str] | None] = None
    #: Options that belong to one algorithm each: switched on, they name their owner.
    OPTION_OWNERS: ClassVar[Mapping[str, str]] = {
        "dynamic_sampling": "dapo",
        "overlong_buffer": "dapo",
        "pf_filter_ratio": "pf_ppo",
        "pf_filter_mode": "pf_ppo",
        "dpo_beta": "dpo",
        "dpo_loss": "dpo",
    }

    def resolve(self, section: object = None) -> AlgorithmConfig:
        """The options of a run: ``section`` (a config section, a mapping or nothing) with
        unset fields taken from ``defaults``, then :data:`BASE_DEFAULTS`.

        Raises:
            ValueError: a mapping has unknown keys, or it switches on an option that only
                another algorithm implements (e.g. dynamic sampling outside dapo).
        """
        values = _section_values(section)
        self._refuse_unread_options(values)
        for key, value in values.items():
            if value is None and key not in NULLABLE_OPTIONS:
                values[key] = self.defaults.get(key, BASE_DEFAULTS.get(key))
        options = AlgorithmConfig(**values)
        self._refuse_foreign_options(options)
        if options.norm_len is not None and options.loss_agg_mode != SUM_NORM:
            raise ValueError(
                f"algorithm.norm_len: only {SUM_NORM} divides by a constant length and "
                f"{self.name} aggregates with {options.loss_agg_mode}; remove it"
            )
        return options

    def _refuse_unread_options(self, values: Mapping[str, object]) -> None:
        """A value set (not the section's default) for an option this algorithm never reads
        would silently do nothing; other algorithms' own options get their owner's message."""
        if self.reads_options is None:
            return
        defaults = _section_values(None)
        for key, value in values.items():
            unread = key not in self.reads_options and key not in self.OPTION_OWNERS
            if unread and value != defaults[key]:
                raise ValueError(
                    f"algorithm.{key}: {self.name} does not read it (it reads only "
                    f"{', '.join(sorted(self.reads_options))}), so it has no effect; remove it"
                )

    def _refuse_foreign_options(self, options: AlgorithmConfig) -> None:
        for key, owner in self.OPTION_OWNERS.items():
            # Off is None (unset), False or 0; anything else (a ratio, a mode) is switched on.
            switched_on = getattr(options, key) not in (None, False, 0)
            if switched_on and key not in self.own_options:
                raise ValueError(
                    f"algorithm.{key} is a {owner} feature; {self.name} does not use it "
                    f"(leave it unset or run --trainer {owner})"
                )

    def uses_reference(self, options: AlgorithmConfig) -> bool:
        """Whether a reference model is needed: only when KL is penalised."""
        return options.kl_coef > 0 or options.adaptive_kl

    def advantage_inputs(self, options: AlgorithmConfig) -> tuple[str, ...]:
        """Dock fields the advantage stage hands :meth:`compute_advantages` beside the
        rewards (and ``values``): none unless an algorithm shapes rewards with them."""
        return ()

    def keep_mask(
        self, seq_rewards: torch.Tensor, group_ids: object, options: AlgorithmConfig
    ) -> torch.Tensor:
        """Samples to train on, ``[batch]`` bool; all of them unless an algorithm filters."""
        return torch.ones(len(seq_rewards), dtype=torch.bool, device=seq_rewards.device)

    def shape_rewards(
        self,
        token_rewards: torch.Tensor,
        mask: torch.Tensor,
        max_response_len: int,
        options: AlgorithmConfig,
    ) -> torch.Tensor:
        """Reward shaping before advantages, ``[batch, T]``; none unless overridden."""
        return token_rewards

    @abstractmethod
    def compute_advantages(self, batch: Batch, options: AlgorithmConfig) -> dict[str, torch.Tensor]:
        """``advantages`` ``[batch, T]`` (plus ``returns`` for critics) from a batch.

        ``batch`` holds ``token_rewards`` and ``response_mask`` ``[batch, T]``, and
        ``group_ids`` ``[batch]`` (group algorithms) or ``values`` ``[batch, T]`` (critics).
        """

    @abstractmethod
    def actor_loss(
        self,
        logprob: torch.Tensor,
        batch: Batch,
        options: AlgorithmConfig,
        num_tokens: Number | None = None,
        entropy: torch.Tensor | None = None,
        num_seqs: Number | None = None,
    ) -> LossAndMetrics:
        """The policy's loss on one micro-batch and detached scalar metrics.

        Args:
            logprob: ``[batch, T]`` log-probs of the policy being trained.
            batch: ``advantages``, ``response_mask``, ``old_logprob`` (absent: on-policy)
                and ``ref_logprob`` when KL is used.
            options: resolved options (see :meth:`resolve`).
            num_tokens: global-batch token count (token-mean aggregation).
            entropy: ``[batch, T]`` per-token entropy, for a bonus and the metric.
            num_seqs: global-batch sequence count (the seq-mean aggregations).
        """

    def critic_loss(
        self,
        values: torch.Tensor,
        batch: Batch,
        options: AlgorithmConfig,
        num_tokens: Number | None = None,
        num_seqs: Number | None = None,
    ) -> LossAndMetrics:
        """The value model's loss on one micro-batch (algorithms with ``needs_critic``)."""
        raise NotImplementedError(f"{self.name} trains no critic")

    # ---- embodied runs (a vision-language-action policy stepping simulators) --------------
    def episode_advantages(
        self, returns: torch.Tensor, group_ids: torch.Tensor, options: AlgorithmConfig
    ) -> torch.Tensor:
        """``[episodes]`` advantages of whole episodes from their ``returns`` (group
        algorithms: the episodes sharing an initial state form a group)."""
        raise NotImplementedError(f"{self.name} has no episode advantages")

    def chunk_step_advantages(
        self,
        rewards: torch.Tensor,
        values: torch.Tensor,
        valid: torch.Tensor,
        bootstrap: torch.Tensor,
        options: AlgorithmConfig,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)`` ``[episodes, T, width(reward_level)]`` of each
        episode's chunk steps from the actions' ``rewards`` and ``valid`` ``[episodes, T,
        C]`` (valid: applied), the value head's ``values`` (shaped as the results) and
        ``bootstrap [episodes]``: the value of where an episode cut off by its horizon
        stopped (0 for one that terminated) (``chunk_value_head``)."""
        raise NotImplementedError(f"{self.name} has no value head for chunk steps")

    def valid_units(
        self,
        valid: torch.Tensor,
        options: AlgorithmConfig,
        action_dims: int,
        level: str | None = None,
    ) -> int:
        """Units of ``level`` (default ``options.logprob_level``) that the valid actions
        ``[..., C]`` hold."""
        raise NotImplementedError(f"{self.name} trains no chunked actions")

    def chunk_value_loss(
        self, values: torch.Tensor, batch: Batch, options: AlgorithmConfig, num_units: Number
    ) -> LossAndMetrics:
        """The value head's loss on chunk steps: ``values``, ``old_values`` and
        ``returns`` ``[rows, width(reward_level)]``, ``valid [rows, C]``; each valid unit
        of ``options.reward_level`` weighs ``1 / num_units`` (``chunk_value_head``)."""
        raise NotImplementedError(f"{self.name} has no value head for chunk steps")

    def chunk_actor_loss(
        self,
        token_logprobs: torch.Tensor,
        token_entropy: torch.Tensor,
        batch: Batch,
        options: AlgorithmConfig,
        action_dims: int,
        num_units: Number,
    ) -> LossAndMetrics:
        """The policy's loss on chunk steps: ``token_logprobs`` / ``token_entropy``
        ``[rows, C*A]``; ``batch``: ``old_logprob [rows, C*A]``, ``advantages`` at
        ``options.reward_level`` and ``valid [rows, C]`` (applied actions);
        ``num_units`` the global batch's valid units at ``options.logprob_level``."""
        raise NotImplementedError(f"{self.name} trains no chunked actions")


def run_options(algorithm: Algorithm, config: MindRLConfig) -> AlgorithmConfig:
    """The options a run trains with: ``algorithm``'s resolution of the config's section,
    with the length constant of ``seq-mean-token-sum-norm`` left unset taken from
    ``rollout.max_response_length``: Dr. GRPO divides by the generation budget (Liu et
    al. 2025, §3.1), the same for every batch, not by a batch's padded width."""
    options = algorithm.resolve(config.algorithm)
    if options.loss_agg_mode == SUM_NORM and options.norm_len is None:
        options = dataclasses.replace(options, norm_len=config.rollout.max_response_length)
    return options


def option_names() -> tuple[str, ...]:
    """Every algorithm option, in the config section's order."""
    return tuple(field.name for field in dataclasses.fields(AlgorithmConfig))


def _section_values(section: object) -> dict[str, object]:
    """Field -> value of a config section, or of a mapping laid over the section's defaults
    (unknown keys refused); nothing gives the section's defaults."""
    names = option_names()
    if section is None or isinstance(section, Mapping):
        given = section or {}
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ValueError(f"unknown algorithm options {unknown}; known: {sorted(names)}")
        section = AlgorithmConfig(**given)
    return {key: getattr(section, key) for key in names}
