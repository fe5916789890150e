"""kill -9 at seeded random points of `checkpoints import` and fetch: afterwards the store lists
only complete checkpoints, every one loads, and the next store operation leaves no temp folder.

The child process counts its file-system operations on the store and the source (Python audit
events: open, rename, mkdir, chmod, unlink, rmtree, ...) and sends itself SIGKILL at the N-th,
N drawn with a fixed seed from the number an uninterrupted run makes: kills land in every phase
(validating, copying or unpacking, the final rename, the clean-up), not only where time is spent.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest

from dbert_core.storage import checkpoint, store
from helpers import KILL_HOOK, ROOT, HubServer, tar_bytes

KILLS = 12

CHILD = r"""
import os, signal, sys
from dbert_core import checkpoint, fetch, store  # imported before counting starts
what, source, name, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
roots = (str(store.home()), source)
""" + KILL_HOOK + r"""
if what == "import":
    store.import_dir(source, name=name)
else:
    fetch.fetch(source, name=name)
print(count, flush=True)
"""


@pytest.fixture(autouse=True)
def _without_shipped(monkeypatch):
    monkeypatch.setattr(store, "shipped", lambda name: None)


def run(what: str, source: str, name: str, kill_at: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", CHILD, what, source, name, str(kill_at)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


def check_store() -> list[str]:
    """Only complete, loadable entries; and a store operation leaves no hidden folder behind."""
    rows = store.entries()  # a store operation: it cleans what killed processes left
    for e in rows:
        assert e.broken is None, f"{e.name}: {e.broken}"
        checkpoint.load(e.path)
    leftovers = [p.name for p in store.store_dir().iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers
    return [e.name for e in rows]


def kill_at_random_points(what: str, source: str, seed: int) -> None:
    for name in ("calibration", "again"):  # the first run also creates the store's folders
        done = run(what, source, name, 0)
        assert done.returncode == 0, done.stderr
    steps = int(done.stdout)  # file-system operations of one uninterrupted run
    assert steps > 20
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, steps + 1), KILLS))
    for i, point in enumerate(points):
        r = run(what, source, f"k{i}", point)
        assert r.returncode == -signal.SIGKILL, (point, steps, r.returncode, r.stderr)
        names = check_store()
        assert set(names) <= {"calibration", "again", *(f"k{j}" for j in range(i + 1))}
    # a name whose operation was cut short before its rename is still free to use
    cut = [f"k{i}" for i in range(KILLS) if f"k{i}" not in check_store()]
    assert cut, "no kill landed before the final rename"
    r = run(what, source, cut[0], 0)
    assert r.returncode == 0, r.stderr
    assert cut[0] in check_store()


@pytest.mark.slow
def test_kill_during_import(tiny_checkpoint):
    kill_at_random_points("import", str(tiny_checkpoint), seed=13)


@pytest.mark.slow
def test_kill_during_fetch(tiny_checkpoint):
    with HubServer() as server:
        server.files["tiny.tar.gz"] = tar_bytes(tiny_checkpoint)
        kill_at_random_points("fetch", f"{server.url}/files/tiny.tar.gz", seed=14)
