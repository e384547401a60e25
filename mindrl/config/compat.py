"""What combines with what: the one matrix of features a run cannot use together yet.

A *feature* is a setting that changes how a run works (disaggregated placement, partial
rollout, streaming, dynamic sampling, ...), with the words a refusal names it by. The
matrix lists, for each feature that has limits, the features it does not work with yet
and what the user can do instead; :func:`unsupported_combinations` turns every row a
config hits into the one line a user sees at start-up:

    rollout.placement: disaggregated with dock.pipeline: stream is not yet supported; use
    rollout.placement: collocated for it
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from mindrl.config.layout import DISAGGREGATED, RunLayout
from mindrl.config.schema import AlgorithmConfig, MindRLConfig


class AlgorithmTraits(Protocol):
    """What the config checks read of an algorithm: the capabilities
    ``mindrl.algorithm.Algorithm`` declares (its docstring says what each means) and its
    resolution of the ``algorithm`` section. Declared here, beside its readers, so the
    config never imports the algorithms, which import it."""

    name: str
    needs_critic: bool
    uses_groups: bool
    offline: bool
    chunk_value_head: bool
    supports_partial_rollout: bool
    supports_stale_rollouts: bool
    defaults: Mapping[str, object]

    def resolve(self, section: object = None) -> AlgorithmConfig: ...

    def uses_reference(self, options: AlgorithmConfig) -> bool: ...


def model_roles(
    algorithm: AlgorithmTraits | None, options: AlgorithmConfig | None, lora: bool = False
) -> tuple[str, ...]:
    """The model roles a run of ``algorithm`` with ``options`` places, ``actor`` first: a
    reference where its loss reads one (offline pairs always do) unless the actor trains
    LoRA adapters (its base, the adapters off, is then the reference: one model in
    memory), a critic where it learns values. Without an algorithm or its options, every
    role (a recipe checked for any trainer)."""
    if algorithm is None or options is None:
        return ("actor", "critic") if lora else ("actor", "reference", "critic")
    reference = uses_reference(algorithm, options) and not lora
    return (
        ("actor",)
        + (("reference",) if reference else ())
        + (("critic",) if algorithm.needs_critic else ())
    )


def uses_reference(algorithm: AlgorithmTraits, options: AlgorithmConfig) -> bool:
    """The run's losses read reference log-probs (offline pairs always do)."""
    return algorithm.offline or algorithm.uses_reference(options)


@dataclass(frozen=True)
class RunFacts:
    """What a feature is read from: the config, the run's algorithm (None: not known yet,
    so no algorithm feature is in use) and the resolved layout."""

    config: MindRLConfig
    algorithm: AlgorithmTraits | None
    layout: RunLayout


@dataclass(frozen=True)
class Feature:
    """A setting a refusal can name: whether a run uses it, and how it is named."""

    used: Callable[[RunFacts], bool]
    name: Callable[[RunFacts], str]


def _named(text: str) -> Callable[[RunFacts], str]:
    return lambda facts: text


def _dynamic_sampling(facts: RunFacts) -> bool:
    algorithm = facts.algorithm
    return bool(
        facts.config.algorithm.dynamic_sampling
        or (algorithm is not None and algorithm.defaults.get("dynamic_sampling"))
    )


def _without_partial_rollout(facts: RunFacts) -> bool:
    return facts.algorithm is not None and not facts.algorithm.supports_partial_rollout


def _stale_rollouts_refused(facts: RunFacts) -> bool:
    algorithm = facts.algorithm
    stale = facts.config.rollout.max_staleness > 0
    return stale and algorithm is not None and not algorithm.supports_stale_rollouts


def _trainer(facts: RunFacts) -> str:
    return f"--trainer {facts.algorithm.name}"


def _group_sizes(facts: RunFacts) -> str:
    group = facts.config.data.n_samples_per_prompt
    sizes = ", ".join(f"{role} {layout.dp}" for role, layout in facts.layout.training.items())
    return f"data.n_samples_per_prompt={group} not a multiple of every data-parallel size ({sizes})"


