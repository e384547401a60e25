"""The sizes of an embodied run's episodes: environments per vector, actions per chunk,
actions per episode. Checked with the rest of the config (mindrl/config/validate.py) and
again when a vector environment is built outside a run (mindrl/envs/embodied.py)."""

from __future__ import annotations


def episode_shape_problems(num_envs: int, chunk_size: int, horizon: int) -> list[str]:
    """One line per size that is not a positive integer, and one when the chunks do not
    tile an episode."""
    sizes = {"num_envs": num_envs, "chunk_size": chunk_size, "horizon": horizon}
    problems = [
        f"env.{name} must be an integer >= 1, got {value!r}"
        for name, value in sizes.items()
        if isinstance(value, bool) or not isinstance(value, int) or value < 1
    ]
    if not problems and horizon % chunk_size:
        problems.append(
            f"env.chunk_size={chunk_size} does not divide env.horizon={horizon}: an episode "
            "is a whole number of chunks; pick a chunk_size that divides the horizon"
        )
    return problems
