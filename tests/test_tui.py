"""dbert-tui with Pilot: Generate, Checkpoints and Train screens driven like a user would, plus
SVG snapshots of each screen from the seeded tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual import events

from dbert_core.storage import store
from dbert_core.errors import DbertError
from dbert_tui.app import create_app
from dbert_tui.messages import FrameReady
from dbert_tui.controller import Settings
from dbert_tui.render import MASK_GLYPH, render_row
from dbert_tui.widgets.controls import ControlBar
from dbert_tui.widgets.generate.compare import ComparePane, CompareView
from dbert_tui.widgets.generate.grid import SampleGrid
from dbert_tui.screens.dialogs import FormDialog
from helpers import SIZE, TINYSTORIES, HubServer, all_finished, fill_dialog, finished, make_app, online, tar_bytes, wait_for


@pytest.fixture(autouse=True)
def _without_shipped_default(monkeypatch):
    """These tests count and draw the store's entries: keep the shipped default out of them."""
    from dbert_core.storage import store as _store

    monkeypatch.setattr(_store, "shipped", lambda name: None)

pytestmark = pytest.mark.anyio  # async tests run on asyncio through anyio's pytest plugin


# ------------------------------------------------------------------------------ Generate
async def test_frames_arrive_and_final_text_has_no_masks(tiny_db):
    seen = []
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE, message_hook=lambda m: seen.append(m) if isinstance(m, FrameReady) else None) as pilot:
        await wait_for(pilot, finished(app), what="the run to finish")
        await pilot.pause()
        g = app.generate_screen
        assert len(g.run.frames) == 16 and g.run.frames[-1].frame.done
        assert g.run.id == 1, "one checkpoint load starts exactly one run"
        # every frame comes in its own message, in order, and is recorded on the UI thread;
        # a burst of them is drawn once
        assert [m.index for m in seen] == list(range(16))
        assert [m.rec for m in seen] == g.run.frames
        assert 1 <= g.frames_drawn <= 16 and g.drawn is g.run.frames[-1]
        assert not g.run.frames[-1].frame.masked.any()
        text = g.shown_text()
        assert text and MASK_GLYPH not in text
        status = str(g.query_one("#gen-status").render())
        assert "step 16/16" in status and "masked 0/20" in status and "done" in status
        masked_counts = [int(r.frame.masked.sum()) for r in g.run.frames]
        assert masked_counts == sorted(masked_counts, reverse=True)  # carry-over: masks only go away
        # the last checkpoint used is remembered, atomically, in the store's home
        state = json.loads((store.home() / "tui.json").read_text())
        assert Path(state["checkpoint"]) == Path(tiny_db.path).resolve()


async def test_the_apps_checkpoint_is_the_one_route_to_the_generate_screen(tiny_db, tiny_linear_checkpoint):
    """Loading a checkpoint sets App.db once; the Generate screen runs what it becomes (one run
    per change) and nothing else starts a run: switching screens back and forth does not."""
    from dbert_core.storage import checkpoint

    other = checkpoint.load(tiny_linear_checkpoint)
    dbs = {Path(tiny_db.path).resolve(): tiny_db, Path(other.path).resolve(): other}
    settings = Settings(steps=16, length=20, pace_ms=0, seed=0, sampler="ancestral", top_k=0)
    app = create_app(checkpoint=tiny_db.path, loader=lambda path: dbs[Path(path).resolve()], settings=settings,
                     deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        assert app.db is tiny_db and g.db is tiny_db and g.run.id == 1
        app.use_checkpoint(other.path)
        await wait_for(pilot, lambda: g.db is other and finished(app)(), what="the second checkpoint's run")
        assert app.db is other and g.run.id == 2
        await pilot.press("2")
        await wait_for(pilot, lambda: app.current_mode == "checkpoints")
        await pilot.press("1")
        await wait_for(pilot, lambda: app.current_mode == "generate")
        await pilot.pause(0.2)
        assert g.run.id == 2, "coming back to the screen is not a new checkpoint"
        app.db = tiny_db  # the reactive itself: the screen follows
        await wait_for(pilot, lambda: g.db is tiny_db and finished(app)(), what="the run of the reassigned checkpoint")
        assert g.run.id == 3


async def test_changing_steps_or_temperature_restarts(tiny_db):
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        first = g.run
        await pilot.press("right_square_bracket")  # double the steps
        await wait_for(pilot, finished(app))
        assert g.run is not first and g.run.settings.steps == 32 and len(g.run.frames) == 32
        second = g.run
        await pilot.press("equals_sign")  # temperature up
        await wait_for(pilot, finished(app))
        assert g.run is not second and g.run.settings.temperature > 1.0 and g.run.settings.steps == 32
        await pilot.press("left_square_bracket", "left_square_bracket", "left_square_bracket")
        await wait_for(pilot, lambda: g.run.settings.steps == 4 and g.run.finished)
        assert len(g.run.frames) == 4
        # the settings dialog applies several controls with one restart
        third = g.run
        await pilot.press("e")
        await fill_dialog(pilot, {"steps": "8", "length": "12", "top_k": "5", "seed": "7"})
        await wait_for(pilot, finished(app))
        assert g.run is not third and g.run.id == third.id + 1
        s = g.run.settings
        assert (s.steps, s.length, s.top_k, s.seed) == (8, 12, 5, 7)
        assert g.run.frames[-1].frame.ids.shape == (1, 12)
        # a bad value keeps the dialog open with every edit in place and marks its field; the run goes on
        await pilot.press("e")
        await fill_dialog(pilot, {"steps": "100000", "top_k": "30"})
        dialog = app.screen
        assert isinstance(dialog, FormDialog) and dialog.error[0] == "steps" and "steps" in dialog.error[1]
        assert dialog.query_one("#row-steps").has_class("-bad") and app.focused is dialog.query_one("#field-steps")
        assert dialog.query_one("#field-top_k").value == "30" and g.run.settings.steps == 8
        dialog.query_one("#field-steps").value = "8"
        dialog.query_one("#field-n").value = ""  # the review's case: an empty "samples"
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is dialog and dialog.error == ("n", "samples must be a whole number, got ''")
        assert dialog.query_one("#row-n").has_class("-bad") and not dialog.query_one("#row-steps").has_class("-bad")
        assert dialog.query_one("#field-top_k").value == "30"
        dialog.query_one("#field-n").value = "1"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is not dialog and g.run.settings.top_k == 30 and finished(app)())
        assert g.run.settings.steps == 8


