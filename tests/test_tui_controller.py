"""The Generate screen's state without Textual (dbert_tui.controller): control steps, runs,
their gate and their playback, and the session (both sides of a comparison, the grid, the keys)."""

from __future__ import annotations

import threading
import time

import pytest

from dbert_core.errors import DbertError
from dbert_core.sampling.sample import resolve
from dbert_tui.controller import (GRID_N, TEMPERATURES, TOP_KS, Session, Settings, compare_partner, differences, next_in,
                                  steps_by, temperature_by)
from dbert_tui.runs import Playback, Recorded, Run, produce


def test_control_steps():
    assert [steps_by(128, 0.5, 256), steps_by(128, 2, 256), steps_by(200, 2, 256)] == [64, 256, 256]
    assert steps_by(1, 0.5, 256) == 1 and steps_by(3, 0.5, 256) == 2
    assert temperature_by(1.0, 1) == 1.1 and temperature_by(1.0, -1) == 0.9
    assert temperature_by(0.7, -1) == 0.5 and temperature_by(3.0, 1) == 3.75 and temperature_by(4.5, 1) == 5.0
    assert temperature_by(0.1, -1) == 0.0 and temperature_by(0.06, -1) == 0.0 and temperature_by(0.0, -1) == 0.0
    assert temperature_by(0.0, 1) == 0.1 and TEMPERATURES[0] == 0.0  # the first rung: greedy
    assert temperature_by(0.95, 1) == 1.0 and temperature_by(0.95, -1) == 0.9  # off the ladder: the next rung
    assert all(temperature_by(t, 1) > t for t in TEMPERATURES)
    assert next_in(TOP_KS, 30) == 100 and next_in(TOP_KS, 100) == 0 and next_in(TOP_KS, 7) == 0
    assert next_in(["a", "b"], None) == "a"


def test_compare_partner_and_differences():
    s = Settings(steps=128, temperature=0.8, seed=5)
    b = compare_partner(s, T=2048)
    assert (b.steps, b.temperature, b.seed) == (16, 0.8, 5)
    assert compare_partner(Settings(steps=8), T=2048).steps == 64
    assert compare_partner(Settings(steps=8), T=32).steps == 32
    assert differences(s, b) == {"steps"}
    assert differences(s, s) == set()


def _run(frames: int, **kw) -> Run:
    run = Run(1, Settings(**kw))
    run.frames = [Recorded(frame=f"frame {i}", order=None, seconds=0.0) for i in range(frames)]
    return run


def test_playback_scrub_step_and_state():
    pb = Playback(_run(5))
    assert pb.shown().frame == "frame 4" and pb.state() == "playing" and not pb.scrubbing
    pb.scrub(-2)
    assert pb.view == 2 and pb.shown().frame == "frame 2" and pb.state() == "scrub 3/5 (End: live)"
    pb.scrub(-10)
    assert pb.view == 0
    pb.step()  # while scrubbing: one recorded frame forward, no new frame asked for
    assert pb.view == 1 and pb.run.step_budget == 0 and pb.run.playing
    pb.scrub(10)
    assert pb.view is None  # reaching the newest frame follows the run again
    pb.step()  # live: pause and ask the worker for exactly one frame
    assert not pb.run.playing and pb.run.step_budget == 1 and pb.state() == "paused (Space: play)"
    pb.scrub_to(3)
    assert pb.view == 3
    pb.live()
    assert pb.view is None
    assert pb.toggle_play() and pb.run.playing
    pb.run.finished = True
    assert pb.state() == "done (Space: replay)" and not pb.toggle_play()  # the caller restarts a finished run
    pb.step()
    assert pb.run.step_budget == 1  # nothing more to compute after the end
    empty = Playback(_run(0))
    empty.scrub(-1)
    empty.scrub_to(3)
    assert empty.shown() is None and empty.view is None


def test_the_gate_lets_through_steps_and_play_and_stops_on_cancel():
    run = _run(0)
    run.set_playing(False)
    run.allow_step()
    assert run.wait_turn(lambda: False, pace_s=10.0)  # a single step passes at once, whatever the pace
    cancelled = threading.Event()
    result = []
    t = threading.Thread(target=lambda: result.append(run.wait_turn(cancelled.is_set, pace_s=0.0)))
    t.start()
    time.sleep(0.1)
    assert t.is_alive()  # paused, no step budget: the worker waits
    cancelled.set()
    t.join(2)
    assert result == [False]
    run.set_playing(True)
    start = time.monotonic()
    assert run.wait_turn(lambda: False, pace_s=0.15)
    assert time.monotonic() - start >= 0.15  # playing: at the pace


