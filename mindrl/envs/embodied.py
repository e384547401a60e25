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
import inspect
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

    def expert_actions(self) -> np.ndarray:
        """``[num_envs, chunk_size, A]``: a scripted expert's next chunk for every
        environment, read from the simulator's state (privileged: what a behaviour-cloned
        start learns from, ``env.clone_steps``). Not every environment has one.

        Raises:
            EnvConfigError: this environment has no scripted expert.
        """
        raise EnvConfigError(no_expert_line(type(self).__name__))

    def checked_actions(self, actions: np.ndarray) -> np.ndarray:
        """``actions`` clipped to the action spec, once their shape is checked to be
        ``[num_envs, chunk_size, dims]`` (a helper for ``chunk_step``).

        Raises:
            ValueError: another shape, in one line naming both.
        """
        expected = (self.num_envs, self.chunk_size, self.action_spec.dims)
        if np.shape(actions) != expected:
            raise ValueError(
                f"{type(self).__name__}.chunk_step: actions must be [num_envs, chunk_size, "
                f"dims] = {list(expected)}, got {list(np.shape(actions))}"
            )
        return self.action_spec.clip(actions)

    def blank_chunk(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Zeroed ``[num_envs, chunk_size]`` rewards (float32), terminations, truncations
        and valid (bool), for ``chunk_step`` to fill."""
        shape = (self.num_envs, self.chunk_size)
        flags = (np.zeros(shape, dtype=np.bool_) for _ in range(3))
        return (np.zeros(shape, dtype=np.float32), *flags)

    def finish_chunk(
        self,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        valid: np.ndarray,
        success: np.ndarray,
    ) -> ChunkResult:
        """What ``chunk_step`` returns once the chunk's actions are applied: the
        observations after them (also ``info["final_observations"]``), and under
        ``auto_reset`` the ended environments started again, whose first observations
        are returned instead (a helper for a subclass that keeps ``_ended`` [num_envs]
        and implements ``_observe(ids)`` and ``_start_episodes(ids)``)."""
        rows = np.arange(self.num_envs)
        observations = self._observe(rows)
        info = {"success": success, "valid": valid, "final_observations": observations}
        ended = np.flatnonzero(self._ended)
        if self.auto_reset and ended.size:
            self._start_episodes(ended)
            observations = self._observe(rows)
        return observations, rewards, terminations, truncations, info

    def close(self) -> None:  # noqa: B027 - a hook: most simulators hold nothing to release
        """Release what the environments hold (processes, renderers); nothing by default."""


def no_expert_line(name: str) -> str:
    """The one line refusing to clone the environment class ``name``, which has no
    scripted expert."""
    return (
        f"{name} has no scripted expert (VectorEnv.expert_actions) to clone; set env.clone_steps=0"
    )


class InitialStates:
    """Where each environment's next initial state is drawn from: its own stream (keyed
    by its global number ``first_env_id + i``), or, after a reset that names reset state
    ids, the stream of its id from that stream's start, so the members of a GRPO group
    start identical, also through the auto-resets after it. Every draw is a hash of
    (seed, which kind of stream, its key, the episode on it, the draw): an environment
    draws the same numbers in a batch of any size or split (sub-simulators).

    Why a hash and not numpy Generators: a Generator is one stream, so drawing for the
    environments a chunk ended would be a Python loop over them; the hash draws for the
    whole batch in a few array operations.
    """

    def __init__(self, num_envs: int, first_env_id: int, seed: int, owner: str) -> None:
        self.first_env_id, self.seed, self.owner = first_env_id, seed, owner
        self._stream = np.full(num_envs, -1, dtype=np.int64)  # reset state id; -1: its own
        self._own_episode = np.zeros(num_envs, dtype=np.int64)  # episodes on its own stream
        self._stream_episode = np.zeros(num_envs, dtype=np.int64)  # since the reset state id
        self.num_envs = num_envs

    def reset_ids(
        self, env_ids: np.ndarray | None, reset_state_ids: np.ndarray | None
    ) -> np.ndarray:
        """The environments a ``reset`` names (every one for None), each now following
        its reset state id's stream from the start, or its own stream without ids.

        Raises:
            ValueError: not one reset state id >= 0 per named environment.
        """
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids, np.int64)
        if reset_state_ids is None:
            self._stream[ids] = -1
            return ids
        streams = np.asarray(reset_state_ids, dtype=np.int64).reshape(-1)
        if streams.shape != ids.shape or np.any(streams < 0):
            raise ValueError(
                f"{self.owner}.reset: one reset state id >= 0 per reset environment "
                f"({ids.size}), got {streams.tolist()!r:.80}"
            )
        self._stream[ids] = streams
        self._stream_episode[ids] = 0
        return ids

    def draw(self, ids: np.ndarray, draws: int) -> np.ndarray:
        """``[len(ids), draws]`` uniforms in ``[0, 1)`` for the next episode of each of
        ``ids`` (advancing their streams)."""
        own = self._stream[ids] < 0
        keys = np.where(own, self.first_env_id + ids, self._stream[ids])
        episodes = np.where(own, self._own_episode[ids], self._stream_episode[ids])
        self._own_episode[ids] += own
        self._stream_episode[ids] += ~own
        return _uniform(self.seed, own, keys, episodes, draws)


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
    device: str | None = None,
) -> VectorEnv:
    """The vector environment ``path`` names, built with the run's sizes and ``kwargs``,
    and with ``device=device`` where given (``env.device: accelerator``).

    Raises:
        EnvConfigError: the class cannot be loaded, refuses ``kwargs``, takes no
            ``device`` where one is given, or the sizes do not fit together.
    """
    cls = load_vector_env_class(path)
    kwargs = dict(kwargs or {})
    if device is not None:
        if "device" not in inspect.signature(cls).parameters:
            raise EnvConfigError(
                f"env.device=accelerator builds env.cls with device={device!r}, but "
                f"{cls.__name__} takes no device keyword (it steps on the host): set "
                "env.device=cpu"
            )
        kwargs["device"] = device
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


_MASK64 = (1 << 64) - 1


def _uniform(
    seed: int, own: np.ndarray, keys: np.ndarray, episodes: np.ndarray, draws: int
) -> np.ndarray:
    """``[len(keys), draws]`` uniforms in ``[0, 1)``, each a hash of (seed, whether the
    key is an environment's own number or a reset state id, the key, the episode, the
    draw): the same arguments give the same numbers in any batch."""
    with np.errstate(over="ignore"):
        state = _splitmix(np.full(keys.shape, seed & _MASK64, dtype=np.uint64))
        state = _splitmix(state ^ own.astype(np.uint64))
        state = _splitmix(state ^ keys.astype(np.uint64))
        state = _splitmix(state ^ episodes.astype(np.uint64))
        bits = _splitmix(state[:, None] ^ np.arange(1, draws + 1, dtype=np.uint64))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
