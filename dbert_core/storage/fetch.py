"""Fetching a checkpoint from the network (a Hugging Face Hub repo or an archive URL) into the store.

This module only downloads: it builds the new entry in a marked temp folder beside it in the
store (`.<name>.dbert-fetch-…`, temp_folders.py), which `store.entries` never lists, and hands it to
`store.commit`, which validates it, gives it the user's umask and only then renames it into
place: a failed, offline, cancelled or killed fetch leaves nothing half-written in the store,
and what a killed one leaves behind is cleaned by the next store operation (store.tidy).

URLs: http(s) only, redirects only on the same host, connect and read timeouts (net.py).
Archives are unpacked by archive.py (format from the bytes; paths, links, devices, code,
pickles and bombs refused). Hub repos: only weights, configs and tokenizer files are
downloaded, never a `trainer_state/` folder (pickled). Downloads are capped at `max_bytes`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Callable, Optional

from ..disk import layout, temp_folders, tree
from . import store
from ..errors import DbertError

MAX_BYTES = 4 * 1024**3  # 4 GiB downloaded
ALLOW_PATTERNS = ["*.safetensors", "*.json", "*.txt", "tokenizer*", "*.model"]
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
CHUNK = 1 << 16

# progress(done_bytes, total_bytes or None, what) is called from the fetching thread.
Progress = Optional[Callable[[int, Optional[int], str], object]]  # what it returns is not read
Cancel = Optional[Callable[[], bool]]


def _is_url(source: str) -> bool:
    return "://" in source or source.lower().startswith(("file:", "javascript:", "data:"))


def default_name(source: str) -> str:
    """The store name a fetch uses without --name: the repo's or the archive's base name."""
    if _is_url(source):
        from urllib.parse import urlparse

        base = PurePosixPath(urlparse(source).path).name
        for suffix in ARCHIVE_SUFFIXES:
            if base.lower().endswith(suffix):
                return base[: -len(suffix)] or "checkpoint"
        return base or "checkpoint"
    return source.rstrip("/").split("/")[-1]


def fetch(source: str, revision: str | None = None, name: str | None = None, progress: Progress = None,
          max_bytes: int = MAX_BYTES, cancel: Cancel = None) -> Path:
    """Fetch a checkpoint into the store; returns its directory.

    source: a Hugging Face Hub repo id ("user/model") or an http(s) URL to an archive.
    revision: a branch, tag or commit of a hub repo (pinned download).
    cancel: polled while downloading; when it returns True the fetch stops with DbertError.
    """
    from .net import check_url, deadline

    source = source.strip()
    if not source:
        raise DbertError("nothing to fetch: give a hub repo id (user/model) or an https URL")
    if _is_url(source):
        check_url(source)
        if revision is not None:
            raise DbertError("applies to hub repos, not to URLs", "revision", revision)
    store.tidy()
    target = store.target(name or default_name(source))
    tmp = temp_folders.temp_dir(target, "fetch")
    try:
        with deadline():  # the whole download within DBERT_FETCH_DEADLINE seconds (net.py)
            if _is_url(source):
                ckpt_dir = _fetch_url(source, tmp, progress, max_bytes, cancel)
            else:
                ckpt_dir = _fetch_hub(source, revision, tmp, progress, max_bytes, cancel)
        return store.commit(ckpt_dir, target)
    finally:
        temp_folders.discard(tmp)


# ------------------------------------------------------------------------------ URL archives
def _fetch_url(url: str, tmp: Path, progress: Progress, max_bytes: int, cancel: Cancel) -> Path:
    import urllib.error
    from urllib.parse import urlparse

    from .archive import unpack
    from .net import no_answer, open_url, timed_out

    if os.environ.get("DBERT_OFFLINE") == "1":
        raise DbertError(f"cannot fetch {url}: DBERT_OFFLINE=1 is set")
    archive = tmp / "download"
    host = urlparse(url).netloc
    try:
        with open_url(url, cancel) as response:
            total = response.headers.get("Content-Length")
            total = int(total) if total and total.isdigit() else None
            if total is not None and total > max_bytes:
                raise DbertError(f"{url} is {total / 1e6:.1f} MB, over the {max_bytes / 1e6:.1f} MB limit")
            done = 0
            with open(archive, "wb") as out:
                while chunk := response.read(CHUNK):
                    if cancel is not None and cancel():
                        raise DbertError("download cancelled")
                    done += len(chunk)
                    if done > max_bytes:
                        raise DbertError(f"{url} is over the {max_bytes / 1e6:.1f} MB limit")
                    out.write(chunk)
                    if progress is not None:
                        progress(done, total, "download")
            if total is not None and done != total:
                raise DbertError(f"{url}: the download stopped early ({done} of {total} bytes)")
    except DbertError:
        raise
    except urllib.error.HTTPError as e:
        raise DbertError(f"cannot fetch {url}: HTTP {e.code} {e.reason}") from None
    except Exception as e:  # noqa: BLE001 - URLError, OSError, http.client errors: one line each
        if timed_out(e):
            raise no_answer(url, host) from None
        text = " ".join(str(getattr(e, "reason", None) or e).split())[:160] or type(e).__name__
        offline = " (offline?)" if isinstance(e, urllib.error.URLError) else ""
        raise DbertError(f"cannot fetch {url}: {text}{offline}") from None
    dest = tmp / "unpacked"
    dest.mkdir()
    if progress is not None:
        progress(done, total, "unpack")
    unpack(archive, dest, url)
    archive.unlink()
    return _checkpoint_root(dest, url)


def _checkpoint_root(dest: Path, source: str) -> Path:
    """The unpacked checkpoint folder: dest itself or its single subfolder holding dbert.json."""
    if (dest / layout.META).is_file():
        return dest
    subdirs = [p for p in dest.iterdir() if p.is_dir()]
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(subdirs) == 1 and not files and (subdirs[0] / layout.META).is_file():
        return subdirs[0]
    raise DbertError(f"{source} does not hold a dbert checkpoint (no dbert.json at its top level)")


# ------------------------------------------------------------------------------ Hugging Face Hub
def _progress_class(progress: Progress, cancel: Cancel, max_bytes: int):
    """A duck-typed tqdm for snapshot_download's tqdm_class: forwards byte counts to progress."""

    class _Bar:
        def __init__(self, *args, **kwargs):
            self.total = kwargs.get("total") or 0
            self.n = kwargs.get("initial") or 0
            self.desc = str(kwargs.get("desc") or "")
            self.bytes = kwargs.get("unit") == "B" and not self.desc.startswith("Downloading")
            self.format_dict = {"rate": None}

        def update(self, n=1):
            if cancel is not None and cancel():
                raise DbertError("download cancelled")
            self.n += n or 0
            if self.bytes and max(self.total or 0, self.n) > max_bytes:
                raise DbertError(f"the download is over the {max_bytes / 1e6:.1f} MB limit")
            if self.bytes and progress is not None:
                progress(int(self.n), int(self.total) or None, "download")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def __getattr__(self, name):  # refresh, close, set_description, set_postfix_str, ...
            return lambda *a, **k: None

    return _Bar


