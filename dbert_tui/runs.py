"""A sampling run in the TUI, without Textual: its frames, the gate its worker waits at, and how a pane plays it.

- `Run`: one sampling run: its settings, the frames recorded so far, and the gate its worker
  waits at between frames (play, pause, single steps). Only the UI thread appends frames (the
  worker posts each one in a message); the gate is the only state both threads touch, under
  the run's lock.
- `Playback`: a run as a pane shows it: which frame is on screen (live or scrubbed), and what
  play, pause, step and scrub do.
- `produce`: the worker's loop, computing a run's frames and handing each to a callback.

The Generate screen's Session (controller.py) makes the runs; these rules are unit-tested directly
(tests/test_tui_controller.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch
    from dbert_core.sampling.base import Frame

    from .controller import Settings

TOPK = 5                               # candidates recorded at each reveal (the token inspector shows them)


@dataclass
class Recorded:
    """One recorded reverse step. `order` is shared by all frames of a run: a position's entry is written once,
    when it is revealed, so it is exact wherever a frame shows a token (later ones are still masked there)."""

    frame: Frame           # dbert_core.sampling.base.Frame, stored compactly (int32 ids, float32 confidence)
    order: torch.Tensor    # (B, L) int32: step at which each position was revealed (0: given / not yet)
    seconds: float         # model time spent so far in this run


def compact(frame):
    """A Frame with smaller dtypes: a long run keeps every step for scrubbing and export."""
    import torch

    return replace(frame, ids=frame.ids.to(torch.int32), confidence=frame.confidence.to(torch.float32))


@dataclass
class Run:
    """One sampling run: its settings and every frame recorded so far."""

    id: int
    settings: Settings
    frames: list[Recorded] = field(default_factory=list)
    finished: bool = False
    playing: bool = True
    step_budget: int = 0
    min_seconds: float = 0.0           # played, the run lasts at least this long (the app's first: FIRST_RUN_S)
    lock: threading.Lock = field(default_factory=threading.Lock)
    template: torch.Tensor | None = None           # (n, L) or (L,) token ids with [MASK]s to fill (a refill), else the prompt's
    source: list | None = None          # a replay: the frames to play back (compact Frames) instead of sampling
    source_order: torch.Tensor | None = None       # the replay's reveal order (B, L)
    source_prompt: str | None = None   # the template its positions follow, when not settings.prompt (an infill)
    words: dict[int, str] | None = None  # a refill: the prompt's words its template kept, by position (drawn as typed)
    failed: str = ""                   # why its worker failed (one line), if it did: the run is over

    @property
    def per_window(self) -> int:
        """The run's step budget (a story's or a long refill's: per window): its settings are resolved
        (Session.new_runs) or a replay's, whose steps Session.replay_runs fills in."""
        assert self.settings.steps is not None
        return self.settings.steps

    def hold(self, is_cancelled: Callable[[], bool], started: float, done: float) -> None:
        """While playing a run with min_seconds, keep a frame that reveals a fraction `done` of the tokens until
        `done * min_seconds` after `started` (time.monotonic()): the reveal spreads evenly over the run however
        many frames the sampler makes (first-hitting makes fewer than its steps). Paused, nothing is held."""
        target = started + self.min_seconds * done
        while self.min_seconds and self.playing and time.monotonic() < target and not is_cancelled():
            time.sleep(0.01)

    def record(self, rec: Recorded) -> None:
        """A frame from the worker (called on the UI thread, in the order the worker made them)."""
        self.frames.append(rec)

    def wait_turn(self, is_cancelled: Callable[[], bool], pace_s: float) -> bool:
        """Block the worker until the next step may be computed; False when cancelled."""
        deadline = time.monotonic() + pace_s
        while True:
            if is_cancelled():
                return False
            with self.lock:
                if self.step_budget > 0:
                    self.step_budget -= 1
                    return True
                if self.playing and time.monotonic() >= deadline:
                    return True
            time.sleep(0.01)

    def set_playing(self, playing: bool) -> None:
        with self.lock:
            self.playing = playing

    def allow_step(self) -> None:
        """Pause, and let the worker compute exactly one more frame."""
        with self.lock:
            self.playing = False
            if not self.finished:
                self.step_budget += 1


