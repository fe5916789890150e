"""A real-terminal check: dbert-tui in tmux at 80x24 fills in text with the control bar on screen,
a key on it restarts the run, an edit-and-refill round (inspect, select, remask, refill) makes a
second version, and ctrl+q exits with 0.

Needs tmux (CI: `apt-get install -y tmux`); skipped where it is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

TMUX = shutil.which("tmux")
BIN = Path(sys.executable).parent / "dbert-tui"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(TMUX is None, reason="tmux is not installed")]


def tmux(*args, check=True) -> str:
    r = subprocess.run([TMUX, "-L", "dbert-test", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise AssertionError(f"tmux {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def capture() -> str:
    return tmux("capture-pane", "-p", "-t", "dbert")


def test_dbert_tui_in_tmux(tiny_checkpoint, tmp_path):
    exit_file = tmp_path / "exit_status"
    env = {k: os.environ[k] for k in ("DBERT_HOME", "HF_HOME", "HF_HUB_OFFLINE", "PATH", "HOME") if k in os.environ}
    env.update(TERM="xterm-256color", TOKENIZERS_PARALLELISM="false")
    exports = " ".join(f"{k}={v!r}" for k, v in env.items())
    command = (f"env {exports} {BIN if BIN.exists() else sys.executable + ' -m dbert_tui.app'} "
               f"--checkpoint {tiny_checkpoint} --steps 48 --length 40 --pace-ms 80; "
               f"echo $? > {exit_file}; sleep 30")
    tmux("kill-server", check=False)
    tmux("new-session", "-d", "-s", "dbert", "-x", "80", "-y", "24", command)
    try:
        frames, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline:
            screen = capture()
            frames.append(screen)
            if "done" in screen and "step 48/48" in screen:
                break
            time.sleep(0.25)
        final = frames[-1]
        assert "step 48/48" in final and "done" in final, final
        assert "Generate" in final and "spindle" in final  # header and schedule strip
        mid = [f for f in frames if "playing" in f and "step " in f and "step 48/48" not in f]
        assert mid, "no frame of the run in progress was seen"

        def token_box(screen):  # the text box's rows: the text being generated
            return [ln[1:-1].strip() for ln in (r.rstrip() for r in screen.splitlines()[3:20])
                    if ln.startswith("│") and ln.endswith("│")]

        def control_bar(screen):  # the line above the footer
            return screen.rstrip("\n").splitlines()[-2]

        assert sum(len(row) for row in token_box(final)) > 40, final  # generated text fills in
        assert "░░░" not in "".join(token_box(final)), final  # and no mask is left
        assert any("░░░" in "".join(token_box(f)) for f in mid)  # masks were visible while running
        # the control bar is on screen the whole time, with steps, temperature and their keys
        # A toast ("loading …", 2 s) may cover the bar's right end: on a busy machine the whole 48-step run
        # can pass under it, so a covered frame is checked up to the toast's edge and the final one in full.
        items = ("[ ] steps 48", "- + temp 1", "k top-k 30", "o top-p off", "m first-hitting")
        for screen in mid:
            visible = control_bar(screen).split("▌")[0]
            assert all(item in visible for item in items[:2]), screen
        for item in items:
            assert item in control_bar(final), final
        tmux("send-keys", "-t", "dbert", "]")  # double the steps: a new run at once, shown on the bar
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ("step 96/96" in capture() and "done" in capture()):
            time.sleep(0.25)
        screen = capture()
        assert "step 96/96" in screen and "[ ] steps 96" in control_bar(screen), screen
        # an edit-and-refill round: inspect, select three tokens, remask them, refill
        before = "".join(token_box(screen))
        tmux("send-keys", "-t", "dbert", "i")
        time.sleep(0.5)
        tmux("send-keys", "-t", "dbert", "Right", "S-Right", "S-Right", "BSpace")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "3 masked" not in capture():
            time.sleep(0.25)
        edited = capture()
        assert "3 masked" in edited and "░░░" in "".join(token_box(edited)), edited
        tmux("send-keys", "-t", "dbert", "f")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ("version 2/2" in capture() and "done" in capture()):
            time.sleep(0.25)
        refilled = capture()
        assert "version 2/2" in refilled and "░░░" not in "".join(token_box(refilled)), refilled
        assert sum(len(row) for row in token_box(refilled)) > 40 and before, refilled
        tmux("send-keys", "-t", "dbert", "C-q")
        deadline = time.monotonic() + 30
        while not exit_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert exit_file.exists(), "dbert-tui did not exit after ctrl+q"
        assert exit_file.read_text().strip() == "0"
    finally:
        tmux("kill-server", check=False)
