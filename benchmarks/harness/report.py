"""What every benchmark report names first, the machine it was measured on, and how it
ends: printed, and written as JSON where asked."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def finish_report(
    report: dict[str, Any], print_report: Callable[[dict[str, Any]], None], path: Path | None
) -> int:
    """Print ``report`` with the benchmark's ``print_report`` and, where ``path`` is given
    (``--json``), write it there; the exit status 0."""
    print_report(report)
    if path:
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"  report written to {path}")
    return 0