def produce(run: Run, db, is_cancelled: Callable[[], bool], emit: Callable[[Recorded], object]) -> bool:
    """The worker's loop: compute `run`'s frames (dbert_core.sampling.sample.frames, seeded by its
    settings) and hand each to `emit`, waiting at the run's gate between frames. True when the
    run reached its last frame, False when cancelled first."""
    import torch

    from dbert_core.sampling.refill import refill_stream
    from dbert_core.sampling.sample import frames, is_story_model, story_stream

    s, order = run.settings, None
    gen = torch.Generator().manual_seed(s.seed)
    if run.source is not None:  # a replay: the recorded frames, through the same gate
        order, stream = run.source_order, iter(run.source)
    elif run.template is None and is_story_model(db):  # a story, window after window on one canvas
        stream = story_stream(db, s, gen, TOPK)
    elif run.template is not None:  # a refill: in windows the model's positions hold when the text is longer
        stream = refill_stream(db, s, gen, run.template, TOPK)
    else:
        stream = frames(db, s, generator=gen, topk=TOPK)
    spent, started = 0.0, time.monotonic()
    while True:
        if is_cancelled():
            return False
        t0 = time.perf_counter()
        frame = next(stream, None)
        spent += time.perf_counter() - t0
        if frame is None:
            return True
        if order is None:  # the canvas's shape: (n, length), a story's (n, 1 + length); a replay has its own
            order = torch.zeros(frame.ids.shape, dtype=torch.int32)
        if run.source is None:
            order[frame.revealed] = frame.step
        run.hold(is_cancelled, started, 1.0 - float(frame.masked.double().mean()))
        if is_cancelled():
            return False
        emit(Recorded(compact(frame), order, spent))
        if frame.done:
            return True
        if not run.wait_turn(is_cancelled, s.pace_ms / 1000):
            return False


class Playback:
    """A run as a pane shows it. `view` is the index of the frame on screen (None: follow the newest one)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.view: int | None = None

    @property
    def frames(self) -> list[Recorded]:
        return self.run.frames

    def shown(self) -> Recorded | None:
        """The frame on screen: the scrubbed one, or the newest."""
        if not self.frames:
            return None
        return self.frames[-1] if self.view is None else self.frames[min(self.view, len(self.frames) - 1)]

    @property
    def scrubbing(self) -> bool:
        return self.view is not None and self.view < len(self.frames) - 1

    def scrub(self, delta: int) -> None:
        """Move the shown frame by delta recorded frames; reaching the newest follows the run again."""
        if not self.frames:
            return
        last = len(self.frames) - 1
        target = max(0, min(last, (last if self.view is None else self.view) + delta))
        self.view = None if target == last else target

    def scrub_to(self, index: int) -> None:
        self.view = max(0, min(index, len(self.frames) - 1)) if self.frames else self.view

    def live(self) -> None:  # follow the newest frame
        self.view = None

    def toggle_play(self) -> bool:
        """Play or pause; False when the run is finished (the caller restarts it)."""
        if self.run.finished:
            return False
        self.run.set_playing(not self.run.playing)
        self.view = None
        return True

    def step(self) -> None:
        """One step forward: through the record while scrubbing, else one new frame (pausing first)."""
        if self.scrubbing:
            return self.scrub(1)
        self.run.allow_step()
        self.view = None

    def state(self) -> str:
        """'scrub i/n (End: live)', 'done (Space: replay)', 'playing' or 'paused (Space: play)'."""
        if self.scrubbing and self.view is not None:  # (scrubbing: a frame before the newest is in view)
            return f"scrub {self.view + 1}/{len(self.frames)} (End: live)"
        if self.run.failed:
            return "failed (Space or r: again)"
        if self.run.finished:
            return "done (Space: replay)"
        return "playing" if self.run.playing else "paused (Space: play)"
