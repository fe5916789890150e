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