async def test_the_settings_and_prompt_dialogs_post_what_was_chosen_to_the_app(tiny_db):
    """The dialogs change no Session themselves: applied, each posts what was chosen (SettingsChosen,
    PromptChosen) to the App, which owns the Session, sets it and has the Generate screen restart;
    a cancelled dialog posts nothing, and a value the checkpoint refuses when the App applies it
    is a notification that changes nothing."""
    from dbert_tui.forms import settings_form
    from dbert_tui.messages import PromptChosen, SettingsChosen

    seen: list = []
    app = make_app(tiny_db)
    hook = lambda m: seen.append(m) if isinstance(m, (SettingsChosen, PromptChosen)) else None  # noqa: E731
    async with app.run_test(size=SIZE, message_hook=hook) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        first = g.run
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, FormDialog))
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is g)
        assert seen == [] and g.run is first
        await pilot.press("e")
        await fill_dialog(pilot, {"steps": "8", "seed": "3"})
        await wait_for(pilot, lambda: g.run is not first and finished(app)())
        assert [type(m) for m in seen] == [SettingsChosen] and (seen[0].values["steps"], seen[0].values["seed"]) == ("8", "3")
        assert (app.session.settings.steps, app.session.settings.seed) == (8, 3) == (g.run.settings.steps, g.run.settings.seed)
        await pilot.press("p")
        await fill_dialog(pilot, {"prompt": "the cat [MASK] on the mat"})
        await wait_for(pilot, lambda: g.run.settings.prompt and finished(app)())
        assert [type(m) for m in seen] == [SettingsChosen, PromptChosen] and seen[1].prompt == "the cat [MASK] on the mat"
        assert g.shown_text().split()[:2] == ["the", "cat"]
        second = g.run
        _, fields = settings_form(app.session.active, None)
        values = {key: value for key, _, value, _ in fields}
        app.post_message(SettingsChosen({**values, "steps": "100000"}))  # as if the checkpoint had changed since
        await wait_for(pilot, lambda: any("steps" in n.message for n in app._notifications), what="the refusal")
        assert app.session.settings.steps == 8 and g.run is second
        app.post_message(PromptChosen(""))  # the App applies a prompt as the dialog would: unconditional again
        await wait_for(pilot, lambda: g.run is not second and finished(app)())
        assert app.session.settings.prompt == "" == g.run.settings.prompt


def final_ids(app):
    return [pb.frames[-1].frame.ids.clone() for pb in app.generate_screen.playbacks]


async def test_control_bar_shows_the_settings_and_its_keys_restart_with_the_same_seed(tiny_db):
    app = make_app(tiny_db, seed=5)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        bar = g.query_one(ControlBar)
        footer = app.screen.query_one("KeyBar")
        # always on screen at 80x24: full width, just above the key bar
        assert bar.region.width == SIZE[0] and bar.region.bottom == footer.region.y <= SIZE[1] - 1
        for shown in ("[ ] steps 16", "- + temp 1", "k top-k off", "o top-p off", "m ancestral", "n seed 5"):
            assert shown in bar.plain()
        first, first_ids = g.run, final_ids(app)
        await pilot.press("right_square_bracket")  # ] doubles the steps: a new run at once, same seed
        await wait_for(pilot, finished(app))
        assert g.run.id == first.id + 1 and (g.run.settings.steps, g.run.settings.seed) == (32, 5)
        assert len(g.run.frames) == 32 and "steps 32" in bar.plain()
        await pilot.press("equals_sign")  # + raises the temperature
        await wait_for(pilot, lambda: g.run.settings.temperature == 1.1 and finished(app)())
        assert g.run.settings.seed == 5 and "temp 1.1" in bar.plain()
        await pilot.press("k", "o", "m")  # top-k, top-p and sampler: the next value of each
        await wait_for(pilot, lambda: g.run.settings.sampler == "cached" and finished(app)())
        s = g.run.settings
        assert (s.top_k, s.top_p, s.seed) == (5, 0.95, 5)
        for shown in ("k top-k 5", "o top-p 0.95", "m cached"):
            assert shown in bar.plain()
        # back to the first settings: the same seed gives the same text again
        await pilot.press("left_square_bracket", "minus")
        g.session.settings = dataclasses.replace(g.session.settings, top_k=0, top_p=1.0, sampler="ancestral")
        g.restart()
        await wait_for(pilot, finished(app))
        assert g.run.settings == first.settings
        assert all((a == b).all() for a, b in zip(final_ids(app), first_ids))


async def test_the_control_bar_shows_the_values_in_force_as_dbert_sample_resolves_them(tiny_checkpoint, tmp_path,
                                                                                       capsys, monkeypatch):
    """No "auto": what the checkpoint recommends (dbert.json's sampling.decoding) shows as its number,
    marked "(checkpoint)", and the numbers are those `dbert sample` uses for the same checkpoint."""
    from dbert_core.storage import checkpoint
    from helpers import run

    folder = tmp_path / "recommends"
    shutil.copytree(tiny_checkpoint, folder)
    meta = json.loads((folder / "dbert.json").read_text())
    meta["sampling"] = {**meta.get("sampling", {}), "decoding": {"steps": 12, "top_p": 0.93}}
    (folder / "dbert.json").write_text(json.dumps(meta))
    code, _, err = run(["sample", "--checkpoint", str(folder), "--n", "1", "--length", "8", "--sampler", "ancestral",
                        "--output", str(tmp_path / "out.jsonl")], capsys, monkeypatch)
    assert code == 0, err
    cli = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])["settings"]
    app = create_app(checkpoint=folder, loader=checkpoint.load, deterministic=True,
                     settings=Settings(length=8, pace_ms=0, sampler="ancestral"))
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_for(pilot, finished(app))
        bar = app.generate_screen.query_one(ControlBar).plain()
        shown = {name: re.search(rf"{name} (\S+)( \(checkpoint\))?", bar) for name in ("steps", "temp", "top-k", "top-p")}
        assert "auto" not in bar
        assert [float(shown[n].group(1)) for n in ("steps", "temp", "top-k", "top-p")] == \
            [cli["steps"], cli["temperature"], cli["top_k"], cli["top_p"]] == [12, 1.0, 30, 0.93]
        assert {n for n, m in shown.items() if m.group(2)} == {"steps", "top-p"}  # the general defaults claim nothing
        await pilot.press("right_square_bracket")  # a value the user chose is no longer the checkpoint's
        await wait_for(pilot, lambda: app.generate_screen.run.settings.steps == 24 and finished(app)())
        bar = app.generate_screen.query_one(ControlBar).plain()
        assert "steps 24 " in bar + " " and "steps 24 (checkpoint)" not in bar and "top-p 0.93 (checkpoint)" in bar


async def test_a_control_key_restarts_a_run_in_progress(tiny_db):
    app = make_app(tiny_db, steps=64, pace_ms=150)
    async with app.run_test(size=SIZE) as pilot:
        g = app.generate_screen
        await wait_for(pilot, lambda: g.run is not None and len(g.run.frames) >= 2)
        old = g.run
        await pilot.press("minus")
        await wait_for(pilot, lambda: g.run is not old and len(g.run.frames) >= 1, timeout=5, what="the restart")
        assert g.run.settings.temperature == 0.9 and g.run.settings.seed == old.settings.seed
        stopped_at = len(old.frames)
        await pilot.pause(0.5)
        assert len(old.frames) == stopped_at and not old.finished  # the old worker was cancelled
        assert "temp 0.9" in g.query_one(ControlBar).plain()


