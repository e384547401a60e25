"""The vector environment interface of embodied runs: one object steps N simulated robots.

A text environment (mindrl/envs/base.py) is one instance per episode answering a turn
with text. A simulator for a vision-language-action policy is the opposite shape: one
object holds N environments and advances all of them in one call, as a GPU simulator
does (its cost grows with N, not with the number of calls), and the policy answers with
a *chunk* of C continuous actions per observation (docs/environments.md, "Embodied
environments").

``VectorEnv`` is what a run's ``env.cls`` names when ``env.kind`` is ``embodied``:

``reset(env_ids=None, reset_state_ids=None) -> Observations``
    Starts a new episode in the environments ``env_ids`` (all when None) and returns
    their first observations, in the order of ``env_ids``. ``reset_state_ids`` (one per
    reset environment) picks each one's initial state: environments given the same id
    start identical (a GRPO group); without ids every environment draws its own.

``chunk_step(actions) -> (observations, rewards, terminations, truncations, info)``
    ``actions`` ``[num_envs, C, A]`` in environment units (``action_spec``; values
    outside its bounds are clipped). The C actions are applied one after another; each
    atomic action has its own reward and done flags (``[num_envs, C]``). A
    termination (the task succeeded or failed for good) or truncation (``horizon``
    actions were taken) marks the action that ended the episode; the episode's later
    actions are not applied (``info["valid"]`` is False for them, their reward 0).
    With ``auto_reset`` the environments whose episode ended are reset at the end of
    the chunk and ``observations`` are their new episodes' first ones (the ended
    episodes' last observations are ``info["final_observations"]``, for bootstrapping
    a truncated episode's value); without it (fixed-length episodes) an ended
    environment stays as it ended until ``reset``. ``info["success"]`` ``[num_envs]``
    says which environments' episodes succeeded during this chunk.

Environments are numbered globally (``first_env_id``) and every random draw is a
function of the run's seed and the environment's number (or its reset state id), never
of the batch: a simulator split into sub-simulators of N/k environments each produces
exactly the trajectories of the whole one.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np

from mindrl.config.class_path import EnvConfigError
from mindrl.config.episode_shape import episode_shape_problems
from mindrl.envs.base import import_class


@dataclass(frozen=True)
class ActionSpec:
    """The continuous actions of an environment: ``dims`` values per atomic action, each
    within ``[low, high]`` (environment units; arrays of ``dims``)."""

    dims: int
    low: np.ndarray
    high: np.ndarray

    def __post_init__(self) -> None:
        low = np.asarray(self.low, dtype=np.float32).reshape(-1)
        high = np.asarray(self.high, dtype=np.float32).reshape(-1)
        if low.shape != (self.dims,) or high.shape != (self.dims,) or not np.all(high > low):
            raise ValueError(
                f"ActionSpec: low and high must be {self.dims} values each with high > low, "
                f"got low={low.tolist()} high={high.tolist()}"
            )
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        """``actions`` ``[..., dims]`` in environment units mapped onto ``[-1, 1]``."""
        span = self.high - self.low
        return 2.0 * (np.asarray(actions, dtype=np.float32) - self.low) / span - 1.0

    def denormalize(self, normalized: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`normalize`: ``[-1, 1]`` back to environment units."""
        return self.low + (np.asarray(normalized, dtype=np.float32) + 1.0) * 0.5 * (
            self.high - self.low
        )

    def clip(self, actions: np.ndarray) -> np.ndarray:
        """``actions`` within the bounds, as float32."""
        return np.clip(np.asarray(actions, dtype=np.float32), self.low, self.high)


@dataclass(frozen=True)
class ObservationSpec:
    """What an observation holds: an RGB image ``image_height x image_width``, a robot
    state of ``state_dim`` floats, and an instruction written in ``instruction_vocab``'s
    words (the environment's own vocabulary; ``Observations.instruction_ids`` index it)."""

    image_height: int
    image_width: int
    state_dim: int
    instruction_vocab: tuple[str, ...]


