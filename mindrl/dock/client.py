"""The dock client: the only thing workers and the driver touch.

``claim`` asks a stage's controller for indexes (metadata only); ``fetch`` / ``put`` move
payloads straight between the caller and the warehouses that own the samples. The
driver can claim and hand index lists to workers, which fetch their own payloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import torch
from tensordict import TensorDict

from mindrl.dock.schema import DockError, FieldSpec
from mindrl.dock.wire import Columns, columns_from, to_tensordict

CLAIM_GRACE_S = 15.0


@dataclass
class WarehouseInfo:
    actor: Any
    node_id: str
    first: int
    last: int


@dataclass
class DockHandle:
    """Picklable description of a dock; build a :class:`DockClient` from it anywhere."""

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


class DockClient:
    """Put / claim / fetch against a dock described by ``handle``."""

    def __init__(self, handle: DockHandle) -> None:
        self.handle = handle
        self._firsts = np.array([w.first for w in handle.warehouses])
        self._local = self._local_warehouse()
        self.bytes_sent = 0
        self.bytes_received = 0

    def _local_warehouse(self) -> int | None:
        if self.handle.central is not None or not ray.is_initialized():
            return None
        node = ray.get_runtime_context().get_node_id()
        local = [i for i, w in enumerate(self.handle.warehouses) if w.node_id == node]
        return local[0] if local else None

    # ---- payloads ---------------------------------------------------------------------
    def owner(self, indexes: np.ndarray) -> np.ndarray:
        """Warehouse id owning each index."""
        if np.any((indexes < 0) | (indexes >= self.handle.n_samples)):
            raise DockError(
                f"sample indexes must be in [0, {self.handle.n_samples}), "
                f"got {indexes.tolist()[:5]}"
            )
        return np.searchsorted(self._firsts, indexes, side="right") - 1

    def put(
        self, indexes: np.ndarray | torch.Tensor | list[int], data: TensorDict | dict[str, Any]
    ) -> None:
        """Store fields of samples ``indexes``.

        ``data`` maps a field to a padded tensor ``[n, max_len, ...]`` (with an optional
        ``<field>_lengths`` entry; without one every row is taken whole), to a list of
        per-sample tensors, or, for fixed fields, to a tensor ``[n, *shape]``.
        """
        indexes = np.asarray(indexes, dtype=np.int64)
        columns = self._encode(data)
        owners = self.owner(indexes)
        refs, names = [], []
        for w in np.unique(owners):
            rows = np.flatnonzero(owners == w)
            part = {name: take_rows(col, rows) for name, col in columns.items()}
            refs.append(self._store(int(w), indexes[rows], part))
            names.append(self._warehouse_name(int(w)))
            self.bytes_sent += sum(c.nbytes for c in part.values())
        self._get(refs, names, timeout_s=self.handle.timeout_s)

    def _encode(self, data: TensorDict | dict[str, Any]) -> dict[str, Columns]:
        keys = list(data.keys())
        columns = {}
        for name in keys:
            if name.endswith("_lengths") and name.removesuffix("_lengths") in keys:
                continue
            spec = self.handle.schema.get(name)
            if spec is None:
                raise DockError(
                    f"unknown field '{name}'; the dock schema has {sorted(self.handle.schema)}"
                )
            lengths = data.get(f"{name}_lengths") if f"{name}_lengths" in keys else None
            columns[name] = columns_from(data[name], lengths, spec)
        return columns

    def fetch(self, indexes: np.ndarray, fields: list[str]) -> TensorDict:
        """Payloads of ``fields`` for ``indexes``, padded, in the order given."""
        indexes = np.asarray(indexes, dtype=np.int64)
        owners = self.owner(indexes)
        groups = [(int(w), np.flatnonzero(owners == w)) for w in np.unique(owners)]
        refs = [self._fetch(w, indexes[rows], fields) for w, rows in groups]
        parts = self._get(refs, [self._warehouse_name(w) for w, _ in groups], self.handle.timeout_s)
        merged = (
            parts[0]
            if len(parts) == 1
            else merge_parts(parts, [r for _, r in groups], self.handle.schema)
        )
        self.bytes_received += sum(v.nbytes + n.nbytes for v, n in merged.values())
        return to_tensordict(merged, self.handle.schema)

    # ---- metadata ---------------------------------------------------------------------
    def claim(
        self,
        stage: str,
        fields: list[str],
        batch_size: int,
        whole_groups: bool = False,
        dp_parts: int = 1,
        timeout_s: float | None = None,
    ) -> list[np.ndarray]:
        """Indexes for ``stage`` (split in ``dp_parts`` balanced by length), marked consumed."""
        timeout_s = self.handle.timeout_s if timeout_s is None else timeout_s
        if self.handle.central is not None:
            ref = self.handle.central.claim.remote(
                stage, fields, batch_size, whole_groups, None, timeout_s, dp_parts
            )
            name = "centralized buffer"
        else:
            controller = self.handle.controllers.get(stage)
            if controller is None:
                raise DockError(
                    f"no TD controller for stage '{stage}'; "
                    f"stages: {sorted(self.handle.controllers)}"
                )
            ref = controller.claim.remote(
                fields, batch_size, whole_groups, self._local, timeout_s, dp_parts
            )
            name = f"TD controller of stage '{stage}'"
        (parts,) = self._get([ref], [name], timeout_s + CLAIM_GRACE_S)
        return parts

    def get(
        self,
        stage: str,
        fields: list[str],
        batch_size: int,
        whole_groups: bool = False,
        timeout_s: float | None = None,
    ) -> tuple[np.ndarray, TensorDict]:
        """Claim ``batch_size`` samples for ``stage`` and fetch their ``fields``."""
        (indexes,) = self.claim(stage, fields, batch_size, whole_groups, 1, timeout_s)
        return indexes, self.fetch(indexes, fields)

    def clear(self) -> None:
        """Forget all samples and consumption (between iterations)."""
        actors = (
            [self.handle.central]
            if self.handle.central is not None
            else [*self.handle.controllers.values(), *(w.actor for w in self.handle.warehouses)]
        )
        self._get(
            [a.clear.remote() for a in actors], ["dock actor"] * len(actors), self.handle.timeout_s
        )

    def stats(self) -> dict[str, Any]:
        """Bytes through each endpoint and metadata bytes held by controllers."""
        if self.handle.central is not None:
            (central,) = self._get([self.handle.central.stats.remote()], ["centralized buffer"], 60)
            return {"endpoints": [central], "metadata_bytes": central["metadata_bytes"]}
        endpoints = self._get(
            [w.actor.stats.remote() for w in self.handle.warehouses],
            [self._warehouse_name(i) for i in range(len(self.handle.warehouses))],
            60,
        )
        metadata = self._get(
            [c.metadata_bytes.remote() for c in self.handle.controllers.values()],
            list(self.handle.controllers),
            60,
        )
        return {"endpoints": endpoints, "metadata_bytes": int(sum(metadata))}

    # ---- plumbing -----------------------------------------------------------------------
    def _store(self, w: int, indexes: np.ndarray, part: dict[str, Columns]) -> Any:
        actor = self.handle.central or self.handle.warehouses[w].actor
        return actor.put.remote(indexes, part)

    def _fetch(self, w: int, indexes: np.ndarray, fields: list[str]) -> Any:
        actor = self.handle.central or self.handle.warehouses[w].actor
        return actor.get.remote(indexes, fields)

    def _warehouse_name(self, w: int) -> str:
        if self.handle.central is not None:
            return "centralized buffer"
        return f"TD warehouse {w} (node {self.handle.warehouses[w].node_id[:8]})"

    @staticmethod
    def _get(refs: list[Any], names: list[str], timeout_s: float) -> list[Any]:
        try:
            return ray.get(refs, timeout=timeout_s)
        except ray.exceptions.RayActorError as exc:
            dead = _dead_actor_name(exc, refs, names)
            raise DockError(f"{dead} is dead; the dock cannot serve this request") from None
        except ray.exceptions.GetTimeoutError:
            raise DockError(
                f"no answer from {', '.join(sorted(set(names)))} within {timeout_s:.0f} s"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, DockError) else None
            if cause is not None:
                raise DockError(str(cause)) from None
            raise


def _dead_actor_name(exc: Exception, refs: list[Any], names: list[str]) -> str:
    for ref, name in zip(refs, names, strict=True):
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError:
            return name
        except Exception:
            continue
    return names[0]


def take_rows(column: Columns, rows: np.ndarray) -> Columns:
    """The samples ``rows`` of a column, still concatenated."""
    offsets = column.offsets
    pieces = [column.values[offsets[r] : offsets[r + 1]] for r in rows]
    values = np.concatenate(pieces) if pieces else column.values[:0]
    return Columns(values, column.lengths[rows])


def merge_parts(parts: list[dict], rows: list[np.ndarray], schema: dict[str, FieldSpec]) -> dict:
    """Combine per-warehouse padded parts into the caller's order, re-padding to one width."""
    total = sum(len(r) for r in rows)
    merged = {}
    for name in parts[0]:
        spec = schema[name]
        width = max(p[name][0].shape[1] for p in parts) if spec.variable else None
        shape = (total, width, *spec.shape) if spec.variable else (total, *spec.shape)
        values = np.full(shape, spec.pad, dtype=spec.numpy_dtype)
        lengths = np.zeros(total, dtype=np.int64)
        for part, where in zip(parts, rows, strict=True):
            v, n = part[name]
            if spec.variable:
                values[where, : v.shape[1]] = v
            else:
                values[where] = v
            lengths[where] = n
        merged[name] = (values, lengths)
    return merged
