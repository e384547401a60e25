"""The VLA's keypoint tokens (``families/vla.py``, ``KeypointEncoder``): where they say
a thing is, and that the instruction decides which thing."""

from __future__ import annotations

import numpy as np
import torch

from backends.megatron.families.vla import KeypointEncoder, VLASpec
from mindrl.envs.batched_reach import COLOURS, BatchedReach

SPEC = VLASpec(image_size=32, keypoints=3)


def test_a_map_peaked_at_a_pixel_puts_the_keypoint_at_that_pixels_centre():
    encoder = KeypointEncoder(SPEC, hidden_size=8)
    row, col = 5, 27
    maps = torch.full((1, 1, 32 * 32), -1e4)
    maps[0, 0, row * 32 + col] = 0.0
    where = torch.softmax(maps, dim=-1) @ encoder.grid
    pixel = 2.0 / 32
    expected = [-1.0 + (col + 0.5) * pixel, 1.0 - (row + 0.5) * pixel]
    torch.testing.assert_close(where[0, 0], torch.tensor(expected))


def test_the_keypoint_grid_reads_batched_reach_images_in_its_own_coordinates():
    """The pixels of the named target's colour in the rendered image centre on the
    named target, in the grid's coordinates (x right, y up)."""
    env = BatchedReach(num_envs=8, seed=11)
    observations = env.reset()
    images = observations.images.astype(np.int64)
    grid = KeypointEncoder(SPEC, hidden_size=8).grid.numpy()
    for e, instruction in enumerate(observations.instructions):
        channel = COLOURS.index(instruction.split()[2])
        # only the named colour's disc is brighter in its channel than in the other two
        stands_out = 2 * images[e, ..., channel] - images[e].sum(axis=-1) > 0
        centre = grid[np.flatnonzero(stands_out)].mean(axis=0)
        assert np.abs(centre - env.goal_positions[e]).max() <= 2.0 / 32


def test_the_instruction_changes_where_the_keypoints_look():
    torch.manual_seed(0)
    encoder = KeypointEncoder(SPEC, hidden_size=8).double()
    pixels = torch.rand(1, 32, 32, 3, dtype=torch.float64) * 2 - 1
    one, other = torch.randn(2, 1, 8, dtype=torch.float64)
    assert encoder(pixels, one).shape == (1, 3, 8)
    assert not torch.allclose(encoder(pixels, one), encoder(pixels, other))
