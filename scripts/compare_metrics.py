"""Compare two runs' ``metrics.jsonl`` in every field that does not measure wall-clock.

A refactoring that claims to change no behaviour must leave every run's losses, rewards,
lengths, gradient norms and counts exactly as they were; the timings (and what is derived
from them: tokens per second, the overhead shares, measured memory) change from one run to
the next anyway, so they are left out. Values compare exactly (a float's JSON text is its
bits): on the CPU a seeded run repeats itself bit for bit.

    .venv/bin/python scripts/compare_metrics.py BEFORE AFTER

BEFORE and AFTER are two run folders (each holding ``metrics.jsonl``), or two folders of
run folders compared by name. One line per run: ``identical`` or where it first differs.
Exit status 0 when every run is identical, 1 when one differs or is missing.
``--allow-new PREFIX`` (repeatable) lets AFTER's records hold keys BEFORE's lack when they
start with PREFIX (a change that adds figures, e.g. ``reward/``, and alters none).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
# The one rule of what a record measures (mindrl/metrics/measured.py).
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mindrl.metrics.measured import is_measured as is_timing  # noqa: E402


def flat_fields(record: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """A record's non-timing fields as (dotted path, value), nested sections walked."""
    for key, value in record.items():
        if is_timing(key):
            continue
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flat_fields(value, f"{path}.")
        else:
            yield path, value


def read_records(run: Path) -> list[dict[str, Any]]:
    with (run / METRICS_FILE).open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def compare_runs(before: Path, after: Path, allow_new: tuple[str, ...] = ()) -> tuple[bool, str]:
    """(identical, verdict) for two run folders; keys only AFTER has that start with one
    of ``allow_new`` are left out."""
    for run in (before, after):
        if not (run / METRICS_FILE).is_file():
            return False, f"no {METRICS_FILE} in {run}"
    old, new = read_records(before), read_records(after)
    if len(old) != len(new):
        return False, f"{len(old)} records before, {len(new)} after"
    compared: set[str] = set()
    for number, (a, b) in enumerate(zip(old, new, strict=True)):
        fields_a, fields_b = dict(flat_fields(a)), dict(flat_fields(b))
        added = [k for k in fields_b.keys() - fields_a.keys() if k.startswith(allow_new)]
        for key in added:
            del fields_b[key]
        if fields_a.keys() != fields_b.keys():
            only = sorted(fields_a.keys() ^ fields_b.keys())
            return False, f"record {number}: fields in one run only: {', '.join(only)}"
        for path, value in fields_a.items():
            if value != fields_b[path]:
                return False, (
                    f"record {number} (iteration {a.get('iteration')}): {path} "
                    f"{value!r} before, {fields_b[path]!r} after"
                )
        compared |= fields_a.keys()
    return True, f"identical ({len(old)} records, {len(compared)} non-timing fields)"


def run_pairs(before: Path, after: Path) -> list[tuple[str, Path, Path]]:
    """(name, before run, after run): the two folders themselves when they are runs, else
    every run folder under ``before`` with its namesake under ``after``."""
    if (before / METRICS_FILE).is_file():
        return [(after.name, before, after)]
    names = sorted(p.parent.name for p in before.glob(f"*/{METRICS_FILE}"))
    return [(name, before / name, after / name) for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="run folder, or folder of run folders")
    parser.add_argument("after", type=Path, help="the same, from the changed code")
    parser.add_argument(
        "--allow-new",
        action="append",
        default=[],
        metavar="PREFIX",
        help="keys only AFTER has that start with PREFIX are not a difference",
    )
    args = parser.parse_args(argv)
    pairs = run_pairs(args.before, args.after)
    if not pairs:
        print(f"compare_metrics: no {METRICS_FILE} under {args.before}", file=sys.stderr)
        return 1
    all_same = True
    for name, before, after in pairs:
        same, verdict = compare_runs(before, after, tuple(args.allow_new))
        all_same &= same
        print(f"{name}: {verdict}")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