def test_produce_emits_every_frame_and_same_seed_same_frames(tiny_db):
    s = resolve(Settings(steps=12, length=10, seed=4, pace_ms=0, sampler="ancestral"), tiny_db)
    runs = [Run(i, s) for i in (1, 2)]
    got = [[], []]
    for run, out in zip(runs, got):
        assert produce(run, tiny_db, lambda: False, out.append) is True
    assert len(got[0]) == 12 and got[0][-1].frame.done and not got[0][-1].frame.masked.any()
    assert all((a.frame.ids == b.frame.ids).all() for a, b in zip(*got))
    order = got[0][-1].order
    for rec in got[0]:  # the shared reveal order is exact wherever a frame shows a token
        assert ((order[0] <= rec.frame.step) | rec.frame.masked[0]).all()
    calls = []
    assert produce(Run(3, s), tiny_db, lambda: len(calls) >= 3, calls.append) is False
    assert len(calls) == 3


@pytest.mark.parametrize("sampler", ["ancestral", "first-hitting"])
def test_produce_waits_at_the_gate(tiny_db, sampler):
    run = Run(1, resolve(Settings(steps=16, length=8, seed=0, pace_ms=0, sampler=sampler), tiny_db))
    run.set_playing(False)
    out, stop = [], threading.Event()
    t = threading.Thread(target=produce, args=(run, tiny_db, stop.is_set, out.append))
    t.start()
    time.sleep(0.3)
    assert len(out) == 1  # the first frame, then it waits
    run.allow_step()
    run.allow_step()
    deadline = time.monotonic() + 10
    while len(out) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(out) == 3
    stop.set()
    t.join(5)
    assert not t.is_alive()


# ------------------------------------------------------------------------------ the session
def _session(tiny_db, **kw) -> Session:
    s = Session(Settings(**kw))
    assert s.fit(tiny_db) == []
    s.new_runs(tiny_db)
    return s


def test_session_fits_a_checkpoint(tiny_db):
    T, max_len = tiny_db.schedule.T, tiny_db.model.max_length
    s = Session(Settings(steps=10 * T))
    s.fit(tiny_db)
    assert s.settings.steps == T and s.settings.length == tiny_db.meta["seq_len"] and s.auto_length
    s = Session(Settings(length=10 * max_len))
    s.fit(tiny_db)
    assert s.settings.length == max_len and not s.auto_length


def test_session_origins_say_which_values_the_checkpoint_chose(tiny_db):
    """The control bar's marks (Session.origins, by the engine's decoding_origins): a value the
    session follows from the checkpoint's recommendation is the checkpoint's; one a key or the
    comparison changed, or one given at the start, is set; the rest are the general defaults."""
    had, sampling = "sampling" in tiny_db.meta, tiny_db.meta.setdefault("sampling", {})
    try:
        sampling["decoding"] = {"steps": 12, "top_p": 0.93}
        s = Session(Settings(top_k=5, sampler="ancestral"))
        s.fit(tiny_db)
        assert (s.settings.steps, s.settings.top_p, s.settings.top_k) == (12, 0.93, 5)
        origins = s.origins(tiny_db)
        assert {f: origins[f] for f in ("steps", "temperature", "top_k", "top_p")} == \
            {"steps": "checkpoint", "temperature": "default", "top_k": "set", "top_p": "checkpoint"}
        s.start_compare(tiny_db.schedule.T)  # side B: an eighth of the steps, the keys change it
        assert s.origins(tiny_db)["steps"] == "set" and s.origins(tiny_db)["top_p"] == "checkpoint"
        s.switch_side()
        assert s.origins(tiny_db)["steps"] == "checkpoint"
        s.steps(tiny_db, 2)  # a key: the value is yours now
        assert s.settings.steps == 24 and s.origins(tiny_db)["steps"] == "set"
    finally:
        sampling.pop("decoding", None)
        if not had:  # the session's shared checkpoint as it was
            tiny_db.meta.pop("sampling")


def test_session_control_keys_change_the_active_side_and_keep_the_seed(tiny_db):
    s = _session(tiny_db, steps=128, seed=3, sampler="ancestral", top_k=30)
    T = tiny_db.schedule.T
    s.steps(tiny_db, 2)
    s.steps(tiny_db, 2)
    s.temperature(tiny_db, -1)
    s.top_k(tiny_db)
    s.top_p(tiny_db)
    s.next_sampler(tiny_db)
    a = s.settings
    assert (a.steps, a.temperature, a.top_k, a.top_p, a.sampler, a.seed) == (T, 0.9, 100, 0.95, "cached", 3)
    with pytest.raises(DbertError):  # a value the checkpoint cannot take changes nothing
        s.change(tiny_db, steps=T + 1)
    assert s.settings == a
    first = s.run
    runs = s.new_runs(tiny_db)
    assert len(runs) == 1 and runs[0].run.id == first.id + 1 and runs[0].run.settings.seed == 3
    assert runs[0].run.settings.sampler == "cached" and s.shown_settings() == runs[0].run.settings
    s.new_seed()
    assert s.settings.seed != 3


