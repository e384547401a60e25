"""A demonstration set for an embodied run's cloned start (``env.clone_data``): the
(observation, action) pairs a scripted expert or a person recorded, trained on in
shuffled batches before RL, as RLinf-VLA starts from a policy fine-tuned on
demonstrations (docs/guide/environments.md, "A behaviour-cloned start").

The file is an ``.npz`` (``scripts/metaworld_expert_data.py`` writes one) holding
``states`` float ``[T, S]`` and ``actions`` float ``[T, A]`` or ``[T, C, A]`` (a chunk
per pair; ``[T, A]`` is a chunk of one), and optionally ``images`` uint8 ``[T, H, W, 3]``
(absent: blank images, as an environment without a renderer gives) and
``instruction_ids`` int ``[T, L]`` (absent: every pair carries the environment's own
instruction, which must then be one for all its episodes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mindrl.envs.embodied import EnvConfigError, Observations, ObservationSpec, VectorEnv


@dataclass(frozen=True)
class Demonstrations:
    """``states [T, S]``, ``actions [T, C, A]``, and ``images`` / ``instruction_ids``
    where the file has them (module docstring)."""

    states: np.ndarray
    actions: np.ndarray
    images: np.ndarray | None
    instruction_ids: np.ndarray | None

    def __len__(self) -> int:
        return len(self.states)

    def batch_rows(self, step: int, seed: int, size: int, rank: int, ranks: int) -> np.ndarray:
        """Rank ``rank``'s share (every ``ranks``-th) of step ``step``'s shuffled batch of
        ``size`` pairs: the same batch whatever the number of ranks."""
        generator = np.random.default_rng([seed, step])
        batch = generator.choice(len(self), size=min(size, len(self)), replace=False)
        return batch[rank::ranks]


def load_demonstrations(
    path: str, spec: ObservationSpec, chunk_size: int, action_dims: int
) -> Demonstrations:
    """The demonstrations in ``path``, checked against what the run's environment and
    policy read.

    Raises:
        EnvConfigError: a missing or unreadable file, a missing array, or a shape that
            differs from the environment's (one line naming it and the fix).
    """
    where = f"env.clone_data={path!r}"
    if not Path(path).is_file():
        raise EnvConfigError(
            f"{where} is not a file; write one with scripts/metaworld_expert_data.py"
        )
    try:
        with np.load(path) as arrays:
            found = {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError) as exc:
        raise EnvConfigError(f"{where} is not an .npz file numpy can read ({exc})") from None
    missing = [name for name in ("states", "actions") if name not in found]
    if missing:
        raise EnvConfigError(
            f"{where} has no {' / '.join(missing)} array; it needs states and actions"
        )
    states = found["states"].astype(np.float32)
    actions = found["actions"].astype(np.float32)
    if actions.ndim == 2:
        actions = actions[:, None, :]
    images, ids = found.get("images"), found.get("instruction_ids")
    pairs = len(states)
    expected = {
        "states": ((pairs, spec.state_dim), states.shape),
        "actions": ((pairs, chunk_size, action_dims), actions.shape),
    }
    if images is not None:
        expected["images"] = ((pairs, spec.image_height, spec.image_width, 3), images.shape)
    if ids is not None:
        expected["instruction_ids"] = ((pairs, *ids.shape[1:]), ids.shape)
    for name, (want, got) in expected.items():
        if tuple(got) != want or not pairs:
            raise EnvConfigError(
                f"{where}: {name} is {list(got)}; this run reads {list(want)} (the "
                "environment's state and image sizes, env.chunk_size, the action dimensions)"
            )
    return Demonstrations(states, actions, None if images is None else images.astype(np.uint8), ids)


def record_expert(env: VectorEnv, episodes: int, images: bool = False) -> dict[str, np.ndarray]:
    """Roll ``env``'s scripted expert (``VectorEnv.expert_actions``) out from a reset until
    ``episodes`` episodes have ended (``env`` built with ``auto_reset``, so an ended
    environment starts its next episode at once): a demonstration set for
    ``env.clone_data``.

    Returns ``states [T, S]``, ``actions [T, C, A]`` (every applied chunk with the
    observation it answered), ``instruction_ids [T, L]`` where the environment gives
    them, ``images [T, H, W, 3]`` with ``images``, ``episode [T]`` (which ended episode
    each pair belongs to, in the order they ended) and ``success [episodes]``.
    """
    pairs = ExpertPairs()
    running: list[list[dict[str, np.ndarray]]] = [[] for _ in range(env.num_envs)]
    observations = env.reset()
    while len(pairs.success) < episodes:
        chunk = env.expert_actions()
        for e in range(env.num_envs):
            running[e].append({**_observed(observations, e, images), "actions": chunk[e]})
        observations, _, terminations, truncations, info = env.chunk_step(chunk)
        for e in np.flatnonzero((terminations | truncations).any(axis=1)):
            if len(pairs.success) < episodes:
                pairs.add_episode(running[e], bool(info["success"][e]))
            running[e] = []
    return pairs.arrays()


def _observed(observations: Observations, row: int, images: bool) -> dict[str, np.ndarray]:
    """Environment ``row``'s share of ``observations``: what a pair keeps of it."""
    kept = {"states": observations.states[row]}
    if observations.instruction_ids is not None:
        kept["instruction_ids"] = observations.instruction_ids[row]
    if images:
        kept["images"] = observations.images[row]
    return kept


@dataclass
class ExpertPairs:
    """Ended episodes' pairs (each a dict of arrays), gathered in the order they end."""

    fields: dict[str, list[np.ndarray]] = field(default_factory=dict)
    episode: list[int] = field(default_factory=list)
    success: list[bool] = field(default_factory=list)

    def add_episode(self, steps: list[dict[str, np.ndarray]], succeeded: bool) -> None:
        for step in steps:
            for name, value in step.items():
                self.fields.setdefault(name, []).append(value)
            self.episode.append(len(self.success))
        self.success.append(succeeded)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            **{name: np.stack(values) for name, values in self.fields.items()},
            "episode": np.array(self.episode, dtype=np.int64),
            "success": np.array(self.success, dtype=np.bool_),
        }
