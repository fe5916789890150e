"""The Generate screen's entropy panel (`h`): hidden at first, shown and hidden by its one key
(the help and the palette name it), its numbers the entropy of the frames' recorded top-k
candidates computed here by hand, following the frame drawn (scrubbed, paused, replayed), and
laid out without overlap from 60x18 to 120x36."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dbert_tui.app import create_app
from dbert_tui.controller import Settings
from dbert_tui.runs import TOPK
from dbert_tui.screens.help import key_rows
from helpers import SIZE, finished, wait_for

pytestmark = pytest.mark.anyio

FIXTURE = Path(__file__).parent / "fixtures" / "tiny"  # a committed tiny model: nothing trained here


@pytest.fixture(scope="module")
def db():
    from dbert_core.storage import checkpoint

    return checkpoint.load(FIXTURE)


def _app(db, **settings):
    defaults = dict(pace_ms=0, steps=16, length=24, sampler="ancestral")
    return create_app(checkpoint=db.path, loader=lambda p: db, settings=Settings(**{**defaults, **settings}),
                      deterministic=True)


def _screen(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def by_hand(frame) -> float | None:
    """The mean over the positions revealed at the frame's step of -sum p log p over their top-k."""
    rows, cols = frame.revealed.nonzero(as_tuple=True)
    terms = [-sum(p * math.log(p) for p in frame.top_probs[r, c].tolist() if p == p and p > 0)
             for r, c in zip(rows.tolist(), cols.tolist())]
    return sum(terms) / len(terms) if terms else None


def _expected(frames) -> list[tuple[int, float]]:
    return [(rec.frame.step, h) for rec in frames if (h := by_hand(rec.frame)) is not None]


def _same(points, want) -> bool:
    return [s for s, _ in points] == [s for s, _ in want] and \
        all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) for (_, a), (_, b) in zip(points, want))


async def test_its_key_shows_and_hides_it_and_the_help_and_palette_name_it(db):
    app = _app(db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        assert not g.entropy.display and "entropy of p'" not in _screen(app)  # hidden at first
        await pilot.press("h")
        await pilot.pause(0.1)
        assert g.entropy.display and f"entropy of p', top-{TOPK} (nats) · step 16/16: " in _screen(app)
        assert dict(key_rows(app, g))["h"] == f"Entropy panel: top-{TOPK} entropy of p' at each step's reveals"
        assert f"top-{TOPK} candidates' terms -p log p, not renormalised: a lower bound" in g.HELP
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        assert commands["Entropy panel"].help.endswith("a lower bound (h)")
        await pilot.press("h")
        await pilot.pause(0.1)
        assert not g.entropy.display and "entropy of p'" not in _screen(app)


async def test_its_numbers_are_the_entropy_of_the_frames_top_candidates(db):
    app = _app(db, top_k=0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.press("h")
        await pilot.pause(0.1)
        frames = g.run.frames
        want = _expected(frames)
        assert len(want) >= 8 and len({round(h, 3) for _, h in want}) > 1  # the steps differ: a real series
        assert _same(g.entropy.points, want), (g.entropy.points, want)
        last = by_hand(frames[-1].frame)
        value = "no reveal" if last is None else f"{last:.3f}"
        assert f"step 16/16: {value} · min {min(h for _, h in want):.3f} · max {max(h for _, h in want):.3f}" \
            in _screen(app)
        step, h = want[len(want) // 2]  # a step that revealed tokens, its number on screen
        back = len(frames) - 1 - next(i for i, rec in enumerate(frames) if rec.frame.step == step)
        await pilot.press(*["left"] * back)
        await pilot.pause(0.1)
        assert f"step {step}/16: {h:.3f} · " in _screen(app), _screen(app)


async def test_it_follows_the_frame_scrubbed_to_and_a_replay(db):
    app = _app(db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.press("h")
        first = list(g.run.frames)
        await pilot.press("left", "left", "left")
        await pilot.pause(0.1)
        at = first[-4].frame
        assert g.entropy.now[:2] == (at.step, 16) and _same(g.entropy.points, _expected(first[:-3]))
        assert f"step {at.step}/16: " in _screen(app)
        await pilot.press("end", "space")  # replay: the recorded frames again, from the first
        await wait_for(pilot, lambda: g.run.id == 2, what="the replay")
        await wait_for(pilot, finished(app), what="the replay's end")
        assert g.entropy.now[0] == 16 and _same(g.entropy.points, _expected(first))


async def test_it_follows_a_paused_run_step_by_step(db):
    app = _app(db, steps=64, pace_ms=150)
    async with app.run_test(size=SIZE) as pilot:
        g = app.generate_screen
        await pilot.press("h")
        await wait_for(pilot, lambda: g.run is not None and len(g.run.frames) >= 3, what="three frames")
        await pilot.press("space")
        await pilot.pause(0.3)
        paused = len(g.run.frames)
        await wait_for(pilot, lambda: g.drawn is g.run.frames[-1], what="the last frame drawn")
        assert g.entropy.now[0] == g.run.frames[-1].frame.step
        await pilot.press("full_stop")
        await wait_for(pilot, lambda: len(g.run.frames) == paused + 1 and g.drawn is g.run.frames[-1],
                       what="one step")
        assert g.entropy.now[0] == g.run.frames[-1].frame.step
        assert _same(g.entropy.points, _expected(g.run.frames))


async def test_it_takes_its_place_without_overlap_from_60x18_to_120x36(db):
    app = _app(db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        g = app.generate_screen
        await pilot.press("h")
        for size in ((80, 24), (120, 36), (60, 18), (80, 24)):
            await pilot.resize_terminal(*size)
            await pilot.pause(0.2)
            panel = g.entropy.region
            assert panel.height >= 3 and panel.right <= size[0] and panel.bottom <= size[1], (size, panel)
            parts = [w for w in g.children if w.display and w.region.height]
            for w in parts:
                if w is not g.entropy:
                    assert not w.region.overlaps(panel), (size, w.id, w.region, panel)
            assert "step 16/16: " in _screen(app), size
