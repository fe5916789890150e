"""Store operations (fetch / import / remove) against a local HTTP server on 127.0.0.1.

The server plays both an archive host (/files/NAME) and the few Hugging Face Hub endpoints
`snapshot_download` uses: repo info at a revision, the recursive tree listing, and
HEAD/GET of /{repo}/resolve/{sha}/{file}.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dbert_core.storage import fetch, store
from helpers import ROOT, SHA, HubServer, online, tar_bytes, zip_bytes
from dbert_core.errors import DbertError


@pytest.fixture(autouse=True)
def _without_shipped_default(monkeypatch):
    """These tests count and draw the store's entries: keep the shipped checkpoints out of them."""
    from dbert_core.storage import store as _store

    monkeypatch.setattr(_store, "shipped", lambda name: None)

@pytest.fixture
def server(tiny_checkpoint):
    with HubServer() as s:
        s.repos["acme/tiny-dbert"] = tiny_checkpoint
        s.files["tiny.tar.gz"] = tar_bytes(tiny_checkpoint)
        s.files["flat.zip"] = zip_bytes(tiny_checkpoint)
        yield s


def _store_names() -> list[str]:
    return [e.name for e in store.entries()]


def _no_leftovers() -> None:
    root = store.store_dir()
    hidden = [p.name for p in root.iterdir() if p.name.startswith(".")] if root.is_dir() else []
    assert hidden == [], f"half-written files left in the store: {hidden}"


def test_fetch_url_tar_gz(server):
    seen = []
    path = fetch.fetch(f"{server.url}/files/tiny.tar.gz", progress=lambda d, t, w: seen.append((d, t, w)))
    assert path == store.store_dir() / "tiny"
    assert "tiny" in _store_names()
    assert seen and seen[-1][0] == len(server.files["tiny.tar.gz"])
    assert not (path / "trainer_state").exists()  # pickled optimizer state is never unpacked
    from dbert_core.storage import checkpoint

    assert checkpoint.load(path).schedule.name == "spindle"
    _no_leftovers()


def test_fetch_url_zip_with_name(server):
    path = fetch.fetch(f"{server.url}/files/flat.zip", name="zipped")
    assert path.name == "zipped" and (path / "model.safetensors").is_file()
    with pytest.raises(DbertError, match="already exists"):
        fetch.fetch(f"{server.url}/files/flat.zip", name="zipped")
    _no_leftovers()


@pytest.mark.parametrize("member,why", [
    ("../evil.txt", "outside"),
    ("/abs/evil.txt", "absolute"),
    ("ckpt/pytorch_model.bin", "pickle"),
])
def test_fetch_refuses_unsafe_archives(server, tiny_checkpoint, member, why):
    server.files["bad.tar.gz"] = tar_bytes(tiny_checkpoint, extra={member: b"x"})
    with pytest.raises(DbertError, match=why):
        fetch.fetch(f"{server.url}/files/bad.tar.gz")
    assert "bad" not in _store_names()
    _no_leftovers()


def test_fetch_refuses_links_and_oversize(server, tiny_checkpoint):
    server.files["link.tar.gz"] = tar_bytes(tiny_checkpoint, symlink="ckpt/vocab2.txt")
    with pytest.raises(DbertError, match="links"):
        fetch.fetch(f"{server.url}/files/link.tar.gz")
    with pytest.raises(DbertError, match="limit"):
        fetch.fetch(f"{server.url}/files/tiny.tar.gz", max_bytes=1000)
    _no_leftovers()
    assert _store_names() == []


