"""The Generate screen's state without Textual (dbert_tui.controller): control steps, runs,
their gate and their playback."""

from __future__ import annotations

import threading
import time

import pytest

from dbert_tui.controller import (TEMPERATURES, TOP_KS, Playback, Recorded, Run, Settings, compare_partner,
                                  differences, next_in, produce, steps_by, temperature_by)


def test_control_steps():
    assert [steps_by(128, 0.5, 256), steps_by(128, 2, 256), steps_by(200, 2, 256)] == [64, 256, 256]
    assert steps_by(1, 0.5, 256) == 1 and steps_by(3, 0.5, 256) == 2
    assert temperature_by(1.0, 1) == 1.1 and temperature_by(1.0, -1) == 0.9
    assert temperature_by(0.7, -1) == 0.5 and temperature_by(3.0, 1) == 3.75 and temperature_by(4.5, 1) == 5.0
    assert temperature_by(0.1, -1) == 0.08 and temperature_by(0.06, -1) == 0.05
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
    assert not pb.run.playing and pb.run.step_budget == 1 and pb.state() == "paused"
    pb.scrub_to(3)
    assert pb.view == 3
    pb.live()
    assert pb.view is None
    assert pb.toggle_play() and pb.run.playing
    pb.run.finished = True
    assert pb.state() == "done" and not pb.toggle_play()  # the caller restarts a finished run
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
    s = Settings(steps=12, length=10, seed=4, pace_ms=0, sampler="ancestral").resolved(tiny_db)
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
    run = Run(1, Settings(steps=16, length=8, seed=0, pace_ms=0, sampler=sampler).resolved(tiny_db))
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
