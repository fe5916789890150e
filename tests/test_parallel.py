"""Batches side by side (sampling/parallel.py): the split, the order frames arrive in, failures, and
that the texts depend on the split alone."""

import threading
import time

import pytest
from helpers import cli_words
import torch

from dbert_core.config import MAX_SEED
from dbert_core.errors import DbertError
from dbert_core.sampling import parallel
from dbert_core.sampling.sample import generate


@pytest.mark.parametrize("n,batch_size,workers", [(10, 32, 1), (10, 32, 2), (100, 32, 2), (100, 32, 4), (3, 32, 4),
                                                  (1, 32, 2), (65, 32, 1), (65, 32, 3), (7, 2, 2)])
def test_plan_holds_every_sample_in_a_multiple_of_the_workers(n, batch_size, workers):
    sizes = parallel.plan(n, batch_size, workers)
    assert sum(sizes) == n and all(1 <= s <= batch_size for s in sizes)
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert len(sizes) % workers == 0 or len(sizes) == n  # fewer samples than workers: one batch each
    if workers == 1:
        assert len(sizes) == -(-n // batch_size)


def test_plan_of_the_cli_default():
    assert parallel.plan(10, 32, 2) == [5, 5] and parallel.plan(10, 32, 1) == [10]
    assert parallel.plan(100, 32, 2) == [25, 25, 25, 25]


def test_batch_seeds_are_distinct_and_batch_zero_keeps_the_seed():
    assert parallel.batch_seed(7, 0) == 7
    seeds = {parallel.batch_seed(s, k) for s in range(50) for k in range(8)}
    assert len(seeds) == 400 and all(0 <= x <= MAX_SEED for x in seeds)


def _job(k, frames, pause, log):
    def run(emit):
        for i in range(frames):
            time.sleep(pause)
            log.append((k, i))
            emit((k, i))
        return f"batch {k}"
    return run


def test_frames_arrive_one_batch_after_another_from_the_callers_thread():
    log, seen, where = [], [], set()
    # batch 0 is slow, batch 1 fast: batch 1 finishes first, but its frames wait for batch 0's
    jobs = [_job(0, 4, 0.1, log), _job(1, 3, 0.0, log), _job(2, 2, 0.0, log)]

    def on_frame(f):
        seen.append(f)
        where.add(threading.current_thread() is threading.main_thread())

    threads = torch.get_num_threads()
    got = parallel.run(jobs, 2, on_frame)
    assert got == ["batch 0", "batch 1", "batch 2"]
    assert seen == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
    assert log.index((1, 2)) < log.index((0, 3))  # they did run side by side
    assert where == {True} and torch.get_num_threads() == threads


def test_one_worker_runs_the_batches_in_turn_in_this_thread():
    order = []
    jobs = [lambda emit, k=k: (emit(k), order.append(threading.current_thread().name), k)[2] for k in range(3)]
    assert parallel.run(jobs, 1, lambda f: None) == [0, 1, 2]
    assert set(order) == {threading.current_thread().name}


def _slow(progress: list):
    """A batch of 200 frames 10 ms apart that logs each one."""
    def run(emit):
        for i in range(200):
            time.sleep(0.01)
            progress.append(i)
            emit(i)
        return "done"
    return run


def test_a_failing_batch_stops_the_others_and_is_raised_here():
    progress = []

    def bad(emit):
        time.sleep(0.05)
        raise DbertError("batch 1 broke")

    threads = torch.get_num_threads()
    with pytest.raises(DbertError, match="batch 1 broke"):
        parallel.run([_slow(progress), bad], 2, lambda f: None)
    assert len(progress) < 100  # stopped at its next frame, not run to its end
    assert torch.get_num_threads() == threads


def test_an_exception_in_on_frame_stops_every_batch():
    progress = []

    def on_frame(f):
        if f == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        parallel.run([_slow(progress), _slow(progress)], 2, on_frame)
    assert len(progress) < 100


def test_workers_set_the_split_and_nothing_else(tiny_db):
    """Two batches side by side draw what each batch draws alone with its own seed: the texts depend
    on the split (n, batch size, workers), not on the threads or which batch finished first."""
    kw = dict(length=12, steps=16, sampler="ancestral", pair_quotes=False)
    both, st = generate(tiny_db, n=6, seed=3, workers=2, **kw)
    first, _ = generate(tiny_db, n=3, seed=parallel.batch_seed(3, 0), workers=1, **kw)
    second, _ = generate(tiny_db, n=3, seed=parallel.batch_seed(3, 1), workers=1, **kw)
    assert both == first + second
    assert st["batches"] == 2 and st["workers"] == 2 and st["samples"] == 6 and st["at_once"] == 1  # one thread here
    again, _ = generate(tiny_db, n=6, seed=3, workers=2, **kw)
    assert again == both
    one, st1 = generate(tiny_db, n=6, seed=3, workers=1, **kw)
    assert one[:3] != both[3:] and st1["batches"] == 1  # one batch of 6 is another draw


def test_a_run_of_one_batch_draws_what_it_always_drew(tiny_db):
    kw = dict(n=4, length=12, steps=16, seed=5, pair_quotes=False)
    one, _ = generate(tiny_db, workers=1, **kw)
    wide, st = generate(tiny_db, workers=4, batch_size=32, **{**kw, "n": 1})
    assert st["batches"] == 1 and st["at_once"] == 1
    assert wide == generate(tiny_db, workers=1, **{**kw, "n": 1})[0]
    assert one[0] != "" and len(one) == 4


def test_every_frame_reaches_on_frame_in_order(tiny_db):
    seen = []
    generate(tiny_db, n=4, seed=1, workers=2, length=12, steps=8, sampler="ancestral", on_frame=seen.append)
    rows = [f.ids.shape[0] for f in seen]
    done = [i for i, f in enumerate(seen) if f.done]
    assert rows == [2] * len(seen) and len(done) == 2 and done[-1] == len(seen) - 1
    steps = [f.step for f in seen[: done[0] + 1]]
    assert steps == sorted(steps)  # batch 0's frames, all of them, before batch 1's first


@pytest.mark.parametrize("bad", [0, -1, 1000, True])
def test_bad_workers(tiny_db, bad):
    with pytest.raises(DbertError) as e:
        generate(tiny_db, n=2, workers=bad, length=8, steps=4)
    assert "--workers" in cli_words(e.value)


def test_auto_workers_are_the_same_on_every_cpu_and_run_as_the_threads_allow(monkeypatch):
    """The split (which sets the texts) is 2 on any CPU and 1 on a GPU; how many run at once is
    the threads'."""
    for threads in (1, 2, 64):
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        assert parallel.auto_workers(torch.device("cpu")) == 2
        assert parallel.auto_workers(torch.device("cuda")) == 1
        assert parallel.concurrency(2) == min(2, threads) and parallel.concurrency(1) == 1


def test_one_thread_runs_the_split_in_turn_and_draws_the_same(tiny_db, monkeypatch):
    kw = dict(n=4, seed=9, workers=2, length=12, steps=8, sampler="ancestral", pair_quotes=False)
    calls = []
    original = parallel.run

    def spy(jobs, at_once, on_frame=None, keep=None):
        calls.append(at_once)
        return original(jobs, at_once, on_frame, keep)

    monkeypatch.setattr(parallel, "run", spy)
    texts, st = generate(tiny_db, **kw)  # the suite runs on one torch thread
    assert calls == [1] and st["batches"] == 2 and st["at_once"] == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    again, st2 = generate(tiny_db, **kw)
    assert calls == [1, 2] and st2["at_once"] == 2 and again == texts


def _cli(monkeypatch, capsys, *args):
    import sys

    from dbert_core.cli import main

    monkeypatch.setattr(sys, "argv", ["dbert", "sample", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return e.value.code or 0, out.out, out.err


def test_cli_workers(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    import json

    common = ["--checkpoint", str(tiny_checkpoint), "--n", "4", "--seed", "2", "--length", "12", "--steps", "8"]
    code, two, err = _cli(monkeypatch, capsys, *common, "--workers", "2", "--stats", "-o", str(tmp_path / "s.jsonl"))
    assert code == 0 and len(two.splitlines()) == 4
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["batches"] == 2 and stats["workers"] == 2 and stats["samples"] == 4 and stats["at_once"] == 1
    records = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert {r["settings"]["workers"] for r in records} == {2}
    code, again, _ = _cli(monkeypatch, capsys, *common, "--workers", "2")
    assert code == 0 and again == two
    code, one, _ = _cli(monkeypatch, capsys, *common, "--workers", "1")
    assert code == 0 and one != two
    code, _, err = _cli(monkeypatch, capsys, *common, "--workers", "0")
    assert code != 0 and "--workers" in err and "Traceback" not in err
    # --trajectory records one batch: unless told, it samples as one
    code, _, err = _cli(monkeypatch, capsys, *common, "--trajectory", str(tmp_path / "t.json"))
    assert code == 0 and json.loads((tmp_path / "t.json").read_text())["settings"]["n"] == 4
    code, _, err = _cli(monkeypatch, capsys, *common, "--workers", "2", "--trajectory", str(tmp_path / "u.json"))
    assert code == 2 and "one batch" in err and not (tmp_path / "u.json").exists()


def test_side_by_side_rate_runs_every_batchs_products(monkeypatch):
    """The limit of batches side by side: each worker's products (its share of the rows) in its own
    thread, their FLOPs over the round's wall time; the threads are given back."""
    from dbert_core.evaluation import rates
    from dbert_core.maths.model import BertConfig

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16)
    calls = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: (calls.append((x.shape[0], threading.current_thread().name)), real(x, w, b))[1])
    threads = torch.get_num_threads()
    r = rates.side_by_side_rate(cfg, 5, 6, 5 * 4, torch.float32, torch.device("cpu"), workers=2, reps=1)
    assert r > 0 and torch.get_num_threads() == threads
    rows = {n for n, _ in calls}
    assert rows == {18, 12, 8}  # 3 and 2 rows of 6 tokens, 12 and 8 positions projected: the split of 5 rows
    per_round = 2 * (4 * 2 + 2)  # two workers, 4 layer products x 2 layers + head and vocabulary
    assert len(calls) == 2 * per_round  # one warm-up round and one timed
    assert len({t for _, t in calls}) == 4 and threading.current_thread().name not in {t for _, t in calls}  # threads of their own, per round


def test_bench_puts_the_cli_run_against_the_higher_limit(tiny_db, tmp_path, monkeypatch):
    """dbert bench measures the CLI's shapes both as one batch and as its batches side by side, and
    the CLI row's fraction is of the higher rate."""
    from dbert_core.evaluation import bench

    b = bench.Bench(tiny_db, tmp_path / "b", length=8, quick=True, reps=1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(bench, "shape_rates", lambda *a, **k: {"qkv": 90.0, "model": 100.0})
    monkeypatch.setattr(bench, "side_by_side_rate", lambda *a, **k: 125.0)
    b.rates("cli", 10, 10, 80, [torch.float32], [2], workers=2)
    row = b.result["rates"]["cli"]["rows"][0]
    assert row["model"] == 100.0 and row["side_by_side"] == 125.0 and row["workers"] == 2
    assert b.rate("cli", "float32", 2) == 125.0
    b.rates("one", 10, 10, 80, [torch.float32], [2], workers=1)
    assert "side_by_side" not in b.result["rates"]["one"]["rows"][0] and b.rate("one", "float32", 2) == 100.0
    md = bench.markdown(b.result)
    assert "| dtype | threads | qkv | model | side by side |\n|---|---:|---:|---:|---:|\n| float32 | 2 | 90.0 | 100.0 | 125.0 |" in md
    assert "| dtype | threads | qkv | model |\n|---|---:|---:|---:|\n| float32 | 2 | 90.0 | 100.0 |\n" in md


def test_overlapping_runs_give_the_first_ones_threads_back(monkeypatch):
    """torch's thread count is the process's: run A shares 2 threads out, run B starts inside it
    and ends after it, and the process ends with its 2 threads, not the 1 that B found when it
    started (a fake count, so that the threads' interleaving is the test's own)."""
    count = {"n": 2}  # the process's one count
    monkeypatch.setattr(torch, "get_num_threads", lambda: count["n"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: count.update(n=n))
    a_inside, b_started, a_done = threading.Event(), threading.Event(), threading.Event()
    shares = {}

    def job_a(emit):
        shares["a"] = torch.get_num_threads()
        a_inside.set()
        b_started.wait(5)
        return "a"

    def job_b(emit):
        shares["b"] = torch.get_num_threads()
        b_started.set()
        a_done.wait(5)
        return "b"

    ta = threading.Thread(target=lambda: (parallel.run([job_a, lambda e: "a2"], 2), a_done.set()))
    ta.start()
    assert a_inside.wait(5)
    assert parallel.concurrency(2) == 2  # the process's threads, not run A's share
    tb = threading.Thread(target=lambda: parallel.run([job_b, lambda e: "b2"], 2))
    tb.start()
    ta.join(10)
    tb.join(10)
    assert shares == {"a": 1, "b": 1} and count["n"] == 2


def test_runs_from_several_threads_draw_what_they_draw_alone(tiny_db):
    """A library calling generate from two threads at once: each prints what it prints alone."""
    kw = dict(n=4, workers=2, length=12, steps=8, sampler="ancestral", pair_quotes=False)
    alone = [generate(tiny_db, seed=s, **kw)[0] for s in (1, 2)]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = [None, None]

        def go(i):
            got[i] = generate(tiny_db, seed=i + 1, **kw)[0]

        for _ in range(3):
            ts = [threading.Thread(target=go, args=(i,)) for i in (0, 1)]
            [t.start() for t in ts]
            [t.join() for t in ts]
            assert got == alone
    finally:
        torch.set_num_threads(before)


class _Canvas:
    """A stand-in frame (weakly referenced, so the test sees which ones are still held)."""

    def __init__(self, k: int, i: int, done: bool = False):
        self.k, self.i, self.done = k, i, done


def _held_while_waiting(keep, on_frame):
    """Batch 1 makes 50 frames while batch 0 waits for it; how many of them are alive then."""
    import weakref

    alive: weakref.WeakSet = weakref.WeakSet()
    made = threading.Event()
    counted: list[int] = []

    def first(emit):
        made.wait(20)
        import gc

        gc.collect()
        counted.append(len(alive))
        emit(_Canvas(0, 0, done=True))
        return "batch 0"

    def later(emit):
        for i in range(50):
            f = _Canvas(1, i, done=i == 49)
            alive.add(f)
            emit(f)
            del f
        time.sleep(0.3)  # the caller's thread has taken every frame from the queue
        made.set()
        return "batch 1"

    got = parallel.run([first, later], 2, on_frame, keep=keep)
    assert got == ["batch 0", "batch 1"]
    return counted[0]


def test_a_later_batchs_frames_are_not_held_unless_asked_for():
    """--workers 2 on long stories held every frame of the later batch (a whole canvas each) until
    the first batch ended: 532 MB against 318 MB in turn. Frames not asked for are dropped as they
    come; the ones asked for (a progress line: the batch's done frame) still arrive in order."""
    seen = []
    assert _held_while_waiting(None, seen.append) == 50  # every frame asked for: every frame waits
    assert [(f.k, f.i) for f in seen] == [(0, 0)] + [(1, i) for i in range(50)]
    seen.clear()
    assert _held_while_waiting(lambda f: f.done, seen.append) == 1  # only the done frame waits
    assert [(f.k, f.i) for f in seen] == [(0, 0), (1, 49)]
    assert _held_while_waiting(None, None) == 0  # no on_frame: nothing kept


def test_generate_hands_a_progress_line_every_batchs_last_frame(tiny_db):
    from dbert_core.cli.progress import SampleProgress
    import io

    kept, every = [], []
    a, _ = generate(tiny_db, n=4, seed=1, workers=2, length=12, steps=8, sampler="ancestral",
                    on_frame=kept.append, every_frame=False)
    b, _ = generate(tiny_db, n=4, seed=1, workers=2, length=12, steps=8, sampler="ancestral", on_frame=every.append)
    assert a == b  # the same texts
    assert [f.done for f in kept].count(True) == 2 and kept[-1].done and len(kept) <= len(every)
    progress = SampleProgress(4, 2, stream=io.StringIO())
    for f in kept:
        progress(f)
    assert progress.done == 4