def test_session_compare_two_sides(tiny_db):
    s = _session(tiny_db, steps=128, seed=3)
    a_playback = s.playbacks[0]
    s.start_compare(tiny_db.schedule.T)
    assert s.view_mode() == "compare" and s.side == 1 and s.partner.steps == 16 and s.partner.seed == 3
    s.temperature(tiny_db, 1)  # the keys change side B
    assert (s.settings.temperature, s.partner.temperature) == (1.0, 1.1)
    a, b = s.new_runs(tiny_db)
    assert a.run.settings.seed == b.run.settings.seed == 3 and (a.run.settings.steps, b.run.settings.steps) == (128, 16)
    assert s.shown_settings() is b.run.settings and s.active_playback() is b
    assert s.switch_side() and s.side == 0
    s.steps(tiny_db, 0.5)
    assert (s.settings.steps, s.partner.steps) == (64, 16)
    s.set_all(prompt="once upon a")
    s.new_seed()
    assert s.settings.prompt == s.partner.prompt == "once upon a" and s.settings.seed == s.partner.seed != 3
    s.new_runs(tiny_db)
    kept = s.playbacks[0]
    assert kept is not a_playback
    s.end_compare()
    assert s.partner is None and s.side == 0 and s.playbacks == [kept] and s.view_mode() == "single"
    assert not s.switch_side()


def test_session_grid_selection_and_zoom(tiny_db):
    s = _session(tiny_db)
    assert s.view_mode() == "single" and not s.select(1) and not s.zoom()
    s.toggle_grid()
    assert s.settings.n == GRID_N
    s.new_runs(tiny_db)
    assert s.view_mode() == "grid"
    assert s.select(-1) and s.selected == GRID_N - 1  # wraps
    assert s.zoom() and s.view_mode() == "single" and s.zoomed
    assert not s.zoom()  # only from the grid
    assert s.unzoom() and s.view_mode() == "grid" and not s.unzoom()
    assert s.zoom(2) and s.selected == 2
    s.change(tiny_db, n=3)
    s.new_runs(tiny_db)
    assert s.selected == 2 and s.zoomed
    s.toggle_grid()
    assert s.settings.n == 1 and not s.zoomed
    s.new_runs(tiny_db)
    assert s.selected == 0
    s.toggle_grid()
    assert s.settings.n == 3  # the number last used


def test_new_runs_play_the_first_is_watchable_and_new_seeds_differ_per_start(tiny_db):
    from dbert_tui.controller import FIRST_RUN_S

    assert FIRST_RUN_S >= 5
    s = Session(Settings(steps=16, length=8, pace_ms=1, seed=0, sampler="first-hitting"), first_run_s=1.0)
    s.fit(tiny_db)
    first = s.new_runs(tiny_db)[0].run
    assert first.min_seconds == 1.0
    start = time.monotonic()
    assert produce(first, tiny_db, lambda: False, lambda rec: None)
    assert time.monotonic() - start >= 0.95  # first-hitting: fewer frames than steps, still the whole second
    first.set_playing(False)  # paused, then a control key or another checkpoint: the new run plays
    second = s.new_runs(tiny_db)[0]
    assert second.run.playing and second.state() == "playing" and second.run.min_seconds == 0
    start = time.monotonic()
    assert produce(second.run, tiny_db, lambda: False, lambda rec: None)
    assert time.monotonic() - start < 0.9  # later runs at the settings' pace
    fastest = Session(Settings(steps=16, pace_ms=0))
    fastest.fit(tiny_db)
    assert fastest.new_runs(tiny_db)[0].run.min_seconds == 0  # --pace-ms 0: flat out, the first run too
    # `n` draws from the OS: two starts of the app do not walk the same seeds (12345, 1406932606, ...)
    a, b = Session(Settings(seed=0)), Session(Settings(seed=0))
    seeds_a, seeds_b = [], []
    for _ in range(3):
        a.new_seed()
        b.new_seed()
        seeds_a.append(a.settings.seed)
        seeds_b.append(b.settings.seed)
    assert seeds_a != seeds_b and 0 not in seeds_a and len(set(seeds_a)) == 3
    import random

    seeded = Session(Settings(seed=0), rng=random.Random(1))
    seeded.new_seed()
    again = Session(Settings(seed=0), rng=random.Random(1))
    again.new_seed()
    assert seeded.settings.seed == again.settings.seed  # tests can pin it


def test_a_branch_names_the_sampler_it_runs(tiny_db):
    """After a refill (a branch) the control bar read `m auto`: the run's settings kept the
    session's unresolved sampler, though the sampler is the one the run before it used."""
    import torch

    s = _session(tiny_db, steps=8, length=8)
    assert s.settings.sampler is None and s.shown_settings().sampler is not None
    template = torch.full((8,), tiny_db.model.mask_id, dtype=torch.long)
    pb = s.edit_run(template, 2, seed=1)
    assert pb.run.settings.sampler == resolve(s.settings, tiny_db).sampler and s.shown_settings() is pb.run.settings
    assert s.settings.sampler is None  # the session still follows the checkpoint's choice
