"""dbert-tui's token inspector, editing by remasking (refill, lock, slots, versions, branch),
replay of a trajectory file, export as cast / HTML, and the stable layout, driven with Pilot."""

from __future__ import annotations

import json
import re

import pytest

from dbert_tui.app import create_app
from dbert_tui.controller import BRANCHES, Settings
from dbert_tui.render import MASK_GLYPH
from helpers import SIZE, all_finished, fill_dialog, finished, make_app, wait_for

pytestmark = pytest.mark.anyio


def token_cells(app) -> dict[int, tuple[int, int]]:
    """{position: (x, y) of its first cell, relative to the token view} from the styles' meta."""
    w = app.generate_screen.query_one("#gen-tokens")
    r = w.region
    out: dict[int, tuple[int, int]] = {}
    for y in range(r.height):
        for x in range(r.width):
            pos = app.screen.get_style_at(r.x + x, r.y + y).meta.get("token")
            if pos is not None and pos not in out:
                out[pos] = (x, y)
    return out


def status(g) -> str:
    return str(g.query_one("#gen-status").render())


def inspector(g) -> str:
    return str(g.query_one("#gen-inspect-line").render())


async def test_inspect_keys_move_the_cursor_and_show_the_token(tiny_db):
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.press("i")
        d = g.draft
        assert d is not None and d.cursor == g.canvas.positions[0] and "inspect" in status(g)
        assert g.query_one("#gen-inspect-line").display and not g.query_one("#gen-strip").display
        info = g.inspected()
        final = g.run.frames[-1]
        assert info["step"] == int(final.order[0, d.cursor]) and len(info["top"]) == 5
        assert info["masking_time"] > 0  # the tiny model uses the spindle schedule
        line = inspector(g)
        assert info["piece"] in line and f"step {info['step']}/16" in line and "top:" in line
        await pilot.press("right", "right")
        assert d.cursor == g.canvas.positions[2] and g.view is None  # the arrows move the cursor, not the frame
        await pilot.press("shift+right", "shift+right")
        assert d.selected == set(g.canvas.positions[2:5]) and d.cursor == g.canvas.positions[4]
        await pilot.press("left")
        assert d.anchor is None and d.cursor == g.canvas.positions[3] and len(d.selected) == 3  # a move keeps the selection
        await pilot.press("enter")
        assert g.canvas.positions[3] not in d.selected  # Enter toggles the token under the cursor
        await pilot.press("enter")
        assert g.canvas.positions[3] in d.selected
        await pilot.press("escape")
        assert g.draft is None and g.query_one("#gen-strip").display
        await pilot.press("i", "i")
        assert g.draft is None


async def test_the_mouse_inspects_hovers_and_drags_a_selection(tiny_db):
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.pause()
        cells = token_cells(app)
        positions = sorted(cells)
        assert len(positions) >= 6
        a, b, c = positions[1], positions[3], positions[5]
        await pilot.click("#gen-tokens", offset=cells[a])  # a click inspects that token
        assert g.draft is not None and g.draft.cursor == a
        await pilot.hover("#gen-tokens", offset=cells[c])  # a hover moves the cursor
        assert g.draft.cursor == c and not g.draft.selected
        await pilot.mouse_down("#gen-tokens", offset=cells[a])  # a drag selects from the press
        await pilot.hover("#gen-tokens", offset=cells[b])
        await pilot.mouse_up("#gen-tokens", offset=cells[b])
        assert g.draft.selected == {p for p in g.canvas.positions if a <= p <= b} and g.draft.cursor == b
        await pilot.press("backspace")
        assert all(g.draft.ids[p] == tiny_db.model.mask_id for p in range(a, b + 1) if p in g.canvas.positions)


