"""The request queue of `dbert serve`: one worker thread owns the model, jobs wait in a bounded queue.

A Job is one prompt's SampleConfig (n samples). The HTTP layer (serve.py) submits jobs and
receives their events through the `notify` callback each job carries (called from the worker
thread; it must be thread-safe):

    ("step", step, steps, texts)   after each reverse step (event), only for jobs that asked:
                                   the partially filled lines, [MASK] where still masked
    ("settled", rows)              for streamed jobs, when a long story's window is finished: per
                                   sample the ids no later step changes (None: no more than before)
    ("done", texts, rows, stats)   texts as `dbert sample` prints them, rows the final ids
    ("error", kind, message)       kind: cancelled, timeout, shutdown or engine

A job runs through the very function `dbert sample` uses, `sample.generate(db, cfg)`, so a
seeded request gives the CLI's text. Unseeded jobs whose settings agree (length, steps,
temperature, top-k, top-p, sampler and its parameters, repeat block, precision) may share one sampler call
(`sample.frames` with one template per row, decoded by `DBert.decode` as generate() does): a
seeded job never does, because the rows of a batch share one random stream. Between reverse
steps the worker checks each job's cancel flag (a client that went away) and deadline
(the per-request time limit), so neither waits for the rest of the run.

This module imports the engine; the engine never imports it.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch

from ..config import SampleConfig
from ..sampling.base import last_frame
from ..sampling.blocks import is_story_model
from ..sampling.sample import frames, generate, parse_prompt, prompt_words

PER_JOB = ("n", "prompt", "batch_size")  # the SampleConfig fields jobs sharing a sampler call may differ in


class QueueFull(Exception):
    """More jobs waiting than the queue holds (HTTP 429)."""


class ShuttingDown(Exception):
    """The server is stopping and takes no new work (HTTP 503)."""


class _Stop(Exception):
    """Raised between reverse steps to abandon a job: args (kind, message)."""


@dataclass(eq=False)
class Job:
    cfg: SampleConfig                    # resolved for the model (SampleConfig.resolved): one prompt, n samples
    notify: Callable[[tuple], object]    # receives the job's events, from the worker thread
    deadline: float = float("inf")       # time.monotonic() past which the job is abandoned
    want_steps: bool = False             # send a "step" event after every reverse step
    want_settled: bool = False           # send a "settled" event as a story's windows finish (a stream)
    cased: bool = True                   # DBert.decode's cased (`dbert sample --lowercase`: False)
    cancelled: threading.Event = field(default_factory=threading.Event)
    verbatim: dict | None = field(default=None, init=False)  # the prompt's words as typed, by position
    reason: tuple = field(default=("cancelled", "the request was cancelled"), init=False)

    def bind(self, db) -> "Job":
        """Read the prompt's own words (sample.prompt_words, as generate() does)."""
        self.verbatim = prompt_words(db, self.cfg.prompt) if self.cfg.prompt else None
        return self

    def line(self, db, ids, start: int = 0, stop: int | None = None) -> str:
        """Tokens start:stop of a row written as generate() writes the whole row (DBert.decode,
        the prompt's words as typed)."""
        stop = len(ids) if stop is None else stop
        words = {k - start: v for k, v in (self.verbatim or {}).items() if start <= k < stop}
        return db.decode(ids[start:stop], cased=self.cased, verbatim=words or None)

    def cancel(self, kind: str = "cancelled", message: str = "the request was cancelled") -> None:
        """Stop at the next reverse step with ("error", kind, message) (a no-op once finished)."""
        if not self.cancelled.is_set():
            self.reason = (kind, message)
            self.cancelled.set()

    @property
    def batch_key(self) -> tuple | None:
        """Settings that must agree to share a sampler call; None: this job runs alone."""
        c = self.cfg
        if c.seed is not None:
            return None
        # every other field of the resolved config, so a setting the request may give never mixes two jobs' runs
        return tuple((f.name, tuple(sorted(v.items())) if isinstance(v := getattr(c, f.name), dict) else v)
                     for f in fields(c) if f.name not in PER_JOB)

    def check(self) -> None:
        """Between steps: stop if the client went away or the time limit passed."""
        if self.cancelled.is_set():
            raise _Stop(*self.reason)
        if time.monotonic() > self.deadline:
            raise _Stop("timeout", "the request ran past the server's time limit (--timeout)")

    def send(self, event: tuple) -> None:
        if event[0] not in ("step", "settled"):
            self.cancelled.set()  # finished: a later cancel() changes nothing
        try:
            self.notify(event)
        except RuntimeError:  # the receiving event loop is closed (shutdown): nobody is listening
            pass


