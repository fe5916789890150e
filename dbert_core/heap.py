"""Freed memory kept for the next array: what the `dbert` and `dbert-tui` processes ask of glibc's malloc.

A sampler's every network call makes arrays of tens to hundreds of MB (the logits of every masked
position over the vocabulary, their softmax) and frees them at once. glibc's malloc gives arrays
that large their own mmap and hands the pages back on free, so the next call's arrays start on
fresh pages, and the kernel zero-fills each page on first touch: on a 2-core AMD EPYC this was
7-9% of `dbert sample --n 10`'s sampling (4 runs each, same machine: 7.4-8.3 s against 6.9-7.6 s;
docs/performance.md). keep_freed_memory() asks malloc to take every array from its heap (no mmap)
and to keep what is freed there, so a call reuses the pages the previous one touched. The price:
the process's resident memory stays at its peak until it exits (the peak itself barely moves).

give_back_freed_memory() is the other way round, for a long run whose arrays change size from step
to step (a story batch's masked positions, the AR baseline's windows padded to each batch's longest):
glibc keeps the freed middles of its heap resident. On a 2-core AMD EPYC the AR baseline grew by
about 48 MB a step, without levelling, to 10-12 GB within a few hundred steps of each resume, and
`dbert train --unit story` (16 windows of 256) from 2.0 GB to 3.6 GB in 120 steps, more slowly as it
went. malloc_trim(0) hands every whole free page back to the kernel. HeapCeiling calls it once resident
memory has outgrown the loop's working set by half, so a days-long run stays within 1.5 times its
working set, for one trim every few dozen steps (the same trainer: 3.3-3.4 GB back to 2.1-2.3 GB).
The sampler needs none: 14 runs of 1-10 stories in one process levelled at 1.1 GB.

Only the entry points call keep_freed_memory (cli.main, the TUI's main): a program that imports
dbert_core keeps its own malloc settings (a trim only hands back what is free). Elsewhere than
Linux with glibc it does nothing. No torch import here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
KEEP = 2**31 - 1  # mallopt takes an int: bytes freed at the heap's top before any goes back (2 GiB)


@functools.lru_cache(maxsize=None)
def _glibc(name: str):
    """glibc's function `name`, looked up once (find_library runs ldconfig); None off Linux or
    where the C library has no such function (musl has no mallopt)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> bool:
    """Ask glibc's malloc for no mmapped arrays and no trimming; True if it agreed."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP))


def give_back_freed_memory() -> bool:
    """Hand every whole free page of glibc's heap back to the kernel (malloc_trim(0)); True if any went."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def resident_mb() -> float:
    """This process's resident memory in MB (Linux's /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class HeapCeiling:
    """after_step() at the end of each step of a long loop: once resident memory exceeds the working
    set (resident memory one step after the start or the last trim) by `growth` of it (at least
    slack_mb), the heap's free pages go back (give_back_freed_memory). Returns True when it trimmed."""

    def __init__(self, growth: float = 0.5, slack_mb: float = 512.0):
        self.growth, self.slack_mb = growth, slack_mb
        self.working: float | None = None
        self.trims = 0

    def after_step(self) -> bool:
        rss = resident_mb()
        if not rss:
            return False
        if self.working is None:
            self.working = rss
            return False
        if rss <= self.working + max(self.slack_mb, self.working * self.growth):
            return False
        self.working = None  # the next step faults its working set back in: measured then
        self.trims += 1
        return give_back_freed_memory()
