"""The Generate screen's state, without Textual: settings, runs and their playback.

- `Settings`: what a run uses (`dbert sample`'s SampleConfig with the TUI's overrides by name),
  and the control steps the keys take (`steps_by`, `temperature_by`, `next_in`).
- the runs themselves (`Run`, `Playback`, the worker's loop `produce`) are runs.py's.
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
from dataclasses import dataclass, replace
from typing import Any

from dbert_core.config import DECODING, SampleConfig

from .runs import Playback, Run

TEMPERATURES = (0.0, 0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0)
TOP_KS = (0, 5, 10, 30, 100)           # `k` cycles through these (0: off)
TOP_PS = (1.0, 0.95, 0.9, 0.8, 0.5)    # `o` cycles through these (1: off)
GRID_N = 6                             # samples `g` starts when there is one
MAX_N = 16
FIRST_RUN_S = 8.0                      # the app's first run lasts at least this long, so a newcomer sees it fill in
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
    (128 -> 16), or eight times as many when there are fewer than 16 (s is fitted: Session.fit)."""
    assert s.steps is not None
    steps = s.steps // 8 if s.steps >= 16 else min(T, s.steps * 8)
    return replace(s, steps=max(1, steps))


def differences(a: SampleConfig, b: SampleConfig) -> set[str]:
    """Names of the fields where two settings differ (a strategy's parameters count as its sampler's)."""
    out = {name for name in vars(a) if getattr(a, name) != getattr(b, name)}
    return out | {"sampler"} if "params" in out else out


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

    def origins(self, db) -> dict[str, str]:
        """Where each decoding value the control bar shows comes from, as `dbert sample` resolves it
        (dbert_core.sampling.settings.decoding_origins): "checkpoint" (its dbert.json recommends it),
        "default" or "set". A value the session still follows from the checkpoint counts as unset."""
        from dbert_core.sampling.settings import decoding_origins, default_decoding

        shown, followed = self.shown_settings(), default_decoding(db)
        unset: dict[str, Any] = {f: None for f in self.auto_decoding if getattr(shown, f) == followed[f]}
        return decoding_origins(replace(shown, **unset), db)

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

        resolved: list[Settings] = [resolve(s, db) for s in self.sides()]  # type: ignore[misc]  # resolve keeps the class
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
        session's pace; its settings are the file's, as far as they are Settings' (its frames' step
        budget where the file gives no steps)."""
        import dataclasses

        names = {f.name for f in dataclasses.fields(Settings)}
        known = {k: v for k, v in replay.settings.items() if k in names and k != "pace_ms"}
        s = replace(Settings(), **known, pace_ms=self.settings.pace_ms)
        if s.steps is None:  # a file that does not say its settings: its frames' own step budget
            s.steps = replay.frames[-1].steps
        self.settings = s
        run = Run(next(self._ids), s, playing=True, source=replay.frames, source_order=replay.order)
        self.playbacks = [Playback(run)]
        self.selected = min(self.selected, replay.frames[-1].ids.shape[0] - 1)
        return self.playbacks

    def play_again(self, runs: list[Run]) -> list[Playback]:
        """Finished runs' recorded frames as new runs that play them again through the gate, each
        side (nothing is sampled; the final text is known)."""
        self.playbacks = [Playback(Run(next(self._ids), run.settings, playing=True, template=run.template, words=run.words,
                                       source=[rec.frame for rec in run.frames], source_order=run.frames[-1].order,
                                       source_prompt=run.source_prompt)) for run in runs]
        return self.playbacks

    def play_infill(self, frames: list, order, template: str, row: int) -> list[Playback]:
        """An infill's winner ([MASK*A-B]): its batch's recorded frames played through the gate on
        its own template, row `row` (the best candidate) shown large."""
        s = replace(self.settings, n=frames[-1].ids.shape[0], length=frames[-1].ids.shape[1])
        self.playbacks = [Playback(Run(next(self._ids), s, playing=True, source=frames, source_order=order,
                                       source_prompt=template))]
        self.selected, self.zoomed = row, s.n > 1
        return self.playbacks

    def drop_runs(self) -> None:
        """No run on screen and one side (an infill is being drawn and ranked)."""
        self.partner, self.side = None, 0
        self.playbacks = []

    def edit_run(self, template, n: int, seed: int, words: dict[int, str] | None = None) -> Playback:
        """A refill: the [MASK]s of `template` (L,) token ids filled given every other token, n times (a branch: n > 1),
        with side A's settings, the shown run's sampler and `seed` (each refill its own: a second one draws anew);
        words: the prompt's words the template keeps, by its positions (drawn as typed)."""
        from dbert_core.config import MAX_SEED

        s = replace(self.settings, n=n, length=int(template.shape[-1]), prompt="", seed=seed % (MAX_SEED + 1),
                    sampler=self.settings.sampler or self.shown_settings().sampler)  # the bar names it, not `auto`
        run = Run(next(self._ids), s, playing=True, template=template, words=words)
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
        if "length" in fields and fields["length"] != self.active.length:
            self.auto_length = False  # a length chosen: no longer each checkpoint's training length
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
        assert self.active.steps is not None  # fitted to db (fit)
        self.change(db, steps=steps_by(self.active.steps, factor, db.schedule.T))

    def temperature(self, db, direction: int) -> None:
        assert self.active.temperature is not None  # fitted to db (fit)
        self.change(db, temperature=temperature_by(self.active.temperature, direction))

    def top_k(self, db) -> None:
        self.change(db, top_k=next_in(TOP_KS, self.active.top_k))

    def top_p(self, db) -> None:
        self.change(db, top_p=next_in(TOP_PS, self.active.top_p))

    def next_sampler(self, db) -> None:
        """The next strategy (strategies.names() order: the exact samplers, the heuristic ones, then
        those registered since) the checkpoint allows, after the one the run uses, at its default parameters."""
        from dbert_core.errors import DbertError
        from dbert_core.strategies import names
        from dbert_core.sampling.sample import resolve

        def allowed(name: str) -> bool:
            try:
                resolve(replace(self.active, sampler=name, params=None), db)
                return True
            except DbertError:
                return False

        self.change(db, sampler=next_in([s for s in names() if allowed(s)], self.shown_settings().sampler),
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