async def test_a_grid_of_samples_fills_in_together(tiny_db):
    L = 20
    app = make_app(tiny_db, n=4, steps=24)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, all_finished(app))
        g = app.generate_screen
        grid = g.query_one(SampleGrid)
        cards = grid.cards()
        assert g.view_mode() == "grid" and grid.display and len(cards) == 4
        assert not g.query_one("#gen-tokens-box").display
        assert "4 samples · step 24/24 · masked 0/80" in str(g.query_one("#gen-status").render())
        final = g.run.frames[-1]
        for b, card in enumerate(cards):  # each card: its own sample, as `dbert sample` prints it
            assert card.text.plain.replace("\n", " ") == tiny_db.decode(final.frame.ids[b])
            assert card.border_subtitle == f"{L}/{L} done · step 24"  # not "20/20 · step 24/24"
        # mid-run, each card shows its own progress (free layout: a mask is one MASK_GLYPH)
        await pilot.press("w", *["left"] * 14)
        rec = g.shown()
        assert rec is g.run.frames[9]
        for b, card in enumerate(cards):
            left = int(rec.frame.masked[b].sum())
            assert card.text.plain.count(MASK_GLYPH) == left
            assert f" {L - left}/{L} · step 10/24" in card.border_subtitle
        assert len({int(rec.frame.masked[b].sum()) for b in range(4)}) > 1  # rows run apart
        # select one and show it large; Esc goes back to the grid
        await pilot.press("end", "down", "down", "enter")
        assert g.view_mode() == "single" and g.session.selected == 2 and cards[2].selected and not cards[0].selected
        assert g.query_one("#gen-tokens-box").display and not grid.display
        assert g.shown_text() == cards[2].text.plain
        assert "sample 3/4 · step 24/24 · masked 0/20" in str(g.query_one("#gen-status").render())
        await pilot.press("up")
        assert g.session.selected == 1 and g.shown_text() == cards[1].text.plain
        await pilot.press("escape")
        assert g.view_mode() == "grid"
        await pilot.click(cards[3])  # a click on a card shows that sample large
        await pilot.pause(0.1)
        assert g.view_mode() == "single" and g.session.selected == 3
        # g: one sample, then the grid again with the same number of samples and the same seed
        await pilot.press("g")
        await wait_for(pilot, all_finished(app))
        assert g.run.settings.n == 1 and g.view_mode() == "single"
        await pilot.press("g")
        await wait_for(pilot, all_finished(app))
        assert g.run.settings.n == 4 and g.view_mode() == "grid" and len(grid.cards()) == 4
        assert (g.run.frames[-1].frame.ids == final.frame.ids).all()


async def test_compare_runs_the_same_seed_under_two_settings_side_by_side(tiny_db):
    import torch

    from dbert_core.sampling.sample import frames

    app = make_app(tiny_db, seed=2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        solo = final_ids(app)[0]
        await pilot.press("c")
        await wait_for(pilot, all_finished(app, sides=2), what="both sides")
        a, b = g.playbacks
        assert (a.run.settings.steps, b.run.settings.steps) == (16, 2)  # B: an eighth of the steps
        assert a.run.settings.seed == b.run.settings.seed == 2
        assert (a.frames[-1].frame.ids == solo).all()  # side A is the draw shown before
        alone = list(frames(tiny_db, b.run.settings, generator=torch.Generator().manual_seed(2)))
        assert len(b.frames) == 2 and (b.frames[-1].frame.ids == alone[-1].ids).all()  # B as if run on its own
        left, right = g.query(ComparePane)
        assert left.display and right.display and left.region.right <= right.region.x
        assert left.region.height >= 10 and right.region.height >= 10
        assert g.shown_text(0) == render_row(tiny_db, a.frames[-1], 0).plain
        assert g.shown_text(1) == render_row(tiny_db, b.frames[-1], 0).plain and MASK_GLYPH not in g.shown_text(1)
        status = str(g.query_one("#gen-status").render())  # the screen says plainly what a seed holds
        assert "compare A | B: separate draws, seed 2" in status
        assert "separate draws" in dict((b.key, b.description) for b in g.BINDINGS)["c"]
        bar = g.query_one(ControlBar)
        assert bar.plain().startswith(" B  tab") and "steps 2" in bar.plain() and bar.differs == {"steps"}
        assert right.active and not left.active
        # Tab: the keys change side A now; a change restarts both sides, with the same seed
        await pilot.press("tab", "equals_sign")
        await wait_for(pilot, lambda: g.playbacks[0].run is not a.run and all_finished(app, sides=2)())
        a2, b2 = g.playbacks
        assert (a2.run.settings.temperature, b2.run.settings.temperature) == (1.1, 1.0)
        assert (a2.run.settings.steps, b2.run.settings.steps) == (16, 2) and a2.run.settings.seed == 2
        assert (b2.frames[-1].frame.ids == b.frames[-1].frame.ids).all()  # B unchanged: the same text
        assert bar.plain().startswith(" A  tab") and bar.differs == {"steps", "temperature"}
        # c again: side A goes on alone
        await pilot.press("c")
        assert len(g.playbacks) == 1 and g.run is a2.run and g.view_mode() == "single"
        assert not g.query_one(CompareView).display and g.query_one("#gen-tokens-box").display and not bar.side


async def test_scrub_shows_earlier_frames(tiny_db):
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        final = g.shown_text()
        await pilot.press("left", "left", "left")
        assert g.view == 12 and g.shown() is g.run.frames[12]
        assert "scrub 13/16" in str(g.query_one("#gen-status").render())
        await pilot.press("w", "home")  # the free layout: a mask is one MASK_GLYPH
        assert g.view == 0
        early = g.shown_text()
        assert early.count(MASK_GLYPH) == int(g.run.frames[0].frame.masked.sum()) > 0
        await pilot.press("full_stop")  # while scrubbing, '.' steps forward through the record
        assert g.view == 1
        await pilot.press("end")
        assert g.view is None and g.shown_text() == final


async def test_pause_and_single_step(tiny_db):
    app = make_app(tiny_db, steps=64, pace_ms=150)
    async with app.run_test(size=SIZE) as pilot:
        g = app.generate_screen
        await wait_for(pilot, lambda: g.run is not None and len(g.run.frames) >= 2)
        await pilot.press("space")
        await pilot.pause(0.3)
        paused_at = len(g.run.frames)
        await pilot.pause(0.5)
        assert len(g.run.frames) == paused_at and not g.run.playing
        assert "paused" in str(g.query_one("#gen-status").render())
        await pilot.press("full_stop", "full_stop")
        await wait_for(pilot, lambda: len(g.run.frames) == paused_at + 2, what="two single steps")
        await pilot.pause(0.3)
        assert len(g.run.frames) == paused_at + 2


async def test_prompt_infill_keeps_given_tokens(tiny_db):
    app = make_app(tiny_db, prompt="once upon a [MASK] there was a")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        text = g.shown_text()
        assert text.startswith("once upon a") and "there was a" in text and MASK_GLYPH not in text
        from dbert_core.sampling.sample import parse_prompt

        given = parse_prompt(tiny_db, "once upon a [MASK] there was a", 20) != tiny_db.model.mask_id
        order = g.run.frames[-1].order[0]
        assert ((order == 0) == given).all()  # given tokens stay, every slot was generated


async def test_the_quote_touch_up_plays_after_the_last_step(tiny_db):
    """With the default pair_quotes, stray quotes are masked again and refilled in frames of
    their own after the step budget is spent: the run ends with the text `dbert sample` prints."""
    from dbert_core.text.quotes import unpaired

    app = make_app(tiny_db, n=4, steps=12, length=16, temperature=2.0, pair_quotes=True, seed=3)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, all_finished(app))
        run = app.generate_screen.run
        touch = [r for r in run.frames if r.frame.touch_up]
        assert len(run.frames) > 12 and touch and all(r.frame.step == 12 for r in touch)
        assert any(r.frame.remasked is not None and r.frame.remasked.any() for r in touch)
        final = run.frames[-1].frame
        assert final.done and not final.masked.any()
        assert int(unpaired(tiny_db, final.ids.long(), ~final.masked).sum()) <= \
            int(unpaired(tiny_db, touch[0].frame.ids.long(), ~touch[0].frame.masked).sum())


