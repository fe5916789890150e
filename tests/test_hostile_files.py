"""Issue 40, items 1-4: what dbert writes never damages the system or a checkpoint.

1. Never replace what is not a regular file: a device node, a FIFO, a socket or a link to one is
   written through (atomic.atomic_write_text), never renamed over.
2. A full disk never touches the previous checkpoint, and is one line (a real, small tmpfs in a
   private mount namespace).
3. A checkpoint a run is training into is held: the store refuses to remove it or import over it.
4. The weights' sha256 digests are recorded in dbert.json and checked on load.

Device nodes are made with mknod in the test's own folder (root only; the real /dev is never
touched); the full-disk test mounts its tmpfs inside `unshare -m`, so the mount dies with it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers import ROOT, TINYSTORIES, run
from dbert_core.disk import atomic, layout
from dbert_core.errors import DbertError

FIXTURE = ROOT / "tests" / "fixtures" / "tiny"  # a committed tiny checkpoint: nothing to train
SAMPLE = ["sample", "--checkpoint", str(FIXTURE), "--n", "1", "--length", "8", "--steps", "4", "--seed", "0",
          "--device", "cpu"]


def one_line(err: str) -> str:
    """The one message line of stderr (sampling progress aside), and no traceback."""
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("sampling ", "scoring "))]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------ 1. never replace what is not a regular file
NULL, FULL = 3, 7  # minor numbers of /dev/null and /dev/full (major 1)


def device(path: Path, minor: int) -> Path:
    """A character device node like /dev/null or /dev/full, made here (root only)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        os.close(os.open(path, os.O_WRONLY))
    except PermissionError:
        pytest.skip("making and opening a device node needs root and a file system without nodev")
    return path


def same_node(path: Path, kind, rdev: int | None = None) -> bool:
    st = os.lstat(path)
    return kind(st.st_mode) and (rdev is None or st.st_rdev == rdev)


@pytest.mark.parametrize("option,minor,via_link", [
    ("-o", NULL, False), ("--trajectory", NULL, False), ("-o", NULL, True), ("-o", FULL, False),
    ("--trajectory", FULL, True),
], ids=["o-null", "trajectory-null", "o-link-to-null", "o-full", "trajectory-link-to-full"])
def test_a_device_is_written_through_never_replaced(tmp_path, option, minor, via_link, capsys, monkeypatch):
    node = device(tmp_path / "dev", minor)
    target = tmp_path / "link"
    target.symlink_to(node) if via_link else None
    code, out, err = run([*SAMPLE, option, str(target if via_link else node)], capsys, monkeypatch)
    assert same_node(node, stat.S_ISCHR, os.makedev(1, minor))  # still the device, not a regular file
    assert not via_link or os.path.islink(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["dev"] + (["link"] if via_link else []))
    if minor == NULL:
        assert code == 0 and len(out.splitlines()) == 1, err
    else:  # /dev/full: its one line, exit 2, no traceback
        assert code == 2 and "No space left on device" in one_line(err)


def test_a_fifo_is_written_through_and_one_nobody_reads_is_one_line(tmp_path, capsys, monkeypatch):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, out, err = run([*SAMPLE, "-o", str(fifo)], capsys, monkeypatch)  # no reader: refused, not a hang
    assert code == 2 and "no process is reading it" in one_line(err)
    got, ready = [], threading.Event()

    def read():
        ready.set()
        got.append(fifo.read_text())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ready.wait(10)
    time.sleep(0.5)  # into its open(): under load a thread can start late, and then nobody reads yet
    try:
        code, out, err = run([*SAMPLE, "-o", str(fifo), "--n", "2"], capsys, monkeypatch)
    finally:
        deadline = time.monotonic() + 10
        while reader.is_alive() and time.monotonic() < deadline:  # the write failed: let the reader go
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: the reader is not in its open() yet
                time.sleep(0.05)
        reader.join(10)
    assert code == 0, err
    assert [json.loads(line)["text"] for line in got[0].splitlines()] == out.splitlines()
    assert same_node(fifo, stat.S_ISFIFO)


