"""Torch side of the wire format: tensors -> :class:`Columns`, padded numpy -> TensorDict.

Only the client imports this (and with it torch and tensordict); the dock's actors
speak numpy alone.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from tensordict import TensorDict

from mindrl.dock.schema import FieldSpec
from mindrl.dock.wire import Columns, Padded


def columns_from(
    value: torch.Tensor | np.ndarray | list[torch.Tensor],
    lengths: torch.Tensor | np.ndarray | None,
    spec: FieldSpec,
) -> Columns:
    """Encode a field given as a list of per-sample tensors or a padded tensor + lengths.

    A padded variable field without ``lengths`` is taken whole (every row full width).
    """
    if isinstance(value, list):
        arrays = [_as_numpy(t) for t in value]
        if not spec.variable:
            arrays = [a.reshape(1, *a.shape) for a in arrays]
        lens = np.array([len(a) for a in arrays], dtype=np.int64)
        flat = np.concatenate(arrays) if arrays else np.zeros((0, *spec.shape), spec.numpy_dtype)
        return Columns(flat, lens)
    array = _as_numpy(value)
    if not spec.variable:
        return Columns(array, np.ones(len(array), dtype=np.int64))
    width = array.shape[1] if array.ndim > 1 else 0
    if lengths is None:
        # Full rows: the padded array already is the concatenation, no copy.
        flat = array.reshape(len(array) * width, *array.shape[2:])
        return Columns(flat, np.full(len(array), width, dtype=np.int64))
    lens = _as_numpy(lengths).astype(np.int64)
    keep = np.arange(width)[None, :] < lens[:, None]
    return Columns(array[keep], lens)


def _as_numpy(value: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    return value.detach().cpu().numpy()


def to_tensordict(parts: dict[str, Padded], schema: dict[str, FieldSpec]) -> TensorDict:
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


def attention_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``[n, width]`` bool mask, True on the real (unpadded) positions of each row."""
    return torch.arange(width)[None, :] < lengths[:, None]