def _fetch_hub(repo_id: str, revision: str | None, tmp: Path, progress: Progress, max_bytes: int,
               cancel: Cancel) -> Path:
    from huggingface_hub import snapshot_download

    from .net import SlowAnswer, configure_hub

    if repo_id.count("/") > 1 or repo_id.startswith((".", "/")) or " " in repo_id:
        raise DbertError(f"{repo_id!r} is neither a hub repo id (user/model) nor an http(s) URL")
    where = f"{repo_id}@{revision}" if revision else repo_id
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise DbertError(f"cannot fetch {where}: offline (HF_HUB_OFFLINE=1 is set)")
    if os.environ.get("DBERT_OFFLINE") == "1":
        raise DbertError(f"cannot fetch {where}: DBERT_OFFLINE=1 is set")
    download = tmp / "hub"
    configure_hub()
    try:
        snapshot_download(repo_id, revision=revision, local_dir=download, cache_dir=tmp / "cache",
                          endpoint=os.environ.get("HF_ENDPOINT") or None,
                          allow_patterns=ALLOW_PATTERNS, ignore_patterns=[f"{d}/*" for d in store.SKIP_DIRS],
                          max_workers=2,
                          tqdm_class=_progress_class(progress, cancel, max_bytes))
    except SlowAnswer as e:  # a connection's answer trickled in (its headers too): name the repo
        raise DbertError(f"cannot fetch {where}: {e}") from None
    except DbertError:
        raise
    except Exception as e:  # noqa: BLE001 - network stacks raise many kinds; one line for the user
        raise _hub_error(e, repo_id, where) from None
    for leftover in (".cache", *store.SKIP_DIRS):
        shutil.rmtree(download / leftover, ignore_errors=True)
    size = sum(os.lstat(Path(d) / f).st_size for d, _, files in tree.walk(download) for f in files)
    if size > max_bytes:
        raise DbertError(f"{repo_id} is {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.1f} MB limit")
    if not (download / layout.META).is_file():
        raise DbertError(f"{where} is not a dbert checkpoint (no dbert.json in the repo)")
    return download