def test_a_link_to_stdout_writes_into_the_stream(tmp_path, capfd, monkeypatch):
    """/dev/stdout, made here as the same link: the records go into stdout, before the texts."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    code, out, err = run([*SAMPLE, "-o", str(link)], capfd, monkeypatch)
    assert code == 0, err
    record, text = out.splitlines()
    assert json.loads(record)["text"] == text
    assert os.readlink(link) == "/proc/self/fd/1"


def test_the_atomic_writer_never_replaces_a_special_file(tmp_path):
    """Every atomic write (sample -o and --trajectory, bench's reports, the TUI's saves and tui.json)
    goes through atomic.atomic_write_text: a socket is connected to, a disk refused, a link to a
    file refused with the link and its file as they were."""
    short = Path(tempfile.mkdtemp(prefix="dbert-sock-"))  # a socket's path must be short
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(short / "s"))
        server.listen(1)
        got = []

        def accept():
            conn, _ = server.accept()
            with conn:
                got.append(conn.makefile("rb").read())

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        atomic.atomic_write_text(short / "s", "to the socket\n")
        t.join(10)
        server.close()
        assert got == [b"to the socket\n"] and same_node(short / "s", stat.S_ISSOCK)
    finally:
        shutil.rmtree(short)
    try:
        os.mknod(tmp_path / "disk", stat.S_IFBLK | 0o600, os.makedev(259, 999_999))  # no such disk
    except PermissionError:
        pass
    else:
        with pytest.raises(DbertError, match="block device"):
            atomic.atomic_write_text(tmp_path / "disk", "x")
        assert same_node(tmp_path / "disk", stat.S_ISBLK)
    (tmp_path / "real.txt").write_text("old\n")
    (tmp_path / "link.txt").symlink_to("real.txt")
    with pytest.raises(DbertError, match="symbolic link .to real.txt.; dbert never writes a file through a link"):
        atomic.atomic_write_text(tmp_path / "link.txt", "new\n")
    assert os.readlink(tmp_path / "link.txt") == "real.txt" and (tmp_path / "real.txt").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "link.txt", "real.txt"][os.geteuid() != 0:]


@pytest.mark.parametrize("option", ["-o", "--trajectory"])
@pytest.mark.parametrize("target", ["file", "dangling", "folder"])
def test_an_output_that_is_a_link_to_a_file_is_refused_and_nothing_changes(tmp_path, option, target, capsys,
                                                                            monkeypatch):
    """-o LINK and --trajectory LINK: refused before sampling, in one line; the link and the file it
    names are as they were, and nothing is made where a dangling link points."""
    real = tmp_path / "precious"
    if target == "file":
        real.write_text("the user's own file\n")
    elif target == "folder":
        real.mkdir()
    link = tmp_path / "out.jsonl"
    link.symlink_to(real)
    code, out, err = run([*SAMPLE, option, str(link)], capsys, monkeypatch)
    line = one_line(err)
    assert code == 2 and out == "" and ("--output" if option == "-o" else option) in line
    assert ("is a folder" if target == "folder" else "symbolic link") in line
    assert os.readlink(link) == str(real)
    assert (real.read_text() == "the user's own file\n") if target == "file" else \
        (real.is_dir() if target == "folder" else not os.path.lexists(real))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.jsonl"] + ([] if target == "dangling"
                                                                                  else ["precious"]))


def test_a_link_swapped_in_after_the_check_is_never_written_through(tmp_path):
    """The writer itself refuses a link to a file (bench's reports and the TUI's saves call it
    without check_output), and a file replaced by a link between check and write is refused too."""
    from dbert_core.disk.output import check_output

    real, out = tmp_path / "precious", tmp_path / "out.txt"
    real.write_text("keep\n")
    out.write_text("old\n")
    check_output(out, "-o")
    out.unlink()
    out.symlink_to(real)
    with pytest.raises(DbertError, match="symbolic link"):
        atomic.atomic_write_text(out, "new\n")
    assert real.read_text() == "keep\n" and os.path.islink(out)


def test_a_bench_report_that_is_a_link_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    (tmp_path / "precious").write_text("keep\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench.md").symlink_to(tmp_path / "precious")
    monkeypatch.setattr("dbert_core.cli.options.load", lambda *a: pytest.fail("the checkpoint was loaded first"))
    code, out, err = run(["bench", "--out", str(tmp_path / "bench")], capsys, monkeypatch)
    assert code == 2 and "symbolic link" in one_line(err) and "--out" in one_line(err)
    assert (tmp_path / "precious").read_text() == "keep\n"


@pytest.mark.parametrize("option", ["-o", "--trajectory"])
def test_a_device_in_a_folder_this_user_cannot_write_is_written_to(tmp_path, option, capsys, monkeypatch):
    """As a normal user /dev is not writable, but /dev/null is: the device is written to, never
    refused for its folder. The folder is made read-only for this user (os.access as a non-root
    user sees it; root passes every permission check)."""
    from dbert_core.disk import output

    folder = tmp_path / "dev"
    folder.mkdir()
    node = device(folder / "null", NULL)
    real_access = os.access
    monkeypatch.setattr(output.os, "access", lambda p, mode: False if Path(p) == folder else real_access(p, mode))
    code, out, err = run([*SAMPLE, option, str(node)], capsys, monkeypatch)
    assert code == 0 and len(out.splitlines()) == 1, err
    assert same_node(node, stat.S_ISCHR, os.makedev(1, NULL)) and [p.name for p in folder.iterdir()] == ["null"]
    code, out, err = run([*SAMPLE, option, str(folder / "new.jsonl")], capsys, monkeypatch)  # a new file there: no
    assert code == 2 and "is not writable" in one_line(err)


# ------------------------------------------------------------------ 3. a checkpoint a run trains into is held
@pytest.fixture
def training_into():
    """A process holding a store entry's output lock, as `dbert train --out NAME` does while it runs."""
    from dbert_core.storage import store

    children = []

    def start(name: str) -> int:
        store.store_dir().mkdir(parents=True, exist_ok=True)
        code = ("import sys, time; from dbert_core.disk.lock import OutLock; lock = OutLock(sys.argv[1]); "
                "print('held', flush=True); time.sleep(600)")
        child = subprocess.Popen([sys.executable, "-c", code, str(store.store_dir() / name)], stdout=subprocess.PIPE,
                                 text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        children.append(child)
        assert child.stdout.readline().strip() == "held"
        return child.pid

    yield start
    for child in children:
        child.kill()
        child.wait()


def test_a_checkpoint_in_training_cannot_be_removed_or_imported_over(training_into, capsys, monkeypatch):
    from dbert_core.storage import store

    shutil.copytree(FIXTURE, store.store_dir() / "x")
    pid = training_into("x")
    code, out, err = run(["checkpoints", "remove", "x", "--yes"], capsys, monkeypatch)
    assert code == 2 and f"pid {pid}" in one_line(err) and "removed" not in err
    assert layout.read_meta(store.store_dir() / "x")  # still there
    with pytest.raises(DbertError, match=f"pid {pid}"):  # the TUI's Checkpoints screen calls the store
        store.remove("x")

    pid = training_into("y")  # a run that has not saved yet: no folder y, but its lock
    code, out, err = run(["checkpoints", "import", str(FIXTURE), "--name", "y"], capsys, monkeypatch)
    assert code == 2 and f"pid {pid}" in one_line(err) and out == ""
    assert not (store.store_dir() / "y").exists()
    with pytest.raises(DbertError, match=f"pid {pid}"):
        store.import_dir(FIXTURE, name="y")
    assert sorted(p.name for p in store.store_dir().iterdir() if not p.name.endswith("dbert-lock")) == ["x"]


def test_a_checkpoint_nobody_trains_into_is_removed(capsys, monkeypatch):
    from dbert_core.storage import store

    shutil.copytree(FIXTURE, store.store_dir() / "x")
    (store.store_dir() / ".x.dbert-lock").write_text("pid 99999999")  # left by a run killed with -9
    code, out, err = run(["checkpoints", "remove", "x", "--yes"], capsys, monkeypatch)
    assert code == 0 and "removed" in err and not (store.store_dir() / "x").exists()


@pytest.mark.parametrize("where", ["flock", "pwrite"])
def test_a_ctrl_c_while_the_lock_is_taken_leaves_no_lock_file(tmp_path, monkeypatch, where):
    """CI once saw `dbert train` stopped by SIGTERM at start-up leave its .dbert-lock behind: the
    signal landed between the lock file's creation and OutLock's return, so nothing released it.
    Interrupted there now removes the file the taking made (before the lock: `flock`; holding it,
    while recording its pid: `pwrite`), and a lock another process holds is never removed."""
    import fcntl

    from dbert_core.disk import lock as lockmod
    from dbert_core.errors import Interrupted

    out = tmp_path / "run"
    file = tmp_path / ".run.dbert-lock"
    real = {"flock": fcntl.flock, "pwrite": os.pwrite}[where]
    calls = []

    def interrupted_once(*args):
        calls.append(args)
        if len(calls) == 1:
            raise Interrupted("SIGINT")
        return real(*args)

    monkeypatch.setattr(fcntl if where == "flock" else lockmod.os, where, interrupted_once)
    with pytest.raises(Interrupted):
        lockmod.OutLock(out)
    assert calls and not file.exists()
    monkeypatch.undo()
    held = lockmod.OutLock(out)  # the folder is free again
    assert lockmod.holder(out) == f"pid {os.getpid()}"
    with pytest.raises(DbertError, match="being written by another dbert run"):
        lockmod.OutLock(out)  # refused: and the holder's file stays
    assert file.exists() and lockmod.holder(out) == f"pid {os.getpid()}"
    held.release()
    assert not file.exists()


# ------------------------------------------------------------------ 2. a full disk never touches the last checkpoint
FULL_DISK = r"""
import contextlib, hashlib, io, json, os, shutil, subprocess, sys
from pathlib import Path
from dbert_core.cli import main

mnt, ckpt, data, report = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
mnt.mkdir()
subprocess.run(["mount", "--make-rprivate", "/"], check=False, capture_output=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)

def files(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}

def leave_free(nbytes):  # fill the tmpfs so that about nbytes stay free
    (mnt / "filler").unlink(missing_ok=True)
    st = os.statvfs(mnt)
    with open(mnt / "filler", "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - nbytes))

def dbert(*args):
    sys.argv = ["dbert", *args]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()

results = []
shutil.copytree(ckpt, mnt / "run")
before = files(mnt / "run")
pages = lambda name: -(-(mnt / "run" / name).stat().st_size // 4096) * 4096
in_tokenizer = pages("model.safetensors") + pages("config.json") + 6 * 4096  # the marker, then into tokenizer.json
for free in (64 << 10, in_tokenizer, 320 << 10):  # the disk fills in the weights, the tokenizer, the optimizer's state
    leave_free(free)
    code, err = dbert("train", "--out", str(mnt / "run"), "--resume", "--max-steps", "151", "--device", "cpu")
    results.append({"free": free, "code": code, "err": err, "same": files(mnt / "run") == before,
                    "left": sorted(p.name for p in mnt.iterdir())})
leave_free(64 << 10)
code, err = dbert("train", "--data", data, "--out", str(mnt / "fresh"), "--preset", "tiny", "--max-steps", "1",
                  "--seq-len", "16", "--batch-size", "8", "--T", "64", "--eval-every", "0", "--device", "cpu")
results.append({"free": 64 << 10, "code": code, "err": err, "fresh": True, "left": sorted(p.name for p in mnt.iterdir())})
report.write_text(json.dumps(results))  # not stdout: dbert's main closes it after a failure
"""


def test_a_full_disk_keeps_the_last_checkpoint_byte_for_byte_and_is_one_line(tiny_checkpoint, tmp_path):
    """A real small tmpfs, mounted in a private mount namespace (it dies with the child)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to mount a small tmpfs")
    data = tmp_path / "small.txt"
    data.write_text("".join(TINYSTORIES.read_text().splitlines(keepends=True)[:400]))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run(["unshare", "-m", sys.executable, "-c", FULL_DISK, str(tmp_path / "mnt"), str(tiny_checkpoint),
                        str(data), str(tmp_path / "results.json")], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0 and "unshare" in r.stderr and "Operation not permitted" in r.stderr:
        pytest.skip("unshare is not permitted here")
    assert r.returncode == 0, r.stderr[-3000:]
    for res in json.loads((tmp_path / "results.json").read_text()):
        lines = [ln for ln in res["err"].splitlines() if ln.startswith("dbert:")]
        assert res["code"] == 2 and len(lines) == 1 and "Traceback" not in res["err"], res
        assert "No space left on device" in lines[0] and "internal error" not in lines[0], res
        if res.get("fresh"):
            assert "nothing was saved" in lines[0], res
        else:
            assert "kept as it was" in lines[0] and res["same"], res
        assert res["left"] == ["filler", "run"], res  # no temp folder, no lock, no half-made fresh/


# ------------------------------------------------------------------ 4. the weights' digests
def test_altered_weights_are_refused_and_checkpoints_without_digests_still_load(tmp_path, capsys, monkeypatch):
    from dbert_core.storage import checkpoint

    assert "sha256" not in layout.read_meta(FIXTURE)  # saved before digests (as a hub download may be)
    checkpoint.load(FIXTURE)
    ck = checkpoint.save(checkpoint.load(FIXTURE), tmp_path / "ck")
    meta = layout.read_meta(ck)
    assert set(meta["sha256"]) == {"model.safetensors", "dbert_tokens.safetensors"}
    assert meta["sha256"]["model.safetensors"] == checkpoint.digest(ck / "model.safetensors")
    code, out, err = run([*SAMPLE[:2], str(ck), *SAMPLE[3:]], capsys, monkeypatch)
    assert code == 0 and len(out.splitlines()) == 1, err

    weights = bytearray((ck / "model.safetensors").read_bytes())
    weights[-3] ^= 0x01  # one bit of one weight, the header intact: the file still parses and the values are finite
    (ck / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(DbertError, match="does not match the sha256"):
        checkpoint.load(ck)
    code, out, err = run([*SAMPLE[:2], str(ck), *SAMPLE[3:]], capsys, monkeypatch)
    assert code == 2 and out == "" and "model.safetensors does not match the sha256" in one_line(err)

    meta["sha256"]["model.safetensors"] = "0" * 63  # not a digest: the schema names the field
    (ck / "dbert.json").write_text(json.dumps(meta))
    with pytest.raises(DbertError, match="'sha256'"):
        checkpoint.load(ck)


def test_the_shipped_checkpoints_record_digests_that_match():
    """assets/*/dbert.json record their weights' sha256 (load checks them: ~50 ms for the default's 32.6 MB)."""
    from dbert_core.storage import checkpoint, store

    for name in store.SHIPPED:
        path = store.shipped(name)
        if path is None:
            continue
        recorded = layout.read_meta(path)["sha256"]
        assert recorded and recorded == {f: checkpoint.digest(path / f) for f in checkpoint.WEIGHT_FILES
                                         if (path / f).is_file()}


def test_a_store_operation_removes_a_lock_nobody_holds_and_keeps_one_held(training_into):
    """A run killed with -9 leaves its lock file: the next store operation removes it (a held one stays)."""
    from dbert_core.storage import store

    store.store_dir().mkdir(parents=True)
    (store.store_dir() / ".gone.dbert-lock").write_text(f"pid {2**22 + 1}".ljust(31) + "\n")
    (store.store_dir() / ".mine.dbert-lock").write_text("a user's file of that name\n")  # not dbert's: kept
    training_into("live")
    store.entries()
    assert sorted(p.name for p in store.store_dir().iterdir()) == [".live.dbert-lock", ".mine.dbert-lock"]
