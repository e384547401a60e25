"""BatchedReach: a 2-D reaching task whose whole batch moves in one array operation.

The project's own embodied environment (docs/environments.md, "BatchedReach"): cheap
enough to train a vision-language-action policy on CPU, shaped like a GPU simulator
(every environment advanced by the same numpy operations, so one call's cost grows with
the number of environments, not with the number of calls).

The task. The workspace is the square ``[-1, 1]^2``. Three coloured targets (red, green,
blue; which colour sits where is drawn per episode) lie on a ring around the centre:
target ``k`` at angle ``theta + 2 pi k / 3`` and distance ``rho_k`` from the centre,
``theta`` uniform and ``rho_k`` drawn so that each target is uniform over the annulus
``ring_inner <= |p| <= ring_outer``. The end effector starts at the centre. The
instruction names one of the three colours, uniformly ("reach the red target"). An
action is a 2-D velocity, each component within ``[-max_speed, max_speed]``; the end
effector moves by it (and stays in the square). Touching a target (end effector within
``success_radius`` of its centre) ends the episode (a termination): a success if it is
the named one, a failure otherwise. ``horizon`` actions without touching one truncate it.

Observations: a ``image_size x image_size`` RGB image (the three target discs, drawn with
the success radius, and the end effector as a white dot on a dark background; drawn at
``render_scale`` times that size and averaged down, which anti-aliases the edges and makes
a step cost what a finer renderer costs, growing with ``num_envs * render_scale^2``), the
state ``[x, y]`` of the end effector, and the instruction, also as ids of the
environment's own six-word vocabulary (``reach the red green blue target``): the
project's built-in tiny tokenizer knows none of these words (its vocabulary is digits
and the synthetic tasks' operators), and it stays as it is.

Reward, per atomic action: ``success_bonus`` on the action that reaches the named target,
plus ``shaping * (d_before - d_after)``, the progress towards it (``d``: distance of the
end effector to the named target's centre). The shaping is potential-based (Ng, Harada
and Russell 1999: a difference of a potential changes no policy's ranking, the optimal
policy stays the one that reaches the named target fastest), it sums over an episode to
the distance covered (at most ``ring_outer``), and it gives a policy that starts far
from ever succeeding a gradient from its first episodes; ``shaping: 0`` leaves the bare
success reward (the RLinf-VLA setting for ManiSkill and LIBERO).

What a blind policy can reach (success rates, upper bounds; ``tests/envs/
test_embodied_reach.py`` checks them with the best scripted blind strategies, and
``blind="image"`` / ``blind="instruction"`` withhold the targets or the colour from a
policy trained on it, docs/guide/environments.md):

* **Instruction-blind** (sees image and state, not which colour is named): at most 1/3.
  Touching any target ends the episode, so an episode succeeds only if the first target
  touched is the named one. The named colour is drawn uniformly and independently of
  everything such a policy sees, so whichever target it heads for is the named one with
  probability exactly 1/3 (visiting the three in turn is impossible: the first touch
  ends the episode). A policy that always reaches the nearest target gets 1/3.
* **Image-blind** (sees state and instruction, not where the targets are): at most
  ``horizon * success_radius^2 / (ring_outer^2 - ring_inner^2)`` (1/6 with the
  defaults). Its observations (its own position, the instruction) do not depend on the
  targets' places, so its path until the episode ends is drawn independently of them.
  Success is decided at the ``horizon`` positions the path visits, so it needs the named
  target's centre within ``success_radius`` of one of them: a union of at most
  ``horizon`` discs of area ``pi * success_radius^2``. The named target's centre is
  uniform over the annulus of area ``pi * (ring_outer^2 - ring_inner^2)``, whatever the
  path, which gives the bound (touching a wrong target first only lowers it).
* **Oracle** (reads the named target's position): 1.0. The farthest target is
  ``ring_outer`` away; moving straight at it at full speed reaches it within
  ``ceil((ring_outer - success_radius) / max_speed)`` actions (4 with the defaults, under
  the horizon of 12), and a straight line from the centre never passes within
  ``success_radius`` of another target (the others are 120 degrees away, at least
  ``ring_inner > success_radius`` from the centre).

Every random draw is a counter-based hash of (seed, environment number, episode number)
or, for environments reset with ``reset_state_ids``, of (seed, reset state id, episode
number since that reset): no generator state is shared across the batch, so a batch, its
sub-batches (``first_env_id``) and single environments give the same episodes.
"""

