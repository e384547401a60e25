"""TD warehouse: the payloads of a contiguous, group-aligned share of the samples.

:class:`WarehouseStore` is the plain logic: it validates a put against the schema
(refusing the whole put, storing nothing, on any problem), keeps each sample's fields
unpadded, and pads on the way out. :class:`TDWarehouse` is the Ray actor: after every
put it broadcasts the new metadata to the controllers, and it counts the bytes that
pass through it.
"""

from __future__ import annotations

import threading

import numpy as np
import ray

from mindrl.dock.controller import StageController
from mindrl.dock.errors import DockError
from mindrl.dock.schema import TOKEN_FIELDS, FieldSpec, check_column
from mindrl.dock.wire import Columns, Padded, pad_columns


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
        self._count = threading.Lock()  # the actor serves several requests on threads

    def validate(self, indexes: np.ndarray, columns: dict[str, Columns], repeat: int = 1) -> None:
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
            if len(column.lengths) * repeat != len(indexes):
                raise DockError(
                    f"field '{name}' has {len(column.lengths)} samples for {len(indexes)} indexes"
                    + (f" (one per {repeat})" if repeat > 1 else "")
                )
            problem = check_column(name, spec, column.values, column.lengths)
            if problem:
                raise DockError(problem)

    def put(self, indexes: np.ndarray, columns: dict[str, Columns], repeat: int = 1) -> np.ndarray:
        """Store all fields of all samples, or nothing. Returns per-sample lengths: the
        tokens of the put's :data:`TOKEN_FIELDS` where it has any, else its longest
        variable field. ``repeat``: each row is the value of ``repeat`` consecutive
        ``indexes``."""
        self.validate(indexes, columns, repeat)
        for name, column in columns.items():
            store, offsets = self.data[name], column.offsets
            # Views, not copies: the put's buffer (mapped from Ray's object store) is the
            # storage, and a later get of the same run can hand it back without a copy.
            # A repeated row is one view stored at each of its indexes.
            for position, index in enumerate(indexes.tolist()):
                row = position // repeat
                store[index] = column.values[offsets[row] : offsets[row + 1]]
            with self._count:
                self.bytes_in += column.nbytes
        tokens = [c.lengths for n, c in columns.items() if n in TOKEN_FIELDS]
        if tokens:
            return np.repeat(np.sum(tokens, axis=0), repeat)
        lengths = [c.lengths for n, c in columns.items() if self.schema[n].variable]
        if not lengths:
            return np.zeros(len(indexes), dtype=np.int64)
        return np.repeat(np.max(lengths, axis=0), repeat)

    def get(self, indexes: np.ndarray, fields: list[str]) -> dict[str, Padded]:
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
            with self._count:
                self.bytes_out += out[name][0].nbytes + out[name][1].nbytes
        return out

    def clear(self) -> None:
        for store in self.data.values():
            store.clear()


#: Requests a warehouse serves at once: numpy copies and Ray's (de)serialization release
#: the GIL, so several readers of one node overlap instead of queueing.
WAREHOUSE_THREADS = 4


@ray.remote(num_cpus=0, max_concurrency=WAREHOUSE_THREADS)
class TDWarehouse:
    """Ray actor around :class:`WarehouseStore` that broadcasts metadata after puts.

    Args:
        warehouse_id: position in the dock's warehouse list.
        first, last: the index share ``[first, last)`` it owns.
        schema: the fields that may be put.
        controllers: stage -> (its StageController, fields it tracks); a put is
            announced to every controller tracking one of its fields.
        timeout_s: deadline of the metadata broadcast.
    """

    def __init__(
        self,
        warehouse_id: int,
        first: int,
        last: int,
        schema: dict[str, FieldSpec],
        controllers: dict[str, tuple[StageController, list[str]]],
        timeout_s: float = 60.0,
    ) -> None:
        self.store = WarehouseStore(warehouse_id, first, last, schema)
        self.controllers = controllers
        self.timeout_s = timeout_s
        self.in_flight: list[tuple[str, ray.ObjectRef]] = []  # (stage, on_put ref)
        self._lock = threading.Lock()

    def put(
        self,
        indexes: np.ndarray,
        columns: dict[str, Columns],
        version: int | None = None,
        repeat: int = 1,
    ) -> int:
        """Validate and store (all or nothing), then announce to the controllers (with
        the weights ``version`` that generated the samples, when given); ``repeat``:
        each row is the value of ``repeat`` consecutive indexes (DockClient.put).

        The announcement is not waited for: a claim waits until its samples are ready
        anyway, and :meth:`clear` drains it first, so no stale metadata outlives an
        iteration (DockClient's recycle and ready_count drain through :meth:`flush`). A
        failed announcement is raised by the next put or clear.
        """
        self._raise_failed(wait_s=0)
        lengths = self.store.put(indexes, columns, repeat)
        w, fields = self.store.warehouse_id, list(columns)
        sent = [
            (stage, actor.on_put.remote(indexes, fields, w, lengths, version))
            for stage, (actor, tracked) in self.controllers.items()
            if set(tracked) & set(fields)
        ]
        with self._lock:
            self.in_flight += sent
        return len(indexes)

    def flush(self) -> None:
        """Wait until every controller has taken every announcement so far."""
        self._raise_failed(wait_s=self.timeout_s)

    def _raise_failed(self, wait_s: float) -> None:
        """Drop delivered announcements; raise for one that failed (or, when waiting, is
        still undelivered after ``wait_s``)."""
        with self._lock:
            pending, self.in_flight = self.in_flight, []
        refs = [ref for _, ref in pending]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s) if refs else ([], [])
        done = set(done)
        with self._lock:
            self.in_flight += [(stage, ref) for stage, ref in pending if ref not in done]
            late = [stage for stage, ref in pending if ref not in done]
        w = self.store.warehouse_id
        for stage, ref in pending:
            if ref not in done:
                continue
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                raise DockError(
                    f"TD controller of stage '{stage}' is dead; warehouse {w} could not "
                    "announce its samples to it"
                ) from None
        if wait_s > 0 and late:
            raise DockError(
                f"TD controller of stage '{late[0]}' did not take warehouse {w}'s metadata "
                f"within {wait_s:g} s"
            )

    def get(self, indexes: np.ndarray, fields: list[str]) -> dict[str, Padded]:
        return self.store.get(indexes, fields)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def stats(self) -> dict[str, int]:
        return {"bytes_in": self.store.bytes_in, "bytes_out": self.store.bytes_out}

    def clear(self) -> None:
        """Drain announcements, then drop every payload (the client clears controllers
        after warehouses, so none hears of a sample from the old iteration)."""
        self.flush()
        self.store.clear()
