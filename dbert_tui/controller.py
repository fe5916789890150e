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
- `Session`: everything the Generate screen shows: the settings of side A (and side B while
  comparing), the side the control keys change, the current runs' playbacks, the selected
  sample and whether it is shown large; every control key and view key is a method here.

The App owns the one Session (DbertApp.session); the Generate screen reads it from there, starts a
worker per playback and draws. Nothing here imports Textual, so these rules are unit-tested
directly (tests/test_tui_controller.py).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from dbert_core.config import DECODING, SampleConfig

TEMPERATURES = (0.0, 0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0)
TOP_KS = (0, 5, 10, 30, 100)           # `k` cycles through these (0: off)
TOP_PS = (1.0, 0.95, 0.9, 0.8, 0.5)    # `o` cycles through these (1: off)
GRID_N = 6                             # samples `g` starts when there is one
MAX_N = 16
FIRST_RUN_S = 8.0                      # the app's first run lasts at least this long, so a newcomer sees it fill in
TOPK = 5                               # candidates recorded at each reveal (the token inspector shows them)
BRANCHES = 6                           # refills `b` draws at once


@dataclass
class Settings(SampleConfig):
    """What a sampling run uses: `dbert sample`'s defaults (config.SampleConfig), except where
    watching differs from printing, overridden here by name. The Generate screen edits these."""

    n: int = 1          # one sample to watch (the CLI prints 10)
    seed: int = 0       # fixed: the same settings give the same story again (a changed one is a new draw)
    prompt: str = ""
    pace_ms: int = 40   # minimum time per shown step while playing (0: as fast as the model goes)


def steps_by(steps: int, factor: float, T: int) -> int:
    """`[` halves and `]` doubles the step budget, within 1..T."""
    return max(1, min(T, round(steps * factor)))


def temperature_by(temperature: float, direction: int) -> float:
    """`+` / `-`: the next temperature up or down the TEMPERATURES ladder (x1.25 / x0.8 past its
    top), within 0..5; its first rung, 0, is greedy decoding."""
    if direction > 0:
        value = next((v for v in TEMPERATURES if v > temperature + 1e-9), temperature * 1.25)
    else:
        value = next((v for v in reversed(TEMPERATURES) if v < temperature - 1e-9), 0.0)
    return round(max(0.0, min(5.0, value)), 3)


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
    """Names of the fields where two settings differ (a strategy's parameters count as its sampler's)."""
    out = {name for name in vars(a) if getattr(a, name) != getattr(b, name)}
    return out | {"sampler"} if "params" in out else out


# ------------------------------------------------------------------------------ runs
@dataclass
class Recorded:
    """One recorded reverse step. `order` is shared by all frames of a run: a position's entry is written once,
    when it is revealed, so it is exact wherever a frame shows a token (later ones are still masked there)."""

    frame: object          # dbert_core.sampling.sample.Frame, stored compactly (int32 ids, float32 confidence)
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
    min_seconds: float = 0.0           # played, the run lasts at least this long (the app's first: FIRST_RUN_S)
    lock: threading.Lock = field(default_factory=threading.Lock)
    template: object = None            # (n, L) or (L,) token ids with [MASK]s to fill (a refill), else the prompt's
    source: list | None = None         # a replay: the frames to play back (compact Frames) instead of sampling
    source_order: object = None        # the replay's reveal order (B, L)
    source_prompt: str | None = None   # the template its positions follow, when not settings.prompt (an infill)
    failed: str = ""                   # why its worker failed (one line), if it did: the run is over

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


def produce(run: Run, db, is_cancelled: Callable[[], bool], emit: Callable[[Recorded], None]) -> bool:
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
        if run.source is None:
            if order is None:  # the canvas's shape: (n, length), a story's (n, 1 + length)
                order = torch.zeros(frame.ids.shape, dtype=torch.int32)
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
        if self.scrubbing:
            return f"scrub {self.view + 1}/{len(self.frames)} (End: live)"
        if self.run.failed:
            return "failed (Space or r: again)"
        if self.run.finished:
            return "done (Space: replay)"
        return "playing" if self.run.playing else "paused (Space: play)"


