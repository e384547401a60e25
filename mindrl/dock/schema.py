"""Field schema of the dock: what may be put, with which dtype and shape.

A field is either fixed-shape per sample (``shape`` is the whole per-sample shape, e.g.
``()`` for a scalar reward) or variable-length (``variable=True``: the first dimension
varies per sample, ``shape`` is the trailing shape, e.g. ``()`` for token ids).
Payloads are stored unpadded and padded with ``pad`` only on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindrl.data.records import RECORD_FIELDS
from mindrl.dock.errors import DockError

__all__ = [
    "CHUNK_STEP_FIELDS",
    "CHUNK_VALUE_FIELDS",
    "RL_FIELDS",
    "TOKEN_FIELDS",
    "DockError",
    "FieldSpec",
    "check_column",
    "chunk_step_fields",
]

#: The fields whose lengths add up to a sample's tokens (what a training forward runs over):
#: a claim deals its samples to the data-parallel ranks balanced by them.
TOKEN_FIELDS = ("prompt_ids", "response_ids")


@dataclass(frozen=True)
class FieldSpec:
    """Declared dtype and per-sample shape of one field.

    Attributes:
        dtype: numpy dtype name, e.g. ``"int64"``; a put of any other dtype is refused.
        shape: per-sample shape of a fixed field, or the trailing shape after the
            variable first dimension of a variable-length field.
        variable: the first dimension varies per sample (tokens); stored unpadded.
        pad: value that fills the right padding of variable fields on the way out.
    """

    dtype: str
    shape: tuple[int, ...] = ()
    variable: bool = False
    pad: float = 0

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)


#: The fields of a GRPO/PPO iteration (docs/architecture.md §3); trainers may pass their own.
RL_FIELDS: dict[str, FieldSpec] = {
    "prompt_ids": FieldSpec("int64", variable=True),
    "response_ids": FieldSpec("int64", variable=True),
    "rollout_logprob": FieldSpec("float32", variable=True),
    # The weights version (updates included) that sampled each token, where tokens may lag
    # the trained weights (mindrl/run_plan.py, tokens_may_lag).
    "rollout_version": FieldSpec("int64", variable=True),
    # A response interrupted before its end (partial rollout's budget, a checkpoint of
    # continuous generation), until it finishes (mindrl/workers/generation.py).
    "paused_ids": FieldSpec("int64", variable=True),
    "paused_logprob": FieldSpec("float32", variable=True),
    "paused_version": FieldSpec("int64", variable=True),
    "token_rewards": FieldSpec("float32", variable=True),
    # A multi-turn trajectory (mindrl/workers/episodes.py): 1 on the model's tokens, 0 on
    # the environment's observations, response-aligned; and the sum of its step rewards.
    "loss_mask": FieldSpec("float32", variable=True),
    "env_reward": FieldSpec("float32"),
    "reward": FieldSpec("float32"),
    "ref_logprob": FieldSpec("float32", variable=True),
    "old_logprob": FieldSpec("float32", variable=True),
    "values": FieldSpec("float32", variable=True),
    "advantages": FieldSpec("float32", variable=True),
    "returns": FieldSpec("float32", variable=True),
    # An embodied chunk step (mindrl/workers/episode_rows.py): its observation's image
    # (H x W x 3, flattened) and robot state, and which of its chunk's actions train
    # (applied before the episode's end, in a group the filter kept).
    "images": FieldSpec("uint8", variable=True),
    "states": FieldSpec("float32", variable=True),
    "action_valid": FieldSpec("bool", variable=True),
}

#: An embodied chunk step as a dock sample: the observation and the instruction's ids as
#: the prompt, the chunk's action ids as the response, their log-probs at generation, the
#: valid actions and the advantages the rank that stepped the episode gave them...
CHUNK_STEP_FIELDS = (
    "images",
    "states",
    "prompt_ids",
    "response_ids",
    "rollout_logprob",
    "action_valid",
    "advantages",
)
#: ... and, with a value head (PPO), its values at generation and the return targets.
CHUNK_VALUE_FIELDS = ("values", "returns")


def chunk_step_fields(value_head: bool) -> tuple[str, ...]:
    """The fields of an embodied chunk step the update reads (a value head's too)."""
    return (*CHUNK_STEP_FIELDS, *(CHUNK_VALUE_FIELDS if value_head else ()))


#: The fields a training run's dock holds: the RL fields plus what the driver puts beside
#: each prompt: its record as UTF-8 bytes (uid, text, ground truth, domain, the rest of its
#: row; the rewards and an environment's ``reset`` read it, mindrl/data/records.py) and its
#: group (group-relative advantages and filters).
RUN_FIELDS: dict[str, FieldSpec] = {
    **RL_FIELDS,
    **{name: FieldSpec("uint8", variable=True) for name in RECORD_FIELDS},
    "group_id": FieldSpec("int64"),
}


def check_column(name: str, spec: FieldSpec, values: np.ndarray, lengths: np.ndarray) -> str | None:
    """One-line reason the concatenated samples of a field do not fit ``spec``, or None."""
    if values.dtype != spec.numpy_dtype:
        return f"field '{name}' must be {spec.dtype}, got {values.dtype}"
    if tuple(values.shape[1:]) != tuple(spec.shape):
        kind = "trailing shape" if spec.variable else "shape"
        return f"field '{name}' needs per-sample {kind} {spec.shape}, got {tuple(values.shape[1:])}"
    if not spec.variable and np.any(lengths != 1):
        return f"field '{name}' is fixed-shape: one value per sample"
    if int(lengths.sum()) != len(values):
        total = int(lengths.sum())
        return f"field '{name}': lengths add up to {total} but {len(values)} values were sent"
    return None
