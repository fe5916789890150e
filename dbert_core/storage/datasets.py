"""Training data from the Hugging Face Hub: `--data hf:owner/name` (or `hf:owner/name@revision`).

A dataset repo's data files (text, JSONL, CSV, TSV, Parquet, compressed too: DATA_PATTERNS; nothing
else, never code) are downloaded once with huggingface_hub's snapshot_download into
$DBERT_HOME/cache/datasets/owner--name[@revision]/, built in a marked temp folder beside it
(disk/temp_folders.py) and renamed into place when complete: a failed, offline or killed
download leaves nothing a later run reads. A later run finds the folder and downloads nothing
(a repo named without a revision is the one downloaded first: delete the folder, or name a
revision, for another). `local` turns a run's --data into the folders' paths, which the rest of
dbert reads like any folder of files (its files, every level down, sorted).
Offline (HF_HUB_OFFLINE=1, DBERT_OFFLINE=1, no network) a repo not yet downloaded is one line.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..disk import layout, temp_folders
from ..errors import DbertError
from .store import home

PREFIX = "hf:"
DATA_PATTERNS = ["*.txt", "*.jsonl", "*.parquet", "*.csv", "*.tsv",  # text.sources reads each of them
                 *(f"*.{kind}.{z}" for z in ("gz", "zst") for kind in ("txt", "jsonl", "csv", "tsv"))]
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def is_hub(pattern: str) -> bool:
    return pattern.startswith(PREFIX)


def parse(pattern: str) -> tuple[str, str | None]:
    """("owner/name", revision or None) of `hf:owner/name[@revision]`; one line when it is not one."""
    repo, _, revision = pattern[len(PREFIX):].partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_PART.match(p) and ".." not in p for p in parts) or (_ and not revision) \
            or not re.match(r"^[A-Za-z0-9._/-]{0,120}$", revision):
        raise DbertError(f"--data {pattern[:80]!r}: a hub dataset is hf:owner/name or hf:owner/name@revision")
    return repo, revision or None


def folder(repo: str, revision: str | None) -> Path:
    """Where the repo's files are kept: $DBERT_HOME/cache/datasets/owner--name[@revision]."""
    name = repo.replace("/", "--") + (f"@{revision.replace('/', '--')}" if revision else "")
    return home() / layout.CACHE / layout.DATASETS_CACHE / name


def local(patterns: list[str]) -> list[str]:
    """The patterns with each hf: one replaced by its downloaded folder (downloaded now when absent)."""
    return [str(download(*parse(p))) if is_hub(p) else p for p in patterns]


def _offline(where: str) -> None:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise DbertError(f"cannot download {where}: offline (HF_HUB_OFFLINE=1 is set) and not downloaded before")
    if os.environ.get("DBERT_OFFLINE") == "1":
        raise DbertError(f"cannot download {where}: DBERT_OFFLINE=1 is set and it was not downloaded before")


def download(repo: str, revision: str | None = None) -> Path:
    """The folder of the dataset repo's data files: the one kept, else downloaded now whole."""
    from huggingface_hub import snapshot_download

    from .fetch import _hub_error
    from .net import SlowAnswer, configure_hub, deadline

    target = folder(repo, revision)
    if target.is_dir():
        return target
    where = PREFIX + repo + (f"@{revision}" if revision else "")
    _offline(where)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp_folders.clean(target.parent)  # what a killed download left
    except OSError as e:
        raise DbertError(f"cannot write {target.parent}: {e.strerror or e}") from None
    tmp = temp_folders.temp_dir(target, "fetch")
    try:
        got = tmp / "hub"
        configure_hub()
        try:
            with deadline():  # the whole download within DBERT_FETCH_DEADLINE seconds (net.py)
                snapshot_download(repo, repo_type="dataset", revision=revision, local_dir=got, cache_dir=tmp / "cache",
                                  endpoint=os.environ.get("HF_ENDPOINT") or None, allow_patterns=DATA_PATTERNS,
                                  max_workers=2)
        except SlowAnswer as e:
            raise DbertError(f"cannot download {where}: {e}") from None
        except DbertError:
            raise
        except Exception as e:  # noqa: BLE001 - network stacks raise many kinds; one line for the user
            raise DbertError(str(_hub_error(e, where, where)).replace("cannot fetch", "cannot download", 1)
                             .replace("no such repo on the hub", "no such dataset on the hub")) from None
        shutil.rmtree(got / ".cache", ignore_errors=True)
        if not got.is_dir() or not any(p.is_file() for p in got.rglob("*")):
            raise DbertError(f"{where} holds no data files ({', '.join(DATA_PATTERNS[:3])}, ...)")
        try:
            os.rename(got, target)
        except OSError:  # another run put it in place first: its copy is as good
            if not target.is_dir():
                raise
    finally:
        temp_folders.discard(tmp)
    return target
