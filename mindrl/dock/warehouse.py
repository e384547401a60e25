"""TD warehouse: the payloads of a contiguous, group-aligned share of the samples.

:class:`WarehouseStore` is the plain logic: it validates a put against the schema
(refusing the whole put, storing nothing, on any problem), keeps each sample's fields
unpadded, and pads on the way out. :class:`TDWarehouse` is the Ray actor: after every
put it broadcasts the new metadata to the controllers, and it counts the bytes that
pass through it.
"""

from __future__ import annotations

import numpy as np
import ray

from mindrl.dock.schema import DockError, FieldSpec, check_column
from mindrl.dock.wire import Columns, pad_columns


class WarehouseStore:
    """Unpadded per-sample storage for indexes ``[first, last)``."""

    def __init__(
        self, warehouse_id: int, first: int, last: int, schema: dict[str, FieldSpec]
    ) -> None:
        self.warehouse_id, self.first, self.last = warehouse_id, first, last
        self.schema = schema
        self.data: dict[str, dict[int, np.ndarray]] = {name: {} for name in schema}
        self.bytes_in = 0
        self.bytes_out = 0

    def validate(self, indexes: np.ndarray, columns: dict[str, Columns]) -> None:
        outside = indexes[(indexes < self.first) | (indexes >= self.last)]
        if len(outside):
            raise DockError(
                f"warehouse {self.warehouse_id} owns indexes [{self.first}, {self.last}), "
                f"not {outside[:5].tolist()}"
            )
        for name, column in columns.items():
            spec = self.schema.get(name)
            if spec is None:
                raise DockError(
                    f"unknown field '{name}'; the dock schema has {sorted(self.schema)}"
                )
            if len(column.lengths) != len(indexes):
                raise DockError(
                    f"field '{name}' has {len(column.lengths)} samples for {len(indexes)} indexes"
                )
            problem = check_column(name, spec, column.values, column.lengths)
            if problem:
                raise DockError(problem)

    def put(self, indexes: np.ndarray, columns: dict[str, Columns]) -> np.ndarray:
        """Store all fields of all samples, or nothing. Returns per-sample lengths."""
        self.validate(indexes, columns)
        for name, column in columns.items():
            store, offsets = self.data[name], column.offsets
            for position, index in enumerate(indexes.tolist()):
                store[index] = column.values[offsets[position] : offsets[position + 1]].copy()
            self.bytes_in += column.values.nbytes
        lengths = [c.lengths for n, c in columns.items() if self.schema[n].variable]
        return np.max(lengths, axis=0) if lengths else np.zeros(len(indexes), dtype=np.int64)

    def get(
        self, indexes: np.ndarray, fields: list[str]
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Padded ``[len(indexes), max_len, ...]`` arrays and lengths per field."""
        out = {}
        for name in fields:
            store, spec = self.data.get(name), self.schema.get(name)
            if spec is None:
                raise DockError(
                    f"unknown field '{name}'; the dock schema has {sorted(self.schema)}"
                )
            try:
                samples = [store[i] for i in indexes.tolist()]
            except KeyError as exc:
                raise DockError(f"field '{name}' of sample {exc.args[0]} was never put") from None
            out[name] = pad_columns(samples, spec)
            self.bytes_out += out[name][0].nbytes
        return out

    def clear(self) -> None:
        for store in self.data.values():
            store.clear()


@ray.remote(num_cpus=0)
class TDWarehouse:
    """Ray actor around :class:`WarehouseStore` that broadcasts metadata after puts."""

    def __init__(
        self,
        warehouse_id: int,
        first: int,
        last: int,
        schema: dict[str, FieldSpec],
        controllers: list,
    ) -> None:
        self.store = WarehouseStore(warehouse_id, first, last, schema)
        self.controllers = controllers

    def put(self, indexes: np.ndarray, columns: dict[str, Columns]) -> int:
        lengths = self.store.put(indexes, columns)
        fields = list(columns)
        # Wait for the broadcast so a consumer that hears "put done" finds the metadata.
        ray.get(
            [
                c.on_put.remote(indexes, fields, self.store.warehouse_id, lengths)
                for c in self.controllers
            ]
        )
        return len(indexes)

    def get(
        self, indexes: np.ndarray, fields: list[str]
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return self.store.get(indexes, fields)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def stats(self) -> dict[str, int]:
        return {"bytes_in": self.store.bytes_in, "bytes_out": self.store.bytes_out}

    def clear(self) -> None:
        self.store.clear()
