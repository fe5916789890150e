"""dbert_core/heap.py: the entry points ask glibc's malloc to keep freed memory (no mmapped arrays,
no trimming), so the sampler's arrays reuse pages; a program that imports dbert_core keeps its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = r"""
import ctypes, ctypes.util, sys
from dbert_core.heap import keep_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
if sys.argv[1] == "keep":
    assert keep_freed_memory() is True
before = libc.mallinfo2().hblks
big = ctypes.create_string_buffer(64 * 2**20)  # 64 MiB: glibc's default gives it its own mmap
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_big_array_comes_from_the_heap_once_asked():
    def mmapped(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", CHECK, mode], capture_output=True, text=True, check=True)
        return int(out.stdout)

    assert mmapped("system") == 1  # the default: an mmap of its own, handed back on free
    assert mmapped("keep") == 0


def test_only_the_commands_themselves_change_it(capsys, monkeypatch):
    """`dbert` run as a program asks; main() called inside another program (here pytest) does not."""
    import dbert_core.cli as cli
    from helpers import run

    asked = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: asked.append(1))
    code, out, _ = run(["--version"], capsys, monkeypatch)
    assert code == 0 and out.startswith("dbert ") and asked == []
    script = ("import sys, runpy, dbert_core.heap as heap; "
              "heap.keep_freed_memory = lambda: print('asked', file=sys.stderr) or True; "
              "sys.argv = ['dbert', '--version']; runpy.run_module('dbert_core.cli', run_name='__main__', alter_sys=True)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("dbert ") and "asked" in done.stderr


TRIM = r"""
import ctypes, sys
from dbert_core.heap import give_back_freed_memory, keep_freed_memory, resident_mb
keep_freed_memory()  # every array from the heap, nothing trimmed at its top: freed pages stay resident
big = ctypes.create_string_buffer(256 * 2**20)  # 256 MiB, zero-filled: every page touched
pin = ctypes.create_string_buffer(64)  # above it, so the freed block is inside the heap, not at its top
del big
held = resident_mb()
gave = give_back_freed_memory()
print(held, resident_mb(), gave)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc")
def test_freed_heap_pages_go_back_when_asked():
    """The AR baseline's long run trims its heap every few steps: freed pages held in the middle of
    glibc's heap stay resident until malloc_trim hands them back."""
    out = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, check=True).stdout.split()
    held, after, gave = float(out[0]), float(out[1]), out[2]
    assert gave == "True"
    assert held - after > 200  # MB: the 256 MiB block's pages went back
    assert after > 0


def test_the_ceiling_trims_once_memory_outgrows_the_working_set(monkeypatch):
    """Resident memory one step after the start (or a trim) is the working set; past it by half (at
    least slack_mb) the heap is trimmed, and the step after measures the working set afresh."""
    import dbert_core.heap as heap

    rss = iter([2000, 2400, 2900, 3001, 2100, 2500, 3100, 3200])
    trims = []
    monkeypatch.setattr(heap, "resident_mb", lambda: next(rss))
    monkeypatch.setattr(heap, "give_back_freed_memory", lambda: trims.append(1) or True)
    ceiling = heap.HeapCeiling(growth=0.5, slack_mb=512)
    did = [ceiling.after_step() for _ in range(8)]
    # working set 2000: trims above 3000; then 2100: above 3150
    assert did == [False, False, False, True, False, False, False, True]
    assert ceiling.trims == len(trims) == 2


def test_small_working_sets_get_the_slack(monkeypatch):
    import dbert_core.heap as heap

    rss = iter([100, 500, 611, 613])
    monkeypatch.setattr(heap, "resident_mb", lambda: next(rss))
    monkeypatch.setattr(heap, "give_back_freed_memory", lambda: True)
    ceiling = heap.HeapCeiling(growth=0.5, slack_mb=512)
    assert [ceiling.after_step() for _ in range(4)] == [False, False, False, True]


def test_no_proc_no_trim(monkeypatch):
    import dbert_core.heap as heap

    monkeypatch.setattr(heap, "resident_mb", lambda: 0.0)
    monkeypatch.setattr(heap, "give_back_freed_memory", lambda: pytest.fail("trimmed blind"))
    ceiling = heap.HeapCeiling()
    assert not any(ceiling.after_step() for _ in range(5))
