"""The dock client: the only thing workers and the driver touch.

``claim`` asks a stage's controller for indexes (metadata only); ``fetch`` / ``put`` move
payloads straight between the caller and the warehouses that own the samples. The
driver can claim and hand index lists to workers, which fetch their own payloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from tensordict import TensorDict

from mindrl.dock.errors import DockError
from mindrl.dock.handle import DockHandle, warehouse_name
from mindrl.dock.schema import FieldSpec, check_column
from mindrl.dock.tensors import columns_from, to_tensordict
from mindrl.dock.wire import Columns, merge_parts, pad_columns, take_rows

#: Extra seconds a client waits for a controller's answer beyond the claim's own deadline,
#: so the controller's "starved" error (which names the stage) arrives before ours.
CLAIM_GRACE_S = 15.0


class DockClient:
    """Put / claim / fetch against a dock described by ``handle``.

    Build one per process (driver or Ray worker) from the picklable handle; it talks to
    controllers for metadata and straight to warehouses for payloads.
    """

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

    @property
    def local_warehouse(self) -> int | None:
        """The warehouse on this process's node (claims prefer its samples), if any."""
        return self._local

    def warehouse_on(self, node_id: str) -> int | None:
        """The warehouse on node ``node_id``, if it has one (a centralized buffer: None,
        every sample lives in the one buffer)."""
        if self.handle.central is not None:
            return None
        return next((i for i, w in enumerate(self.handle.warehouses) if w.node_id == node_id), None)

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
        self,
        indexes: np.ndarray | torch.Tensor | list[int],
        data: TensorDict | dict[str, Any],
        version: int | None = None,
        repeat: int = 1,
    ) -> None:
        """Store fields of samples ``indexes``; ``version``: the weights that generated them
        (the stages' controllers keep it as metadata, :meth:`versions`).

        ``data`` maps a field to a padded tensor ``[n, max_len, ...]`` (with an optional
        ``<field>_lengths`` entry; without one every row is taken whole), to a list of
        per-sample tensors, or, for fixed fields, to a tensor ``[n, *shape]``.

        ``repeat``: each row of ``data`` is the value of ``repeat`` consecutive indexes (a
        group's prompt, the same for its N responses). The row crosses the network once
        and the warehouse stores it for each of them: what it stores is what a put of
        every row ``repeat`` times stores, for 1 / ``repeat`` of the bytes.
        """
        indexes = np.asarray(indexes, dtype=np.int64)
        columns = self._encode(data)
        row_indexes = self._rows_of(indexes, repeat)
        for name, column in columns.items():
            if len(column.lengths) != len(row_indexes):
                per = f" (one per {repeat})" if repeat > 1 else ""
                raise DockError(
                    f"field '{name}' has {len(column.lengths)} samples for {len(indexes)} "
                    f"indexes{per}"
                )
        owners = self.owner(row_indexes[:, 0])
        refs, names = [], []
        for w in np.unique(owners):
            rows = np.flatnonzero(owners == w)
            part = {name: take_rows(col, rows) for name, col in columns.items()}
            refs.append(self._store(int(w), row_indexes[rows].ravel(), part, version, repeat))
            names.append(self._warehouse_name(int(w)))
            self.bytes_sent += sum(c.nbytes for c in part.values())
        self._get(refs, names, timeout_s=self.handle.timeout_s)

    def _rows_of(self, indexes: np.ndarray, repeat: int) -> np.ndarray:
        """``indexes`` as ``[rows, repeat]``: the indexes each row of a put is stored at,
        all in one warehouse (whole groups are, mindrl.dock.builder)."""
        if repeat < 1 or len(indexes) % repeat:
            raise DockError(f"a put of {len(indexes)} indexes cannot repeat rows {repeat} times")
        rows = indexes.reshape(-1, repeat)
        if repeat > 1 and np.any(np.ptp(self.owner(indexes).reshape(-1, repeat), axis=1)):
            raise DockError(
                f"a put repeating each row {repeat} times needs each row's indexes in one "
                "warehouse: put whole groups"
            )
        return rows

    def _encode(self, data: TensorDict | dict[str, Any]) -> dict[str, Columns]:
        keys = list(data.keys())
        columns = {}
        for name in keys:
            if name.endswith("_lengths") and name.removesuffix("_lengths") in keys:
                continue
            spec = self._spec(name)
            lengths = data.get(f"{name}_lengths") if f"{name}_lengths" in keys else None
            column = columns_from(data[name], lengths, spec)
            # Checked here too, so a put split over warehouses is refused before any stores.
            problem = check_column(name, spec, column.values, column.lengths)
            if problem:
                raise DockError(problem)
            columns[name] = column
        return columns

    def _spec(self, name: str) -> FieldSpec:
        spec = self.handle.schema.get(name)
        if spec is None:
            raise DockError(
                f"unknown field '{name}'; the dock schema has {sorted(self.handle.schema)}"
            )
        return spec

    def fetch(self, indexes: np.ndarray, fields: list[str]) -> TensorDict:
        """Payloads of ``fields`` for ``indexes``, padded, in the order given."""
        indexes = np.asarray(indexes, dtype=np.int64)
        if len(indexes) == 0:
            empty = {name: pad_columns([], self._spec(name)) for name in fields}
            return to_tensordict(empty, self.handle.schema)
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
        part_warehouses: list[int | None] | None = None,
    ) -> list[np.ndarray]:
        """Indexes for ``stage`` (split in ``dp_parts`` balanced by length), marked consumed.

        ``part_warehouses``: the warehouse beside each part's worker (:meth:`warehouse_on`
        its node); each part then holds what that warehouse stores while it can.
        """
        return self.claim_async(
            stage, fields, batch_size, whole_groups, dp_parts, timeout_s,
            part_warehouses=part_warehouses,
        ).result()  # fmt: skip

    def claim_async(
        self,
        stage: str,
        fields: list[str],
        batch_size: int,
        whole_groups: bool = False,
        dp_parts: int = 1,
        timeout_s: float | None = None,
        step: int | None = None,
        part_warehouses: list[int | None] | None = None,
    ) -> PendingClaim:
        """Ask for a claim without waiting for it; ``ray.wait`` on ``.ref``, then ``.result()``.

        With ``step`` it is a chunk: it is answered once ``step`` samples are ready and
        takes the largest multiple of ``step`` ready by then, up to ``batch_size`` (a
        streaming stage takes samples as the stage before it puts them).
        """
        timeout_s = self.handle.timeout_s if timeout_s is None else timeout_s
        if self.handle.central is not None:
            ref = self.handle.central.claim.remote(
                stage, fields, batch_size, whole_groups, None, timeout_s, dp_parts, step,
                part_warehouses,
            )  # fmt: skip
            name = "centralized buffer"
        else:
            controller = self._controller(stage)
            ref = controller.claim.remote(
                fields, batch_size, whole_groups, self._local, timeout_s, dp_parts, step,
                part_warehouses,
            )  # fmt: skip
            name = f"TD controller of stage '{stage}'"
        return PendingClaim(self, ref, name, timeout_s)

    def _claim_result(self, claim: PendingClaim) -> list[np.ndarray]:
        try:
            (parts,) = self._get([claim.ref], [claim.name], claim.timeout_s + CLAIM_GRACE_S)
        except DockError as starved:
            self._raise_if_a_warehouse_died(starved)
            raise
        return parts

    def _raise_if_a_warehouse_died(self, error: DockError) -> None:
        """A warehouse that dies right after a put may never announce those samples, so a
        stage starves on them; name the dead warehouse instead of blaming the upstream
        stage."""
        if self.handle.central is not None:
            return
        probes = [w.actor.__ray_ready__.remote() for w in self.handle.warehouses]
        # One shared deadline; a warehouse too busy to answer by then counts as alive.
        answered, _ = ray.wait(probes, num_returns=len(probes), timeout=self.handle.timeout_s)
        dead = [
            self._warehouse_name(i)
            for i, probe in enumerate(probes)
            if probe in answered and _is_dead(probe)
        ]
        if dead:
            names = ", ".join(dead)
            raise DockError(f"{names} is dead, so its samples never arrive; {error}") from None

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

    def recycle(self, indexes: np.ndarray | list[int]) -> None:
        """Free ``indexes`` in every stage for new samples within this iteration (e.g. the
        groups DAPO's dynamic sampling drops): no claim returns them until they are put
        again, and a new put overwrites their payloads."""
        indexes = np.asarray(indexes, dtype=np.int64)
        if self.handle.central is not None:
            refs, names = [self.handle.central.recycle.remote(indexes)], ["centralized buffer"]
        else:
            # A warehouse announces a put without waiting; one still travelling when the
            # controllers forget would mark the index ready again with the old payload.
            self._flush(np.unique(self.owner(indexes)))
            stages = list(self.handle.controllers)
            refs = [self.handle.controllers[s].recycle.remote(indexes) for s in stages]
            names = [f"TD controller of stage '{s}'" for s in stages]
        self._get(refs, names, self.handle.timeout_s)

    def _flush(self, warehouses: np.ndarray) -> None:
        """Wait until the controllers have heard of every put ``warehouses`` took so far."""
        refs = [self.handle.warehouses[w].actor.flush.remote() for w in warehouses]
        names = [self._warehouse_name(int(w)) for w in warehouses]
        self._get(refs, names, self.handle.timeout_s)

    def hold(
        self, indexes: np.ndarray | list[int], held: bool = True, stages: list[str] | None = None
    ) -> None:
        """Keep ``indexes`` out of every stage's claims (``held``), or give them back;
        nothing else about them changes (see ControllerState.hold). ``stages``: only
        those stages' claims (the others keep taking them)."""
        indexes = np.asarray(indexes, dtype=np.int64)
        if self.handle.central is not None:
            refs = [self.handle.central.hold.remote(indexes, held, stages)]
            names = ["centralized buffer"]
        else:
            stages = [s for s in self.handle.controllers if stages is None or s in stages]
            refs = [self.handle.controllers[s].hold.remote(indexes, held) for s in stages]
            names = [f"TD controller of stage '{s}'" for s in stages]
        self._get(refs, names, self.handle.timeout_s)

    def versions(self, stage: str, indexes: np.ndarray) -> np.ndarray:
        """The weights version that generated each of ``indexes``, as ``stage``'s controller
        recorded it (-1: the put named none)."""
        return self._ask_stage(stage, "versions", np.asarray(indexes, dtype=np.int64))

    def ready_count(self, stage: str, fields: list[str]) -> int:
        """How many samples have every one of ``fields`` stored, as ``stage`` sees it once
        it has heard of every put made so far (progress bars poll it about once a second)."""
        if self.handle.central is None:
            self._flush(np.arange(len(self.handle.warehouses)))
        return self._ask_stage(stage, "ready_count", fields)

    def _controller(self, stage: str) -> Any:
        """``stage``'s TD controller (distributed dock)."""
        controller = self.handle.controllers.get(stage)
        if controller is None:
            raise DockError(
                f"no TD controller for stage '{stage}'; stages: {sorted(self.handle.controllers)}"
            )
        return controller

    def _ask_stage(self, stage: str, method: str, *args: Any) -> Any:
        """``method(*args)`` of ``stage``'s controller, or of the centralized buffer (which
        takes the stage first), waited for within the dock's timeout."""
        if self.handle.central is not None:
            ref = getattr(self.handle.central, method).remote(stage, *args)
            name = "centralized buffer"
        else:
            ref = getattr(self._controller(stage), method).remote(*args)
            name = f"TD controller of stage '{stage}'"
        (answer,) = self._get([ref], [name], self.handle.timeout_s)
        return answer

    def clear(self) -> None:
        """Forget all samples and consumption in every actor (between iterations)."""
        named = self.handle.actors()
        # Warehouses first: each drains its metadata announcements before controllers forget.
        stores = {n: a for n, a in named.items() if not n.startswith("TD controller")}
        controllers = {n: a for n, a in named.items() if n not in stores}
        for group in (stores, controllers):
            refs = [actor.clear.remote() for actor in group.values()]
            self._get(refs, list(group), self.handle.timeout_s)

    def stats(self) -> dict[str, Any]:
        """Bytes through each endpoint and the metadata bytes the controllers handled.

        Returns:
            ``{"endpoints": [{"bytes_in", "bytes_out"} per warehouse (or the central
            buffer)], "metadata_bytes": int, "client": {"bytes_sent", "bytes_received"}}``.
        """
        client = {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received}
        timeout = self.handle.timeout_s
        if self.handle.central is not None:
            refs, names = [self.handle.central.stats.remote()], ["centralized buffer"]
            (central,) = self._get(refs, names, timeout)
            return {
                "endpoints": [central],
                "metadata_bytes": central["metadata_bytes"],
                "client": client,
            }
        warehouses = self.handle.warehouses
        endpoints = self._get(
            [w.actor.stats.remote() for w in warehouses],
            [self._warehouse_name(i) for i in range(len(warehouses))],
            timeout,
        )
        stages = list(self.handle.controllers)
        metadata = self._get(
            [self.handle.controllers[s].metadata_bytes.remote() for s in stages],
            [f"TD controller of stage '{s}'" for s in stages],
            timeout,
        )
        return {"endpoints": endpoints, "metadata_bytes": int(sum(metadata)), "client": client}

    # ---- plumbing -----------------------------------------------------------------------
    def _store(
        self,
        w: int,
        indexes: np.ndarray,
        part: dict[str, Columns],
        version: int | None,
        repeat: int = 1,
    ) -> Any:
        actor = self.handle.central or self.handle.warehouses[w].actor
        return actor.put.remote(indexes, part, version, repeat)

    def _fetch(self, w: int, indexes: np.ndarray, fields: list[str]) -> Any:
        actor = self.handle.central or self.handle.warehouses[w].actor
        return actor.get.remote(indexes, fields)

    def _warehouse_name(self, w: int) -> str:
        if self.handle.central is not None:
            return "centralized buffer"
        return warehouse_name(w, self.handle.warehouses[w].node_id)

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


@dataclass(frozen=True)
class PendingClaim:
    """A claim sent to a controller and not yet answered."""

    client: DockClient
    ref: Any  # the controller's answer (ray.ObjectRef)
    name: str
    timeout_s: float

    def result(self) -> list[np.ndarray]:
        """The claimed indexes per data-parallel part (waits if not answered yet)."""
        return self.client._claim_result(self)


def _is_dead(answered_ref: Any) -> bool:
    """Whether an answered call failed because its actor is dead."""
    try:
        ray.get(answered_ref)
    except ray.exceptions.RayActorError:
        return True
    return False


def _dead_actor_name(exc: Exception, refs: list[Any], names: list[str]) -> str:
    for ref, name in zip(refs, names, strict=True):
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError:
            return name
        except Exception:
            continue
    return names[0]
