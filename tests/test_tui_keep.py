"""Keeping a story from dbert-tui: `C` copies the selected sample to the clipboard, `s` in one
sample's view saves that sample alone, a saved .txt opens with a header line of the seed and the
settings, and `dbert-tui --prompt` starts with that prompt."""

from __future__ import annotations

import json

import pytest

from dbert_tui.files import HEADER, texts_of
from dbert_tui.screens.dialogs import FormDialog
from helpers import SIZE, fill_dialog, finished, make_app, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _without_shipped_default(monkeypatch):
    from dbert_core.storage import store

    monkeypatch.setattr(store, "shipped", lambda name: None)


def header_of(line: str) -> dict:
    assert line.startswith(HEADER), line
    return json.loads(line[len(HEADER):])


async def test_copy_puts_the_selected_sample_on_the_clipboard(tiny_db):
    app = make_app(tiny_db, n=3)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        texts = texts_of(tiny_db, g.run.frames[-1])
        assert len(set(texts)) == 3
        await pilot.press("down")  # the grid's second card
        await pilot.press("C")
        await pilot.pause()
        assert app.clipboard == texts[1]
        assert any("copied sample 2 of 3" in n.message for n in app._notifications)
        await pilot.press("enter", "down", "C")  # large, then the third: the one shown
        await pilot.pause()
        assert app.clipboard == texts[2]
    assert "C" in {b.key for b in g.BINDINGS}  # the key catalogue, which the key help lists


async def test_save_in_one_samples_view_writes_that_sample_with_its_settings(tiny_db, tmp_path):
    app = make_app(tiny_db, n=3, seed=5, temperature=0.8)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        texts = texts_of(tiny_db, g.run.frames[-1])
        await pilot.press("s")  # the grid: every sample
        await wait_for(pilot, lambda: isinstance(app.screen, FormDialog))
        await fill_dialog(pilot, {"path": str(tmp_path / "all.txt")})
        lines = (tmp_path / "all.txt").read_text().splitlines()
        head = header_of(lines[0])
        assert lines[1:] == texts
        assert (head["seed"], head["steps"], head["temperature"], head["top_k"], head["sampler"], head["samples"],
                head["of"], head["length"]) == (5, 16, 0.8, 0, "ancestral", [1, 2, 3], 3, 20)
        assert head["checkpoint"] == tiny_db.path.name
        await pilot.press("down", "enter")  # sample 2 large
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, FormDialog))
        dialog = app.screen
        assert "Save sample 2 of 3" in str(dialog.query_one(".dialog-title").render())
        assert dialog.query_one("#field-path").value.endswith("-seed5-sample2.txt")
        await fill_dialog(pilot, {"path": str(tmp_path / "one.txt")})
        lines = (tmp_path / "one.txt").read_text().splitlines()
        assert lines[1:] == [texts[1]] and header_of(lines[0])["samples"] == [2]
        assert any("saved sample 2 of 3" in n.message for n in app._notifications)


def test_the_prompt_option_starts_the_app_with_that_prompt(monkeypatch):
    import dbert_tui.app as tui

    seen = {}

    def fake_run(checkpoint=None, settings=None, replay=None):
        seen["settings"] = settings
        return 0

    monkeypatch.setattr(tui, "run", fake_run)
    with pytest.raises(SystemExit) as exit_:
        tui.main(["--prompt", "Tom had a red kite.", "--seed", "3"])
    assert exit_.value.code == 0
    assert seen["settings"].prompt == "Tom had a red kite." and seen["settings"].seed == 3


async def test_a_prompt_given_at_the_start_is_the_first_runs(tiny_db):
    app = make_app(tiny_db, prompt="the cat [MASK] on the mat")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        words = g.shown_text().split()
        assert words[:2] == ["the", "cat"] and words[3:6] == ["on", "the", "mat"], words
        assert "prompt 'the cat [MASK] on the mat'" in str(g.query_one("#gen-legend").render())