class Scheduler:
    """A bounded queue of Jobs and the one thread that runs them on the model.

    max_queue   jobs waiting (not yet running) at most; submit raises QueueFull beyond
    batching    let compatible unseeded jobs share one sampler call
    max_rows    rows (samples) per shared call
    threads     torch intra-op threads of the worker (default: the caller's setting)
    """

    def __init__(self, db, max_queue: int = 64, batching: bool = True, max_rows: int = 32,
                 threads: int | None = None):
        self.db = db
        self.max_queue, self.batching, self.max_rows = max_queue, batching, max_rows
        self._threads = threads or torch.get_num_threads()
        self._pending: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._busy = False
        self._running: list[Job] = []
        self.calls = 0          # sampler runs so far
        self.shared = 0         # of which several jobs shared one call
        self.stopped: list[tuple[str, int, int]] = []  # (kind, step, steps) of each job abandoned mid-run
        self._thread = threading.Thread(target=self._run, name="dbert-serve-worker", daemon=True)

    # ------------------------------------------------------------------ the HTTP side
    def start(self) -> None:
        self._thread.start()

    def submit(self, jobs: list[Job]) -> None:
        """Queue the jobs of one request, all or none."""
        with self._cv:
            if self._closed:
                raise ShuttingDown("the server is shutting down")
            if len(self._pending) + len(jobs) > self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} waiting); retry later")
            self._pending.extend(job.bind(self.db) for job in jobs)
            self._cv.notify()

    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def busy(self) -> bool:
        return self._busy

    def stop_all(self, message: str = "the server is shutting down") -> None:
        """Take no more jobs; fail the queued ones and stop the running ones at their next step."""
        with self._cv:
            self._closed = True
            queued, running, self._pending = list(self._pending), list(self._running), collections.deque()
            self._cv.notify_all()
        for job in running:
            job.cancel("shutdown", message)
        for job in queued:
            job.send(("error", "shutdown", message))

    def refuse(self) -> None:
        """Take no more jobs (the ones queued still run)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def close(self, timeout: float | None = 30.0) -> None:
        """Take no more jobs; queued ones get a shutdown error; the running one stops at its next
        step if its request was cancelled, else finishes. Waits for the worker thread."""
        with self._cv:
            self._closed = True
            left, self._pending = list(self._pending), collections.deque()
            self._cv.notify_all()
        for job in left:
            job.send(("error", "shutdown", "the server is shutting down"))
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the worker
    def _run(self) -> None:
        torch.set_num_threads(self._threads)  # the same float sums as the caller's thread: same samples
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if self._closed and not self._pending:
                    return
                group = self._take()
                self._busy = bool(group)
                self._running = group
            try:
                if len(group) == 1:
                    self._alone(group[0])
                elif group:
                    self._together(group)
            except Exception as e:  # an engine failure fails these requests, never the worker
                for job in group:
                    job.send(("error", "engine", str(e) or type(e).__name__))
            finally:
                with self._cv:
                    self._busy = False
                    self._running = []

    def _take(self) -> list[Job]:
        """The next job and, with batching, the queued jobs that can share its call (under the lock)."""
        while self._pending:
            first = self._pending.popleft()
            try:
                first.check()
            except _Stop as e:
                first.send(("error", *e.args))
                continue
            group, rows = [first], first.cfg.n
            key = first.batch_key if self.batching and not is_story_model(self.db) else None  # a story runs alone
            if key is not None:
                for job in list(self._pending):
                    if job.batch_key == key and rows + job.cfg.n <= self.max_rows and not job.cancelled.is_set():
                        self._pending.remove(job)
                        group.append(job)
                        rows += job.cfg.n
            return group
        return []

    def _alone(self, job: Job) -> None:
        """One job through generate(), exactly as `dbert sample` runs it."""
        db, n, length, steps = self.db, job.cfg.n, job.cfg.length, job.cfg.steps
        assert length is not None and steps is not None  # a job's cfg is resolved
        finals: list[torch.Tensor] = []  # the last frame's ids of each batch generate() runs
        start = 1 if is_story_model(db) else 0  # a story's canvas opens with the [SEP] no text shows
        partial = None
        reached = [0]
        sent = [0] * n  # the settled columns already sent, per sample
        end = db.tokenizer.sep_token_id

        def on_frame(f) -> None:
            reached[0] = f.step
            job.check()
            lo = sum(len(ids) for ids in finals)
            if f.done:
                finals.append(f.ids[:, start:])
            elif job.want_settled and f.settled is not None:
                rows = [None] * n
                for b, cols in enumerate(f.settled.tolist()):
                    if cols > max(sent[lo + b], start):
                        sent[lo + b] = cols
                        ids = f.ids[b, start:cols].tolist()
                        rows[lo + b] = ids[:ids.index(end)] if end in ids else ids  # the story, not its padding
                if any(r is not None for r in rows):
                    job.send(("settled", rows))
            if partial is not None:
                partial[lo:lo + len(f.ids)] = [job.line(db, row[start:]) for row in f.ids]
                job.send(("step", f.step, f.steps, list(partial)))

        try:
            job.check()
            if job.want_steps:
                partial = [job.line(db, parse_prompt(db, job.cfg.prompt or "", length))] * n
            texts, stats = generate(db, job.cfg, on_frame=on_frame, cased=job.cased)
        except _Stop as e:
            self.stopped.append((e.args[0], reached[0], steps))
            job.send(("error", *e.args))
            return
        self.calls += 1
        job.send(("done", texts, torch.cat(finals), stats))

    def _together(self, group: list[Job]) -> None:
        """Compatible unseeded jobs in one frames() call, one template per row."""
        db = self.db
        templates = []
        for j in group:
            assert j.cfg.length is not None  # a job's cfg is resolved
            templates.append(parse_prompt(db, j.cfg.prompt or "", j.cfg.length).unsqueeze(0).repeat(j.cfg.n, 1))
        template = torch.cat(templates)
        bounds, lo = [], 0
        for j in group:
            bounds.append((lo, lo + j.cfg.n))
            lo += j.cfg.n
        cfg = replace(group[0].cfg, n=lo, prompt=None, batch_size=max(lo, 1))
        gen = torch.Generator().manual_seed(torch.seed() % 2**63)  # as generate() does without a seed
        live = set(range(len(group)))
        start = time.perf_counter()
        last = None
        try:
            for last in frames(db, cfg, generator=gen, template=template):
                for i in list(live):
                    try:
                        group[i].check()
                    except _Stop as e:
                        self.stopped.append((e.args[0], last.step, last.steps))
                        group[i].send(("error", *e.args))
                        live.discard(i)
                if not live:
                    return
                for i in live:
                    if group[i].want_steps:
                        a, b = bounds[i]
                        group[i].send(("step", last.step, last.steps, [group[i].line(db, row) for row in last.ids[a:b]]))
        except Exception as e:  # an engine failure fails these requests, never the worker
            for i in live:
                group[i].send(("error", "engine", str(e) or type(e).__name__))
            return
        self.calls += 1
        self.shared += 1
        last = last_frame(last)
        seconds = round(time.perf_counter() - start, 3)
        for i in live:
            a, b = bounds[i]
            stats = {"nfe": last.nfe, "rows": last.rows, "gflop": float(f"{last.flops / 1e9:.4g}"), "seconds": seconds,
                     "samples": b - a, "steps": cfg.steps, "shared_with": len(group) - 1}
            group[i].send(("done", [group[i].line(db, row) for row in last.ids[a:b]], last.ids[a:b], stats))
