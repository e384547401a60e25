"""How many samples a rank hands its generation engine per call.

Its own module (plain arithmetic) because two sides read it: the generation loop
(``mindrl/workers/generation.py``) and the planner, which sizes the engine's batch.
"""

from __future__ import annotations

#: About this many samples per engine call, so the dock (and the progress bar) see results
#: early; rounded to whole groups, so the engine prefills each group's prompt once.
GENERATION_CHUNK = 64


def chunk_samples(group_size: int) -> int:
    """Samples per engine call: :data:`GENERATION_CHUNK` rounded down to whole groups
    (at least one group)."""
    return max(1, GENERATION_CHUNK // group_size) * group_size
