"""Wire format: one flat numpy buffer per field plus per-sample lengths.

Ray hands numpy arrays from the same-node object store to readers without copying, while
torch tensors are copied (DESIGN.md §6: 3 ms vs 120-520 ms for 100 MB), so payloads cross
process boundaries as :class:`Columns` and are rebuilt into a TensorDict on the reader.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict

from mindrl.dock.schema import FieldSpec


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


def columns_from(
    value: torch.Tensor | list[torch.Tensor], lengths: torch.Tensor | None, spec: FieldSpec
) -> Columns:
    """Encode a field given as a list of per-sample tensors or a padded tensor + lengths."""
    if isinstance(value, list):
        arrays = [t.detach().cpu().numpy() for t in value]
        if not spec.variable:
            arrays = [a.reshape(1, *a.shape) for a in arrays]
        lens = np.array([len(a) for a in arrays], dtype=np.int64)
        flat = np.concatenate(arrays) if arrays else np.zeros((0, *spec.shape), spec.numpy_dtype)
        return Columns(flat, lens)
    array = value.detach().cpu().numpy()
    if not spec.variable:
        return Columns(array, np.ones(len(array), dtype=np.int64))
    if lengths is None:
        lens = np.full(len(array), array.shape[1] if array.ndim > 1 else 0, dtype=np.int64)
    else:
        lens = lengths.cpu().numpy().astype(np.int64)
    keep = np.arange(array.shape[1])[None, :] < lens[:, None]
    return Columns(array[keep], lens)


def pad_columns(samples: list[np.ndarray], spec: FieldSpec) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad variable-length samples to the longest; fixed ones are stacked."""
    lengths = np.array([len(s) for s in samples], dtype=np.int64)
    if not spec.variable:
        return np.stack([s[0] for s in samples]) if samples else np.zeros((0, *spec.shape)), lengths
    width = int(lengths.max()) if len(samples) else 0
    out = np.full((len(samples), width, *spec.shape), spec.pad, dtype=spec.numpy_dtype)
    for row, sample in enumerate(samples):
        out[row, : len(sample)] = sample
    return out, lengths


def to_tensordict(
    parts: dict[str, tuple[np.ndarray, np.ndarray]], schema: dict[str, FieldSpec]
) -> TensorDict:
    """Padded numpy fields -> TensorDict with ``<field>`` and ``<field>_lengths`` entries.

    Tensors are zero-copy views of the arrays Ray mapped from the object store, which are
    read-only: clone a tensor before writing to it in place.
    """
    batch = len(next(iter(parts.values()))[1]) if parts else 0
    out = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*non-writable.*")
        for name, (values, lengths) in parts.items():
            out[name] = torch.from_numpy(values)
            if schema[name].variable:
                out[f"{name}_lengths"] = torch.from_numpy(lengths)
    return TensorDict(out, batch_size=[batch])