from __future__ import annotations

import numpy as np

from mindrl.envs.embodied import (
    ActionSpec,
    ChunkResult,
    InitialStates,
    Observations,
    ObservationSpec,
    VectorEnv,
)

COLOURS = ("red", "green", "blue")
RGB = np.array([[220, 40, 40], [40, 200, 40], [50, 90, 235]], dtype=np.uint8)
BACKGROUND = np.array([30, 30, 30], dtype=np.uint8)
EFFECTOR = np.array([255, 255, 255], dtype=np.uint8)
VOCAB = ("reach", "the", *COLOURS, "target")
INSTRUCTIONS = np.array([f"reach the {colour} target" for colour in COLOURS], dtype=object)
INSTRUCTION_IDS = np.array(
    [[VOCAB.index(word) for word in text.split()] for text in INSTRUCTIONS], dtype=np.int64
)
#: The instruction an instruction-blind environment gives: its words without a colour
#: (padded with "the" to the others' width: every instruction has one length).
UNNAMED = "reach the the target"
UNNAMED_IDS = np.array([VOCAB.index(word) for word in UNNAMED.split()], dtype=np.int64)
EFFECTOR_DRAW_RADIUS = 0.07
#: What a blinded environment withholds from the policy (``blind``): ``image``, the
#: targets (the image shows the end effector alone), or ``instruction`` (always "reach the
#: target", no colour); for checking the module docstring's bounds by training.
BLINDS = (None, "image", "instruction")
#: Random numbers one reset draws per environment: the ring's angle, three distances,
#: three keys ordering the colours, the named target.
DRAWS_PER_RESET = 8


