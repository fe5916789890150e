"""dbert-tui on a story checkpoint, driven with Pilot: a prompt drawn where its tokens are on the
story's canvas (which opens with [SEP]), refill of a story longer than the model's positions,
and a long story followed and scrolled at 80x24."""

from __future__ import annotations

import pytest

from dbert_core.sampling.blocks import story_of
from dbert_core.sampling.sample import prompt_words
from helpers import SIZE, fill_dialog, finished, make_app, train_stories, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def story_db(tmp_path_factory):
    """A tiny story model (24-token windows, 158 positions), trained for two steps."""
    return train_stories(tmp_path_factory.mktemp("tui-stories"), max_steps=2)


def story_text(db, rec, prompt: str) -> str:
    """What `dbert sample` prints for the frame's first story: the prompt's words as typed."""
    ids = story_of(rec.frame.ids[0], db.tokenizer.sep_token_id)
    return db.decode(ids, paragraph="\n", verbatim=prompt_words(db, prompt))


@pytest.mark.parametrize("prompt", ["Tom had a red kite.", "Tom had a [MASK*3] dog. He [MASK*8]"])
async def test_a_story_prompt_is_drawn_where_its_tokens_are(story_db, prompt):
    app = make_app(story_db, length=30, min_length=0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="the first run")
        await pilot.press("p")
        await fill_dialog(pilot, {"prompt": prompt})
        g = app.generate_screen
        await wait_for(pilot, lambda: g.run.settings.prompt == prompt and finished(app)(), what="the prompted run")
        await pilot.pause()
        words = prompt.split("[MASK")[0].split()
        expected = story_text(story_db, g.run.frames[-1], prompt)
        assert expected.split()[:len(words)] == words
        assert g.shown_text().split() == expected.split()  # the live canvas reads what is saved
        await pilot.press("w")  # the other layout (stable / free) draws the same words
        await pilot.pause()
        assert g.shown_text().split() == expected.split()
        mid = g.run.frames[len(g.run.frames) // 2]
        g.player.scrub_to(len(g.run.frames) // 2)
        g._draw()
        assert g.shown_text().split()[:len(words)] == words  # mid-run too: the prompt is given from the start
        assert mid.frame.ids.shape[1] == 31


def test_a_long_refill_goes_in_windows_around_its_masks():
    from dbert_core.sampling.refill import windows

    assert windows([3, 180], 201, 24) == [0, 169]          # each mask centred in its own window
    assert windows([100, 105, 111], 201, 24) == [94]        # a run of at most half a window: one window
    assert windows([100, 112], 201, 24) == [89, 101]        # longer: two
    assert windows([199, 200], 201, 24) == [177]            # the canvas's end: the window stays inside
    assert windows([], 201, 24) == []


async def test_refill_of_a_story_longer_than_the_models_positions(story_db):
    """A 200-token story on a 158-position model: remask a token near each end and refill; the
    sampler gets windows the model holds, the text comes back filled, the rest kept."""
    mask = story_db.model.mask_id
    assert story_db.model.max_length < 201
    app = make_app(story_db, length=200, min_length=190, steps=4)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="the long story")
        g = app.generate_screen
        original = [int(i) for i in g.run.frames[-1].frame.ids[0]]
        await pilot.press("i")
        p = g.canvas.positions
        assert p[-1] > story_db.model.max_length
        for at in (p[2], p[-3]):
            g.draft.cursor = at
            await pilot.press("backspace")
        template = list(g.draft.ids)
        assert template.count(mask) == 2
        await pilot.press("f")
        await wait_for(pilot, finished(app), timeout=60, what="the refill")
        await pilot.pause()
        new = [int(i) for i in g.run.frames[-1].frame.ids[0]]
        assert len(new) == len(original) and mask not in new
        assert all(new[i] == t for i, t in enumerate(template) if t != mask)  # the rest is kept
        assert g.run.frames[-1].frame.steps == 2 * 4  # two windows of 4 steps
        assert "version 2/2" in str(g.query_one("#gen-status").render())
        assert g.shown_text().strip()
        await pilot.press("u")
        assert [int(i) for i in g.run.frames[-1].frame.ids[0]] == original


async def test_a_long_story_at_80x24_follows_the_writing_and_pages(story_db):
    from dbert_tui.screens.help import HelpScreen

    app = make_app(story_db, length=400, min_length=390, steps=2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), timeout=120, what="the long story")
        await pilot.pause(0.2)
        g = app.generate_screen
        c = g.canvas
        assert c.max_scroll_y > 8, "the story is far taller than the box"
        assert c.scroll_y >= c.max_scroll_y - 1 and c.follow  # the end of the writing is in view
        await pilot.press("home")  # the first step writes at the top
        await pilot.pause(0.2)
        assert c.scroll_y == 0
        g.action_scrub_to(len(g.run.frames) // 2)  # half way: its window is in view, away from both ends
        await pilot.pause(0.2)
        rec = g.shown()
        row = rec.frame.masked[0].tolist()
        assert 0 < c.scroll_y < c.max_scroll_y and True in row
        y = c.scroll_y
        await pilot.press("pageup")
        await pilot.pause(0.2)
        assert not c.follow and c.scroll_y < y
        y = c.scroll_y
        await pilot.press("right")  # a redraw does not take the box back while scrolled by hand
        await pilot.pause(0.2)
        assert c.scroll_y == y
        await pilot.press("pagedown")
        await pilot.pause(0.2)
        assert c.scroll_y > y
        await pilot.press("end")  # live, following again: the end of the story
        await pilot.pause(0.2)
        assert c.follow and c.scroll_y >= c.max_scroll_y - 1
        await pilot.press("question_mark")
        await pilot.pause(0.2)
        assert isinstance(app.screen, HelpScreen)
        rows = dict(app.screen.rows)
        assert "PgUp" in rows and "PgDn" in rows and "follows the writing" in rows["end"]
        assert "follows the writing" in g.HELP and "PgDn" in g.HELP


async def test_a_story_of_two_windows_shows_the_window_and_the_step_within_it(story_db):
    """The control bar's steps are per window; the status line says which window and the step
    within it (`window 1/3 · step 3/4`), not the count across windows (`step 3/12`)."""
    from dbert_tui.render import step_label

    app = make_app(story_db, length=40, min_length=38, steps=4)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), timeout=60, what="the two-window story")
        await pilot.pause()
        g = app.generate_screen
        frames = [r.frame for r in g.run.frames]
        windows = frames[-1].steps // 4
        assert windows >= 2 and frames[-1].steps == 4 * windows and "[ ] steps 4" in g.query_one("#gen-controls").plain()
        first = next(i for i, f in enumerate(frames) if f.step == 3)
        second = next(i for i, f in enumerate(frames) if f.step == 7)
        for index, expected in ((first, f"window 1/{windows} · step 3/4"), (second, f"window 2/{windows} · step 3/4")):
            g.action_scrub_to(index)
            await pilot.pause()
            status = str(g.query_one("#gen-status").render())
            assert expected in status and f"/{4 * windows}" not in status, status
        await pilot.press("end", "i")  # the inspector tells a token's reveal step the same way
        order = g.run.frames[-1].order[0]
        pos = next(p for p in g.canvas.positions if 4 < int(order[p]) <= 8)
        g.draft.cursor = pos
        g._draw()
        line = str(g.query_one("#gen-inspect-line").render())
        assert f"window 2/{windows} · step {int(order[pos]) - 4}/4" in line, line
    assert step_label(5, 16, 16) == "step 5/16"  # one window: the plain count
    assert step_label(0, 8, 4) == "window 1/2 · step 0/4" and step_label(8, 8, 4) == "window 2/2 · step 4/4"


