"""Host memory of this process: resident size now and at peak, and freed heap handed back.

Why a trim is needed: glibc's malloc keeps what a process frees in its arenas and gives
memory back to the kernel only from the top of a heap (and chunks above its dynamic mmap
threshold, which climbs to 32 MiB after the first large frees). A model worker frees and
re-allocates gigabytes every iteration from several threads (activations, the swap of
the training state, generation buffers and KV cache), so freed chunks stranded below
live ones pile up as resident memory nobody uses: the SmolLM2-135M recipe's actor grew
~0.5 GiB per iteration until the node's out-of-memory killer ended the run, while no
tensor leaked (forcing every allocation over 64 KiB to mmap kept it flat, 25 % slower).
``malloc_trim(0)`` once per stage returns every free page (madvise) and leaves the
allocation path alone, so it costs no speed between trims.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from pathlib import Path

import psutil

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None on a C library without it (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Give the pages of every free heap chunk back to the kernel; False when unsupported."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def resident_bytes() -> int:
    """This process's resident set size now."""
    return psutil.Process().memory_info().rss


def peak_resident_bytes() -> int:
    """The most this process has held resident since start or the last reset (VmHWM)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resident_bytes()


def reset_peak_resident() -> None:
    """Start a new peak window: the kernel sets VmHWM to the current RSS (Linux only)."""
    # Without /proc (not Linux) the peak spans the whole process.
    with contextlib.suppress(OSError):
        _CLEAR_REFS.write_text("5")