async def test_save_texts_and_export_trajectory(tiny_db, tmp_path):
    app = make_app(tiny_db, n=2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.press("s")
        await fill_dialog(pilot, {"path": str(tmp_path / "out" / "texts.txt")})
        head, *lines = (tmp_path / "out" / "texts.txt").read_text().splitlines()
        assert head.startswith("# dbert-tui: {") and json.loads(head.split(": ", 1)[1])["samples"] == [1, 2]
        assert len(lines) == 2 and all(lines) and "[MASK]" not in "".join(lines)
        await pilot.press("x")
        await fill_dialog(pilot, {"path": str(tmp_path / "out" / "run.json")})
        data = json.loads((tmp_path / "out" / "run.json").read_text())
        assert len(data["frames"]) == 16 and data["texts"] == lines
        assert data["frames"][0]["masked"][0].count(True) >= data["frames"][-1]["masked"][0].count(True) == 0
        assert data["settings"]["steps"] == 16 and len(data["reveal_step"]) == 2
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["run.json", "texts.txt"]  # no temp files
        assert g.run.finished


async def test_save_names_one_prefix_in_the_outputs_folder_and_says_what_a_half_run_writes(tiny_checkpoint, tmp_path):
    from dbert_tui.files import output_dir

    ckpt = tmp_path / "dbert-minilm-stories"
    shutil.copytree(tiny_checkpoint, ckpt)
    app = create_app(checkpoint=str(ckpt), deterministic=True,
                     settings=Settings(steps=64, length=20, pace_ms=150, seed=0, sampler="ancestral", top_k=0))
    async with app.run_test(size=SIZE) as pilot:
        g = app.generate_screen
        await wait_for(pilot, lambda: g.run is not None and len(g.run.frames) >= 3, what="a few steps")
        await pilot.press("space")  # paused half-way: saving says what it writes
        await pilot.pause(0.3)
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, FormDialog))
        dialog = app.screen
        title = str(dialog.query_one(".dialog-title").render())
        assert "still masked" in title and "[MASK]" in title
        default = dialog.query_one("#field-path").value
        assert default == str(output_dir() / "dbert-minilm-stories-seed0.txt"), default  # one prefix, a known folder
        await pilot.press("enter")
        await pilot.pause(0.2)
        saved = Path(default)
        assert "[MASK]" in saved.read_text()
        toast = app._notifications
        assert any(str(saved.resolve()) in n.message and "[MASK] left" in n.message for n in toast)
        # a finished run; a bare file name lands in the outputs folder, the toast gives the full path
        await pilot.press("space")
        await wait_for(pilot, finished(app), what="the run to finish", timeout=120)
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, FormDialog))
        assert app.screen.query_one("#field-path").value.endswith("dbert-minilm-stories-seed0-2.txt")  # not overwritten
        assert "Save the text(s), one per line" in str(app.screen.query_one(".dialog-title").render())
        await fill_dialog(pilot, {"path": "mine.txt"})
        assert "[MASK]" not in (output_dir() / "mine.txt").read_text()
        assert any(f"to {(output_dir() / 'mine.txt').resolve()}" in n.message for n in app._notifications)
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, FormDialog))
        exported = Path(app.screen.query_one("#field-path").value)
        assert exported == output_dir() / "dbert-minilm-stories-seed0.json"
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert json.loads(exported.read_text())["frames"]
        assert any(str(exported.resolve()) in n.message for n in app._notifications)


async def test_worker_errors_become_messages():
    def broken(path):
        raise DbertError(f"checkpoint {path}: model.safetensors is corrupt (truncated)")

    app = create_app(checkpoint=TINYSTORIES.parent, loader=broken, deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.current_mode == "checkpoints", what="the checkpoints screen")
        await pilot.pause(0.2)
        messages = [n.message for n in app._notifications]
        assert any("model.safetensors is corrupt" in m for m in messages)
        assert "could not load" in app.checkpoints_screen.message
    assert app.return_code in (0, None)

    def oom(path):
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")

    app = create_app(checkpoint=TINYSTORIES.parent, loader=oom, deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: any("out of memory" in n.message for n in app._notifications))


async def test_quit_stops_a_running_sampler(tiny_db):
    app = make_app(tiny_db, steps=200, length=40, pace_ms=200)
    async with app.run_test(size=SIZE) as pilot:
        g = app.generate_screen
        await wait_for(pilot, lambda: g.run is not None and len(g.run.frames) >= 1)
        await pilot.press("ctrl+q")
    assert app.return_code == 0
    assert not app.session.run.finished  # the App's session (the screen reads it from its App, gone now)


async def test_command_palette_offers_the_main_actions(tiny_db, tmp_path):
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        assert commands["Keys"].callback == app.action_toggle_keys  # the key help screen, not Textual's panel
        for title in ("Restart sampling", "Sampling settings", "Save texts", "Export trajectory", "Several samples",
                      "Compare two settings", "Checkpoints screen", "Train screen", "Fetch a checkpoint"):
            assert title in commands
        from textual.content import Content  # how the palette draws a command's help

        assert Content.from_markup(commands["Prompt / infill template"].help).plain == "Text with [MASK] slots (p)"
        from dbert_tui.screens.help import HelpScreen

        await pilot.press("question_mark")  # every key of the screen, with its description
        await pilot.pause(0.2)
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"Export trajectory")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, FormDialog), timeout=10, what="the export dialog")
        await fill_dialog(pilot, {"path": str(tmp_path / "p.json")})
        assert len(json.loads((tmp_path / "p.json").read_text())["frames"]) == 16


def screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (160, 45)])
async def test_key_bar_keeps_the_screen_keys_and_quit_and_help_shows_every_key_whole(tiny_db, size):
    from dbert_tui.screens.help import HelpScreen, key_rows
    from dbert_tui.widgets.keybar import KeyBar

    app = make_app(tiny_db)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, finished(app))
        for mode, own in (("generate", "space Replay"), ("train", "f5 Start"), ("checkpoints", "⏎ Use")):
            app.switch_mode(mode)
            await pilot.pause(0.2)
            bar = app.screen.query_one(KeyBar)
            shown = bar.plain()
            for key in ("1 Gen", "2 Ckpts", "3 Train", "? Keys", "^q Quit", own):
                assert key in shown, f"{key!r} missing from the {mode} key bar at {size}: {shown!r}"
            assert len(shown) <= size[0] - 2 and bar.region.bottom == size[1]
            last_line = screen_text(app).splitlines()[-1]
            assert last_line.strip() == shown.strip(), "drawn as it is, nothing overdrawn or glued"
        app.switch_mode("generate")
        await pilot.pause(0.2)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the key help")
        help_screen = app.screen
        rows = key_rows(app, app.generate_screen)
        assert {"Double the steps", "Selected sample large", "Quit", "Train"} <= {d for _, d in rows}
        scroll = help_screen.query_one("#help-scroll")
        if size == (80, 24):  # more keys than rows: it scrolls
            assert scroll.max_scroll_y > 0
        seen = screen_text(app)
        while scroll.scroll_y < scroll.max_scroll_y:  # page through it: every key is there, whole
            await pilot.press("pagedown")
            await pilot.pause(0.1)
            seen += screen_text(app)
        for keys, description in rows:
            assert description in seen, f"{description!r} cut or missing at {size}"
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: app.screen is app.generate_screen, what="the help to close")


async def test_a_finished_run_says_space_replays_and_large_terminals_use_their_room(tiny_db):
    from dbert_tui.widgets.keybar import KeyBar

    app = make_app(tiny_db, steps=16, length=40)
    async with app.run_test(size=(160, 45)) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.pause(0.2)
        g = app.generate_screen
        assert "done (Space: replay)" in str(g.query_one("#gen-status").render())
        assert "space Replay" in g.query_one(KeyBar).plain()
        text = screen_text(app)
        assert "100%┤" in text and "0%┤" in text and "16 steps" in text  # the schedule chart has axes
        shown = str(g.query_one("#gen-tokens").render())
        lines = [ln for ln in shown.split("\n")]
        assert len(lines) >= 3 and all(not ln.strip() for ln in lines[1::2]), "double-spaced on a tall terminal"
        assert shown.replace("\n\n", " ").split() == g.shown_text().split()
        await pilot.press("space")  # replay: a new run, playing
        await wait_for(pilot, lambda: g.run.id == 2)
        assert g.run.playing


async def test_grid_says_when_cards_are_below_the_fold(tiny_db):
    app = make_app(tiny_db, n=6, length=24)
    async with app.run_test(size=(80, 18)) as pilot:
        await wait_for(pilot, all_finished(app))
        await pilot.pause(0.2)
        g = app.generate_screen
        g._status()
        status = str(g.query_one("#gen-status").render())
        below = g.grid.cards_below()
        assert below and below[-1] == 5, below
        assert f"#{below[0] + 1}-#6 below (↓)" in status or (len(below) == 1 and "#6 below" in status)
        for _ in range(5):
            await pilot.press("down")  # selecting the last card scrolls to it: nothing is below then
        await pilot.pause(0.3)
        g._status()
        assert not g.grid.cards_below() and "below" not in str(g.query_one("#gen-status").render())


# ------------------------------------------------------------------------------ Checkpoints
async def test_checkpoints_fetch_use_and_delete(tiny_db, tiny_checkpoint, monkeypatch):
    with HubServer() as server:
        server.files["fromurl.tar.gz"] = tar_bytes(tiny_checkpoint)
        server.repos["acme/tiny-dbert"] = tiny_checkpoint
        app = create_app(loader=lambda path: tiny_db, deterministic=True)
        async with app.run_test(size=SIZE) as pilot:
            # an empty store: the app opens on Checkpoints with a clear message
            await wait_for(pilot, lambda: app.current_mode == "checkpoints")
            ck = app.checkpoints_screen
            assert "No checkpoint yet" in ck.message
            # fetch from a URL through the dialog
            await pilot.press("f")
            await fill_dialog(pilot, {"source": f"{server.url}/files/fromurl.tar.gz"})
            await wait_for(pilot, lambda: "fromurl" in [e.name for e in ck.rows], what="the URL fetch")
            # a failed fetch: one-line message, nothing half-written
            ck.start_fetch(f"{server.url}/files/missing.tar.gz")
            await wait_for(pilot, lambda: any("HTTP 404" in n.message for n in app._notifications))
            # Esc cancels a download in progress: a message, and nothing written
            ck.start_fetch(f"{server.url}/slow/fromurl.tar.gz", name="slowpoke")
            await wait_for(pilot, lambda: "download:" in str(ck.query_one("#ck-status").render()), what="progress")
            await pilot.press("escape")
            await wait_for(pilot, lambda: any("cancelled" in n.message for n in app._notifications), what="the cancel")
            assert not (store.store_dir() / "slowpoke").exists()
            # the hub path, with HF_ENDPOINT pointing at the local server
            online(monkeypatch, server)
            ck.start_fetch("acme/tiny-dbert", "main", "hubbed")
            await wait_for(pilot, lambda: "hubbed" in [e.name for e in ck.rows], what="the hub fetch")
            # import a local folder through the dialog
            await pilot.press("i")
            await fill_dialog(pilot, {"path": str(tiny_checkpoint), "name": "imported"})
            await wait_for(pilot, lambda: "imported" in [e.name for e in ck.rows], what="the import")
            assert [p.name for p in store.store_dir().iterdir() if p.name.startswith(".")] == []
            assert [e.name for e in ck.rows] == ["fromurl", "hubbed", "imported"]
            # use the selected one: it loads and the Generate screen runs
            ck.query_one("#ck-table").move_cursor(row=1)
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.current_mode == "generate" and finished(app)())
            # delete with confirmation: 'n' keeps it, 'y' removes it
            await pilot.press("2")
            await wait_for(pilot, lambda: app.current_mode == "checkpoints")
            ck.query_one("#ck-table").move_cursor(row=0)
            await pilot.press("d")
            await pilot.press("n")
            assert (store.store_dir() / "fromurl").is_dir()
            await pilot.press("d")
            await pilot.press("y")
            await pilot.pause()
            assert not (store.store_dir() / "fromurl").exists()
            assert [e.name for e in ck.rows] == ["hubbed", "imported"]


