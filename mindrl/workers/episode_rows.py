"""An embodied rollout's chunk steps as rows for the update (mindrl/workers/embodied.py):
what the pipelined stages record as they step, the step-major rows it becomes, and those
rows as dock samples (each chunk step one sample: the observation and instruction its
prompt, the action tokens its response)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict

from backends.megatron.families.vla import VLAChunk, VLAObservation
from mindrl.envs.embodied import Observations
from mindrl.envs.stages import SimulatorStages, StageLayout


@dataclass
class ChunkSteps:
    """One rank's episodes of an iteration, one row per (chunk step, environment),
    step-major: ``images`` uint8 ``[rows, H, W, 3]``, ``states`` ``[rows, S]``,
    ``prompt_ids`` ``[rows, L]``, ``action_ids`` / ``logprobs`` ``[rows, C*A]``
    (generation's), ``rewards`` / ``valid`` ``[rows, C]``, ``values [rows, V]``
    (generation's value head: one per chunk or per action), ``advantages [rows, W]``
    (``W`` units of ``algorithm.reward_level``: the episode's under a group algorithm,
    the step's own under a value head) and ``returns [rows, W]`` (the value head's
    targets; empty for a group algorithm) and ``kept [rows]`` (False: the row's group
    was filtered out and trains nothing)."""

    images: torch.Tensor
    states: torch.Tensor
    prompt_ids: torch.Tensor
    action_ids: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor
    valid: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    kept: torch.Tensor

    def __len__(self) -> int:
        return len(self.action_ids)

    def rows(self, which: slice | torch.Tensor) -> ChunkSteps:
        """The rows ``which`` selects (an empty field stays empty)."""
        return ChunkSteps(
            **{name: value[which] if len(value) else value for name, value in vars(self).items()}
        )

    def observation(self) -> VLAObservation:
        return VLAObservation(self.images, self.states, self.prompt_ids)

    def dock_fields(self, value_head: bool) -> dict[str, torch.Tensor]:
        """The rows as dock samples (``CHUNK_STEP_FIELDS``, with ``CHUNK_VALUE_FIELDS``
        under a value head), ``valid`` already cleared on the rows whose group the
        filter dropped; images flattened, every figure float32 (the dock's)."""
        columns = {
            "images": self.images.reshape(len(self), -1),
            "states": self.states.float(),
            "prompt_ids": self.prompt_ids,
            "response_ids": self.action_ids,
            "rollout_logprob": self.logprobs.float(),
            "action_valid": self.valid & self.kept.unsqueeze(-1),
            "advantages": self.advantages.float(),
        }
        if value_head:
            columns |= {"values": self.values.float(), "returns": self.returns.float()}
        return columns

    @classmethod
    def from_dock(cls, data: TensorDict, image_shape: tuple[int, int, int]) -> ChunkSteps:
        """Rows fetched from the dock (:meth:`dock_fields`' samples): every sample of an
        embodied run has the same widths, so the fetched padded fields are whole."""
        rows, keys = len(data), set(data.keys())
        values = data["values"] if "values" in keys else torch.zeros(0)
        return cls(
            images=data["images"].reshape(rows, *image_shape),
            states=data["states"],
            prompt_ids=data["prompt_ids"],
            action_ids=data["response_ids"],
            logprobs=data["rollout_logprob"],
            rewards=torch.zeros(0),  # the advantages hold what the update needs of them
            valid=data["action_valid"],
            values=values,
            advantages=data["advantages"],
            returns=data["returns"] if "returns" in keys else torch.zeros(0),
            kept=torch.ones(rows, dtype=torch.bool),
        )


@dataclass
class SteppedEpisodes:
    """What a rollout's stages recorded: per stage, each chunk step's (observation,
    chunk) and (rewards, valid), which environments succeeded, and the seconds it spent
    generating."""

    layout: StageLayout
    chunks: int

    @property
    def stages(self) -> int:
        return self.layout.count

    @property
    def num_envs(self) -> int:
        return self.layout.num_envs

    def __post_init__(self) -> None:
        self.recorded: list[list[tuple[VLAObservation, VLAChunk]]] = [
            [] for _ in range(self.stages)
        ]
        self.outcomes: list[list[tuple[torch.Tensor, torch.Tensor]]] = [
            [] for _ in range(self.stages)
        ]
        self.success = np.zeros(self.num_envs, dtype=np.bool_)
        self.terminated = np.zeros(self.num_envs, dtype=np.bool_)
        self.last_observations: list[Observations | None] = [None] * self.stages
        self.generate_s = [0.0] * self.stages

    def record_step(self, stage: int, answer: tuple) -> Observations:
        """Keep stage ``stage``'s chunk result; its next observations."""
        observations, rewards, terminations, _, info = answer
        outcome = (torch.tensor(rewards), torch.tensor(info["valid"]))  # copies: read-only
        self.outcomes[stage].append(outcome)
        rows = self.layout.rows(stage)
        self.success[rows] |= info["success"]
        self.terminated[rows] |= terminations.any(axis=1)
        self.last_observations[stage] = observations
        return observations

    def chunk_steps(self) -> ChunkSteps:
        """The episodes' rows, step-major, each step's rows in environment order (every
        stage's in turn): the layout of one whole simulator's rollout."""
        order = [(step, stage) for step in range(self.chunks) for stage in range(self.stages)]
        observations = [self.recorded[stage][step][0] for step, stage in order]
        chunks = [self.recorded[stage][step][1] for step, stage in order]
        outcomes = [self.outcomes[stage][step] for step, stage in order]
        return ChunkSteps(
            images=torch.cat([o.images for o in observations]),
            states=torch.cat([o.states for o in observations]),
            prompt_ids=torch.cat([o.prompt_ids for o in observations]),
            action_ids=torch.cat([c.action_ids for c in chunks]),
            logprobs=torch.cat([c.logprobs for c in chunks]),
            rewards=torch.cat([rewards for rewards, _ in outcomes]),
            valid=torch.cat([valid for _, valid in outcomes]),
            values=torch.cat([c.values for c in chunks]),
            advantages=torch.zeros(0),
            returns=torch.zeros(0),
            kept=torch.ones(sum(len(c.action_ids) for c in chunks), dtype=torch.bool),
        )

    def seconds(self, env: SimulatorStages) -> dict[str, float]:
        """Each stage's environment and generation seconds (``env_s_<stage>``,
        ``generate_s_<stage>``) and their sums."""
        env_s = env.take_env_seconds()
        figures = {"env_s": sum(env_s), "generate_s": sum(self.generate_s)}
        for stage in range(self.stages):
            figures[f"env_s_{stage}"] = env_s[stage]
            figures[f"generate_s_{stage}"] = self.generate_s[stage]
        return figures


def reset_state_ids(first_env_id: int, num_envs: int, group_size: int, groups: int, iteration: int):
    """Each environment's reset state id in ``iteration``: its group's (``group_size``
    consecutive environments by global number), new every iteration."""
    global_ids = first_env_id + np.arange(num_envs)
    return iteration * groups + global_ids // group_size


def informative_groups(success: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """``[envs]``: whether each environment's group holds both a success and a failure.

    RLinf-VLA's success-rate filter: in a group whose episodes all succeeded, or all
    failed, no episode did better at the task than another, and a group algorithm's
    advantages there are only the shaping's differences (scaled up to unit spread where
    the advantages are divided by the group's std)."""
    _, inverse = np.unique(group_ids, return_inverse=True)
    rate = np.bincount(inverse, weights=success.astype(np.float64)) / np.bincount(inverse)
    return ((rate > 0) & (rate < 1))[inverse]


def rows_to_put(live: torch.Tensor, counts: list[int], rank: int) -> torch.Tensor:
    """``[rows]``: which of data-parallel rank ``rank``'s chunk steps go into the dock.

    ``live``: its rows with a valid action; ``counts``: every rank's number of them. The
    live rows, and, where all ranks' together do not split evenly over the ranks (a
    claim deals equal shares, so every rank takes as many optimizer steps), as few
    others as make them: such a row trains nothing (no valid unit), and the lowest ranks
    holding such rows give them. Every rank steps as many rows, and all of them split
    evenly, so the rows needed are always there."""
    ranks = len(counts)
    short = -sum(counts) % ranks
    spare = [len(live) - count for count in counts]
    before = min(sum(spare[:rank]), short)
    mine = min(spare[rank], short - before)
    rows = live.clone()
    rows[(~live).nonzero().squeeze(-1)[:mine]] = True
    return rows
