"""A dock client that keeps the seconds its caller spent moving payloads.

Workers report these seconds with each stage, so the driver can say how much of an
iteration went to the dock rather than to compute (the paper's overhead budget).
"""

from __future__ import annotations

import time
from typing import Any

from mindrl.dock import DockClient


class TimedDockClient(DockClient):
    """:class:`~mindrl.dock.DockClient` whose ``put`` / ``fetch`` add to ``seconds``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = 0.0

    def put(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        try:
            super().put(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def fetch(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return super().fetch(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def take_seconds(self) -> float:
        """Seconds since the last call (and reset)."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds
