"""Wire format: one flat numpy buffer per field plus per-sample lengths (numpy only).

Ray hands numpy arrays from the same-node object store to readers without copying, while
torch tensors are copied (3 ms vs 120-520 ms for 100 MB, docs/architecture.md §4), so
payloads cross process boundaries as :class:`Columns` (puts) or padded ``(values, lengths)`` pairs
(gets). This module imports no torch, so the dock's actors start as light processes;
the torch side lives in :mod:`mindrl.dock.tensors`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindrl.dock.schema import FieldSpec

#: A padded field on its way out: values ``[n, max_len, *trailing]`` (fixed fields
#: ``[n, *shape]``) and lengths ``[n]``.
Padded = tuple[np.ndarray, np.ndarray]


@dataclass
class Columns:
    """Samples of one field: ``values`` concatenated along dim 0, ``lengths`` per sample."""

    values: np.ndarray
    lengths: np.ndarray

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)])

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.lengths.nbytes


def take_rows(column: Columns, rows: np.ndarray) -> Columns:
    """The samples ``rows`` of a column, still concatenated."""
    if len(rows) == len(column.lengths) and np.array_equal(rows, np.arange(len(rows))):
        return column  # the whole put goes to one warehouse: no copy
    offsets = column.offsets
    pieces = [column.values[offsets[r] : offsets[r + 1]] for r in rows]
    values = np.concatenate(pieces) if pieces else column.values[:0]
    return Columns(values, column.lengths[rows])


def contiguous_block(samples: list[np.ndarray]) -> np.ndarray | None:
    """The samples as one ``[n, len, ...]`` view when they are equal-length neighbours in
    one buffer (the common case: a get of what one put stored), else None."""
    if not samples or len(samples[0]) == 0 or samples[0].base is None:
        return None
    first, base = samples[0], samples[0].base
    if not base.flags.c_contiguous or base.dtype != first.dtype:
        return None
    start, step = first.__array_interface__["data"][0], first.nbytes
    for i, sample in enumerate(samples):
        same_run = sample.base is base and len(sample) == len(first)
        if not same_run or sample.__array_interface__["data"][0] != start + i * step:
            return None
    offset = (start - base.__array_interface__["data"][0]) // first.itemsize
    flat = base.reshape(-1)[offset : offset + len(samples) * first.size]
    if flat.size != len(samples) * first.size:
        return None
    return flat.reshape(len(samples), *first.shape)


def pad_columns(samples: list[np.ndarray], spec: FieldSpec) -> Padded:
    """Right-pad variable-length samples to the longest with ``spec.pad``; stack fixed ones."""
    lengths = np.array([len(s) for s in samples], dtype=np.int64)
    if not spec.variable:
        if not samples:
            return np.zeros((0, *spec.shape), spec.numpy_dtype), lengths
        return np.stack([s[0] for s in samples]), lengths
    block = contiguous_block(samples)
    if block is not None:
        return block, lengths
    width = int(lengths.max()) if len(samples) else 0
    out = np.full((len(samples), width, *spec.shape), spec.pad, dtype=spec.numpy_dtype)
    for row, sample in enumerate(samples):
        out[row, : len(sample)] = sample
    return out, lengths


def merge_parts(
    parts: list[dict[str, Padded]], rows: list[np.ndarray], schema: dict[str, FieldSpec]
) -> dict[str, Padded]:
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
            part_values, part_lengths = part[name]
            if spec.variable:
                values[where, : part_values.shape[1]] = part_values
            else:
                values[where] = part_values
            lengths[where] = part_lengths
        merged[name] = (values, lengths)
    return merged
