"""A run's batches side by side, each on its own share of the CPU's threads.

One batch on every thread leaves cores idle in the sampler's own work between the matrix products:
thin attention heads, the softmax, class sums, indexing and sorting of a few microseconds each,
which run on one thread or wait on each other. Two batches, each on one thread, fill each other's
gaps, and the products keep their rate: F.linear at the model's shapes ran 399-412 GFLOP/s as two
one-thread products of half the rows side by side against 326-399 as one two-thread product (six
rounds, 2-core AMD EPYC, Zen 4, bf16; docs/performance.md). Each batch also stops when its own rows
are done. Ten stories: 3.79 s against 4.77 s as one batch, 3.97 against 4.26 s an hour later
(medians of six interleaved runs each).

plan() splits n samples into batches; batch_seed() seeds batch k (batch 0 takes the run's seed, so
a run of one batch draws what it always drew); run() runs the batches and hands on_frame their
frames in the order one batch after another would: batch 0's as they come, each later batch's
when the one before it is done. The texts depend on the split, never on which batch ran first or
on how many threads each had (a one-thread and a two-thread product give the same bits here).
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch

from ..config import MAX_SEED

ON_CPU = 2  # batches unless told on a CPU: the split sets the texts, so it is the same on every CPU (measured on 2 cores)


def auto_workers(device: torch.device) -> int:
    """Batches side by side unless told: ON_CPU on a CPU, whatever its cores (so `--seed` gives the
    same texts on every CPU of one precision; one thread runs them in turn); 1 on a GPU, whose one
    big batch keeps it busy."""
    return ON_CPU if device.type == "cpu" else 1


# torch's thread count is the process's (this build: set in one thread, every other reads it), so runs
# side by side in several threads (a library calling generate from its own threads) must give back the
# count the process had when the first began, not the share a later one found
_SHARING = threading.Lock()  # guards the two below
_RUNS = 0  # runs with their batches side by side now
_THREADS = 0  # torch's threads before the first of them shared them out, given back when the last ends


def _threads() -> int:
    """torch's threads as the process has them, not as a run going on now has shared them out."""
    with _SHARING:
        return _THREADS if _RUNS else torch.get_num_threads()


@contextmanager
def _shared(workers: int) -> Iterator[int]:
    """torch's threads shared out among a run's batches (yields each one's share); the count the
    process had before is given back when the last such run ends, whichever thread ends last."""
    global _RUNS, _THREADS
    with _SHARING:
        if _RUNS == 0:
            _THREADS = torch.get_num_threads()
        _RUNS += 1
        each = max(1, _THREADS // workers)
        torch.set_num_threads(each)
    try:
        yield each
    finally:
        with _SHARING:
            _RUNS -= 1
            if _RUNS == 0:
                torch.set_num_threads(_THREADS)


def concurrency(workers: int) -> int:
    """How many of a run's batches run at once: workers, at most torch's threads (each batch gets
    one thread or more)."""
    return max(1, min(workers, _threads()))


def plan(n: int, batch_size: int, workers: int) -> list[int]:
    """The rows of each batch: as few batches of at most batch_size as hold n samples, made a
    multiple of workers (so that none waits on a last one alone) while each keeps a row, sizes
    as equal as they can be (the first ones one row larger)."""
    count = math.ceil(n / batch_size)
    if workers > 1:
        count = min(n, math.ceil(count / workers) * workers)
    each, extra = divmod(n, count)
    return [each + (k < extra) for k in range(count)]


def batch_seed(seed: int, k: int) -> int:
    """The seed of batch k of a run seeded seed: seed itself for batch 0, for each later batch
    another seed `--seed` takes (a batch can be drawn again alone: `--n <its rows> --seed <this> --workers 1`)."""
    return seed if k == 0 else (seed * 6364136223846793005 + k * 1442695040888963407) % (MAX_SEED + 1)


class _Cancelled(Exception):
    """Raised inside a batch when the run stops (another batch failed, on_frame raised, Ctrl-C)."""


class _Finished:
    """A batch's end: its result."""

    def __init__(self, value):
        self.value = value


def run(jobs: list[Callable], workers: int, on_frame: Callable | None = None,
        keep: Callable | None = None) -> list:
    """jobs[k](emit) runs batch k, calls emit(frame) after each of its steps and returns its
    result; returns the results in order. workers > 1 runs that many at once in threads, each
    with torch's threads shared out among them (restored after); on_frame sees the frames, from
    this thread, in the order of jobs run one after another: a batch's frames as they come while
    every batch before it has ended, and of the frames a later batch makes before then, the
    ones keep(frame) is true for (default: all; they wait in memory, a story's canvas each, so a
    caller that needs only some says which). Without on_frame no frame is kept. An exception in
    a job or in on_frame stops the others at their next frame and is raised here."""
    emit_all = on_frame or (lambda frame: None)
    if workers <= 1 or len(jobs) <= 1:
        return [job(emit_all) for job in jobs]
    workers = min(workers, len(jobs))
    if on_frame is None:
        keep = _none
    with _shared(workers) as each:
        return _side_by_side(jobs, workers, each, emit_all, keep)


def _none(frame) -> bool:
    return False


def _side_by_side(jobs: list[Callable], workers: int, each: int, emit_all: Callable,
                  keep: Callable | None = None) -> list:
    """run()'s work with the threads shared out: `workers` threads of `each` torch threads; a
    frame of a batch that is not yet the one shown is dropped unless keep(frame) (None: kept)."""
    shown = [0]  # the batch whose frames go to emit_all as they come (read by the batch threads)
    events: queue.Queue = queue.Queue()
    stop = threading.Event()

    def batch(k: int) -> None:
        torch.set_num_threads(each)  # again in this thread, for a runtime that keeps the count per thread

        def emit(frame) -> None:
            if stop.is_set():
                raise _Cancelled
            if keep is None or k <= shown[0] or keep(frame):  # a frame that would wait and is not asked for: dropped
                events.put((k, frame))

        try:
            events.put((k, _Finished(jobs[k](emit))))
        except _Cancelled:
            events.put((k, _Finished(None)))
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            events.put((k, e))

    results: list = [None] * len(jobs)
    waiting: list[list] = [[] for _ in jobs]
    current = finished = 0
    failure: BaseException | None = None
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dbert-batch")
    try:
        for k in range(len(jobs)):
            pool.submit(batch, k)
        while finished < len(jobs):
            try:
                k, item = events.get(timeout=0.2)  # a timeout, so that Ctrl-C reaches this thread
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                finished += 1
                failure = failure or item
                stop.set()
                continue
            finished += isinstance(item, _Finished)
            waiting[k].append(item)
            while failure is None and current < len(jobs) and waiting[current]:
                got = waiting[current].pop(0)
                if isinstance(got, _Finished):
                    results[current] = got.value
                    current += 1
                    shown[0] = current
                else:
                    emit_all(got)
    finally:
        stop.set()  # a no-op after a clean run; else the batches still going stop at their next frame
        pool.shutdown(wait=True)
    if failure is not None:
        raise failure
    return results
