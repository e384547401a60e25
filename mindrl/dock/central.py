"""Centralized replay buffer: one actor holds every payload and every stage's metadata.

The baseline the paper compares the dock against; it speaks the same client interface,
so swapping ``dock.kind: central`` in a config changes nothing else.
"""

from __future__ import annotations

import asyncio

import numpy as np
import ray

from mindrl.dock.controller import ControllerState, balance_by_length, starved
from mindrl.dock.schema import DockError, FieldSpec
from mindrl.dock.warehouse import WarehouseStore
from mindrl.dock.wire import Columns


@ray.remote(num_cpus=0)
class CentralBuffer:
    def __init__(
        self, n_samples: int, group_size: int, schema: dict[str, FieldSpec], stages: list[str]
    ) -> None:
        self.store = WarehouseStore(0, 0, n_samples, schema)
        self.states = {s: ControllerState(s, n_samples, group_size, list(schema)) for s in stages}
        self.changed = asyncio.Condition()

    async def put(self, indexes: np.ndarray, columns: dict[str, Columns]) -> int:
        lengths = self.store.put(indexes, columns)
        for state in self.states.values():
            state.on_put(indexes, list(columns), 0, lengths)
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
    ) -> list[np.ndarray]:
        state = self.states.get(stage)
        if state is None:
            raise DockError(f"unknown stage '{stage}'; known: {sorted(self.states)}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with self.changed:
            while state.claimable(fields, whole_groups) < batch_size:
                remaining = deadline - loop.time()
                try:
                    if remaining <= 0:
                        raise TimeoutError
                    await asyncio.wait_for(self.changed.wait(), timeout=remaining)
                except TimeoutError:
                    have = state.claimable(fields, whole_groups)
                    raise starved(stage, timeout_s, batch_size, have, fields) from None
        taken = state.claim(fields, batch_size, whole_groups)
        return [taken] if dp_parts == 1 else balance_by_length(taken, state.length[taken], dp_parts)

    def get(
        self, indexes: np.ndarray, fields: list[str]
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return self.store.get(indexes, fields)

    def stats(self) -> dict[str, int]:
        metadata = sum(s.metadata_bytes for s in self.states.values())
        return {
            "bytes_in": self.store.bytes_in,
            "bytes_out": self.store.bytes_out,
            "metadata_bytes": metadata,
        }

    def clear(self) -> None:
        self.store.clear()
        for state in self.states.values():
            state.clear()