def _hub_error(e: Exception, repo_id: str, where: str) -> DbertError:
    """One line for whatever snapshot_download raised."""
    from urllib.parse import urlparse

    from huggingface_hub import constants
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError)

    from .net import no_answer, timed_out

    if timed_out(e):
        endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        return no_answer(where, urlparse(endpoint).netloc or endpoint)
    status = _http_status(e)  # the hub client hides a server's answer behind "not in the local cache"
    if status is not None and status >= 500:
        return DbertError(f"cannot fetch {where}: the Hugging Face Hub answered HTTP {status} (a server error, "
                          "not this machine being offline); try again later")
    if isinstance(e, OfflineModeIsEnabled):
        return DbertError(f"cannot fetch {where}: offline (HF_HUB_OFFLINE=1 is set)")
    if isinstance(e, LocalEntryNotFoundError) and status is None:
        cause = _root_cause(e)  # what the hub client met: a refused connection, a name that did not resolve, ...
        why = f" ({type(cause).__name__})" if cause is not e else ""
        return DbertError(f"cannot fetch {where}: the Hugging Face Hub is not reachable{why} (offline, or "
                          "HF_HUB_OFFLINE=1 is set)")
    if isinstance(e, LocalEntryNotFoundError):
        return DbertError(f"cannot fetch {where}: the Hugging Face Hub answered HTTP {status}")
    if isinstance(e, RevisionNotFoundError):
        return DbertError(f"cannot fetch {where}: no such revision")
    if isinstance(e, GatedRepoError):
        return DbertError(f"cannot fetch {repo_id}: the repo is gated; log in with `hf auth login` first")
    if isinstance(e, RepositoryNotFoundError):
        return DbertError(f"cannot fetch {repo_id}: no such repo on the hub (or it is private)")
    text = " ".join(str(e).split())[:160]
    if isinstance(e, (EntryNotFoundError, HfHubHTTPError)):
        return DbertError(f"cannot fetch {where}: {text}")
    return DbertError(f"cannot fetch {where}: {type(e).__name__}" + (f": {text}" if text else ""))


def _root_cause(e: BaseException) -> BaseException:
    """The last exception of e's chain (what the hub client caught before wrapping it)."""
    seen = 0
    while seen < 16 and (behind := e.__cause__ or e.__context__) is not None:
        e, seen = behind, seen + 1
    return e


def _http_status(e: BaseException) -> int | None:
    """The HTTP status a server answered with, from the error or the errors behind it."""
    seen = 0
    current: BaseException | None = e
    while current is not None and seen < 16:
        response = getattr(current, "response", None)
        status = getattr(response, "status_code", None)
        if isinstance(status, int):
            return status
        current, seen = current.__cause__ or current.__context__, seen + 1
    return None