@dataclass
class Observations:
    """Observations of n environments: ``images`` uint8 ``[n, H, W, 3]``, ``states``
    float32 ``[n, S]``, ``instructions`` (n texts) and, where the environment gives
    them, ``instruction_ids`` int64 ``[n, L]``: the instructions as indices of
    ``ObservationSpec.instruction_vocab`` (for a policy whose tokenizer lacks the words)."""

    images: np.ndarray
    states: np.ndarray
    instructions: list[str]
    instruction_ids: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.instructions)


#: What :meth:`VectorEnv.chunk_step` returns: observations, rewards ``[n, C]``,
#: terminations ``[n, C]``, truncations ``[n, C]``, info.
ChunkResult = tuple[Observations, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class VectorEnv(abc.ABC):
    """N environments stepped together, C actions per call (module docstring).

    A subclass is built as ``cls(num_envs=..., chunk_size=..., horizon=...,
    auto_reset=..., seed=..., first_env_id=..., **env.kwargs)``, calls this constructor,
    and sets ``action_spec`` and ``observation_spec``.
    """

    action_spec: ActionSpec
    observation_spec: ObservationSpec

    def __init__(
        self,
        num_envs: int,
        chunk_size: int,
        horizon: int,
        auto_reset: bool = True,
        seed: int = 0,
        first_env_id: int = 0,
    ) -> None:
        check_episode_shape(num_envs, chunk_size, horizon)
        self.num_envs = num_envs
        self.chunk_size = chunk_size
        self.horizon = horizon
        self.auto_reset = auto_reset
        self.seed = seed
        self.first_env_id = first_env_id

    @abc.abstractmethod
    def reset(
        self, env_ids: np.ndarray | None = None, reset_state_ids: np.ndarray | None = None
    ) -> Observations:
        """New episodes in ``env_ids`` (all when None); their first observations."""

    @abc.abstractmethod
    def chunk_step(self, actions: np.ndarray) -> ChunkResult:
        """Apply ``actions`` ``[num_envs, chunk_size, A]`` (module docstring)."""

    def close(self) -> None:  # noqa: B027 - a hook: most simulators hold nothing to release
        """Release what the environments hold (processes, renderers); nothing by default."""


def check_episode_shape(num_envs: int, chunk_size: int, horizon: int) -> None:
    """The sizes a vector environment is built with make sense together.

    Raises:
        EnvConfigError: one of them is below 1, or the chunks do not tile the episode.
    """
    problems = episode_shape_problems(num_envs, chunk_size, horizon)
    if problems:
        raise EnvConfigError(problems[0])


def load_vector_env_class(path: str) -> type[VectorEnv]:
    """The vector environment class ``path`` (``"package.module:ClassName"``) names.

    Raises:
        EnvConfigError: no such module or class, or the class is no :class:`VectorEnv`.
    """
    cls = import_class(path)
    if not issubclass(cls, VectorEnv):
        raise EnvConfigError(
            f"env.cls {path!r}: env.kind=embodied needs a subclass of "
            "mindrl.envs.embodied.VectorEnv (reset, chunk_step, action_spec, observation_spec)"
        )
    return cls


def make_vector_env(
    path: str,
    *,
    num_envs: int,
    chunk_size: int,
    horizon: int,
    auto_reset: bool = True,
    seed: int = 0,
    first_env_id: int = 0,
    kwargs: dict[str, Any] | None = None,
) -> VectorEnv:
    """The vector environment ``path`` names, built with the run's sizes and ``kwargs``.

    Raises:
        EnvConfigError: the class cannot be loaded, refuses ``kwargs``, or the sizes
            do not fit together.
    """
    cls = load_vector_env_class(path)
    kwargs = dict(kwargs or {})
    try:
        return cls(
            num_envs=num_envs,
            chunk_size=chunk_size,
            horizon=horizon,
            auto_reset=auto_reset,
            seed=seed,
            first_env_id=first_env_id,
            **kwargs,
        )
    except TypeError as exc:
        raise EnvConfigError(f"env.cls {path!r} refuses env.kwargs {kwargs!r}: {exc}") from None