async def test_checkpoints_screen_guards_the_one_in_use_and_shows_details(tiny_checkpoint):
    from dbert_tui.screens.dialogs import ConfirmDialog

    for name in ("alpha", "beta"):
        shutil.copytree(tiny_checkpoint, store.store_dir() / name)
    state = store.store_dir() / "beta" / "trainer_state" / "state.json"
    data = json.loads(state.read_text())
    data["history"].append({"step": 150, "val_nats_per_token": 5.731, "val_ppl_token": 308.2})
    state.write_text(json.dumps(data))
    app = create_app(checkpoint="beta", settings=Settings(pace_ms=0, steps=8, length=8, sampler="ancestral", top_k=0),
                     deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("2")
        await wait_for(pilot, lambda: app.current_mode == "checkpoints")
        await pilot.pause(0.2)
        ck = app.checkpoints_screen
        table = ck.query_one("#ck-table")
        assert [e.name for e in ck.rows] == ["alpha", "beta"] and table.cursor_row == 1, "the cursor on the one in use"
        details = str(ck.query_one("#ck-details").render())
        assert "beta" in details and "150 steps" in details and "ELBO ≤ 5.731" in details and "(step 150)" in details
        assert "train.txt" in details and "parameters" in details
        # deleting the one in use is refused before any question
        await pilot.press("d")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, ConfirmDialog)
        assert any("beta is in use" in n.message for n in app._notifications)
        assert (store.store_dir() / "beta").is_dir()
        # another row: its own details; a status line does not outlive the next operation
        table.move_cursor(row=0)
        await pilot.pause(0.1)
        assert "alpha" in str(ck.query_one("#ck-details").render())
        assert "not recorded" in str(ck.query_one("#ck-details").render())
        (store.store_dir() / "alpha" / "MODEL_CARD.md").write_text(
            "# alpha\n\nA tiny model of stories.\n\n128-step ELBO bound per token on 256 sentences. Best:\n26.6 at step 4,200.\n")
        ck.show_details()
        details = str(ck.query_one("#ck-details").render())
        assert "held-out ppl ≤ 26.6 per token at step 4,200" in details and "card: A tiny model of stories." in details
        ck.say("imported alpha into the store · Enter uses it", "bold green")
        await pilot.press("1")
        await wait_for(pilot, lambda: app.current_mode == "generate")
        await pilot.press("2")
        await wait_for(pilot, lambda: app.current_mode == "checkpoints")
        await pilot.pause(0.2)
        assert "imported" not in ck.message and "Enter uses the selected one" in ck.message
        assert table.cursor_row == 1  # back on the one in use
        ck.say("imported alpha into the store · Enter uses it", "bold green")
        table.move_cursor(row=0)
        await pilot.press("d")  # a new operation: the old line goes
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert "imported" not in ck.message
        await pilot.press("y")
        await pilot.pause(0.2)
        assert not (store.store_dir() / "alpha").exists() and "deleted alpha" in ck.message


async def test_import_dialog_picks_a_checkpoint_folder(tiny_db, tiny_checkpoint, tmp_path):
    from dbert_tui.screens.dialogs import FileDialog

    shutil.copytree(tiny_checkpoint, tmp_path / "src" / "mine")
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("2")
        await wait_for(pilot, lambda: app.current_mode == "checkpoints")
        await pilot.press("i")
        await wait_for(pilot, lambda: isinstance(app.screen, FormDialog))
        form = app.screen
        form.query_one("#field-path").value = str(tmp_path / "src")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, FileDialog), what="the folder picker")
        tree = app.screen.query_one("#file-tree")
        await wait_for(pilot, lambda: any(str(getattr(n.data, "path", "")).endswith("mine") for n in tree.root.children),
                       what="the tree to list folders")
        tree.move_cursor(next(n for n in tree.root.children if str(n.data.path).endswith("mine")))
        await pilot.press("enter")  # a folder holding a checkpoint is taken, not opened
        await wait_for(pilot, lambda: app.screen is form, what="back in the import form")
        assert form.query_one("#field-path").value == str(tmp_path / "src" / "mine")
        await pilot.press("enter")
        await wait_for(pilot, lambda: "mine" in [e.name for e in app.checkpoints_screen.rows], what="the import")


# ------------------------------------------------------------------------------ Train
async def test_train_stop_and_resume_from_the_train_screen(tiny_db):
    app = create_app(checkpoint=tiny_db.path, loader=lambda p: tiny_db, train_data=[str(TINYSTORIES)],
                     settings=Settings(pace_ms=0, steps=8, length=12, sampler="ancestral", top_k=0), deterministic=True)
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("3")
        await wait_for(pilot, lambda: app.current_mode == "train")
        tr = app.train_screen
        # ctrl+o picks a data file from a tree and appends it to the data field
        tr.query_one("#tr-data").value = ""
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: app.screen.query("#file-tree"), what="the file dialog")
        tree = app.screen.query_one("#file-tree")
        await wait_for(pilot, lambda: any(str(getattr(n.data, "path", "")).endswith("train.txt")
                                          for n in tree.root.children), what="the tree to list files")
        node = next(n for n in tree.root.children if str(n.data.path).endswith("train.txt"))
        tree.move_cursor(node)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is tr)
        assert tr.query_one("#tr-data").value == str(TINYSTORIES)
        for wid, value in {"tr-out": "tuitrain", "tr-steps": "400", "tr-batch": "8", "tr-seq": "16",
                           "tr-T": "64", "tr-eval": "5", "tr-sample": "5"}.items():
            tr.query_one(f"#{wid}").value = value
        await pilot.press("f5")
        await wait_for(pilot, lambda: len(tr.losses) >= 6 and len(tr.vals) >= 1, what="training steps")
        await pilot.press("f6")  # stop: saves a checkpoint that can be resumed
        await wait_for(pilot, lambda: tr.trainer is None and "stopped at step" in str(tr.query_one("#tr-stats").render()),
                       what="the stop")
        out = store.store_dir() / "tuitrain"
        from dbert_core.storage.checkpoint import read_meta

        stopped_at = read_meta(out)["step"]
        assert 6 <= stopped_at < 400
        assert "tuitrain" in [e.name for e in store.entries()]
        shown = re.search(r"\[step (\d+)\]", str(tr.query_one("#tr-preview").render()))
        assert shown and int(shown.group(1)) % 5 == 0 and int(shown.group(1)) <= stopped_at  # a preview every 5 steps
        tr.query_one("#tr-steps").value = str(stopped_at + 4)
        await pilot.press("f7")
        await wait_for(pilot, lambda: tr.trainer is None and "finished at step" in str(tr.query_one("#tr-stats").render()),
                       what="the resumed run")
        assert read_meta(out)["step"] == stopped_at + 4
        # a bad setting is a message, not a crash
        tr.query_one("#tr-data").value = "/no/such/file.txt"
        await pilot.press("f5")
        await pilot.pause(0.2)
        assert any("no such data file" in n.message for n in app._notifications)
        # keys respond while training runs; ctrl+q stops the run, which saves a checkpoint
        tr.query_one("#tr-data").value = str(TINYSTORIES)
        tr.query_one("#tr-out").value = "quitter"
        tr.query_one("#tr-steps").value = "100000"
        await pilot.press("f5")
        # the new run's own steps (tr.losses may still hold the last run's until its first progress message)
        await wait_for(pilot, lambda: tr.trainer is not None and tr.trainer.step > 3, what="the second run")
        trainer = tr.trainer
        await pilot.press("f1")  # the data field has the focus: digits would go there
        await wait_for(pilot, lambda: app.current_mode == "generate", timeout=10)
        g = app.generate_screen
        latencies = []
        for _ in range(4):  # a key posted as the terminal would, timed until the screen reacts
            before = g.controls.colour
            start = time.perf_counter()
            app.post_message(events.Key("v", "v"))
            while g.controls.colour == before:
                await asyncio.sleep(0.002)
            latencies.append(time.perf_counter() - start)
        assert trainer.step > 3 and tr.trainer is trainer  # still training meanwhile
        assert sorted(latencies)[1] < 0.25, f"key latencies while training: {latencies}"
        await pilot.press("ctrl+q")
    assert app.return_code == 0
    for _ in range(300):  # the worker thread finishes its step and saves
        if trainer.step and (store.store_dir() / "quitter" / "dbert.json").is_file():
            break
        await asyncio.sleep(0.1)
    from dbert_core.storage.checkpoint import read_meta

    assert 3 <= read_meta(store.store_dir() / "quitter")["step"] < 100000


