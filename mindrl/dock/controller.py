"""TD controller: per-stage metadata, never payloads.

:class:`ControllerState` is the plain logic (testable without Ray): per sample index it
knows which fields are ready, in which warehouse the sample lives, its length, and
whether this stage has consumed it. :class:`TDController` is the thin async Ray actor
around it that lets a stage wait, with a deadline, until enough samples are ready.
"""

from __future__ import annotations

import asyncio

import numpy as np
import ray

from mindrl.dock.schema import DockError


class ControllerState:
    """Readiness and consumption bookkeeping of one stage over ``n_samples`` indexes."""

    def __init__(self, stage: str, n_samples: int, group_size: int, fields: list[str]) -> None:
        self.stage = stage
        self.n_samples = n_samples
        self.group_size = group_size
        self.fields = list(fields)
        self.clear()

    def clear(self) -> None:
        self.ready = {f: np.zeros(self.n_samples, dtype=bool) for f in self.fields}
        self.consumed = np.zeros(self.n_samples, dtype=bool)
        self.warehouse = np.full(self.n_samples, -1, dtype=np.int32)
        self.length = np.zeros(self.n_samples, dtype=np.int64)
        self.metadata_bytes = 0

    def on_put(
        self, indexes: np.ndarray, fields: list[str], warehouse: int, lengths: np.ndarray
    ) -> None:
        """Record that ``fields`` of ``indexes`` are now stored in ``warehouse``."""
        for field in fields:
            if field in self.ready:
                self.ready[field][indexes] = True
        self.warehouse[indexes] = warehouse
        self.length[indexes] = np.maximum(self.length[indexes], lengths)
        self.metadata_bytes += indexes.nbytes + lengths.nbytes + 4 * len(fields) + 4

    def available(self, fields: list[str]) -> np.ndarray:
        """Mask of unconsumed indexes whose ``fields`` are all ready."""
        mask = ~self.consumed
        for field in fields:
            mask &= self.ready[field]
        return mask

    def claimable(self, fields: list[str], whole_groups: bool) -> int:
        """How many samples a claim could take now."""
        mask = self.available(fields)
        if whole_groups:
            return int(mask.reshape(-1, self.group_size).all(axis=1).sum()) * self.group_size
        return int(mask.sum())

    def claim(
        self,
        fields: list[str],
        batch_size: int,
        whole_groups: bool,
        prefer_warehouse: int | None = None,
    ) -> np.ndarray:
        """Take up to ``batch_size`` ready indexes (whole groups if asked), mark consumed.

        Indexes stored in ``prefer_warehouse`` come first so workers read locally.
        """
        unknown = [f for f in fields if f not in self.ready]
        if unknown:
            raise DockError(
                f"stage '{self.stage}' asked for unknown field(s) {unknown}; known: {self.fields}"
            )
        mask = self.available(fields)
        if whole_groups:
            groups = mask.reshape(-1, self.group_size).all(axis=1)
            mask = np.repeat(groups, self.group_size)
            batch_size -= batch_size % self.group_size
        candidates = np.flatnonzero(mask)
        if prefer_warehouse is not None and len(candidates):
            local = self.warehouse[candidates] == prefer_warehouse
            candidates = np.concatenate([candidates[local], candidates[~local]])
            if whole_groups:  # keep groups contiguous after the reorder
                candidates = self._group_order(candidates)
        taken = np.sort(candidates[:batch_size]) if not whole_groups else candidates[:batch_size]
        self.consumed[taken] = True
        return taken

    def _group_order(self, candidates: np.ndarray) -> np.ndarray:
        group_ids = candidates // self.group_size
        _, first = np.unique(group_ids, return_index=True)
        ordered_groups = group_ids[np.sort(first)]
        return (
            np.concatenate(
                [np.arange(g * self.group_size, (g + 1) * self.group_size) for g in ordered_groups]
            )
            if len(ordered_groups)
            else candidates
        )

    def missing(self, fields: list[str]) -> int:
        return int((~self.consumed & ~self.available(fields)).sum())


def starved(stage: str, timeout_s: float, need: int, have: int, fields: list[str]) -> DockError:
    """The error of a stage that waited past its deadline."""
    return DockError(
        f"stage '{stage}' waited {timeout_s:.0f} s for {need} samples with fields {fields}: "
        f"{need - have} missing ({have} ready)"
    )


def balance_by_length(indexes: np.ndarray, lengths: np.ndarray, parts: int) -> list[np.ndarray]:
    """Split ``indexes`` into ``parts`` of equal count with similar total length.

    Greedy: longest first, each to the part with the smallest load that still has room.
    """
    if len(indexes) % parts:
        raise DockError(
            f"cannot split {len(indexes)} samples evenly over {parts} data-parallel ranks"
        )
    room = len(indexes) // parts
    loads, members = np.zeros(parts), [[] for _ in range(parts)]
    for i in np.argsort(-lengths, kind="stable"):
        open_parts = [p for p in range(parts) if len(members[p]) < room]
        target = min(open_parts, key=lambda p: loads[p])
        members[target].append(indexes[i])
        loads[target] += lengths[i]
    return [np.sort(np.array(m, dtype=np.int64)) for m in members]


@ray.remote(num_cpus=0)
class TDController:
    """Ray actor around :class:`ControllerState`; ``claim`` waits with a deadline."""

    def __init__(self, stage: str, n_samples: int, group_size: int, fields: list[str]) -> None:
        self.state = ControllerState(stage, n_samples, group_size, fields)
        self.changed = asyncio.Condition()

    async def on_put(
        self, indexes: np.ndarray, fields: list[str], warehouse: int, lengths: np.ndarray
    ) -> None:
        self.state.on_put(indexes, fields, warehouse, lengths)
        async with self.changed:
            self.changed.notify_all()

    async def claim(
        self,
        fields: list[str],
        batch_size: int,
        whole_groups: bool,
        prefer_warehouse: int | None,
        timeout_s: float,
        dp_parts: int = 1,
    ) -> list[np.ndarray]:
        """Wait until ``batch_size`` samples are ready (or the deadline), then take them."""
        need = batch_size
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with self.changed:
            while self.state.claimable(fields, whole_groups) < need:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0 or not await self._wait(remaining):
                    have = self.state.claimable(fields, whole_groups)
                    raise starved(self.state.stage, timeout_s, need, have, fields)
        taken = self.state.claim(fields, batch_size, whole_groups, prefer_warehouse)
        if dp_parts == 1:
            return [taken]
        return balance_by_length(taken, self.state.length[taken], dp_parts)

    async def _wait(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.changed.wait(), timeout=seconds)
            return True
        except TimeoutError:
            return False

    def locations(self, indexes: np.ndarray) -> np.ndarray:
        return self.state.warehouse[indexes]

    def clear(self) -> None:
        self.state.clear()

    def metadata_bytes(self) -> int:
        return self.state.metadata_bytes
