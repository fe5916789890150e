"""Store operations (fetch / import / remove) against a local HTTP server on 127.0.0.1.

The server plays both an archive host (/files/NAME) and the few Hugging Face Hub endpoints
`snapshot_download` uses: repo info at a revision, the recursive tree listing, and
HEAD/GET of /{repo}/resolve/{sha}/{file}.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from dbert_core import fetch, store
from dbert_core.errors import DbertError


@pytest.fixture(autouse=True)
def _without_shipped_default(monkeypatch):
    """These tests count and draw the store's entries: keep the shipped checkpoints out of them."""
    from dbert_core import store as _store

    monkeypatch.setattr(_store, "shipped", lambda name: None)

ROOT = Path(__file__).resolve().parent.parent
SHA = "0123456789abcdef0123456789abcdef01234567"


class HubServer:
    """A tiny in-process file server: `files` maps /files/<name> to bytes, `repos` maps
    repo ids to checkpoint directories served at commit SHA (revision "main" or SHA)."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.types: dict[str, str] = {}  # file name -> Content-Type (default application/octet-stream)
        self.redirects: dict[str, str] = {}  # path -> Location of a 302
        self.repos: dict[str, Path] = {}
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def _send(self, code, body=b"", headers=None, head=False, ctype="application/octet-stream"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, obj, head=False):
                self._send(200, json.dumps(obj).encode(), head=head, ctype="application/json")

            def _serve(self, head):
                path = unquote(urlparse(self.path).path)
                server.requests.append(f"{self.command} {path}")
                if path in server.redirects:
                    return self._send(302, b"", {"Location": server.redirects[path]}, head)
                if path.startswith("/slow/"):  # dribbles the file out, for cancelling mid-download
                    data = server.files.get(path[len("/slow/"):], b"")
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    try:
                        for i in range(0, len(data), 4096):
                            self.wfile.write(data[i:i + 4096])
                            self.wfile.flush()
                            time.sleep(0.05)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
                if path.startswith("/files/"):
                    name = path[len("/files/"):]
                    if name not in server.files:
                        return self._send(404, b"not found", head=head)
                    return self._send(200, server.files[name], head=head,
                                      ctype=server.types.get(name, "application/octet-stream"))
                if path.startswith("/api/models/"):
                    rest = path[len("/api/models/"):]
                    for repo, folder in server.repos.items():
                        if rest.startswith(repo + "/revision/"):
                            rev = rest[len(repo + "/revision/"):]
                            if rev not in ("main", SHA):
                                return self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound"}, head)
                            return self._json({"id": repo, "sha": SHA, "private": False,
                                               "siblings": [{"rfilename": f} for f in _listing(folder)]}, head)
                        if rest.startswith(repo + "/tree/"):
                            return self._json([{"type": "file", "path": f, "size": (folder / f).stat().st_size,
                                                "oid": hashlib.sha1((folder / f).read_bytes()).hexdigest()}
                                               for f in _listing(folder)], head)
                    return self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"}, head)
                for repo, folder in server.repos.items():
                    prefix = f"/{repo}/resolve/"
                    if path.startswith(prefix):
                        rev, _, fname = path[len(prefix):].partition("/")
                        f = folder / fname
                        if rev not in ("main", SHA) or not f.is_file():
                            return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                        data = f.read_bytes()
                        return self._send(200, data, {"X-Repo-Commit": SHA,
                                                      "ETag": '"' + hashlib.sha1(data).hexdigest() + '"'}, head)
                self._send(404, b"not found", {"X-Error-Code": "RepoNotFound"}, head)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def tar_bytes(folder: Path, arcname: str = "ckpt", extra: dict[str, bytes] | None = None,
              symlink: str | None = None, mode: int | None = None, compression: str = "gz") -> bytes:
    def chmod(info):
        if mode is not None:
            info.mode = mode
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}") as tf:
        tf.add(folder, arcname=arcname, filter=chmod)
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if symlink:
            info = tarfile.TarInfo(symlink)
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tf.addfile(info)
    return buf.getvalue()


def zip_bytes(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in _listing(folder):
            zf.write(folder / f, f)
    return buf.getvalue()


@pytest.fixture
def server(tiny_checkpoint):
    with HubServer() as s:
        s.repos["acme/tiny-dbert"] = tiny_checkpoint
        s.files["tiny.tar.gz"] = tar_bytes(tiny_checkpoint)
        s.files["flat.zip"] = zip_bytes(tiny_checkpoint)
        yield s


def online(monkeypatch, server):
    """Point huggingface_hub at the local server and allow it to go online (in-process)."""
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)


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
    from dbert_core import checkpoint

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