def _group_split_by_dp(facts: RunFacts) -> bool:
    dp = [layout.dp for layout in facts.layout.training.values()]
    return all(dp) and facts.config.data.n_samples_per_prompt % math.lcm(*dp) != 0


FEATURES: dict[str, Feature] = {
    "disaggregated": Feature(
        lambda f: f.layout.mode == DISAGGREGATED, _named("rollout.placement: disaggregated")
    ),
    "partial rollout": Feature(
        lambda f: f.config.rollout.partial_rollout_budget is not None,
        lambda f: f"rollout.partial_rollout_budget={f.config.rollout.partial_rollout_budget}",
    ),
    "generation TP": Feature(lambda f: f.config.rollout.tp > 1, _named("rollout.tp > 1")),
    "generation EP": Feature(lambda f: f.config.rollout.ep > 1, _named("rollout.ep > 1")),
    "streaming": Feature(
        lambda f: f.config.dock.pipeline == "stream", _named("dock.pipeline: stream")
    ),
    "dynamic sampling": Feature(_dynamic_sampling, _named("dynamic sampling (DAPO)")),
    "validation": Feature(
        lambda f: f.config.data.val_every > 0, _named("validation (data.val_every > 0)")
    ),
    # What an algorithm declares it cannot train on (mindrl/algorithm.py), named by it.
    "an algorithm without partial rollout": Feature(_without_partial_rollout, _trainer),
    "an algorithm without stale rollouts": Feature(
        _stale_rollouts_refused, lambda f: f"{_trainer(f)} and rollout.max_staleness > 0"
    ),
    "environment": Feature(
        lambda f: f.config.env.enabled, lambda f: f"env.cls {f.config.env.cls!r} (multi-turn)"
    ),
    "offline": Feature(
        lambda f: f.algorithm is not None and f.algorithm.offline,
        lambda f: f"--trainer {f.algorithm.name} (stored pairs, nothing generates)",
    ),
    "reward model": Feature(
        lambda f: f.config.reward.reward_model is not None, _named("reward.reward_model")
    ),
    # Every finished group must train on its own, so the update never waits on a second
    # group to fill its data-parallel split.
    "groups split by data parallelism": Feature(_group_split_by_dp, _group_sizes),
}


@dataclass(frozen=True)
class Limits:
    """The features ``feature`` does not work with yet, in the order refusals list them,
    and what a refusal tells the user to do."""

    without: tuple[str, ...]
    instead: str


#: The matrix. A pair not listed here combines.
NOT_YET_SUPPORTED: dict[str, Limits] = {
    "disaggregated": Limits(
        (
            "generation EP",
            "streaming",
            "dynamic sampling",
            "validation",
            "an algorithm without stale rollouts",
        ),
        "use rollout.placement: collocated for it",
    ),
    "partial rollout": Limits(
        (
            "disaggregated",
            "streaming",
            "dynamic sampling",
            "an algorithm without partial rollout",
            "groups split by data parallelism",
        ),
        "remove rollout.partial_rollout_budget for it",
    ),
    # An episode's reward is the sum of its environment's step rewards; the features below
    # generate or score one response per prompt.
    "environment": Limits(
        (
            "partial rollout",
            "disaggregated",
            "generation TP",
            "dynamic sampling",
            "offline",
            "validation",
            "reward model",
        ),
        "remove the env section for it",
    ),
}


def unsupported_combinations(feature: str, facts: RunFacts) -> list[str]:
    """One line per feature the run uses beside ``feature`` that ``feature`` does not
    work with yet (none when the run does not use ``feature``)."""
    if not FEATURES[feature].used(facts):
        return []
    limits = NOT_YET_SUPPORTED[feature]
    named = FEATURES[feature].name(facts)
    return [
        f"{named} with {FEATURES[other].name(facts)} is not yet supported; {limits.instead}"
        for other in limits.without
        if FEATURES[other].used(facts)
    ]
