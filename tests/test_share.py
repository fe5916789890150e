"""Sharing a run: the asciinema cast (asciinema itself reads it) and the HTML page, and the
stable layout both use (stable.py): every frame has the final text's line breaks."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dbert_core.sampling.sample import frames
from dbert_core.sampling.share import cast, frame_lines, html
from dbert_core.sampling.trajectory import reveal_order


@pytest.fixture(scope="module")
def run(tiny_db):
    fs = list(frames(tiny_db, n=2, length=20, steps=12, sampler="ancestral", seed=1,
                     generator=torch.Generator().manual_seed(1)))
    return fs, reveal_order(fs)


def test_cast_is_asciinema_v2_and_asciinema_reads_it(tiny_db, run, tmp_path):
    fs, order = run
    text = cast(tiny_db, fs, order, width=60, title="tiny")
    lines = text.splitlines()
    header = json.loads(lines[0])
    assert header["version"] == 2 and header["width"] == 60 and header["height"] >= 24
    events = [json.loads(x) for x in lines[1:]]
    assert len(events) == len(fs) + 1 and all(e[1] == "o" and isinstance(e[2], str) for e in events)
    times = [e[0] for e in events]
    assert times == sorted(times) and times[0] == 0
    assert "\x1b[38;2;" in events[-2][2]  # 24-bit colours
    path = tmp_path / "run.cast"
    path.write_text(text)
    exe = shutil.which("asciinema") or str(Path(sys.executable).with_name("asciinema"))
    out = subprocess.run([exe, "cat", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import re

    shown = re.sub(r"\x1b\[[0-9;]*[mJH]", "", out.stdout)
    assert "step 1/12" in shown and "step 12/12" in shown
    final = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in frame_lines(tiny_db, fs[-1], order, 0, fs[-1], 60)]
    assert all(line in shown for line in final)


def test_every_frame_has_the_final_line_breaks(tiny_db, run):
    import re

    fs, order = run
    plain = [[re.sub(r"\x1b\[[0-9;]*m", "", line) for line in frame_lines(tiny_db, f, order, 0, fs[-1], 30)]
             for f in fs]
    widths = [[len(line) for line in lines] for lines in plain]
    assert all(w == widths[-1] for w in widths)  # the same lines, the same widths, from the first frame
    assert "░" in plain[0][0] and "░" not in "".join(plain[-1])


def test_html_colours_each_word_by_its_reveal_step(tiny_db, run):
    fs, order = run
    page = html(tiny_db, fs, order, title="a <b>")
    assert page.startswith("<!doctype html>") and "a &lt;b&gt;" in page
    assert page.count("<p>") == 2 and 'title="step ' in page and "color:#" in page