async def test_the_train_screen_shows_the_corpus_tokenizing_into_the_token_cache(tiny_db, tmp_path, monkeypatch):
    """A run on a corpus not cached yet: the panel shows what `dbert train` says on stderr (MB read,
    MB/s, tokens, ETA; then where the entry is) before its first step; a second run says it is reused."""
    from dbert_core.text import token_cache
    from dbert_tui.messages import TrainPrepare

    monkeypatch.setattr(token_cache, "BATCH_CHARS", 40_000)  # many reports, each batch a little slow to see
    real = token_cache._encoder

    def slow(tokenizer):
        encode = real(tokenizer)
        return lambda texts: time.sleep(0.1) or encode(texts)

    monkeypatch.setattr(token_cache, "_encoder", slow)
    app = create_app(checkpoint=tiny_db.path, loader=lambda p: tiny_db, train_data=[str(TINYSTORIES)],
                     settings=Settings(pace_ms=0, steps=8, length=12, sampler="ancestral", top_k=0), deterministic=True)
    heard: list = []
    hook = lambda m: heard.append(m.info["stage"]) if isinstance(m, TrainPrepare) else None  # noqa: E731
    async with app.run_test(size=(100, 40), message_hook=hook) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("3")
        await wait_for(pilot, lambda: app.current_mode == "train")
        tr = app.train_screen
        seen: list[str] = []

        def done(word: str):  # every line the panel shows until the run ends
            seen.append(str(tr.query_one("#tr-stats").render()))
            return f"{word} at step" in seen[-1]

        for name in ("first", "again"):
            for wid, value in {"tr-out": name, "tr-steps": "2", "tr-batch": "8", "tr-seq": "16", "tr-T": "64",
                               "tr-eval": "0", "tr-sample": "0"}.items():
                tr.query_one(f"#{wid}").value = value
            await pilot.press("f5")
            await wait_for(pilot, lambda: done("finished"), what="the run")
            if name == "first":
                tokenizing = [t for t in seen if t.startswith("preparing · tokenizing ")]
                assert len(set(tokenizing)) >= 2, seen  # it moves on while it tokenizes
                assert re.search(r"tokenizing [\d.]+/0\.9 MB, [\d.]+ MB/s, [\d,]+ tokens, eta ", tokenizing[-1])
                assert any("(tokenized now)" in t for t in seen) and heard[-1] == "built"
                heard.clear()
        assert heard and set(heard) == {"cached"}  # the second run reads the first's entry: nothing tokenized


async def test_train_form_takes_the_readme_recipe_and_a_failed_start_resets_the_panel(tiny_db, tmp_path):
    from textual.widgets import Checkbox, Input, Label, Select

    app = create_app(checkpoint=tiny_db.path, loader=lambda p: tiny_db, train_data=[str(TINYSTORIES)],
                     settings=Settings(pace_ms=0, steps=8, length=12, sampler="ancestral", top_k=0), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("3")
        await wait_for(pilot, lambda: app.current_mode == "train")
        tr = app.train_screen
        await pilot.pause()
        assert app.focused is tr.query_one("#tr-data"), "typing on arrival goes to the data field"
        await pilot.press("escape", "question_mark")  # Esc leaves the field: ? is the key help again
        await pilot.pause(0.2)
        from dbert_tui.screens.help import HelpScreen

        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert app.screen is tr
        # every field of the form has its own label, just before it (a checkbox may carry its own)
        for widget in tr.query_one("#tr-form").query("Input, Select, Checkbox"):
            siblings = list(widget.parent.children)
            before = siblings[siblings.index(widget) - 1] if siblings.index(widget) else None
            own = isinstance(widget, Checkbox) and str(widget.label).strip()
            assert isinstance(before, Label) or own or widget.id == "tr-data", f"{widget.id} has no label"
        # the README's tiny recipe, and the options beyond it, all from the form
        for wid, value in {"tr-out": "recipe", "tr-steps": "300", "tr-lr": "3e-3", "tr-seq": "32",
                           "tr-warmup": "10", "tr-vocab": "500", "tr-lam": "0.2", "tr-seed": "7",
                           "tr-save": "0", "tr-eval": "100"}.items():
            tr.query_one(f"#{wid}", Input).value = value
        tr.query_one("#tr-unit", Select).value = "sentence"
        tr.query_one("#tr-pack", Checkbox).value = True
        tr.query_one("#tr-objective", Select).value = "elbo"
        tr.query_one("#tr-dtype", Select).value = "fp32"
        tr.query_one("#tr-val-data", Input).value = str(TINYSTORIES.parent / "valid.txt")
        cfg, _ = tr.config(resume=False)
        assert cfg.val_data == [str((TINYSTORIES.parent / "valid.txt").resolve())] and not cfg.trim_vocab
        assert (cfg.max_steps, cfg.lr, cfg.seq_len, cfg.unit, cfg.pack, cfg.warmup, cfg.vocab_size, cfg.lam,
                cfg.seed, cfg.save_every, cfg.loss, cfg.dtype, cfg.eval_every) == (
            300, 3e-3, 32, "sentence", True, 10, 500, 0.2, 7, 0, "elbo", "fp32", 100)
        assert cfg.data == [str(TINYSTORIES.resolve())]
        tr.query_one("#tr-init", Input).value = str(tmp_path)  # the default model's recipe: init + trim vocab
        tr.query_one("#tr-trim", Checkbox).value = True
        tr.query_one("#tr-vocab", Input).value = ""
        cfg, _ = tr.config(resume=False)
        assert cfg.init == str(tmp_path) and cfg.trim_vocab and cfg.preset is None
        tr.query_one("#tr-init", Input).value = ""
        tr.query_one("#tr-trim", Checkbox).value = False
        tr.query_one("#tr-val-data", Input).value = ""
        tr.query_one("#tr-lr", Input).value = "fast"
        await pilot.press("f5")
        assert any("lr must be a number" in n.message for n in app._notifications)
        # an output that exists: the TUI's words, before anything starts
        (store.store_dir() / "taken").mkdir(parents=True)
        (store.store_dir() / "taken" / "dbert.json").write_text("{}")
        tr.query_one("#tr-lr", Input).value = "3e-3"
        tr.query_one("#tr-out", Input).value = "taken"
        await pilot.press("f5")
        assert any(n.message == "taken already exists: F7 resumes it, or change the output name"
                   for n in app._notifications)
        assert tr.trainer is None and "preparing" not in str(tr.query_one("#tr-stats").render())
        # a start that fails in the worker: the panel is reset and says why, in the form's words
        tr.query_one("#tr-out", Input).value = "fresh"
        tr.query_one("#tr-init", Input).value = str(tmp_path / "no-bert")
        await pilot.press("f5")
        await wait_for(pilot, lambda: "failed" in str(tr.query_one("#tr-stats").render()), what="the failed start")
        stats = str(tr.query_one("#tr-stats").render())
        assert "not training" in stats and "preparing" not in stats and "--init" not in stats
        assert not tr.query_one("#tr-start").disabled and tr.query_one("#tr-stop").disabled
        # a short run: its charts carry a scale, and its last step is evaluated (7 is no multiple of 5)
        tr.query_one("#tr-init", Input).value = ""
        for wid, value in {"tr-steps": "7", "tr-batch": "8", "tr-seq": "16", "tr-T": "64", "tr-eval": "5",
                           "tr-sample": "0", "tr-vocab": "", "tr-warmup": "2"}.items():
            tr.query_one(f"#{wid}", Input).value = value
        await pilot.press("f5")
        await wait_for(pilot, lambda: "finished at step 7" in str(tr.query_one("#tr-stats").render()),
                       what="the short run")
        await pilot.pause(0.2)
        assert [s for s, _ in tr.vals] == [5, 7]
        val = tr.query_one("#tr-val")
        assert "step 7:" in val.title and val.points[-1][0] == 7
        loss = tr.query_one("#tr-loss")
        drawn = loss.render().plain
        assert "now " in drawn and "min " in drawn and "max " in drawn and "step 1" in drawn and drawn.rstrip().endswith("7")
        # the file picker goes up to the parent folder
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: app.screen.query("#file-tree"), what="the file dialog")
        tree = app.screen.query_one("#file-tree")
        start = Path(tree.path)
        await pilot.press("backspace")
        await pilot.pause()
        assert Path(tree.path) == start.parent


