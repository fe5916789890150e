"""One clear line for every bad input, in the corners an audit found: `dbert bench` with a batch of
hundreds of digits, a fetched archive whose member is both a file and a folder (named by the
user's URL and the member, never dbert's temp folder), and the scripts users run
(scripts/export_default.py, scripts/studies/stories.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile

import pytest

from helpers import ROOT, HubServer, run
from dbert_core.errors import DbertError

TINY = ROOT / "tests" / "fixtures" / "tiny"  # committed: a checkpoint to bench, export and pack


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("download ", "unpack "))]
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.mark.parametrize("digits", [400, 5000])
def test_bench_with_a_batch_of_hundreds_of_digits_is_one_short_line(tmp_path, capsys, monkeypatch, digits):
    """400 digits: 'internal error: OverflowError: int too large to convert to float' (exit 1);
    5,000: the whole number echoed back, a line of thousands of characters."""
    code, out, err = run(["bench", "--checkpoint", str(TINY), "--batch", "9" * digits, "--out", str(tmp_path / "b")],
                         capsys, monkeypatch)
    line = one_line(err)
    assert code == 2 and out == "" and line.startswith("dbert: error: --batch takes "), (code, err)
    assert len(line) < 160 and f"({digits:,} characters)" in line, line
    assert not (tmp_path / "b").exists()


def _tar(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(TINY, arcname="ck")
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip(members) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in sorted(TINY.rglob("*")):
            if f.is_file():
                zf.write(f, "ck/" + str(f.relative_to(TINY)))
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


BOTH = {  # (archive bytes, the path that is both a file and a folder)
    "tar-file-then-folder": (lambda: _tar([("ck/extra", b"a file"), ("ck/extra/x.json", b"{}")]), "ck/extra"),
    "tar-folder-then-file": (lambda: _tar([("ck/extra", None), ("ck/extra", b"a file")]), "ck/extra"),
    "zip-file-then-folder": (lambda: _zip([("ck/extra", "a file"), ("ck/extra/x.json", "{}")]), "ck/extra"),
}


@pytest.mark.parametrize("case", list(BOTH))
def test_an_archive_member_that_is_a_file_and_a_folder_names_the_archive_and_member(tmp_path, case):
    """It said 'cannot unpack the archive: File exists (/tmp/.../unpacked/ck/extra)': dbert's own
    temp folder, not what the user gave."""
    from dbert_core.storage.archive import unpack

    make, both = BOTH[case]
    archive = tmp_path / "download"
    archive.write_bytes(make())
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(DbertError) as e:
        unpack(archive, dest, "https://example.org/ck.tar.gz")
    message = str(e.value)
    assert "https://example.org/ck.tar.gz" in message and f"{both!r} is both a file and a folder" in message, message
    assert str(dest) not in message and str(tmp_path) not in message


def test_a_fetched_archive_with_a_file_and_a_folder_is_one_line_naming_the_url(capsys, monkeypatch):
    from dbert_core.storage import store

    with HubServer() as server:
        server.files["ck.tar.gz"] = BOTH["tar-file-then-folder"][0]()
        url = server.url + "/files/ck.tar.gz"
        code, out, err = run(["checkpoints", "fetch", url, "--name", "x"], capsys, monkeypatch)
    messages = [ln for ln in err.splitlines() if not ln.startswith(("download ", "unpack ", "dbert: warning"))]
    assert code == 2 and out == "" and len(messages) == 1 and "Traceback" not in err, err
    assert url in messages[0] and "'ck/extra' is both a file and a folder" in messages[0], messages[0]
    assert "/unpacked/" not in messages[0] and ".fetch" not in messages[0]
    assert not any(store.store_dir().glob("*x*"))


def _script(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.parametrize("extra,needle", [
    (["--top-p", "5"], "--top-p must be"),
    (["--steps", "0"], "--steps"),
    (["--card", "no-such-card.md"], "cannot read --card no-such-card.md"),
], ids=["top-p-5", "steps-0", "missing-card"])
def test_export_default_refuses_bad_values_in_one_line_and_writes_nothing(tmp_path, extra, needle):
    done = _script(ROOT / "scripts" / "export_default.py", TINY, tmp_path / "out", *extra)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    line = one_line(done.stderr)
    assert line.startswith("export_default: error: ") and needle in line, line
    assert not (tmp_path / "out").exists()


def test_export_default_of_a_missing_checkpoint_is_one_line(tmp_path):
    done = _script(ROOT / "scripts" / "export_default.py", tmp_path / "none", tmp_path / "out")
    assert done.returncode == 2 and "export_default: error: " in one_line(done.stderr)


@pytest.mark.parametrize("which", ["sample-file", "heldout"])
def test_the_stories_study_on_a_missing_file_is_one_line(tmp_path, which):
    held = tmp_path / "held.txt"
    held.write_text("Tom had a red kite. He ran with it.\n<|endoftext|>\n")
    files = ["missing.txt", "--heldout", held] if which == "sample-file" else [held, "--heldout", "missing.txt"]
    done = _script(ROOT / "scripts" / "studies" / "stories.py", *files)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    line = one_line(done.stderr)
    assert line.startswith("stories: error: ") and "missing.txt" in line, line


def test_bench_on_a_full_stdout_is_one_line_saying_where_the_report_is(tmp_path):
    """It said 'No space left on device' and nothing of stdout or of the report it had kept."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "dbert_core.cli", "bench", "--checkpoint", str(TINY), "--quick",
                            "--steps", "4", "--batch", "1", "--samplers", "ancestral", "--length", "8", "--no-train",
                            "--no-bf16", "--out", str(tmp_path / "b")],
                           stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert errors[0] == (f"dbert: error: cannot write the report to stdout: No space left on device; it is in "
                         f"{tmp_path / 'b' / 'bench.md'} (and bench.json)")
    assert (tmp_path / "b" / "bench.md").read_text().startswith("#")
