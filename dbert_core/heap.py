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
to step (the AR baseline's story windows are padded to each batch's longest): glibc keeps the freed
middle of its heap resident, and that run grew by about 48 MB a step until it had to be restarted;
malloc_trim(0) hands every whole free page back to the kernel.

Only the entry points call it (cli.main, the TUI's main): a program that imports dbert_core keeps
its own malloc settings. Elsewhere than Linux with glibc it does nothing. No torch import here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
KEEP = 2**31 - 1  # mallopt takes an int: bytes freed at the heap's top before any goes back (2 GiB)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc for no mmapped arrays and no trimming; True if it agreed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP))


def give_back_freed_memory() -> bool:
    """Hand every whole free page of glibc's heap back to the kernel (malloc_trim(0)); True if any went."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
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