def test_fetch_failures_are_one_line(server):
    with pytest.raises(DbertError, match="HTTP 404"):
        fetch.fetch(f"{server.url}/files/missing.tar.gz")
    server.files["junk.tar.gz"] = b"this is not an archive"
    with pytest.raises(DbertError, match="not a .tar.gz, .tgz, .tar or .zip archive"):
        fetch.fetch(f"{server.url}/files/junk.tar.gz")
    with pytest.raises(DbertError, match="offline"):  # HF_HUB_OFFLINE=1 from conftest
        fetch.fetch("acme/tiny-dbert")
    with pytest.raises(DbertError, match="cancelled"):
        fetch.fetch(f"{server.url}/files/tiny.tar.gz", cancel=lambda: True)
    closed = HubServer()
    closed.httpd.server_close()  # nothing listens on this port any more
    with pytest.raises(DbertError, match="cannot fetch"):
        fetch.fetch(f"{closed.url}/files/tiny.tar.gz")
    _no_leftovers()
    assert _store_names() == []


def test_fetch_hub_repo_pinned(server, monkeypatch):
    online(monkeypatch, server)
    seen = []
    path = fetch.fetch("acme/tiny-dbert", revision=SHA, progress=lambda d, t, w: seen.append(d))
    assert path.name == "tiny-dbert"
    assert (path / "model.safetensors").is_file() and not (path / "trainer_state").exists()
    assert not (path / ".cache").exists()
    assert any(r.startswith("GET /acme/tiny-dbert/resolve/") for r in server.requests)
    assert seen and seen[-1] > 0
    with pytest.raises(DbertError, match="no such repo"):
        fetch.fetch("acme/missing")
    _no_leftovers()


def test_import_and_remove(tiny_checkpoint, tmp_path):
    path = store.import_dir(tiny_checkpoint, name="mine")
    assert path == store.store_dir() / "mine" and "mine" in _store_names()
    with pytest.raises(DbertError, match="not a dbert checkpoint|missing"):
        store.import_dir(tmp_path)
    with pytest.raises(DbertError, match="default"):
        store.remove("default")
    store.remove("mine")
    assert "mine" not in _store_names() and not path.exists()
    with pytest.raises(DbertError, match="no checkpoint named"):
        store.remove("mine")
    _no_leftovers()


def test_cli_fetch_hub_and_remove(server, tmp_path):
    """The same operations through `dbert checkpoints`, in a fresh process whose env points at the server."""
    env = dict(os.environ, HF_ENDPOINT=server.url, HF_HUB_OFFLINE="0")
    run = lambda *args: subprocess.run([sys.executable, "-m", "dbert_core.cli", "checkpoints", *args],  # noqa: E731
                                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
                                       stdin=subprocess.DEVNULL)
    r = run("fetch", "acme/tiny-dbert", "--revision", "main", "--name", "fromhub")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(store.store_dir() / "fromhub")  # data on stdout: the new path
    r = run("fetch", "acme/nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such repo" in r.stderr
    r = run("remove", "fromhub")  # no terminal to ask on: refuses without --yes
    assert r.returncode == 2 and "--yes" in r.stderr and (store.store_dir() / "fromhub").is_dir()
    r = run("remove", "fromhub", "--yes")
    assert r.returncode == 0, r.stderr
    assert not (store.store_dir() / "fromhub").exists()
    r = run("import", str(server.repos["acme/tiny-dbert"]), "--name", "local")
    assert r.returncode == 0 and r.stdout.strip() == str(store.store_dir() / "local"), r.stderr



def test_a_mistyped_checkpoint_name_for_init_gets_a_did_you_mean(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    """--init takes a store name or a hub id: a near miss of a store name was only 'the Hub is not reachable'."""
    import shutil

    from helpers import run as cli

    monkeypatch.setenv("DBERT_HOME", str(tmp_path))
    shutil.copytree(tiny_checkpoint, tmp_path / "checkpoints" / "my-stories")
    data = tmp_path / "data.txt"
    data.write_text("Tom had a red kite.\nLily saw a big dog.\n")
    code, _, err = cli(["train", "--data", str(data), "--init", "my-storeis", "--max-steps", "1",
                        "--out", str(tmp_path / "run")], capsys, monkeypatch)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--init my-storeis" in err and err.rstrip().endswith("did you mean 'my-stories'?"), err