async def test_a_story_grid_card_tells_its_window_within_the_cards_border(story_db):
    app = make_app(story_db, n=2, length=40, min_length=38, steps=4)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), timeout=60, what="two stories")
        g = app.generate_screen
        mid = next(i for i, r in enumerate(g.run.frames) if r.frame.step == 6)
        g.action_scrub_to(mid)
        await pilot.pause()
        for card in g.grid.cards():
            title = card.border_subtitle
            assert "window 2/" in title and "step " in title and len(title) <= card.size.width, (title, card.size)


def test_a_storys_status_counts_the_length_asked_for():
    """`length 383` in the control bar read `masked 383/384` in the status: the canvas's [SEP]
    that opens the story was counted as one of its tokens."""
    from types import SimpleNamespace

    import torch

    from dbert_core.sampling.sample import Frame
    from dbert_tui.render import progress_line

    def status(width: int, length: int, rows: int = 1) -> str:
        masked = torch.ones(rows, width, dtype=torch.bool)
        masked[:, 0] = False
        frame = Frame(ids=torch.zeros(rows, width, dtype=torch.long), masked=masked, revealed=torch.zeros_like(masked),
                      confidence=torch.zeros(rows, width), step=0, steps=96, t=0, nfe=0)
        pb = SimpleNamespace(run=SimpleNamespace(settings=SimpleNamespace(steps=48, length=length)),
                             state=lambda: "running")
        return progress_line(pb, SimpleNamespace(frame=frame, seconds=0.0), timed=False).plain

    assert "masked 383/383" in status(384, 383)  # a story: its [SEP] opens the canvas
    assert "masked 766/766" in status(384, 383, rows=2)
    assert "masked 39/40" in status(40, 40)  # a canvas of the length asked for: every column counts


