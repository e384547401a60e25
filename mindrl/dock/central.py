"""Centralized replay buffer: one actor holds every payload and every stage's metadata.

The baseline the paper compares the dock against; it speaks the same client interface,
so ``create_dock(..., kind="central")`` changes nothing else for workers.
"""

from __future__ import annotations

import asyncio

import numpy as np
import ray

from mindrl.dock.controller import ControllerState, wait_and_claim
from mindrl.dock.errors import DockError
from mindrl.dock.schema import FieldSpec
from mindrl.dock.warehouse import WarehouseStore
from mindrl.dock.wire import Columns, Padded


@ray.remote(num_cpus=0)
class CentralBuffer:
    """Payloads of all samples plus one :class:`ControllerState` per stage, in one actor.

    Args:
        n_samples: sample indexes per iteration.
        group_size: samples per group.
        schema: the fields that may be put.
        reads: stage -> the fields that stage tracks.
        group_ids: optional explicit group id per index.
    """

    def __init__(
        self,
        n_samples: int,
        group_size: int,
        schema: dict[str, FieldSpec],
        reads: dict[str, list[str]],
        group_ids: np.ndarray | None = None,
    ) -> None:
        self.store = WarehouseStore(0, 0, n_samples, schema)
        self.states = {
            stage: ControllerState(stage, n_samples, group_size, fields, group_ids)
            for stage, fields in reads.items()
        }
        self.changed = asyncio.Condition()

    async def put(
        self,
        indexes: np.ndarray,
        columns: dict[str, Columns],
        version: int | None = None,
        repeat: int = 1,
    ) -> int:
        lengths = self.store.put(indexes, columns, repeat)
        for state in self.states.values():
            if set(state.fields) & set(columns):
                state.on_put(indexes, list(columns), 0, lengths, version)
        async with self.changed:
            self.changed.notify_all()
        return len(indexes)

    async def claim(
        self,
        stage: str,
        fields: list[str],
        batch_size: int,
        whole_groups: bool,
        prefer_warehouse: int | None,
        timeout_s: float,
        dp_parts: int = 1,
        step: int | None = None,
        part_warehouses: list[int | None] | None = None,
    ) -> list[np.ndarray]:
        state = self.states.get(stage)
        if state is None:
            raise DockError(f"unknown stage '{stage}'; known: {sorted(self.states)}")
        request = (fields, batch_size, whole_groups, prefer_warehouse)
        return await wait_and_claim(
            state, self.changed, request, timeout_s, dp_parts, step, part_warehouses
        )

    def get(self, indexes: np.ndarray, fields: list[str]) -> dict[str, Padded]:
        return self.store.get(indexes, fields)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def stats(self) -> dict[str, int]:
        metadata = sum(s.metadata_bytes for s in self.states.values())
        return {
            "bytes_in": self.store.bytes_in,
            "bytes_out": self.store.bytes_out,
            "metadata_bytes": metadata,
        }

    def versions(self, stage: str, indexes: np.ndarray) -> np.ndarray:
        return self.states[stage].version[indexes]

    def recycle(self, indexes: np.ndarray) -> None:
        for state in self.states.values():
            state.recycle(indexes)

    async def hold(self, indexes: np.ndarray, held: bool, stages: list[str] | None = None) -> None:
        for stage, state in self.states.items():
            if stages is None or stage in stages:
                state.hold(indexes, held)
        async with self.changed:  # a released sample may complete a waiting claim
            self.changed.notify_all()

    def ready_count(self, stage: str, fields: list[str]) -> int:
        return self.states[stage].ready_count(fields)

    def clear(self) -> None:
        self.store.clear()
        for state in self.states.values():
            state.clear()
