"""Small things a new user meets in dbert-tui: the settings form's labels read apart from their
values, Ctrl-C's hint is words (not markup), and the inspector lists only candidates the sampler
could have drawn."""

from __future__ import annotations

import pytest

from dbert_tui.screens.dialogs import FormDialog
from helpers import SIZE, finished, make_app, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _without_shipped_default(monkeypatch):
    from dbert_core.storage import store

    monkeypatch.setattr(store, "shipped", lambda name: None)


async def test_every_label_of_the_settings_form_ends_before_its_value(tiny_db):
    from textual.widgets import Input, Label

    app = make_app(tiny_db, cache_masked=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, FormDialog))
        await pilot.pause()
        rows = list(app.screen.query(".field-row"))
        assert any(row.id == "row-cache_masked" for row in rows)
        for row in rows:
            label, field = row.query_one(Label), row.query_one(Input)
            text = str(label.render())
            assert len(text) <= label.content_region.width, text  # never cut
            assert label.region.right < field.region.x, text      # a gap: "masks: yes/no  yes", not "(yes/no)yes"
        assert app.screen.query_one("#field-cache_masked", Input).value == "yes"


async def test_ctrl_c_says_in_words_how_to_quit(tiny_db):
    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("ctrl+c")
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert "Press ctrl+q to quit the app" in messages, messages
        assert not any("[b]" in m for m in messages)
        assert app.is_running  # a hint, not a quit


async def test_the_inspector_lists_no_candidate_of_probability_zero(tiny_db):
    app = make_app(tiny_db, top_k=2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.press("i")
        await pilot.pause()
        info = g.inspected()
        assert len(info["top"]) == 5 and sum(p == 0 for _, p in info["top"]) == 3  # recorded: 5, top-k kept 2
        line = str(g.query_one("#gen-inspect-line").render())
        listed = line.split("top: ", 1)[1].split(" · ")
        assert len(listed) == 2 and all(float(entry.rsplit(" ", 1)[1]) > 0 for entry in listed), line


async def test_space_on_a_finished_run_plays_its_frames_again_without_sampling(tiny_db):
    from dbert_tui.widgets.generate.canvas import final_of

    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        for layout in ("stable", "free"):
            first = g.run
            await pilot.press("space")
            await wait_for(pilot, lambda: g.run is not first and finished(app)(), what=f"the replay ({layout})")
            again = g.run
            assert again.source is not None  # the recorded frames, not a new sampling run
            assert [r.frame.step for r in again.frames] == [r.frame.step for r in first.frames]
            assert all((a.frame.ids == b.frame.ids).all() for a, b in zip(again.frames, first.frames))
            assert (final_of(again, g.controls.stable) is not None) == (layout == "stable")  # stable from the start
            await pilot.press("w")  # the free layout next: a replay all the same


@pytest.mark.parametrize("size", [SIZE, (60, 18), (120, 36)])
async def test_notifications_stand_above_the_control_bar(tiny_db, size):
    """At 80x24 a notification covered the control bar (and the settings a key had just changed)."""
    from textual.widgets._toast import Toast

    app = make_app(tiny_db)
    async with app.run_test(size=size, notifications=True) as pilot:
        g = app.generate_screen
        await wait_for(pilot, finished(app))
        app.notify("a notification long enough to wrap onto a second line of its toast, at least", title="note")
        await pilot.pause(0.2)
        toasts = [t.region for t in g.query(Toast)]
        bottom = [w.region for w in (g.query_one("#gen-strip"), g.controls, g.query_one("#gen-keys")) if w.display]
        assert toasts and bottom
        assert all(not t.overlaps(b) for t in toasts for b in bottom), (toasts, bottom)


async def test_a_shrunk_terminal_draws_the_text_afresh(tiny_db):
    """A tall terminal draws one sample double-spaced, its lines wrapped at that width; shrunk to
    80x24 it kept those lines and blank lines between them, each wrapped again."""
    from dbert_tui.widgets.generate.canvas import TokenView

    app = make_app(tiny_db, length=120)
    async with app.run_test(size=(160, 40)) as pilot:
        g = app.generate_screen
        await wait_for(pilot, finished(app))
        await pilot.pause(0.2)
        shown = lambda: str(g.canvas.query_one(TokenView).render())  # noqa: E731
        assert "\n\n" in shown()  # double-spaced on the tall screen
        await pilot.resize_terminal(*SIZE)
        await pilot.pause(0.5)
        assert "\n\n" not in shown(), shown()
