"""Continuous actions as token ids, the way OpenVLA writes them.

Each action dimension is normalised onto ``[-1, 1]`` (the environment's bounds), cut into
``bins`` uniform bins, and written as one token: the LAST ``bins`` ids of the
vocabulary are the bins, bin ``b`` is id ``vocab_size - bins + b`` (OpenVLA counts them
from the end of the vocabulary downwards; counting upwards here keeps a larger id a
larger action and changes nothing else). An action of A dimensions is A tokens; a chunk
of C actions is C * A tokens. Decoding gives a bin's centre, so ids -> actions -> ids is
exact and actions -> ids -> actions is off by at most half a bin.
"""

from __future__ import annotations

import numpy as np


class ActionTokenizer:
    """Bins <-> ids <-> continuous actions for a vocabulary of ``vocab_size`` ids whose
    last ``bins`` are the action bins; ``low`` / ``high`` (one value per action
    dimension, or one for all) are the environment's action bounds."""

    def __init__(
        self,
        vocab_size: int,
        bins: int = 256,
        low: np.ndarray | float = -1.0,
        high: np.ndarray | float = 1.0,
    ) -> None:
        if bins < 2 or vocab_size <= bins:
            raise ValueError(
                f"ActionTokenizer: needs 2 <= bins < vocab_size (the action ids are the "
                f"vocabulary's last {bins}), got bins={bins} vocab_size={vocab_size}"
            )
        self.vocab_size = vocab_size
        self.bins = bins
        self.first_id = vocab_size - bins
        self.low = np.asarray(low, dtype=np.float64)
        self.high = np.asarray(high, dtype=np.float64)
        if not np.all(self.high > self.low):
            raise ValueError(f"ActionTokenizer: high must exceed low, got {low!r} and {high!r}")

    @property
    def bin_width(self) -> np.ndarray:
        """One bin's width in environment units (per dimension)."""
        return (self.high - self.low) / self.bins

    def actions_to_ids(self, actions: np.ndarray) -> np.ndarray:
        """``actions`` ``[..., A]`` (environment units; clipped to the bounds) -> their
        ids, int64 of the same shape."""
        normalized = (
            2.0 * (np.asarray(actions, dtype=np.float64) - self.low) / (self.high - self.low) - 1.0
        )
        bins = np.floor((normalized + 1.0) * 0.5 * self.bins).astype(np.int64)
        return self.first_id + np.clip(bins, 0, self.bins - 1)

    def ids_to_actions(self, ids: np.ndarray) -> np.ndarray:
        """Action ids ``[..., A]`` -> the centres of their bins in environment units,
        float32 of the same shape.

        Raises:
            ValueError: an id is not an action id.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if not np.all(self.is_action_id(ids)):
            bad = ids[~self.is_action_id(ids)].reshape(-1)[0]
            raise ValueError(
                f"ActionTokenizer: id {bad} is no action id (they are {self.first_id}.."
                f"{self.vocab_size - 1})"
            )
        centres = -1.0 + (ids - self.first_id + 0.5) * (2.0 / self.bins)
        return (self.low + (centres + 1.0) * 0.5 * (self.high - self.low)).astype(np.float32)

    def is_action_id(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` are action ids (the vocabulary's last ``bins``)."""
        ids = np.asarray(ids)
        return (ids >= self.first_id) & (ids < self.vocab_size)
