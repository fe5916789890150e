"""scripts/recipes/gpu_stories.sh, dry run on the CPU at toy scale: the device step probes, trains
a run sized to its time budget, returns only what a device call can (at most 8 files under 16 MiB),
and collect puts a checkpoint back together that loads and holds the trained weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest

from helpers import ROOT, TINYSTORIES, TINYSTORIES_VALID

SCRIPT = ROOT / "scripts" / "recipes" / "gpu_stories.sh"


def _head(src, dst, lines):
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, encoding="utf-8") as f:
        dst.write_text("".join(line for _, line in zip(range(lines), f)), encoding="utf-8")


@pytest.mark.slow
def test_the_gpu_recipe_runs_end_to_end_on_the_cpu(tiny_checkpoint, tmp_path):
    from safetensors.torch import load_file

    gpu, out, work = tmp_path / "gpu", tmp_path / "out", tmp_path / "work"
    shared = gpu / "shared"
    _head(TINYSTORIES, shared / "tinystories" / "train.txt", 300)
    _head(TINYSTORIES_VALID, shared / "tinystories" / "valid.txt", 1060)  # the last 1,000 lines are held out
    _head(TINYSTORIES, shared / "tinystories" / "more" / "train_1001_2016.txt", 40)
    _head(TINYSTORIES, shared / "tinystories" / "more" / "train_2317_5000_lowercase.txt", 40)
    _head(TINYSTORIES, shared / "fables" / "fables.txt", 40)
    out.mkdir()
    env = {**os.environ, "GPU_DIR": str(gpu), "OUT": str(out), "WORK": str(work), "DEVICE": "cpu",
           "INIT": str(tiny_checkpoint), "SEQ_LEN": "24", "BATCH": "8", "PROBE_STEPS": "3", "TRAIN_S": "2",
           "WARMUP": "1", "EVAL_LIMIT": "20", "TESTS": "0", "OMP_NUM_THREADS": "1",
           "BENCH": "--quick --no-train --no-bf16 --batch 1 --steps 16 --length 16",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    done = subprocess.run(["bash", str(SCRIPT), "device"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert "model.part00" in files and {"rest.tar.gz", "train.log", "report.tar.gz"} <= set(files)
    assert len(files) <= 8 and all((out / f).stat().st_size < 16 * 2**20 for f in files)  # what a call returns
    with tarfile.open(out / "report.tar.gz") as tar:
        names = set(tar.getnames())
        ev = json.load(tar.extractfile("./eval.json"))
        machine = tar.extractfile("./machine.txt").read().decode()
    assert {"./probe.log", "./bench.json"} <= names, names
    assert ev["examples"] > 0 and ev["ppl_token"] > 1 and "steps: " in machine
    steps = int(machine.split("steps: ")[1].split()[0])
    assert steps >= 3  # at least the probe's steps, sized from its rate
    to = tmp_path / "collected"
    got = subprocess.run(["bash", str(SCRIPT), "collect", str(out)], env={**env, "TO": str(to), "EVAL": "0"},
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    state = json.loads((to / "train_state.json").read_text())
    assert state["step"] == steps
    assert (to.parent / "collected-device" / "train.log").is_file()
    trained = load_file(str(work / "export" / "model.safetensors"))
    back = load_file(str(to / "model.safetensors"))
    assert trained.keys() == back.keys() and all((trained[k] == back[k]).all() for k in trained)
