"""scripts/recipes/gpu_stories.sh, dry run on the CPU at toy scale: the run trains against its time budget
(scripts/recipes/train_timed.py), keeps the best held-out weights, scores them beside the starting ones, and
returns only what a device call can (at most 8 files under 16 MiB each) from which the checkpoint is put back
together and loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest

from helpers import DATA, ROOT

SCRIPT = ROOT / "scripts" / "recipes" / "gpu_stories.sh"
HEAD = DATA / "tinystories" / "TinyStories-train-head.txt"


def _stories(dst, first: int, count: int) -> None:
    """Stories first .. first + count of the head file, in its own <|endoftext|> format."""
    out, n = [], 0
    for line in HEAD.read_text(encoding="utf-8").splitlines(keepends=True):
        if first <= n < first + count:
            out.append(line)
        if line.strip() == "<|endoftext|>":
            n += 1
    dst.write_text("".join(out), encoding="utf-8")


@pytest.mark.slow
def test_the_gpu_recipe_runs_end_to_end_on_the_cpu(tiny_checkpoint, tmp_path):
    from dbert_core.storage import checkpoint

    data, out, work = tmp_path / "data", tmp_path / "out", tmp_path / "work"
    data.mkdir()
    out.mkdir()
    _stories(data / "head-train.txt", 0, 24)
    _stories(data / "lowercase-stories.txt", 24, 8)
    _stories(data / "fables.txt", 32, 8)
    _stories(data / "head-heldout.txt", 2000, 3)
    _stories(data / "books-slice.txt", 40, 8)  # the curriculum's English stage (its own file here)
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "DATA_DIR": str(data), "INIT": str(tiny_checkpoint),
           "DEVICE": "cpu", "PARTS": "english train eval", "ENGLISH_SECONDS": "8", "TRAIN_SECONDS": "12", "BATCH": "4", "SEQ_LEN": "32", "WARMUP": "2",
           "EVAL_EVERY": "10", "OMP_NUM_THREADS": "1", "PY": sys.executable,
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all((out / f).stat().st_size < 16 * 2**20 for f in files), files  # what a call returns
    assert {"best.tar.00", "train.json", "train.log", "english.json", "eval.jsonl", "info.log"} <= set(files), files
    info = (out / "info.log").read_text()
    assert "english exit 0" in info and "train exit 0" in info and info.count("exit 0") == 5, info  # two stages, 3 evals
    english = json.loads((out / "english.json").read_text())
    assert english["best_step"] is not None  # the stories stage started from the English stage's best
    summary = json.loads((out / "train.json").read_text())
    assert summary["steps"] >= 30 and summary["max_steps"] == summary["steps"]  # fitted to the budget, and reached
    assert summary["evals"][0]["step"] == 0 and summary["best_step"] is not None
    best = min(e["val_ppl_token"] for e in summary["evals"] if e["step"] > 0)
    assert summary["best_val_ppl"] == best
    parts = sorted(out.glob("best.tar.*"))
    joined = tmp_path / "best.tar"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as tar:
        tar.extractall(tmp_path / "back", filter="data")
    db = checkpoint.load(tmp_path / "back" / "best")  # loads: its digests match its float16 weights
    assert db.meta["step"] == summary["best_step"] and db.meta["unit"] == "story"
    assert round(db.meta["val_ppl_token"], 3) == round(best, 3)
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    scored = [e for e in evals if "ppl_token" in e]
    assert len(scored) == 3 and all(e["documents"] == 3 and e["ppl_token"] > 1 for e in scored)
    assert checkpoint.load(work / "english" / "best").meta["unit"] == "story"
    assert db.meta["train_config"]["init"] == str(work / "english" / "best")  # the stories stage grew from the English one


@pytest.mark.slow
def test_the_recipes_ar_part_brings_back_a_baseline_the_cpu_samples(tiny_checkpoint, tmp_path):
    """PARTS=ar: the same-budget GPT-2 baseline trained on the given files (not the checkpoint's own paths),
    brought back in float16 pieces under 16 MiB, put together here, and sampled as whole stories."""
    data, out, work = tmp_path / "data", tmp_path / "out", tmp_path / "work"
    data.mkdir()
    out.mkdir()
    for name, first, count in (("head-train.txt", 0, 12), ("lowercase-stories.txt", 12, 4), ("fables.txt", 16, 4)):
        _stories(data / name, first, count)
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "DATA_DIR": str(data), "INIT": str(tiny_checkpoint),
           "DEVICE": "cpu", "PARTS": "ar", "AR_SECONDS": "120", "AR_TOKENS": "3000", "AR_BATCH": "4",
           "OMP_NUM_THREADS": "1", "PY": sys.executable,
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    info = (out / "info.log").read_text()
    assert "ar exit 0" in info, info
    state = json.loads((out / "ar-state.json").read_text())
    assert state["step"] == state["steps"] and state["tokens_seen"] >= 3000 * 0.8
    parts = sorted(out.glob("ar.tar.*"))
    assert parts and all(p.stat().st_size < 16 * 2**20 for p in parts)
    joined = tmp_path / "ar.tar"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as tar:
        tar.extractall(tmp_path / "back", filter="data")
    back = tmp_path / "back" / "ar-half"
    assert not (back / "optimizer.pt").exists()
    lines = tmp_path / "ar.txt"
    sampled = subprocess.run([sys.executable, str(ROOT / "scripts" / "studies" / "ar_baseline.py"), "sample", str(back),
                              "--n", "3", "--length", "20", "--lines", str(lines)], env=env, capture_output=True,
                             text=True, timeout=120)
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert len(lines.read_text().splitlines()) == 3
