"""The player: the runs' workers, their frames as they arrive, playback, and the status line.

`Player` is the status line under the header (`#gen-status`) and what drives it: it starts one
sampling worker per side of the session (a sampler, or a replay's recorded frames played
through the same gate), or the infill worker that draws and ranks every length of a
[MASK*A-B] prompt; it records each frame on the UI thread and tells the screen (RunAdvanced,
InfillChosen), which draws. Play / pause, one step, scrubbing and going live act on the
session's playbacks (runs.Playback).
"""

from __future__ import annotations

import itertools
from functools import partial

from rich.text import Text
from textual import on
from textual.widgets import Static
from textual.worker import Worker, WorkerState, get_current_worker

from ...runs import Playback, Run, produce
from ...forms import SIDES
from ...messages import FrameReady, InfillChosen, InfillReady, RunAdvanced, RunFailed, RunFinished
from ...render import progress_line
from ...workers import ReportWorkerErrors, one_line


class Player(ReportWorkerErrors, Static):
    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.infilling = 0                      # the token of the infill being computed (0: none)
        self._infill_tokens = itertools.count(1)
        self.ranking: list = []                 # the last infill's candidates, best first
        self._runs: dict[Worker, int] = {}      # each running worker's run id (0: an infill)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A worker's failure is the app's notification (ReportWorkerErrors' handler, which Textual
        calls too), and its run's end: the screen gets a RunFailed and goes back to a usable state."""
        if event.state in (WorkerState.SUCCESS, WorkerState.CANCELLED, WorkerState.ERROR):
            run_id = self._runs.pop(event.worker, None)
            if event.state == WorkerState.ERROR and run_id is not None:
                assert event.worker.error is not None  # Textual records a worker's error before its ERROR state
                self.post_message(RunFailed(run_id, one_line(event.worker.error)))

    @property
    def playbacks(self) -> list[Playback]:
        return self.app.session.playbacks

    # ------------------------------------------------------------------ workers
    def cancel(self, side: int | None = None) -> None:
        """Stop the worker of one side (None: both)."""
        for i in (0, 1) if side is None else (side,):
            self.workers.cancel_group(self, f"sample-{i}")

    def start(self, playbacks: list[Playback], db) -> None:
        """A worker per playback (a sampler, or a replay's recorded frames)."""
        self.infilling = 0
        if len(playbacks) == 1:
            self.cancel(1)
        for i, pb in enumerate(playbacks):
            worker: Worker = self.run_worker(partial(self._sample, pb.run, db), name="sampling", group=f"sample-{i}",
                                     exclusive=True, thread=True, exit_on_error=False)
            self._runs[worker] = pb.run.id

    def _sample(self, run: Run, db) -> None:
        """(worker thread) Compute the run's frames and post each one; then say it finished."""
        worker = get_current_worker()
        index = itertools.count()
        if produce(run, db, lambda: worker.is_cancelled,
                   lambda rec: self.post_message(FrameReady(run.id, next(index), rec))):
            self.post_message(RunFinished(run.id))

    @on(FrameReady)
    def _frame_ready(self, message: FrameReady) -> None:
        pb = self.app.session.playback_of(message.run_id)
        if pb is not None:
            pb.run.record(message.rec)
            self.post_message(RunAdvanced(message.run_id))

    @on(RunFinished)
    def _run_finished(self, message: RunFinished) -> None:
        pb = self.app.session.playback_of(message.run_id)
        if pb is not None:
            pb.run.finished = True
            self.post_message(RunAdvanced(message.run_id, finished=True))

    # ------------------------------------------------------------------ infill of unknown length
    def start_infill(self, cfg, db) -> None:
        """A prompt with [MASK*A-B]: every length drawn and ranked (dbert_core.sampling.infill) in a
        worker; the screen then plays the winner's batch (InfillChosen)."""
        self.cancel()
        token = self.infilling = next(self._infill_tokens)
        worker: Worker = self.run_worker(partial(self._infill, token, cfg, db), name="infill", group="sample-0",
                                 exclusive=True, thread=True, exit_on_error=False)
        self._runs[worker] = 0

    def _infill(self, token: int, cfg, db) -> None:
        """(worker thread) The infill's candidates, posted when all are ranked."""
        from dbert_core.sampling.infill import infill

        from ...runs import TOPK

        worker = get_current_worker()

        class Cancelled(Exception):
            pass

        def check(_frame) -> None:
            if worker.is_cancelled:
                raise Cancelled

        keep: dict = {}
        try:
            got = infill(db, cfg, on_frame=check, keep=keep, topk=TOPK)
        except Cancelled:
            return
        self.post_message(InfillReady(token, got, keep))

    @on(InfillReady)
    def _infill_ready(self, message: InfillReady) -> None:
        if message.token != self.infilling or not message.candidates:
            return
        from dbert_core.sampling.infill import variants
        from dbert_core.sampling.trajectory import reveal_order

        from ...runs import compact

        self.infilling = 0
        self.ranking = message.candidates
        best = message.candidates[0]
        frames = [compact(f) for f in message.keep[best.lengths]]
        template = dict(variants(self.app.session.settings.prompt))[best.lengths]
        lines = [f"#{i + 1} {c.score:.3f} nats/token, {'+'.join(map(str, c.lengths))} token(s)"
                 for i, c in enumerate(message.candidates[:3])]
        self.app.notify(f"infill: {len(message.candidates)} candidates ranked by ELBO per token; shown: the best\n"
                        + "\n".join(lines), title="infill", timeout=10)
        self.post_message(InfillChosen(frames, reveal_order(frames), template, best.row))

    # ------------------------------------------------------------------ playback
    def finished(self) -> bool:
        return all(pb.run.finished for pb in self.playbacks)

    def toggle(self) -> None:
        """Play / pause every side (live again)."""
        playing = not self.playbacks[0].run.playing
        for pb in self.playbacks:
            pb.run.set_playing(playing)
            pb.live()

    def step(self) -> None:
        """One reverse step (pauses first); while scrubbing, one recorded step forward."""
        for pb in self.playbacks:
            pb.step()

    def scrub(self, delta: int) -> None:
        for pb in self.playbacks:
            pb.scrub(delta)

    def scrub_to(self, index: int) -> None:
        for pb in self.playbacks:
            pb.scrub_to(index)

    def live(self) -> None:
        for pb in self.playbacks:
            pb.live()

    def space_label(self) -> str:
        """What Space does now: Pause, Play or Replay."""
        if not self.playbacks:
            return "Play/Pause"
        if self.finished():
            return "Replay"
        return "Pause" if self.playbacks[0].run.playing else "Play"

    # ------------------------------------------------------------------ the status line
    def show_status(self, db, mode: str, below: list[int], inspecting: Text | None, prefix: Text) -> None:
        """The run's progress (or the infill's, or the comparison's), the cards below the grid's
        fold (`below`), and the editor's part: `inspecting` replaces the progress, `prefix` leads it."""
        session = self.app.session
        text = Text()
        if self.infilling:
            text.append("infill", style="bold magenta")
            text.append(" · drawing every length of the [MASK*A-B] span, ranking by ELBO per token…", style="dim")
        elif session.run is None or db is None:
            text.append("no run", style="dim")
        elif mode == "compare":
            seeds = {pb.run.settings.seed for pb in self.playbacks}
            text.append("compare A | B: separate draws", style="bold")  # a seed does not hold a draw across settings
            text.append(f", seed {'/'.join(map(str, sorted(seeds)))} · keys change {SIDES[session.side]}"
                        " (Tab: switch) · c: end")
        else:
            pb = self.playbacks[0]
            rec = pb.shown()
            n, selected = pb.run.settings.n, session.selected
            if n > 1:
                text.append(f"sample {selected + 1}/{n} · " if mode == "single" else f"{n} samples · ", style="bold")
            if below:  # early in the line: it must not be cut off on a narrow terminal
                text.append(f"#{below[0] + 1}{'' if len(below) == 1 else f'-#{below[-1] + 1}'} below (↓) · ",
                            style="bold yellow")
            if inspecting is not None:
                text.append_text(inspecting)
            elif rec is None and pb.run.failed:
                text.append(f"step 0/{pb.run.settings.steps} · failed (Space or r: again)", style="bold red")
            elif rec is None:
                text.append(f"step 0/{pb.run.settings.steps} · starting", style="dim")
            else:
                text.append_text(prefix)
                text.append_text(progress_line(pb, rec, selected if mode == "single" and n > 1 else None,
                                               not self.app.deterministic, room=self.content_size.width - text.cell_len))
        self.update(text)