class BatchedReach(VectorEnv):
    """Reach the named one of three coloured targets (module docstring)."""

    def __init__(
        self,
        num_envs: int = 16,
        chunk_size: int = 4,
        horizon: int = 12,
        auto_reset: bool = True,
        seed: int = 0,
        first_env_id: int = 0,
        image_size: int = 32,
        success_radius: float = 0.1,
        max_speed: float = 0.2,
        ring_inner: float = 0.3,
        ring_outer: float = 0.9,
        shaping: float = 1.0,
        success_bonus: float = 1.0,
        blind: str | None = None,
        render_scale: int = 1,
    ) -> None:
        super().__init__(num_envs, chunk_size, horizon, auto_reset, seed, first_env_id)
        if not 0 < success_radius < ring_inner < ring_outer <= 1.0:
            raise ValueError(
                "BatchedReach: needs 0 < success_radius < ring_inner < ring_outer <= 1, got "
                f"{success_radius}, {ring_inner}, {ring_outer}"
            )
        self.success_radius, self.max_speed = success_radius, max_speed
        self.ring_inner, self.ring_outer = ring_inner, ring_outer
        self.shaping, self.success_bonus = shaping, success_bonus
        if blind not in BLINDS:
            raise ValueError(f"BatchedReach: blind={blind!r}; choose one of {BLINDS}")
        self.blind = blind
        if render_scale < 1:
            raise ValueError(f"BatchedReach: render_scale must be >= 1, got {render_scale}")
        self.render_scale = render_scale
        self.action_spec = ActionSpec(2, np.full(2, -max_speed), np.full(2, max_speed))
        self.observation_spec = ObservationSpec(image_size, image_size, 2, VOCAB)
        n = num_envs
        self._position = np.zeros((n, 2), dtype=np.float64)
        self._targets = np.zeros((n, 3, 2), dtype=np.float64)
        self._colour_of_target = np.zeros((n, 3), dtype=np.int64)
        self._goal = np.zeros(n, dtype=np.int64)  # index of the named target
        self._steps = np.zeros(n, dtype=np.int64)
        self._ended = np.zeros(n, dtype=np.bool_)
        self._initial_states = InitialStates(n, first_env_id, seed, type(self).__name__)
        rendered = image_size * render_scale  # drawn at this size, averaged down to image_size
        self._scene = np.zeros((n, rendered, rendered, 3), dtype=np.uint8)  # no effector
        self._images = np.zeros_like(self._scene)  # the scenes with the effector drawn in
        self.reset()

    @property
    def target_positions(self) -> np.ndarray:
        """``[num_envs, 3, 2]``: the targets' centres (what the image shows; for scripted
        policies and tests)."""
        return self._targets.copy()

    @property
    def goal_positions(self) -> np.ndarray:
        """``[num_envs, 2]``: the named target's centre (privileged: an oracle's input)."""
        return self._targets[np.arange(self.num_envs), self._goal]

    def expert_actions(self) -> np.ndarray:
        """The oracle's chunk (module docstring): straight at the named target at full
        speed (the offset scaled down until no component exceeds the speed limit)."""
        position, goal = self._position.copy(), self.goal_positions
        chunk = np.empty((self.num_envs, self.chunk_size, 2))
        for c in range(self.chunk_size):
            offset = goal - position
            chunk[:, c] = offset / np.maximum(
                np.abs(offset).max(axis=1, keepdims=True) / self.max_speed, 1.0
            )
            position = position + chunk[:, c]
        return chunk

    def reset(
        self, env_ids: np.ndarray | None = None, reset_state_ids: np.ndarray | None = None
    ) -> Observations:
        ids = self._initial_states.reset_ids(env_ids, reset_state_ids)
        self._start_episodes(ids)
        return self._observe(ids)

    def chunk_step(self, actions: np.ndarray) -> ChunkResult:
        actions = self.checked_actions(actions).astype(np.float64)
        n, chunk = self.num_envs, self.chunk_size
        rewards, terminations, truncations, valid = self.blank_chunk()
        success = np.zeros(n, dtype=np.bool_)
        rows = np.arange(n)
        before = self._distances()[rows, self._goal]
        for c in range(chunk):  # the chunk's actions in turn, every environment at once
            live = ~self._ended
            valid[:, c] = live
            moved = np.clip(self._position + actions[:, c], -1.0, 1.0)
            self._position = np.where(live[:, None], moved, self._position)
            distances = self._distances()
            touched = distances < self.success_radius
            hit_any = touched.any(axis=1) & live
            hit_goal = touched[rows, self._goal] & live
            after = distances[rows, self._goal]
            step_reward = self.shaping * (before - after) + self.success_bonus * hit_goal
            rewards[:, c] = np.where(live, step_reward, 0.0)
            self._steps += live
            terminations[:, c] = hit_any
            truncations[:, c] = live & ~hit_any & (self._steps >= self.horizon)
            success |= hit_goal
            self._ended |= terminations[:, c] | truncations[:, c]
            before = after
        return self.finish_chunk(rewards, terminations, truncations, valid, success)

    def _start_episodes(self, ids: np.ndarray) -> None:
        """New scenes for the environments ``ids``, drawn from each one's own stream."""
        if not ids.size:
            return
        draws = self._initial_states.draw(ids, DRAWS_PER_RESET)
        angle = 2.0 * np.pi * (draws[:, :1] + np.arange(3) / 3.0)
        inner2, outer2 = self.ring_inner**2, self.ring_outer**2
        distance = np.sqrt(inner2 + draws[:, 1:4] * (outer2 - inner2))  # uniform in area
        self._targets[ids] = np.stack([np.cos(angle), np.sin(angle)], axis=-1) * distance[..., None]
        self._colour_of_target[ids] = np.argsort(draws[:, 4:7], axis=1)
        self._goal[ids] = np.minimum((draws[:, 7] * 3).astype(np.int64), 2)
        self._position[ids] = 0.0
        self._steps[ids] = 0
        self._ended[ids] = False
        self._draw_scenes(ids)

    def _draw_scenes(self, ids: np.ndarray) -> None:
        """The static part of the images of ``ids``: background, then the targets."""
        self._scene[ids] = BACKGROUND
        if self.blind == "image":
            return  # the end effector alone
        for k in range(3):  # the three targets, each stamped over the whole batch
            colours = RGB[self._colour_of_target[ids, k]]
            _stamp(self._scene, ids, self._targets[ids, k], self.success_radius, colours)

    def _observe(self, ids: np.ndarray) -> Observations:
        """The observations of ``ids``: their scenes with the end effector drawn in."""
        images = self._images[: ids.size]
        np.copyto(images, self._scene[ids])
        rows = np.arange(ids.size)
        _stamp(images, rows, self._position[ids], EFFECTOR_DRAW_RADIUS, EFFECTOR)
        colour = self._colour_of_target[ids, self._goal[ids]]
        instructions, instruction_ids = INSTRUCTIONS[colour].tolist(), INSTRUCTION_IDS[colour]
        if self.blind == "instruction":
            instructions = [UNNAMED] * ids.size
            instruction_ids = np.broadcast_to(UNNAMED_IDS, instruction_ids.shape).copy()
        return Observations(
            images=self._downsampled(images),
            states=self._position[ids].astype(np.float32),
            instructions=instructions,
            instruction_ids=instruction_ids,
        )

    def _downsampled(self, images: np.ndarray) -> np.ndarray:
        """``images`` drawn at ``render_scale`` times the observation's size, each block
        of ``render_scale^2`` pixels averaged into one (anti-aliased edges); a copy."""
        scale = self.render_scale
        if scale == 1:
            return images.copy()
        n, size = len(images), images.shape[1] // scale
        blocks = images.reshape(n, size, scale, size, scale, 3).astype(np.float32)
        return np.rint(blocks.mean(axis=(2, 4))).astype(np.uint8)

    def _distances(self) -> np.ndarray:
        """``[num_envs, 3]``: the end effector's distance to each target's centre."""
        return np.linalg.norm(self._targets - self._position[:, None, :], axis=-1)