async def test_remask_lock_slots_refill_undo_redo(tiny_db):
    app = make_app(tiny_db)
    mask = tiny_db.model.mask_id
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        original = [int(i) for i in g.run.frames[-1].frame.ids[0]]
        await pilot.press("i")
        p = g.canvas.positions
        await pilot.press("right", "l")  # lock p[1]
        assert g.draft.locked == {p[1]}
        await pilot.press("left", "shift+right", "shift+right", "backspace")  # p[0..2]: the locked one stays
        d = g.draft
        assert d.ids[p[0]] == mask and d.ids[p[2]] == mask and d.ids[p[1]] == original[p[1]]
        assert "2 masked · 1 locked" in status(g)
        await pilot.press("a")  # a masked slot before the cursor (p[2])
        assert len(d.ids) == len(original) + 1 and d.ids[p[2]] == mask and d.locked == {p[1]}
        await pilot.press("d")  # and deleted again
        assert len(d.ids) == len(original)
        await pilot.press("right", "right", "right", "d")  # a token is not a slot
        assert len(d.ids) == len(original)
        await pilot.press("a")
        template = list(d.ids)
        await pilot.press("f")
        assert g.draft is None and g.run.template is not None
        await wait_for(pilot, finished(app), what="the refill")
        new = [int(i) for i in g.run.frames[-1].frame.ids[0]]
        assert len(new) == len(template) and mask not in new
        assert all(new[i] == t for i, t in enumerate(template) if t != mask)  # the rest is kept
        assert len(g.editor.versions) == 2 and "version 2/2" in status(g)
        assert not any(g.run.frames[0].frame.revealed[0, i] for i, t in enumerate(template) if t != mask)
        await pilot.press("u")
        assert [int(i) for i in g.run.frames[-1].frame.ids[0]] == original and "version 1/2" in status(g)
        await pilot.press("u")  # nothing before the first
        await pilot.press("y")
        assert [int(i) for i in g.run.frames[-1].frame.ids[0]] == new
        await pilot.press("i")
        assert g.draft.locked == {p[1]}  # locks stay from one version to the next
        await pilot.press("f")  # nothing masked: refused
        assert g.draft is not None


async def test_branch_draws_several_refills_and_enter_picks_one(tiny_db):
    app = make_app(tiny_db)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.press("i", "shift+right", "shift+right", "backspace", "b")
        assert g.run.settings.n == BRANCHES and g.view_mode() == "grid"
        await wait_for(pilot, all_finished(app), what="the branch")
        rows = {tuple(int(i) for i in row) for row in g.run.frames[-1].frame.ids}
        assert len(rows) > 1  # different refills
        await pilot.press("down", "down", "enter")
        assert g.view_mode() == "single" and g.session.selected == 2 and len(g.editor.versions) == 2
        chosen = [int(i) for i in g.run.frames[-1].frame.ids[2]]
        assert g.editor.versions.current().row == 2 and "version 2/2" in status(g)
        await pilot.press("u", "y")
        assert g.session.selected == 2 and [int(i) for i in g.run.frames[-1].frame.ids[g.session.selected]] == chosen


async def test_a_prompts_words_stay_as_typed_in_the_inspector_and_through_a_refill(tiny_db):
    """The prompt's words are drawn as typed ("the cat", not the truecased "The cat"); inspecting
    the text, and refilling or branching another span of it, dropped them, so the prompt's first
    word jumped to "The". A word remasked is refilled as the model writes it; a slot inserted before
    the prompt's words moves them on."""
    app = make_app(tiny_db, prompt="the cat [MASK] on the mat")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        assert g.shown_text().split()[:2] == ["the", "cat"]
        await pilot.press("i")
        assert g.shown_text().split()[:2] == ["the", "cat"]  # the draft as typed too
        await pilot.press(*["right"] * 6, "shift+right", "backspace", "f")
        await wait_for(pilot, finished(app), what="the refill")
        assert "version 2/2" in status(g) and g.shown_text().split()[:2] == ["the", "cat"]
        await pilot.press("i", "a")  # a slot before "the": the prompt's words one place on
        assert g.shown_text().split()[:3] == [MASK_GLYPH, "the", "cat"]
        await pilot.press("b")
        await wait_for(pilot, all_finished(app), what="the branch")
        texts = [card.text.plain for card in g.grid.cards()]
        assert len(texts) == BRANCHES and all("the cat" in t and "The cat" not in t for t in texts), texts
        await pilot.press("enter", "u", "y")
        assert "version 3/3" in status(g) and "the cat" in g.shown_text()


