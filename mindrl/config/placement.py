"""Where generation runs: on the actor's devices (collocated) or on devices of its own
(disaggregated), and how far behind the trained weights its samples may be.

Collocated (the default, the paper's all-colocated placement): every role spans all
``world`` devices and the actor's ranks generate between updates. Disaggregated
(issue 15): ``rollout.devices`` of them run rollout workers with their own generation
engine; the model roles train on the other ``world - rollout.devices``, and after every
update the trainer ranks send the new weights to the rollout workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindrl.config.schema import MindRLConfig

if TYPE_CHECKING:  # mindrl.algorithm imports this package: a type-only import avoids a cycle
    from mindrl.algorithm import Algorithm


def is_disaggregated(config: MindRLConfig) -> bool:
    return config.rollout.placement == "disaggregated"


def tokens_may_lag(config: MindRLConfig) -> bool:
    """Whether a trained token may come from older weights than the trained ones: a sample
    generated before the last update (``rollout.max_staleness``) or a response continued
    across updates (``rollout.partial_rollout_budget``). The loss then weights each token
    by its behaviour ratio (algorithm.behaviour_is_cap)."""
    return config.rollout.max_staleness > 0 or config.rollout.partial_rollout_budget is not None


#: Partial rollout's default in-flight pool, in batches of data.global_batch_size groups:
#: room for one batch to finish while up to one more batch of long responses is paused.
PARTIAL_ROLLOUT_BATCHES = 2


def partial_rollout_groups(config: MindRLConfig) -> int:
    """Groups partial rollout keeps in flight (``rollout.partial_rollout_groups``, by
    default 2 x data.global_batch_size); the dock holds that many."""
    groups = config.rollout.partial_rollout_groups
    return PARTIAL_ROLLOUT_BATCHES * config.data.global_batch_size if groups is None else groups


def train_world_size(config: MindRLConfig) -> int:
    """Devices the model roles (actor, reference, critic) train on."""
    if is_disaggregated(config):
        return config.world_size - config.rollout.devices
    return config.world_size


def rollout_world_size(config: MindRLConfig) -> int:
    """Devices that generate: all of them collocated, ``rollout.devices`` disaggregated."""
    return config.rollout.devices if is_disaggregated(config) else config.world_size


def check_placement(config: MindRLConfig, algorithm: Algorithm | None = None) -> list[str]:
    """One line per impossible or not yet supported placement / staleness setting."""
    rollout, world = config.rollout, config.world_size
    if not is_disaggregated(config):
        problems = []
        if rollout.devices:
            problems.append(
                f"rollout.devices={rollout.devices} needs rollout.placement: disaggregated "
                "(collocated, every device generates); remove it or set the placement"
            )
        if rollout.max_staleness:
            problems.append(
                f"rollout.max_staleness={rollout.max_staleness} needs rollout.placement: "
                "disaggregated (collocated, generation and training take turns on the same "
                "devices, so nothing overlaps); set it, or rollout.max_staleness: 0"
            )
        return problems
    if rollout.devices < 1 or rollout.devices >= world:
        return [
            f"rollout.devices={rollout.devices}: a disaggregated run needs at least one device "
            f"to generate and one to train, and the cluster has {world} "
            f"(resources.nodes x resources.devices_per_node); set 1 <= rollout.devices <= "
            f"{world - 1}"
        ]
    unsupported = {
        "rollout.tp > 1": rollout.tp > 1,
        "rollout.ep > 1": rollout.ep > 1,
        "dock.pipeline: stream": config.dock.pipeline == "stream",
        "dynamic sampling (DAPO)": bool(
            config.algorithm.dynamic_sampling
            or (algorithm is not None and algorithm.defaults.get("dynamic_sampling"))
        ),
        "resources.nodes > 1": config.resources.nodes > 1,
        "validation (data.val_every > 0)": config.data.val_every > 0,
        # GSPO's ratio is per sequence: a per-token behaviour weight does not apply to it.
        "--trainer gspo and rollout.max_staleness > 0": (
            algorithm is not None and algorithm.name == "gspo" and rollout.max_staleness > 0
        ),
    }
    return [
        f"rollout.placement: disaggregated with {what} is not yet supported; use "
        "rollout.placement: collocated for it"
        for what, used in unsupported.items()
        if used
    ]
