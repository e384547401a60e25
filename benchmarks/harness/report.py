"""What every benchmark report names first: the machine it was measured on."""

from __future__ import annotations

import os
import platform


def machine(*extra: str) -> str:
    """This machine as a report's first line: architecture, cores, the load average when
    the measurement started (a loaded box skews every figure), Python; then ``extra``."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    parts = [
        f"{platform.machine()} CPU, {os.cpu_count()} cores, load average {load:.1f} at start",
        f"Python {platform.python_version()}",
        *extra,
    ]
    return ", ".join(parts)
