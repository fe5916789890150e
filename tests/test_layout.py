"""Where checkpoints live on disk: swap and temp folders dbert marks as its own, recovery that
touches nothing else, stale temp folders cleaned, files written with the user's umask."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import tiny_config
from dbert_core.storage import checkpoint, fetch, store
from dbert_core.disk import layout, temp_folders
from dbert_core.errors import DbertError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _without_shipped(monkeypatch):
    monkeypatch.setattr(store, "shipped", lambda name: None)


@pytest.fixture
def own_db(tiny_checkpoint):
    return checkpoint.load(tiny_checkpoint)


def user_folder(path: Path) -> Path:
    """A folder of the user's that merely looks like dbert's old swap name."""
    path.mkdir(parents=True)
    (path / "thesis.txt").write_text("years of work\n")
    return path


def intact(path: Path) -> bool:
    return (path / "thesis.txt").is_file() and (path / "thesis.txt").read_text() == "years of work\n"


def dead_temp(target: Path, kind: str) -> Path:
    """A temp folder made by a process that has exited since (as after a kill -9)."""
    code = "import sys; from pathlib import Path; from dbert_core.disk import temp_folders; " \
           "print(temp_folders.temp_dir(Path(sys.argv[1]), sys.argv[2]))"
    out = subprocess.run([sys.executable, "-c", code, str(target), kind], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    return Path(out.strip())


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------------------ data loss
def test_save_never_touches_a_users_dot_old_folder(own_db, tmp_path):
    target = tmp_path / "run"
    mine = user_folder(tmp_path / "run.old")
    also = user_folder(tmp_path / ".run.old")
    checkpoint.save(own_db, target)
    checkpoint.save(own_db, target)  # a replacing save: the previous checkpoint is swapped out and back
    assert intact(mine) and intact(also)
    assert checkpoint.load(target).schedule.name == "spindle"
    assert hidden(tmp_path) == [".run.old"]  # no swap folder left


def test_a_missing_checkpoint_is_never_replaced_by_a_users_dot_old(own_db, tmp_path):
    mine = user_folder(tmp_path / "ck.old")
    temp_folders.recover(tmp_path / "ck")  # what a writer runs first
    assert intact(mine) and not (tmp_path / "ck").exists()
    with pytest.raises(DbertError, match="not found|no checkpoint"):
        checkpoint.load(tmp_path / "ck")
    checkpoint.save(own_db, tmp_path / "ck")
    assert intact(mine) and not (tmp_path / "ck" / "thesis.txt").exists()


def test_train_out_leaves_dir_old_alone_even_when_it_fails(tmp_path):
    from dbert_core.training.train import Trainer

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep")
    mine = user_folder(tmp_path / "busy.old")
    with pytest.raises(DbertError, match="already holds files"):
        Trainer(tiny_config(busy, max_steps=2, batch_size=8, T=32, eval_steps=8)).run()
    assert intact(mine) and (busy / "notes.txt").read_text() == "keep"

    fresh = tmp_path / "fresh"
    other = user_folder(tmp_path / "fresh.old")
    Trainer(tiny_config(fresh, max_steps=2, batch_size=8, T=32, eval_steps=8)).run()
    assert intact(other) and (fresh / "dbert.json").is_file()


def test_store_ignores_a_users_dot_old_entry(tiny_checkpoint):
    root = store.store_dir()
    root.mkdir(parents=True)
    user_folder(root / "mine.old")
    with pytest.raises(DbertError, match="no checkpoint named 'mine'"):
        store.resolve("mine")
    store.import_dir(tiny_checkpoint, name="mine")  # the name is free: mine.old is not dbert's
    assert intact(root / "mine.old") and (root / "mine" / "dbert.json").is_file()
    store.remove("mine")
    assert intact(root / "mine.old")


def test_save_refuses_to_replace_a_folder_that_is_not_a_checkpoint(own_db, tmp_path):
    target = user_folder(tmp_path / "docs")
    with pytest.raises(DbertError, match="not a dbert checkpoint"):
        checkpoint.save(own_db, target)
    assert intact(target)


# ------------------------------------------------------------------------------ swaps
def test_interrupted_swap_is_read_then_recovered(own_db, tmp_path):
    path = checkpoint.save(own_db, tmp_path / "ck")
    swap = dead_temp(path, "swap")  # a save killed between its two renames
    os.rename(path, swap / "old")
    assert temp_folders.is_ours(swap) and temp_folders.exists(path)
    again = checkpoint.load(path)  # readers read the previous checkpoint and touch nothing
    assert torch.equal(again.counts, own_db.counts)
    assert (swap / "old").is_dir() and not path.exists()
    checkpoint.save(again, path)  # the next writer puts it back first, then swaps in the new one
    assert path.is_dir() and hidden(tmp_path) == []


def test_a_live_writers_swap_is_left_alone(own_db, tmp_path):
    path = checkpoint.save(own_db, tmp_path / "ck")
    live = temp_folders.temp_dir(path, "swap")  # this process: alive
    temp_folders.recover(path)
    temp_folders.clean(tmp_path)
    assert live.is_dir()
    shutil.rmtree(live)


def test_temp_names_are_recognised_only_with_dbert_marker(tmp_path):
    target = tmp_path / "ck"
    ours = temp_folders.temp_dir(target, "fetch")
    assert ours.name.startswith(".ck.dbert-fetch-") and temp_folders.is_ours(ours)
    lookalike = tmp_path / ours.name.replace("fetch", "import")
    lookalike.mkdir()
    (lookalike / "data.bin").write_bytes(b"x")
    assert not temp_folders.is_ours(lookalike)  # the right shape of name, but no marker written by dbert
    for name in ("ck.old", ".ck.old", ".ck.tmp-abc", ".ck.fetch-abc", "ck.dbert-swap-1-x"):
        assert not temp_folders.is_ours(user_folder(tmp_path / name))


# ------------------------------------------------------------------------------ stale temp folders
def test_stale_temp_folders_are_cleaned_by_the_next_store_operation(tiny_checkpoint):
    root = store.store_dir()
    root.mkdir(parents=True)
    dead = dead_temp(root / "big", "fetch")
    (dead / "download").write_bytes(b"\0" * 4096)
    dead_import = dead_temp(root / "other", "import")
    shutil.copytree(tiny_checkpoint, dead_import / "ckpt")
    empty = root / f".half.dbert-fetch-{_dead_pid()}-abcd1234"  # killed before its marker was written
    empty.mkdir()
    alive = temp_folders.temp_dir(root / "busy", "fetch")  # a fetch in progress in this process
    old = temp_folders.temp_dir(root / "ancient", "import")
    marker = json.loads((old / layout.MARK).read_text())
    marker["created"] = time.time() - temp_folders.STALE_SECONDS - 60  # a live pid, but far too old (pid reuse)
    (old / layout.MARK).write_text(json.dumps(marker))
    foreign = root / f".x.dbert-fetch-{_dead_pid()}-zzzz9999"  # our name shape, not our marker: not ours
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    user = user_folder(root / ".mine.old")

    store.entries()  # any store operation cleans up
    assert hidden(root) == sorted([alive.name, foreign.name, ".mine.old"])
    assert intact(user)
    shutil.rmtree(alive)


def test_a_dead_removal_is_finished_and_a_dead_swap_restored(tiny_checkpoint):
    root = store.store_dir()
    root.mkdir(parents=True)
    gone = dead_temp(root / "old-entry", "remove")
    shutil.copytree(tiny_checkpoint, gone / "x")
    swap = dead_temp(root / "swapped", "swap")
    shutil.copytree(tiny_checkpoint, swap / "old")
    shutil.copytree(tiny_checkpoint, swap / "new")
    names = [e.name for e in store.entries()]
    assert names == ["swapped"] and hidden(root) == []
    assert checkpoint.load(root / "swapped").schedule.name == "spindle"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------------------ permissions
@pytest.fixture
def private_umask():
    old = os.umask(0o077)
    yield
    os.umask(old)


def modes(root: Path) -> dict[str, int]:
    found = {".": root.stat().st_mode & 0o777}
    for p in root.rglob("*"):
        found[str(p.relative_to(root))] = p.stat().st_mode & 0o777
    return found


def test_saved_checkpoints_follow_a_private_umask(own_db, tmp_path, private_umask):
    path = checkpoint.save(own_db, tmp_path / "private", trainer_state={
        "optimizer": {"state": {}, "param_groups": []}, "rng": {"cpu": torch.get_rng_state()}, "state": {"step": 1}})
    found = modes(path)
    assert (path / "trainer_state" / "optimizer.pt").is_file()
    assert all(m & 0o077 == 0 for m in found.values()), found
    checkpoint.save(own_db, path)  # replacing keeps it private
    assert all(m & 0o077 == 0 for m in modes(path).values())


def test_imported_and_fetched_checkpoints_follow_a_private_umask(tiny_checkpoint, private_umask):
    from helpers import HubServer, tar_bytes

    path = store.import_dir(tiny_checkpoint, name="imported")  # the source files are 0644
    assert all(m & 0o077 == 0 for m in modes(path).values()), modes(path)
    with HubServer() as server:
        server.files["t.tar.gz"] = tar_bytes(tiny_checkpoint, mode=0o777)
        path = fetch.fetch(f"{server.url}/files/t.tar.gz")
    found = modes(path)
    assert all(m & 0o077 == 0 for m in found.values()), found
    assert all(m & 0o111 == 0 for name, m in found.items() if (path / name).is_file())  # nothing executable


def test_default_umask_gives_the_usual_modes(own_db, tmp_path):
    old = os.umask(0o022)
    try:
        path = checkpoint.save(own_db, tmp_path / "shared")
    finally:
        os.umask(old)
    found = modes(path)
    assert found["."] == 0o755 and found["model.safetensors"] == 0o644
