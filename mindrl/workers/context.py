"""What a worker group is handed at start-up: the run plan's decisions for it.

The driver builds the run plan once (mindrl/run_plan.py); every worker of a group gets
the part of it that group serves, typed, so a worker fetches what its stage reads and
puts what it writes without re-deriving either from the config (docs/architecture.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.algorithm import Algorithm
from mindrl.config.schema import AlgorithmConfig, MindRLConfig
from mindrl.config.specs import EngineSpecs
from mindrl.run_plan import RunPlan, StagePlan


@dataclass(frozen=True)
class StageContext:
    """One worker group's share of the run plan.

    Attributes:
        role: the group (``actor``, ``reference``, ``critic``, ``reward``).
        config: the whole run config (sections the worker builds from: model, rollout).
        algorithm: the trainer's maths (losses, advantages, shaping, the group filter).
        options: the algorithm's options as the run trains with them.
        stages: the plan's entries of the stages this group serves, in plan order: what
            each reads from the dock and what it writes.
        sequence: the fields a model stage packs its rows from (prompt, response, and a
            multi-turn trajectory's loss mask).
        tokens_may_lag: a trained token may come from older weights (the update then
            weights each by its behaviour ratio).
    """

    role: str
    config: MindRLConfig
    algorithm: Algorithm
    options: AlgorithmConfig
    stages: tuple[StagePlan, ...]
    sequence: tuple[str, ...]
    tokens_may_lag: bool

    def stage(self, name: str) -> StagePlan:
        """The plan entry of stage ``name``.

        Raises:
            KeyError: this group does not serve that stage in this run.
        """
        for stage in self.stages:
            if stage.name == name:
                return stage
        served = ", ".join(s.name for s in self.stages) or "none"
        raise KeyError(f"the {self.role} workers do not serve stage '{name}' (they serve {served})")

    def response_fields(self, name: str) -> tuple[str, ...]:
        """What stage ``name`` reads beyond the packed sequence (response-aligned inputs of
        its loss: advantages, reference and behaviour log-probs, values)."""
        return tuple(f for f in self.stage(name).reads if f not in self.sequence)


@dataclass(frozen=True)
class ModelContext(StageContext):
    """A model role's share of the plan, with what its engines are built with.

    Attributes:
        specs: the role's training layout and optimizer, resolved from the plan.
        mode: the plan's mode (``RunPlan.mode``): whether the actor's ranks generate
            (collocated), send the weights to rollout workers (disaggregated) or neither.
        offloaded: the plan offloads this role: its state waits on the host between stages.
    """

    specs: EngineSpecs
    mode: str
    offloaded: bool


def stage_context(
    plan: RunPlan,
    role: str,
    config: MindRLConfig,
    algorithm: Algorithm,
    only: tuple[str, ...] | None = None,
) -> StageContext:
    """The share of ``plan`` that the ``role`` group serves; ``only``: those of its stages
    a group of its own serves for it (a disaggregated run's rollout workers serve the
    actor's ``rollout``)."""
    shared = _shared(plan, role, config, algorithm)
    if only is not None:
        shared["stages"] = tuple(s for s in shared["stages"] if s.name in only)
    return StageContext(**shared)


def model_context(
    plan: RunPlan, role: str, config: MindRLConfig, algorithm: Algorithm, specs: EngineSpecs
) -> ModelContext:
    """A model role's share of ``plan``, built with ``specs``."""
    return ModelContext(
        **_shared(plan, role, config, algorithm),
        specs=specs,
        mode=plan.mode,
        offloaded=role in plan.offloaded_roles,
    )


def _shared(plan: RunPlan, role: str, config: MindRLConfig, algorithm: Algorithm) -> dict:
    return {
        "role": role,
        "config": config,
        "algorithm": algorithm,
        "options": plan.options,
        "stages": tuple(s for s in plan.stages if s.role == role),
        "sequence": plan.sequence,
        "tokens_may_lag": plan.tokens_may_lag,
    }