class Session:
    """The Generate screen's state. Methods that take a `db` check the result against that
    checkpoint and raise DbertError (leaving the state as it was) when it cannot take it; the
    screen restarts the runs (`new_runs`) after any change of settings."""

    def __init__(self, settings: Settings | None = None, rng: random.Random | None = None,
                 first_run_s: float = FIRST_RUN_S) -> None:
        self.settings = settings or Settings()    # side A: the run, or the left side of a comparison
        self.rng = rng or random.Random()         # `n`: seeded from the OS, so each start of the app differs
        self.first_run_s = first_run_s            # the least time the app's first run takes (pace > 0)
        self.partner: Settings | None = None      # side B while comparing
        self.side = 0                             # the side the control keys change (0: A, 1: B)
        self.playbacks: list[Playback] = []       # one per side, of the current runs
        self.selected = 0                         # the sample shown large / highlighted in the grid
        self.zoomed = False                       # the selected sample large instead of the grid
        self.grid_n = self.settings.n if self.settings.n > 1 else GRID_N
        self.auto_length = self.settings.length is None  # follow each checkpoint's training length
        self.auto_decoding = {f for f in DECODING if getattr(self.settings, f) is None}  # followed until set
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ what is shown
    @property
    def run(self) -> Run | None:
        """Side A's run (the only one unless comparing)."""
        return self.playbacks[0].run if self.playbacks else None

    @property
    def active(self) -> Settings:
        """The settings the control keys change."""
        return self.partner if self.side == 1 and self.partner is not None else self.settings

    def active_playback(self) -> Playback | None:
        return self.playbacks[min(self.side, len(self.playbacks) - 1)] if self.playbacks else None

    def shown_settings(self) -> Settings:
        """What the control bar shows: the active side's run as resolved (sampler and length filled in)."""
        pb = self.active_playback()
        return pb.run.settings if pb is not None and len(self.playbacks) > self.side else self.active

    def sides(self) -> list[Settings]:
        return [self.settings] + ([self.partner] if self.partner is not None else [])

    def view_mode(self) -> str:
        """'compare', 'grid' (several samples) or 'single' (one sample large, or the only one)."""
        if self.partner is not None:
            return "compare"
        n = self.run.settings.n if self.run is not None else self.settings.n
        return "grid" if n > 1 and not self.zoomed else "single"

    def playback_of(self, run_id: int) -> Playback | None:
        return next((pb for pb in self.playbacks if pb.run.id == run_id), None)

    # ------------------------------------------------------------------ runs
    def fit(self, db) -> list[str]:
        """Fit every side to a (new) checkpoint: its recommended decoding where automatic, steps within T, its
        length when automatic (else within its maximum), a sampler it allows. Returns what the user should hear."""
        from dbert_core.errors import DbertError
        from dbert_core.sampling.settings import (MAX_STORY, default_decoding, default_length, default_sampler,
                                                  is_story_model, resolve)

        notes, rec = [], default_decoding(db)

        def fitted(s: Settings) -> Settings:
            s = replace(s, **{f: rec[f] for f in DECODING if f in self.auto_decoding or getattr(s, f) is None})
            s.steps = max(1, min(db.schedule.T, s.steps))
            if self.auto_length or s.length is None:
                s.length = default_length(db)
            s.length = max(1, min(MAX_STORY if is_story_model(db) else db.model.max_length, s.length))
            try:
                resolve(s, db)
            except DbertError as e:  # e.g. `cached` on a time-conditioned model: use the default
                s.sampler = default_sampler(db)
                notes.append(f"{e}; using {s.sampler}")
            return s

        self.settings = fitted(self.settings)
        if self.partner is not None:
            self.partner = fitted(self.partner)
        return notes

    def new_runs(self, db) -> list[Playback]:
        """Fresh runs of every side (each with its own seed setting, by default the same), still
        to be started; they play, whether or not the previous ones were paused. The app's very
        first run lasts first_run_s at least (unless the pace is 0: as fast as it goes), its
        tokens revealed evenly over that time. Raises DbertError if a side's settings do not suit db (the current runs stay)."""
        from dbert_core.sampling.sample import resolve

        resolved = [resolve(s, db) for s in self.sides()]
        first = self.run is None
        self.playbacks = []
        for s in resolved:
            least = self.first_run_s if first and s.pace_ms > 0 else 0.0
            self.playbacks.append(Playback(Run(next(self._ids), s, playing=True, min_seconds=least)))
        n = resolved[0].n
        self.selected = min(self.selected, n - 1)
        self.zoomed = self.zoomed and n > 1
        return self.playbacks

    def replay_runs(self, replay) -> list[Playback]:
        """A run that plays a replay's recorded frames (dbert_core.sampling.replay.Replay) at this
        session's pace; its settings are the file's, as far as they are Settings'."""
        import dataclasses

        names = {f.name for f in dataclasses.fields(Settings)}
        known = {k: v for k, v in replay.settings.items() if k in names and k != "pace_ms"}
        s = replace(Settings(), **known, pace_ms=self.settings.pace_ms)
        self.settings = s
        run = Run(next(self._ids), s, playing=True, source=replay.frames, source_order=replay.order)
        self.playbacks = [Playback(run)]
        self.selected = min(self.selected, replay.frames[-1].ids.shape[0] - 1)
        return self.playbacks

    def edit_run(self, template, n: int, seed: int) -> Playback:
        """A refill: the [MASK]s of `template` (L,) token ids filled given every other token, n times (a branch: n > 1),
        with side A's settings, the shown run's sampler and `seed` (each refill its own: a second one draws anew)."""
        from dbert_core.config import MAX_SEED

        s = replace(self.settings, n=n, length=int(template.shape[-1]), prompt="", seed=seed % (MAX_SEED + 1),
                    sampler=self.settings.sampler or self.shown_settings().sampler)  # the bar names it, not `auto`
        run = Run(next(self._ids), s, playing=True, template=template)
        self.partner, self.side = None, 0
        self.playbacks = [Playback(run)]
        self.selected = 0
        self.zoomed = False
        return self.playbacks[0]

    def show_version(self, run: Run, row: int) -> None:
        """Show a version (a finished run and its chosen row) large."""
        self.playbacks = [Playback(run)]
        self.selected = row
        self.zoomed = run.settings.n > 1

    # ------------------------------------------------------------------ settings
    def change(self, db, **fields) -> None:
        """Set fields of the active side's settings, checked against db (a changed DECODING field stops following)."""
        new = replace(self.active, **fields)
        if db is not None:
            from dbert_core.sampling.sample import resolve

            resolve(new, db)
        else:
            new.validate()
        self.auto_decoding -= {f for f in DECODING if f in fields and fields[f] != getattr(self.active, f)}
        if self.side == 1 and self.partner is not None:
            self.partner = new
        else:
            self.settings = new

    def set_all(self, **fields) -> None:
        """Set fields on every side (the seed, the prompt, the number of samples)."""
        self.settings = replace(self.settings, **fields)
        if self.partner is not None:
            self.partner = replace(self.partner, **fields)

    def steps(self, db, factor: float) -> None:
        self.change(db, steps=steps_by(self.active.steps, factor, db.schedule.T))

    def temperature(self, db, direction: int) -> None:
        self.change(db, temperature=temperature_by(self.active.temperature, direction))

    def top_k(self, db) -> None:
        self.change(db, top_k=next_in(TOP_KS, self.active.top_k))

    def top_p(self, db) -> None:
        self.change(db, top_p=next_in(TOP_PS, self.active.top_p))

    def next_sampler(self, db) -> None:
        """The next strategy (config.STRATEGIES order: the exact samplers, then the heuristic ones)
        the checkpoint allows, after the one the run uses, at its default parameters."""
        from dbert_core.config import STRATEGIES
        from dbert_core.errors import DbertError
        from dbert_core.sampling.sample import resolve

        def allowed(name: str) -> bool:
            try:
                resolve(replace(self.active, sampler=name, params=None), db)
                return True
            except DbertError:
                return False

        self.change(db, sampler=next_in([s for s in STRATEGIES if allowed(s)], self.shown_settings().sampler),
                    params=None)

    def new_seed(self) -> None:
        """Another seed (random, a different one at each start of the app), the same for both sides."""
        from dbert_core.config import MAX_SEED

        seed = self.settings.seed
        while seed == self.settings.seed:
            seed = self.rng.randrange(min(MAX_SEED, 2**31 - 1) + 1)
        self.set_all(seed=seed)

    # ------------------------------------------------------------------ views
    def toggle_grid(self) -> None:
        """One sample <-> several (the number last used, GRID_N at first), on both sides."""
        n = self.settings.n
        if n > 1:
            self.grid_n = n
        self.set_all(n=1 if n > 1 else self.grid_n)
        self.zoomed = False

    def select(self, delta: int) -> bool:
        """Select another sample (wrapping); False when there is one."""
        n = self.run.settings.n if self.run is not None else self.settings.n
        if n <= 1:
            return False
        self.selected = (self.selected + delta) % n
        return True

    def zoom(self, index: int | None = None) -> bool:
        """Show the selected sample (or sample `index`) large; False unless the grid is shown."""
        if self.view_mode() != "grid":
            return False
        if index is not None:
            self.selected = index
        self.zoomed = True
        return True

    def unzoom(self) -> bool:
        was, self.zoomed = self.zoomed, False
        return was

    def start_compare(self, T: int) -> None:
        """Side B: side A's settings and seed with an eighth (or 8x) of the steps; the keys change B."""
        self.partner = compare_partner(self.settings, T)
        self.side = 1

    def end_compare(self) -> None:
        """Side A goes on alone (its run is kept)."""
        self.partner, self.side = None, 0
        self.playbacks = self.playbacks[:1]

    def switch_side(self) -> bool:
        if self.partner is None:
            return False
        self.side = 1 - self.side
        return True
