"""A newcomer's first ten minutes in dbert-tui, at 80x24, as one walk (issue 59): the app opens on
a checkpoint in the store, a typed prompt is generated and its frames fill in, a span is refilled
and branched, the Train screen trains a tiny model on a tiny corpus, and the result is listed on
the Checkpoints screen and used. Each stage is checked by what the screen shows."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from dbert_core.storage import store
from dbert_tui.app import create_app
from dbert_tui.render import MASK_GLYPH
from helpers import SIZE
from helpers import wait_for as _wait_for

pytestmark = pytest.mark.anyio  # 15 to 20 s on 2 busy cores: under the 20 s of a slow test

FIXTURE = Path(__file__).parent / "fixtures" / "tiny"  # a committed tiny model: no corpus needed
PROMPT = "the little dog"
CORPUS = [f"the {who} {did} the {what} in the {where} ." for who in ("dog", "cat", "girl", "boy", "bird")
          for did in ("saw", "liked", "found", "lost") for what in ("ball", "cake", "tree", "box")
          for where in ("park", "house", "garden")]


@pytest.fixture(autouse=True)
def _without_shipped_default(monkeypatch):
    """A newcomer's own store: the shipped model is not in it (the walk lists and picks what is)."""
    monkeypatch.setattr(store, "shipped", lambda name: None)


def screen(app) -> str:
    """What the terminal shows: every line of the screen on top (a dialog over its screen too)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def status(app) -> str:
    """The Generate screen's status line, as drawn (the second line of the screen)."""
    return screen(app).splitlines()[1]


def masked(app) -> tuple[int, int] | None:
    """The status line's `masked m/n` (None before a frame is drawn)."""
    m = re.search(r"masked (\d+)/(\d+)", status(app))
    return (int(m.group(1)), int(m.group(2))) if m else None


def text_box(app) -> str:
    """The lines inside the sample's box (between its top and bottom borders)."""
    lines = screen(app).splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    bottom = next(i for i, line in enumerate(lines) if line.startswith("╰") and i > top)
    return "\n".join(line.strip("│ ") for line in lines[top + 1:bottom])


def live_panel(app) -> str:
    """The Train screen's right-hand panel (stats, charts, preview), its wrapped lines joined."""
    rows = [line.split("││", 1)[1] for line in screen(app).splitlines() if "││" in line]
    return " ".join(" ".join(row.strip("│ ").split()) for row in rows)


async def wait_for(pilot, condition, timeout: float = 60.0, what: str = "condition"):
    """helpers.wait_for, with the screen said when it times out (what the newcomer was looking at)."""
    try:
        await _wait_for(pilot, condition, timeout, what)
    except AssertionError as e:
        raise AssertionError(f"{e}; the screen:\n{screen(pilot.app)}") from None


async def type_into(pilot, wid: str, text: str) -> None:
    """Focus a field as Tab would, clear it (Home, then ctrl+k) and type text key by key."""
    pilot.app.screen.query_one(f"#{wid}").focus()
    await pilot.press("home", "ctrl+k", *text)