def test_training_charts_have_a_scale():
    from dbert_tui.render import ema, line_chart

    two = line_chart([(200, 5.731), (300, 5.644)], 30, 3).plain.splitlines()
    assert two[0].startswith("5.73") and two[2].startswith("5.64")      # max on top, min at the bottom
    assert two[-1].split() == ["step", "200", "300"]                     # the step axis
    bars = [line[6:] for line in two[:3]]
    assert sum(ch != " " for line in bars for ch in line) <= 4, "two points are two thin bars, not a block"
    assert ema([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])  # debiased: no pull towards 0
    assert ema([0.0, 10.0], 0.5) == pytest.approx([0.0, 20 / 3])


# ------------------------------------------------------------------------------ snapshots
def _snapshot_app(tiny_db):
    return make_app(tiny_db, steps=24, length=40, seed=3)


async def _settle(pilot):
    app = pilot.app
    await wait_for(pilot, finished(app))
    await pilot.pause(0.2)
    app.clear_notifications()
    await pilot.pause()


def test_snapshot_generate(snap_compare, snapshot_db):
    assert snap_compare(_snapshot_app(snapshot_db), terminal_size=SIZE, run_before=_settle)


def test_snapshot_generate_scrubbed_confidence(snap_compare, snapshot_db):
    async def before(pilot):
        await _settle(pilot)
        await pilot.press("v", "left", "left", "left", "left", "left", "left", "left", "left")

    assert snap_compare(_snapshot_app(snapshot_db), terminal_size=SIZE, run_before=before)


def test_snapshot_generate_grid(snap_compare, snapshot_db):
    async def before(pilot):
        await wait_for(pilot, all_finished(pilot.app))
        await pilot.press(*["left"] * 12)
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(make_app(snapshot_db, n=4, steps=24, length=24, seed=3), terminal_size=SIZE, run_before=before)


def test_snapshot_generate_compare(snap_compare, snapshot_db):
    async def before(pilot):
        await _settle(pilot)
        await pilot.press("c")
        await wait_for(pilot, all_finished(pilot.app, sides=2))
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(_snapshot_app(snapshot_db), terminal_size=SIZE, run_before=before)


def test_snapshot_checkpoints(snap_compare, tiny_db, tiny_checkpoint):
    entry = store.store_dir() / "tiny"
    shutil.copytree(tiny_checkpoint, entry)
    meta = json.loads((entry / "dbert.json").read_text())
    meta["created"] = meta["saved"] = "2026-01-02T03:04:05+00:00"  # fixed for a stable picture (the details pane)
    meta["train_seconds"], meta["tokens_seen"], meta["data"] = 42.0, 30000, ["stories/train.txt"]
    for key in ("train_config", "data_files", "val_data_files", "sha256"):  # absolute paths: their length differs
        # by machine; the weights' digests lengthen dbert.json, and so the size the listing shows
        meta.pop(key, None)
    (entry / "dbert.json").write_text(json.dumps(meta))

    async def before(pilot):
        await _settle(pilot)
        await pilot.press("2")
        await pilot.pause(0.2)
        pilot.app.clear_notifications()
        pilot.app.checkpoints_screen.say("1 checkpoint(s) · Enter uses the selected one", "dim")
        await pilot.pause()

    app = create_app(checkpoint="tiny", loader=lambda p: tiny_db, settings=Settings(pace_ms=0, steps=8, length=8, sampler="ancestral", top_k=0),
                     deterministic=True)
    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_train(snap_compare, tiny_db):
    async def before(pilot):
        await _settle(pilot)
        await pilot.press("3")
        await pilot.pause(0.2)
        pilot.app.clear_notifications()
        await pilot.pause()

    app = create_app(checkpoint=tiny_db.path, loader=lambda p: tiny_db, train_data=["corpus.txt"],
                     settings=Settings(pace_ms=0, steps=8, length=8, sampler="ancestral", top_k=0), deterministic=True)
    assert snap_compare(app, terminal_size=SIZE, run_before=before)


# ------------------------------------------------------------------------------ boundaries
def test_core_never_imports_textual():
    code = ("import sys, dbert_core.cli, dbert_core.storage.fetch, dbert_core.sampling.sample, dbert_core.training.train, dbert_core.storage.store; "
            "bad = [m for m in sys.modules if m == 'textual' or m.startswith('textual.')]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


@pytest.mark.parametrize("argv", [["-m", "dbert_tui.app"], ["-m", "dbert_core.cli", "tui"]])
def test_a_bad_checkpoint_is_one_line_before_the_screen_opens(argv):
    r = subprocess.run([sys.executable, *argv, "--checkpoint", "no-such-model"], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no checkpoint named 'no-such-model'" in r.stderr