async def test_the_sampler_key_says_what_a_heuristics_tilde_means(tiny_db):
    """`m` showed `confidence~` on the control bar with nothing saying what the ~ is."""
    app = make_app(tiny_db, sampler="first-hitting")
    async with app.run_test(size=SIZE) as pilot:
        g = app.generate_screen
        await wait_for(pilot, finished(app))
        await pilot.press("m")
        await wait_for(pilot, lambda: g.run.settings.sampler == "confidence" and finished(app)())
        notes = [n.message for n in app._notifications]
        assert any(n.startswith("confidence~ is a heuristic (~): the order of reveals is the model's most confident")
                   for n in notes), notes


async def test_the_grid_at_80x24_says_which_cards_are_below_and_its_status_fits(story_db):
    """The grid at 80x24 cut its status line and said `#1-#6 below` while #1 and #2 were on screen."""
    app = make_app(story_db, n=6, length=60, steps=8)
    async with app.run_test(size=SIZE) as pilot:
        g = app.generate_screen
        await wait_for(pilot, finished(app))
        await pilot.pause(0.2)
        status = g.query_one("#gen-status")
        line = str(status.render())
        assert len(line) <= status.content_size.width and "window " in line and " · done" in line, line
        grid = g.grid
        view = grid.scrollable_content_region.height
        below = grid.cards_below()
        for card in grid.cards():  # a card said to be below has less than half of itself (or of the view) in view
            r = card.virtual_region
            shown = max(0, min(view, r.bottom) - max(0, r.y))
            assert (card.index in below) == (r.bottom > view and 2 * shown < min(r.height, view)), (card.index, r)
        assert 0 not in below and 1 not in below
        if below:
            shown = f"#{below[0] + 1}" + ("" if len(below) == 1 else f"-#{below[-1] + 1}") + " below"
            assert shown in line


async def test_the_checkpoints_screen_names_the_shipped_model_as_the_cli_does(tiny_db):
    """The TUI listed the shipped model as `default`, `dbert checkpoints list` as
    `dbert-minilm-stories (default)`, the README as `dbert-minilm-stories`."""
    from dbert_tui.app import create_app

    app = create_app(checkpoint=tiny_db.path, loader=lambda p: tiny_db, deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("2")
        await wait_for(pilot, lambda: app.current_mode == "checkpoints")
        ck = app.checkpoints_screen
        table = ck.query_one("#ck-table")
        names = [str(table.get_row_at(i)[0]).strip() for i in range(table.row_count)]
        assert names[0] == "dbert-minilm-stories" and "default" not in names, names
        assert table.virtual_size.width <= SIZE[0]  # the row fits 80 columns: no sideways scrolling
        table.move_cursor(row=0)
        await pilot.pause(0.2)
        assert str(ck.query_one("#ck-details").render()).startswith("dbert-minilm-stories (default) · ")
