"""The Generate screen's state, without Textual: settings, runs and their playback.

- `Settings`: what a run uses (`dbert sample`'s SampleConfig with the TUI's overrides by name),
  and the control steps the keys take (`steps_by`, `temperature_by`, `next_in`).
- `Run`: one sampling run: its settings, the frames recorded so far, and the gate its worker
  waits at between frames (play, pause, single steps). Only the UI thread appends frames (the
  worker posts each one in a message); the gate is the only state both threads touch, under
  the run's lock.
- `Playback`: a run as a pane shows it: which frame is on screen (live or scrubbed), and what
  play, pause, step and scrub do.
- `produce`: the worker's loop, computing a run's frames and handing each to a callback.

The screen owns the Playbacks and draws them; nothing here imports Textual, so these rules are
unit-tested directly (tests/test_tui_controller.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from dbert_core.config import SampleConfig

TEMPERATURES = (0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0)
TOP_KS = (0, 5, 10, 30, 100)           # `k` cycles through these (0: off)
TOP_PS = (1.0, 0.95, 0.9, 0.8, 0.5)    # `o` cycles through these (1: off)
GRID_N = 6                             # samples `g` starts when there is one
MAX_N = 16


@dataclass
class Settings(SampleConfig):
    """What a sampling run uses: `dbert sample`'s defaults (config.SampleConfig), except where
    watching differs from printing, overridden here by name. The Generate screen edits these."""

    n: int = 1          # one sample to watch (the CLI prints 10)
    seed: int = 0       # fixed, so a changed control shows its effect on the same draw
    prompt: str = ""
    pace_ms: int = 40   # minimum time per shown step while playing (0: as fast as the model goes)


def steps_by(steps: int, factor: float, T: int) -> int:
    """`[` halves and `]` doubles the step budget, within 1..T."""
    return max(1, min(T, round(steps * factor)))


def temperature_by(temperature: float, direction: int) -> float:
    """`+` / `-`: the next temperature up or down the TEMPERATURES ladder (x1.25 / x0.8 past its
    ends), within 0.05..5."""
    if direction > 0:
        value = next((v for v in TEMPERATURES if v > temperature + 1e-9), temperature * 1.25)
    else:
        value = next((v for v in reversed(TEMPERATURES) if v < temperature - 1e-9), temperature * 0.8)
    return round(max(0.05, min(5.0, value)), 3)


def next_in(values, current):
    """The value after `current` in `values`, cycling (the first one when `current` is not there)."""
    values = list(values)
    return values[(values.index(current) + 1) % len(values)] if current in values else values[0]


def compare_partner(s: Settings, T: int) -> Settings:
    """The second side of a comparison: the same settings and seed with an eighth of the steps
    (128 -> 16), or eight times as many when there are fewer than 16."""
    steps = s.steps // 8 if s.steps >= 16 else min(T, s.steps * 8)
    return replace(s, steps=max(1, steps))


def differences(a: SampleConfig, b: SampleConfig) -> set[str]:
    """Names of the fields where two settings differ."""
    return {name for name in vars(a) if getattr(a, name) != getattr(b, name)}


def expected_masked(db, steps: int) -> list[float]:
    """Expected masked fraction after k reverse steps, k = 0..steps (1.0 at k=0, 0.0 at the end),
    weighting each token's a_t(v) by its corpus frequency."""
    import torch

    from dbert_core.schedule import step_grid

    grid = torch.tensor(step_grid(db.schedule.T, steps), dtype=torch.float32)  # T ... 0
    counts = db.counts.to(torch.float64)
    alpha = db.schedule.alpha_vocab(grid).to(torch.float64)  # (K, V) or (K, 1)
    visible = (alpha * counts).sum(-1) / counts.sum() if alpha.shape[-1] > 1 else alpha[:, 0]
    return [float(1.0 - v) for v in visible]


# ------------------------------------------------------------------------------ runs
@dataclass
class Recorded:
    """One recorded reverse step. `order` is shared by all frames of a run: a position's entry
    is written once, when it is revealed, so for any frame it is exact wherever that frame
    shows a token (positions revealed later are still masked there)."""

    frame: object          # dbert_core.sample.Frame, stored compactly (int32 ids, float32 confidence)
    order: object          # (B, L) int32: step at which each position was revealed (0: given / not yet)
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
    lock: threading.Lock = field(default_factory=threading.Lock)

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


def produce(run: Run, db, is_cancelled: Callable[[], bool], emit: Callable[[Recorded], None]) -> bool:
    """The worker's loop: compute `run`'s frames (dbert_core.sample.frames, seeded by its
    settings) and hand each to `emit`, waiting at the run's gate between frames. True when the
    run reached its last frame, False when cancelled first."""
    import torch

    from dbert_core.sample import frames

    s = run.settings
    gen = torch.Generator().manual_seed(s.seed)
    order = torch.zeros((s.n, s.length), dtype=torch.int32)
    stream = frames(db, s, generator=gen)
    spent = 0.0
    while True:
        if is_cancelled():
            return False
        t0 = time.perf_counter()
        frame = next(stream, None)
        spent += time.perf_counter() - t0
        if frame is None:
            return True
        order[frame.revealed] = frame.step
        emit(Recorded(compact(frame), order, spent))
        if frame.done:
            return True
        if not run.wait_turn(is_cancelled, s.pace_ms / 1000):
            return False


class Playback:
    """A run as a pane shows it. `view` is the index of the frame on screen, None to follow the
    newest one."""

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
        current = last if self.view is None else self.view
        target = max(0, min(last, current + delta))
        self.view = None if target == last else target

    def scrub_to(self, index: int) -> None:
        if self.frames:
            self.view = max(0, min(index, len(self.frames) - 1))

    def live(self) -> None:
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
            self.scrub(1)
            return
        self.run.allow_step()
        self.view = None

    def state(self) -> str:
        """'scrub i/n (End: live)', 'done', 'playing' or 'paused'."""
        if self.scrubbing:
            return f"scrub {self.view + 1}/{len(self.frames)} (End: live)"
        if self.run.finished:
            return "done"
        return "playing" if self.run.playing else "paused"
