"""The TUI and broken checkpoints: a checkpoint that fails to load is never remembered, a bad
remembered one is ignored at start-up with a notice, and a broken store entry is a row."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from dbert_core.storage import store
from dbert_tui.app import create_app
from dbert_tui.controller import Settings
from helpers import SIZE, finished, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _without_shipped(monkeypatch):
    monkeypatch.setattr(store, "shipped", lambda name: None)


def entry(tiny_checkpoint, name, **meta_changes):
    path = store.store_dir() / name
    shutil.copytree(tiny_checkpoint, path)
    meta = json.loads((path / "dbert.json").read_text())
    meta.update(meta_changes)
    (path / "dbert.json").write_text(json.dumps(meta))
    return path


def remembered():
    f = store.home() / "tui.json"
    return json.loads(f.read_text()).get("checkpoint") if f.is_file() else None


def messages(app) -> list[str]:
    return [n.message for n in app._notifications]


def settings():
    return Settings(steps=8, length=8, pace_ms=0)


async def test_a_checkpoint_that_fails_to_load_is_never_remembered(tiny_checkpoint):
    good = entry(tiny_checkpoint, "good")
    bad = entry(tiny_checkpoint, "bad", seq_len="abc")
    app = create_app(checkpoint=str(good), settings=settings(), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="the good checkpoint's run")
        assert remembered() == str(good.resolve())
        app.use_checkpoint(bad)
        await wait_for(pilot, lambda: app.current_mode == "checkpoints", what="the failed load")
        await pilot.pause(0.2)
        assert any("seq_len" in m for m in messages(app))
    assert remembered() == str(good.resolve())
    app = create_app(checkpoint=str(bad), settings=settings(), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.current_mode == "checkpoints", what="the failed load")
    assert remembered() == str(good.resolve())


async def test_a_db_the_screen_cannot_use_is_not_remembered(tiny_db, tiny_checkpoint):
    odd = copy.copy(tiny_db)
    odd.meta = {**tiny_db.meta, "seq_len": "abc"}  # what a loader without the schema would hand over
    app = create_app(checkpoint=str(tiny_checkpoint), loader=lambda p: odd, deterministic=True,
                     settings=Settings(steps=8, length=None, pace_ms=0))  # the length comes from seq_len
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.current_mode == "checkpoints", what="the refusal")
        await pilot.pause(0.2)
        assert any("could not use" in m for m in messages(app)), messages(app)
    assert app.return_code in (0, None) and remembered() is None


@pytest.mark.parametrize("state", [
    {"checkpoint": "{bad}"}, {"checkpoint": 42}, {"checkpoint": ["x"]}, {"checkpoint": "/no/such/dir"}, "garbage{",
], ids=["bad-meta", "number", "list", "missing", "not-json"])
async def test_a_bad_remembered_checkpoint_is_ignored_at_start(tiny_checkpoint, state):
    good = entry(tiny_checkpoint, "good")
    bad = entry(tiny_checkpoint, "bad", **{"lambda": "abc"})
    text = state if isinstance(state, str) else json.dumps(state).replace("{bad}", str(bad))
    store.home().mkdir(parents=True, exist_ok=True)
    (store.home() / "tui.json").write_text(text)
    app = create_app(settings=settings(), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="a run of the store's good checkpoint")
        assert app.db.path == good
        if state != "garbage{":  # an unreadable tui.json is simply a fresh start
            assert any("ignoring" in m for m in messages(app)), messages(app)
    assert remembered() == str(good.resolve())


async def test_broken_store_entries_are_rows_not_crashes(tiny_checkpoint):
    good = entry(tiny_checkpoint, "good")
    entry(tiny_checkpoint, "bad", **{"lambda": "abc"})
    app = create_app(checkpoint=str(good), settings=settings(), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("2")
        await wait_for(pilot, lambda: app.current_mode == "checkpoints")
        ck = app.checkpoints_screen
        assert [e.name for e in ck.rows] == ["bad", "good"]
        assert "lambda" in ck.rows[0].broken
        ck.query_one("#ck-table").move_cursor(row=0)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert any("broken" in m and "lambda" in m for m in messages(app)), messages(app)
        assert app.db.path == good
    assert remembered() == str(good.resolve())
