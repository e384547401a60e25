"""The picklable description of a dock that every client is built from (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mindrl.dock.schema import FieldSpec


@dataclass
class WarehouseInfo:
    """One TD warehouse: its actor, the node it lives on, its index share ``[first, last)``."""

    actor: Any
    node_id: str
    first: int
    last: int


@dataclass
class DockHandle:
    """Picklable description of a dock; build a ``DockClient`` from it anywhere.

    Attributes:
        schema: the fields that may be put.
        n_samples: sample indexes per iteration (G * N).
        group_size: samples per group (N responses of a prompt): a group's samples sit at
            consecutive indexes of one slot (:func:`group_slots`).
        warehouses: the TD warehouses in index order (the central buffer is the only
            "warehouse" of a centralized dock).
        controllers: stage -> its :class:`~mindrl.dock.controller.StageController` (empty
            for a centralized dock).
        central: the centralized buffer actor, or None for a distributed dock.
        timeout_s: default deadline of a wait for samples and of any actor call.
    """

    schema: dict[str, FieldSpec]
    n_samples: int
    group_size: int
    warehouses: list[WarehouseInfo]
    controllers: dict[str, Any] = field(default_factory=dict)
    central: Any = None
    timeout_s: float = 120.0

    @property
    def kind(self) -> str:
        return "central" if self.central is not None else "distributed"

    @property
    def stages(self) -> list[str]:
        return list(self.controllers)

    def controller_actors(self) -> dict[Any, list[str]]:
        """Each controller process (a :class:`TDControllers` actor) -> its stages."""
        actors: dict[Any, list[str]] = {}
        for stage, controller in self.controllers.items():
            actors.setdefault(controller.actor, []).append(stage)
        return actors

    def actors(self) -> dict[str, Any]:
        """Every actor of the dock by the name errors use for it."""
        if self.central is not None:
            return {"centralized buffer": self.central}
        named = {}
        for actor, stages in self.controller_actors().items():
            quoted = ", ".join(f"'{stage}'" for stage in stages)
            plural = "s" if len(stages) > 1 else ""
            named[f"TD controller{plural} of stage{plural} {quoted}"] = actor
        for w, info in enumerate(self.warehouses):
            named[warehouse_name(w, info.node_id)] = info.actor
        return named


def warehouse_name(w: int, node_id: str) -> str:
    return f"TD warehouse {w} (node {node_id[:8]})"


def group_slots(indexes: np.ndarray, group_size: int) -> np.ndarray:
    """The slot of each sample index: the dock keeps a group's ``group_size`` samples at
    consecutive indexes, slot ``s`` holding indexes ``s * group_size`` onwards."""
    return np.asarray(indexes, dtype=np.int64) // group_size


def slot_indexes(slots: np.ndarray | list[int], group_size: int) -> np.ndarray:
    """The sample indexes of group ``slots``, slot by slot (:func:`group_slots` inverted)."""
    first = np.asarray(slots, dtype=np.int64)[:, None] * group_size
    return (first + np.arange(group_size)).ravel()
