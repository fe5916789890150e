"""kill -9 at seeded random points of `dbert train`: after every kill the output folder holds a
checkpoint that loads (or nothing, before the first save), a stale lock never blocks the next
run, and resuming until the end gives exactly the weights of an uninterrupted run.

As in test_faults.py, the child counts its file-system operations under the output's parent
(Python audit events) and sends itself SIGKILL at the N-th, so kills land inside saves (the
temp folder, the renames, the trainer state) and not only between them.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import KILL_HOOK, TINYSTORIES

from dbert_core.storage import checkpoint
from dbert_core.disk import temp_folders

ROOT = Path(__file__).resolve().parent.parent
KILLS = 10

CHILD = r"""
import os, signal, sys
from pathlib import Path
from dbert_core.disk import temp_folders
from dbert_core.config import TrainConfig
from dbert_core.training.train import Trainer
data, out, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
roots = (str(Path(out).parent),)
resume = (temp_folders.readable(Path(out)) / "trainer_state" / "state.json").is_file()
cfg = TrainConfig(data=[data], out=out, preset="tiny", unit="sentence", seq_len=16, batch_size=8, max_steps=12,
                  T=64, warmup=2, eval_every=0, save_every=2, val_examples=16, device="cpu", seed=0, resume=resume)
""" + KILL_HOOK + r"""
Trainer(cfg).run()
print(count, flush=True)
"""


def train(out: Path, kill_at: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", CHILD, str(TINYSTORIES), str(out), str(kill_at)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def weights(path: Path) -> dict:
    return {k: v.clone() for k, v in checkpoint.load(path).model.state_dict().items()}


@pytest.mark.slow
def test_kill_9_anywhere_in_training_then_resume_is_exact(tmp_path):
    straight = train(tmp_path / "a" / "run", 0)
    assert straight.returncode == 0, straight.stderr
    total = int(straight.stdout.split()[-1])
    out = tmp_path / "b" / "run"
    rng = random.Random(1234)
    killed = 0
    for kill_at in sorted(rng.sample(range(1, total + 1), KILLS)):
        res = train(out, kill_at)
        killed += res.returncode == -9
        assert res.returncode in (0, -9), res.stderr
        if temp_folders.exists(out):
            checkpoint.load(temp_folders.readable(out))  # whatever the moment of the kill: a complete checkpoint
    assert killed >= KILLS // 2
    final = train(out, 0)
    assert final.returncode == 0, final.stderr
    assert checkpoint.load_trainer_state(out)["state"]["step"] == 12
    a, b = weights(tmp_path / "a" / "run"), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    leftovers = [p.name for p in out.parent.iterdir() if p.name != "run"]
    assert not [n for n in leftovers if "lock" not in n], leftovers  # no temp or swap folders left behind