def _stamp(
    images: np.ndarray,
    rows: np.ndarray,
    centres: np.ndarray,
    radius: float,
    colours: np.ndarray,
) -> None:
    """Paint a disc of ``radius`` around ``centres[i]`` (world units) into
    ``images[rows[i]]``: every pixel whose centre lies in the disc. Only the few
    pixels around each centre are looked at, so a step's drawing costs a few dozen
    operations per environment, not one per pixel."""
    size = images.shape[1]
    pixel = 2.0 / size
    reach = int(np.ceil(radius / pixel)) + 1
    offsets = np.arange(-reach, reach + 1)
    col = np.rint((centres[:, 0] + 1.0) / pixel - 0.5).astype(np.int64)[:, None] + offsets
    row = np.rint((1.0 - centres[:, 1]) / pixel - 0.5).astype(np.int64)[:, None] + offsets
    dx = -1.0 + (col + 0.5) * pixel - centres[:, :1]  # [n, window] along x
    dy = 1.0 - (row + 0.5) * pixel - centres[:, 1:]  # [n, window] along y
    inside = dy[:, :, None] ** 2 + dx[:, None, :] ** 2 <= radius**2
    inside &= ((row >= 0) & (row < size))[:, :, None] & ((col >= 0) & (col < size))[:, None, :]
    env, r, c = np.nonzero(inside)
    colours = np.broadcast_to(colours, (len(centres), 3))
    images[rows[env], row[env, r], col[env, c]] = colours[env]
