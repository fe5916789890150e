"""Long work shows its progress on stderr, and nothing of it on stdout (issue 59): a long story's
window and step, block continuation, `dbert eval`, `dbert bench` and `dbert checkpoints fetch`."""

from __future__ import annotations

import io
import json
import time
from types import SimpleNamespace

import pytest
import torch

from helpers import HubServer, run, tar_bytes, train_stories


class Tty(io.StringIO):
    def isatty(self):
        return True


def _frame(step: int, steps: int, done: bool = False, rows: int = 1):
    from dbert_core.sampling.sample import Frame

    masked = torch.zeros(rows, 3, dtype=torch.bool) if done else torch.ones(rows, 3, dtype=torch.bool)
    return Frame(ids=torch.zeros(rows, 3, dtype=torch.long), masked=masked, revealed=torch.zeros_like(masked),
                 confidence=torch.zeros(rows, 3), step=step, steps=steps, t=0, nfe=step)


class Clock:
    """A progress module's time.perf_counter or time.monotonic, under the test's hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_long_storys_live_line_says_the_window_and_the_step_within_it(monkeypatch):
    from dbert_core.cli import progress
    from dbert_core.cli.progress import SampleProgress

    clock = Clock()
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=clock))
    stream = Tty()
    bar = SampleProgress(1, 1, stream=stream, per_window=48)
    bar(_frame(40, 96))
    assert "sampling 0/1 · window 1/2 · step 40/48 · 40 calls" in stream.getvalue()
    clock.now += 0.2  # the live line is redrawn at most every 0.1 s
    bar(_frame(60, 96))
    assert "window 2/2 · step 12/48" in stream.getvalue()
    one = Tty()
    SampleProgress(1, 1, stream=one, per_window=48)(_frame(12, 48))  # one window: the plain count
    assert "· step 12/48 ·" in one.getvalue() and "window" not in one.getvalue()


def test_plain_progress_says_each_window_and_breaks_a_long_silence(monkeypatch):
    from dbert_core.cli import progress

    clock = Clock()
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=clock))
    stream = io.StringIO()
    bar = progress.SampleProgress(1, 1, stream=stream, per_window=4)
    bar(_frame(1, 8))
    bar(_frame(2, 8))
    assert stream.getvalue().splitlines() == ["sampling 0/1 · window 1/2 · step 1/4 · 1 calls · 0:00 · eta 0:00"]
    bar(_frame(5, 8))
    assert stream.getvalue().splitlines()[-1].startswith("sampling 0/1 · window 2/2 · step 1/4")
    one = io.StringIO()  # one window: a line once 2 s pass without one, then every 10 s
    bar = progress.SampleProgress(1, 1, stream=one, per_window=64)
    bar(_frame(1, 64))
    clock.now += 1.5
    bar(_frame(2, 64))
    assert one.getvalue() == ""
    clock.now += 0.6
    bar(_frame(3, 64))
    assert one.getvalue().splitlines() == ["sampling 0/1 · step 3/64 · 3 calls · 0:02 · eta 0:42"]
    clock.now += 5
    bar(_frame(4, 64))
    assert len(one.getvalue().splitlines()) == 1
    clock.now += 5
    bar(_frame(5, 64))
    assert len(one.getvalue().splitlines()) == 2
    bar(_frame(64, 64, done=True))
    assert one.getvalue().splitlines()[-1].startswith("sampling 1/1 · 64 calls")


@pytest.fixture(scope="module")
def story_model(tmp_path_factory):
    """A tiny model trained for a few steps on whole stories (windows of 24 tokens)."""
    return train_stories(tmp_path_factory.mktemp("story"))


def test_block_continuation_shows_its_windows_on_stderr_only(story_model, capsys, monkeypatch):
    code, out, err = run(["sample", "-c", str(story_model.path), "--n", "1", "--length", "60", "--steps", "4",
                          "--seed", "1", "--workers", "1"], capsys, monkeypatch)
    assert code == 0, err
    assert len(out.splitlines()) == 1 and "sampling" not in out and "window" not in out
    assert "sampling 0/1 · window 1/5 · step 1/4 · " in err  # a 24-token window, 12 of context: five at most
    assert "sampling 1/1 · " in err


def test_eval_says_its_scoring_before_the_first_batch(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    from helpers import TINYSTORIES_VALID

    seen = []
    from dbert_core.evaluation import metrics

    real = metrics.elbo

    def elbo(*args, **kwargs):
        seen.append(capsys.readouterr().err)  # what stderr held when this batch began
        return real(*args, **kwargs)

    monkeypatch.setattr(metrics, "elbo", elbo)
    code, out, err = run(["eval", "--checkpoint", str(tiny_checkpoint), "--data", str(TINYSTORIES_VALID), "--limit", "4",
                          "--steps", "4", "--batch-size", "2", "--json"], capsys, monkeypatch)
    assert code == 0, err
    assert "scoring 0/4 · " in seen[0]  # before the first batch's scoring
    assert "scoring" not in out and json.loads(out)["examples"] == 4


def test_bench_shows_each_sampling_run_and_warns_of_a_loaded_machine(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (7.5, 7.0, 6.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    code, out, err = run(["bench", "--checkpoint", str(tiny_checkpoint), "--quick", "--steps", "4", "--batch", "1",
                          "--samplers", "ancestral", "--length", "8", "--no-train", "--no-bf16", "--threads", "1",
                          "--out", str(tmp_path / "b")], capsys, monkeypatch)
    assert code == 0, err
    assert "bench: ancestral steps 4 batch 1 1/1 · 4 calls" in err
    assert "bench: sample --n 10 defaults " in err
    warning = "warning: the load average was 7.5 on 2 cores as the bench began"
    assert f"dbert: {warning}" in err and warning in out  # said first, and kept in the report
    assert "bench:" not in out and "calls ·" not in out


def test_fetch_of_a_download_of_unknown_size_shows_progress(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """A server that sends no Content-Length: the plain lines went by quarters of the size, so
    nothing was said until the end."""
    from dbert_core.cli.commands import checkpoints

    clock = Clock()
    monkeypatch.setattr(checkpoints, "time", SimpleNamespace(monotonic=clock), raising=False)
    bar = checkpoints._FetchProgress()
    bar(4096, None, "download")
    clock.now += 2.5
    bar(8192, None, "download")
    clock.now += 1
    bar(12288, None, "download")
    assert capsys.readouterr().err == "download 8.0 KB\n"
    with HubServer() as server:
        server.files["tiny.tar.gz"] = tar_bytes(tiny_checkpoint)
        monkeypatch.setattr(checkpoints, "time", time)  # the real clock
        code, out, err = run(["checkpoints", "fetch", f"{server.url}/unsized/tiny.tar.gz", "--name", "unsized"],
                             capsys, monkeypatch)
    assert code == 0, err
    assert out == f"{tmp_path / 'dbert_home' / 'checkpoints' / 'unsized'}\n"  # the path alone
    assert len(server.files["tiny.tar.gz"]) > 4096 * 60  # dribbled at 4 KB a 0.05 s: over 3 s, a line before the end
    lines = [x for x in err.splitlines() if x.startswith("download ")]
    assert lines and "%" not in lines[0], err


def test_training_counts_its_parameters_as_the_checkpoints_list_does(tmp_path, capsys, monkeypatch):
    """The tiny preset read 'training 0.1M parameters' here and 0.06M in `checkpoints list`."""
    from dbert_core.cli.progress import TrainProgress
    from dbert_core.training.train import Trainer
    from helpers import tiny_config

    stream = io.StringIO()
    Trainer(tiny_config(tmp_path / "run", max_steps=1, eval_every=0), [TrainProgress(1, stream=stream)]).run()
    meta = json.loads((tmp_path / "run" / "dbert.json").read_text())
    said = [x for x in stream.getvalue().splitlines() if x.startswith("training ")]  # after the tokenizing lines
    assert said and said[0].startswith(f"training {meta['parameters'] / 1e6:.2f}M parameters on ")
    monkeypatch.setenv("DBERT_HOME", str(tmp_path))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "run").symlink_to(tmp_path / "run")
    code, out, _ = run(["checkpoints", "list"], capsys, monkeypatch)
    assert code == 0 and f" {meta['parameters'] / 1e6:.2f}M " in out



def test_eval_samples_show_a_long_storys_window_and_step(story_model, capsys, monkeypatch):
    """`dbert eval --samples` on a story longer than a window: its progress counted the steps on
    across the windows (step 7/20) where `dbert sample` says `window 2/5 · step 3/4`."""
    stories = story_model.path.parent / "stories.txt"
    code, out, err = run(["eval", "-c", str(story_model.path), "--data", str(stories), "--limit", "2", "--steps", "2",
                          "--samples", "1", "--sample-length", "60", "--sample-steps", "4", "--seed", "1", "--json"],
                         capsys, monkeypatch)
    assert code == 0, err
    assert "sampling 0/2 · window 1/5 · step 1/4 · " in err, err
    assert "sampling 0/2 · window 2/5 · step 1/4 · " in err
    assert "/20 · " not in err  # never the steps of all the windows counted together
    assert "sampling" not in out and json.loads(out)["samples"] == 1


def test_the_token_cache_lines_go_quiet_on_a_broken_stream_and_never_stop_the_work():
    """dbert eval's tokenizing lines (CacheProgress): a stream that fails (EIO, a closed stderr) ends
    them, not the eval; a working one hears a line every 5 s and the entry's line."""
    from dbert_core.cli.progress import CacheProgress

    class Broken(io.StringIO):
        def write(self, text):
            raise OSError(5, "Input/output error")

    report = {"stage": "tokenize", "bytes": 2e6, "total": 4e6, "tokens": 500, "seconds": 1.0}
    broken = CacheProgress(Broken())
    broken(report)
    broken({"stage": "built", "tokens": 500, "documents": 3, "folder": "/x"})
    assert broken.stream is None
    out = io.StringIO()
    working = CacheProgress(out)
    working(report)
    working(report)  # within 5 s of the last: not written
    working({"stage": "cached", "tokens": 500, "documents": 3, "folder": "/x"})
    assert out.getvalue().splitlines() == ["tokenizing 2.0/4.0 MB, 2.0 MB/s, 500 tokens, eta 0:01",
                                           "token cache: 500 tokens of 3 documents (reused, nothing tokenized): /x"]