@pytest.fixture
def traj_file(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    import sys

    from dbert_core.cli import main

    out = tmp_path / "run.json"
    monkeypatch.setattr(sys, "argv", ["dbert", "sample", "--checkpoint", str(tiny_checkpoint), "--n", "1", "--seed", "4",
                                      "--length", "30", "--steps", "16", "--sampler", "ancestral", "--trajectory", str(out)])
    with pytest.raises(SystemExit):
        main()
    capsys.readouterr()
    return out


async def test_replay_plays_scrubs_and_inspects_without_a_model(traj_file, tmp_path):
    data = json.loads(traj_file.read_text())
    app = create_app(replay=traj_file, settings=Settings(pace_ms=0), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="the replay")
        g = app.generate_screen
        assert g.replay is not None and len(g.run.frames) == len(data["frames"])
        assert g.shown_text().replace("\n", " ") == data["texts"][0] and "Replay" in g.sub_title
        await pilot.press("home")
        assert g.view == 0
        await pilot.press("i")
        info = g.inspected()
        pos = next(i for i, m in enumerate(data["frames"][0]["masked"][0]) if not m)
        g.draft.cursor = pos
        info = g.inspected()
        assert info["piece"] == data["pieces"][str(data["frames"][0]["ids"][0][pos])]
        assert [w for w, _ in info["top"]] == [data["pieces"][str(i)] for i in data["top"]["ids"][0][pos]]
        await pilot.press("backspace", "f")  # no model: refill is refused, the draft stays
        assert g.draft is not None and g.run.source is not None
        await pilot.press("escape", "right_square_bracket")  # nor can the settings change
        assert g.run.settings.steps == 16
        await pilot.press("end", "space")  # Space plays it again
        await wait_for(pilot, finished(app), what="the replay again")


async def test_replay_of_a_file_without_its_settings_plays(traj_file):
    """A trajectory file need not say its settings (replay.load reads it without them): the replay
    plays and draws with the frames' own step budget (a None steps once reached the step count's
    arithmetic and failed the screen's drawing)."""
    data = json.loads(traj_file.read_text())
    del data["settings"]
    traj_file.write_text(json.dumps(data))
    app = create_app(replay=traj_file, settings=Settings(pace_ms=0), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="the replay")
        g = app.generate_screen
        assert g.shown_text().replace("\n", " ") == data["texts"][0]
        assert g.run.settings.steps == data["frames"][-1]["steps"] == 16
        await pilot.press("i")  # the inspector draws with the steps too
        assert g.inspected()["piece"]


async def test_export_as_cast_and_html(tiny_db, tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        for name in ("run.cast", "run.html", "run.json"):
            await pilot.press("x")
            await fill_dialog(pilot, {"path": str(tmp_path / name)})
        cast = (tmp_path / "run.cast").read_text().splitlines()
        assert json.loads(cast[0])["version"] == 2 and len(cast) == len(g.run.frames) + 2
        exe = shutil.which("asciinema") or str(Path(sys.executable).with_name("asciinema"))
        out = subprocess.run([exe, "cat", str(tmp_path / "run.cast")], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "step 16/16" in re.sub(r"\x1b\[[0-9;]*[mJH]", "", out.stdout)
        page = (tmp_path / "run.html").read_text()
        assert page.startswith("<!doctype html>") and 'title="step ' in page
        traj = json.loads((tmp_path / "run.json").read_text())
        assert traj["top"]["k"] == 5 and traj["pieces"]
        from dbert_core.sampling.replay import load

        again = load(tmp_path / "run.json")  # the TUI's export replays too
        assert [again.db.decode(row) for row in again.frames[-1].ids] == [tiny_db.decode(row) for row in
                                                                          g.run.frames[-1].frame.ids]


async def test_a_scrubbed_frame_is_inspected_as_it_was(tiny_db):
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.press("home", *["right"] * 7, "i")
        rec = g.run.frames[7]
        masked = [i for i, m in enumerate(rec.frame.masked[0].tolist()) if m]
        shown = [i for i, m in enumerate(rec.frame.masked[0].tolist()) if not m]
        assert g.draft.masked == len(masked) > 0
        g.draft.cursor = masked[0]
        assert g.inspected()["masked"]
        await pilot.press("right")
        g.draft.cursor = shown[0]
        info = g.inspected()
        assert 1 <= info["step"] <= 8 and len(info["top"]) == 5


async def test_stable_layout_keeps_the_final_line_breaks(traj_file):
    app = create_app(replay=traj_file, settings=Settings(pace_ms=0), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        width = g.query_one("#gen-tokens").content_size.width

        def lines():
            return [len(line.plain) for line in g.canvas.text.wrap(app.console, width)]

        final = lines()
        for k in range(len(g.run.frames)):
            g.action_scrub_to(k)
            assert lines() == final  # the same lines of the same widths at every frame
        await pilot.press("w", "home")
        assert not g.controls.stable and "░░░" in g.shown_text()


def test_snapshot_inspector_80x24(snap_compare, snapshot_db):
    async def before(pilot):
        await wait_for(pilot, finished(pilot.app))
        await pilot.press("i", "right", "right", "right", "shift+right")
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(make_app(snapshot_db, steps=24, length=40, seed=3), terminal_size=(80, 24), run_before=before)


def test_snapshot_inspector_120x40(snap_compare, snapshot_db):
    async def before(pilot):
        await wait_for(pilot, finished(pilot.app))
        await pilot.press("i", *["right"] * 6, "l", "right", "shift+right", "shift+right", "backspace", "right", "right")
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(make_app(snapshot_db, steps=24, length=40, seed=3), terminal_size=(120, 40), run_before=before)


async def test_an_infill_prompt_ranks_every_length_and_plays_the_best(snapshot_db):
    app = make_app(snapshot_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.press("p")
        await fill_dialog(pilot, {"prompt": "once upon a time [MASK*1-3] girl"})
        await wait_for(pilot, lambda: g.run is not None and g.run.source_prompt is not None and g.run.finished
                       and g.drawn is g.run.frames[-1], what="the infill")
        best = g.player.ranking[0]
        assert [c.score for c in g.player.ranking] == sorted(c.score for c in g.player.ranking)
        assert {c.lengths for c in g.player.ranking} <= {(1,), (2,), (3,)}
        assert g.session.selected == best.row and g.run.source_prompt == f"once upon a time [MASK*{best.lengths[0]}] girl"
        assert g.shown_text().replace("\n", " ") == best.text
        await pilot.press("i")  # the inspector works on it too
        assert g.inspected()["piece"]


def test_replay_of_a_bad_file_is_one_line_before_the_screen_opens(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "x.json"
    bad.write_text("{}")
    for target, what in ((bad, "is not a dbert trajectory"), (tmp_path / "none.json", "cannot read")):
        r = subprocess.run([sys.executable, "-m", "dbert_tui.app", "--replay", str(target)], capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and what in r.stderr


def test_the_new_engine_modules_never_import_textual():
    import subprocess
    import sys

    code = ("import sys, dbert_core.sampling.inspector, dbert_core.sampling.replay, dbert_core.sampling.share, dbert_core.text.stable, "
            "dbert_core.sampling.infill; bad = [m for m in sys.modules if m == 'textual' or m.startswith('textual.')]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