async def test_a_newcomer_generates_edits_trains_and_uses_the_new_model(tmp_path):
    shutil.copytree(FIXTURE, store.store_dir() / "tiny")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n")
    app = create_app(checkpoint="tiny", deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        # 1. the app opens on the checkpoint and its first run fills in, paced so it can be watched
        await wait_for(pilot, lambda: "Generate · tiny" in screen(app) and "step" in status(app),
                       what="the first run")
        await wait_for(pilot, lambda: (m := masked(app)) is not None and 0 < m[0] < m[1], what="a frame half filled in")
        await pilot.press("space")
        assert "paused (Space: play)" in status(app)
        shown = text_box(app)
        assert MASK_GLYPH in shown and re.search(r"[a-z]{2,}", shown.replace(MASK_GLYPH, "")), shown

        # 2. a typed prompt: a new run that starts from it, frames arriving until no mask is left
        await pilot.press("p")
        await wait_for(pilot, lambda: "Prompt" in screen(app), what="the prompt dialog")
        await pilot.press(*PROMPT, "enter")
        seen: list[tuple[int, int]] = []

        def record() -> bool:
            if masked(app) is not None and ("playing" in status(app) or "done" in status(app)):
                seen.append(masked(app))
            return "done (Space: replay)" in status(app)

        await wait_for(pilot, record, what="the prompt's run")
        first = text_box(app)
        assert first.startswith(PROMPT) and MASK_GLYPH not in first, first
        counts = [m for m, _ in seen]
        assert len(set(counts)) >= 2 and counts == sorted(counts, reverse=True) and counts[-1] == 0, seen
        assert f"prompt '{PROMPT}'" in screen(app)

        # 3. a span remasked and refilled: the rest stays, the status says version 2/2
        await pilot.press("i")
        assert "inspect" in status(app)
        await pilot.press(*["right"] * 4, "shift+right", "shift+right", "backspace")
        assert "3 masked" in status(app) and text_box(app).count(MASK_GLYPH) == 3
        await pilot.press("f")
        await wait_for(pilot, lambda: "done" in status(app), what="the refill")
        refilled = text_box(app)
        assert "version 2/2" in status(app) and MASK_GLYPH not in refilled
        assert refilled.startswith(PROMPT), refilled

        # 4. a branch: several refills of one span side by side, Enter keeps the selected one
        await pilot.press("i", *["right"] * 4, "shift+right", "backspace", "b")
        await wait_for(pilot, lambda: "samples" in status(app) and "done" in status(app), what="the branch")
        assert screen(app).count("╭") >= 2  # the grid's cards
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: "version 3/3" in status(app), what="the chosen branch")
        assert MASK_GLYPH not in text_box(app)

        # 5. the Train screen: a few steps of the tiny preset on a tiny corpus, saved in the store
        await pilot.press("3")
        await wait_for(pilot, lambda: "dbert — Train" in screen(app), what="the Train screen")
        assert "not training" in screen(app)
        await type_into(pilot, "tr-data", str(corpus))
        for wid, value in {"tr-out": "my-first", "tr-steps": "4", "tr-batch": "8", "tr-seq": "12", "tr-T": "64",
                           "tr-warmup": "1", "tr-eval": "2", "tr-sample": "2"}.items():
            await type_into(pilot, wid, value)
        await pilot.press("f5")
        await wait_for(pilot, lambda: "in the store" in live_panel(app) or "failed" in live_panel(app),
                       timeout=120, what="the training run")
        trained = live_panel(app)
        assert "finished at step 4; saved as my-first in the store" in trained, trained
        assert "validation ELBO · step 4: ppl ≤" in trained and "[step 2]" in trained, trained

        # 6. the new checkpoint is listed beside the first; choosing it runs it on Generate
        await pilot.press("escape", "2")
        await wait_for(pilot, lambda: "dbert — Checkpoints" in screen(app), what="the Checkpoints screen")
        listed = screen(app)
        assert re.search(r"^ *● tiny ", listed, re.M) and re.search(r"^ *my-first ", listed, re.M), listed
        assert "2 checkpoint(s)" in listed
        rows = [line.replace("●", "").split()[0] for line in listed.splitlines()
                if re.match(r"^ *(● )?(tiny|my-first) ", line)]
        moves = rows.index("my-first") - rows.index("tiny")  # the cursor starts on the one in use
        await pilot.press(*(["down"] * moves if moves > 0 else ["up"] * -moves))
        await wait_for(pilot, lambda: "my-first · " in screen(app), what="the details of my-first")
        assert "4 steps" in screen(app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: "Generate · my-first" in screen(app) and "done" in status(app),
                       timeout=60, what="a run of the new model")
        assert MASK_GLYPH not in text_box(app)
        await pilot.press("2")
        await wait_for(pilot, lambda: re.search(r"^ *● my-first ", screen(app), re.M), what="my-first in use")
