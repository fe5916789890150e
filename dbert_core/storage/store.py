"""The checkpoint store: named checkpoints in a per-user data directory, plus the shipped ones.

    $DBERT_HOME (default: platformdirs' user data dir for "dbert")/checkpoints/<name>/

Shipped checkpoints live in the package's assets/ and are listed first, under their names in
SHIPPED: "default" (what every command uses when none is named; its folder's own name,
"dbert-minilm-stories", names it too) and the others. `resolve`
turns what a user typed (a store name, a shipped name, or a path) into a directory.

The store's operations are here too: `import_dir`, `remove`, and `commit`, through which every
entry enters the store (fetch.py downloads from the network and commits through it).
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from ..disk import layout, temp_folders, tree
from ..display import is_safe, safe_text
from ..errors import DbertError
from ..disk.lock import Busy, OutLock, holder
from ..stopping import put_off_stops
from ..disk.modes import apply_umask
from ..disk.trust import PICKLE_SUFFIXES, is_code, pickled

DEFAULT_NAME = "default"
# shipped checkpoints: name -> folder inside assets/, the default first
SHIPPED = {DEFAULT_NAME: "dbert-minilm-stories", "dbert-minilm-wiki": "dbert-minilm-wiki"}


def home() -> Path:
    env = os.environ.get("DBERT_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("dbert", appauthor=False))


def store_dir() -> Path:
    return home() / "checkpoints"


def assets_dir() -> Path:
    """The shipped assets: inside the installed package, or the repository's assets/ folder."""
    from importlib.resources import files

    packaged = Path(str(files("dbert_core") / "assets"))
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "assets"


def shipped(name: str) -> Path | None:
    """The directory of a shipped checkpoint by name, if it is installed."""
    folder = SHIPPED.get(name) or (name if name in SHIPPED.values() else None)  # "default" or its own name
    path = assets_dir() / folder if folder else None
    return path if path is not None and (path / layout.META).is_file() else None


def default_checkpoint() -> Path | None:
    return shipped(DEFAULT_NAME)


MAX_NAME = 100  # characters of a store name (its temp folders add ~35 to it, within NAME_MAX)


def is_name(text: str) -> bool:
    """A store name: no path separators, not '.' or '..', not hidden, at most MAX_NAME
    characters, and nothing a terminal would act on (no newline, escape or other control)."""
    return (bool(text) and "/" not in text and os.sep not in text and not text.startswith(".")
            and len(text) <= MAX_NAME and is_safe(text) and text == text.strip())


def out_path(out: str) -> Path:
    """Where `dbert train --out X` writes: a store entry for a bare name (even when a folder of
    that name exists here: write ./X for that), else the path."""
    if not out.strip():
        raise DbertError("must name a checkpoint (a store name or a directory)", "out", out)
    if out in SHIPPED or out in SHIPPED.values():
        raise DbertError(f"{out!r} is the name of a shipped checkpoint; choose another name", "out", out)
    path = store_dir() / out if is_name(out) else Path(out)
    if "/" not in out and os.sep not in out and not is_name(out):
        raise DbertError(f"{out!r} is not a usable store name (at most {MAX_NAME} characters, not hidden, "
                         "no control characters); give ./NAME for a folder here", "out", out)
    if path.exists() and not path.is_dir():
        raise DbertError(f"{path} is a file, not a checkpoint folder", "out", out)
    return path


def resolve(name_or_path: str | None) -> Path:
    """The checkpoint directory for a store name, 'default', a path, or None (the default).

    A bare name (no path separator) means the shipped checkpoint or store entry of that name,
    even when a folder of that name exists here; only when neither exists is the folder used.
    Anything with a separator (./name, runs/name) is a path."""
    if name_or_path is None or name_or_path == DEFAULT_NAME:
        path = default_checkpoint()
        if path is None:
            raise DbertError("no default checkpoint is installed; name one ($checkpoint NAME_OR_DIR; see `dbert "
                             "checkpoints list`)", refs=("checkpoint",))
        return path
    p = Path(name_or_path).expanduser()
    if is_name(name_or_path):
        path = shipped(name_or_path)
        if path is not None:
            return path
        entry = store_dir() / name_or_path
        if temp_folders.exists(entry):
            return entry
        if p.is_dir():
            return p
        raise DbertError(f"no checkpoint named {name_or_path!r} in {store_dir()} and no such directory"
                         f"{did_you_mean(name_or_path)} (see `dbert checkpoints list`)")
    if temp_folders.exists(p):  # a checkpoint between a save's two renames is still there to read
        return p
    raise DbertError(f"checkpoint directory not found: {name_or_path}")


@overload
def named(init: None) -> None: ...


@overload
def named(init: str) -> str: ...


def named(init: str | None) -> str | None:
    """What `--init` names, with a checkpoint of the store in its place: a folder stays itself, a
    bare name that is a shipped checkpoint (`default` too) or a store entry becomes its folder
    (fine-tuning it offline); anything else is left for the hub."""
    if init is None or Path(init).expanduser().is_dir() or not is_name(init):
        return init
    path = shipped(init)
    if path is None and temp_folders.exists(store_dir() / init):
        path = store_dir() / init
    return init if path is None else str(path)


def known_names() -> list[str]:
    """Every name a checkpoint answers to: the shipped ones (by both names) and the store's entries."""
    names = [n for n in (*SHIPPED, *SHIPPED.values()) if shipped(n) is not None]
    root = store_dir()
    try:
        names += sorted(p.name for p in root.iterdir() if is_name(p.name) and p.is_dir()) if root.is_dir() else []
    except OSError:
        pass
    return list(dict.fromkeys(names))


def did_you_mean(name: str) -> str:
    """'; did you mean 'x' or 'y'?': the checkpoint names (known_names) close to a mistyped one, else ''."""
    import difflib

    close = difflib.get_close_matches(name, known_names(), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def human_size(n: float) -> str:
    """1536 -> '1.5 KB' (sizes in the checkpoint listings of the CLI and the TUI)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


@dataclass
class Entry:
    name: str
    path: Path
    size: int
    parameters: int | None
    schedule: str
    time: str
    created: str
    broken: str | None = None  # why the entry cannot be used; the other fields are then placeholders
    step: int | None = None    # optimizer steps trained
    val_ppl: float | None = None  # the quality figure (quality()), else the last held-out bound measured while training
    quality: str | None = None    # what val_ppl is, where the checkpoint records its quality figure

    @property
    def label(self) -> str:
        """The name as a listing shows it: the default with its own name too."""
        return f"{SHIPPED[self.name]} ({self.name})" if self.name == DEFAULT_NAME else self.name


def _size(path: Path) -> int:
    """Bytes of a checkpoint's files (not its trainer state), links not followed: a link to / or
    a tree of 990 folders is counted only as far as tree.walk goes."""
    total = 0
    for dirpath, dirs, files in tree.walk(path, strict=False):
        if layout.STATE in dirs:
            dirs.remove(layout.STATE)  # pruned, as with os.walk
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def _entry(name: str, path: Path) -> Entry:
    """A listing row: the checkpoint's settings, or `broken` with the reason it cannot be used."""
    size = _size(path)
    try:
        meta = layout.inspect(path)
    except DbertError as e:
        reason = str(e).replace(f"checkpoint {path}", "").replace(str(path), "").strip(" :")  # the row shows the path
        return Entry(name, path, size, None, "?", "?", "?", broken=safe_text(reason or str(e)))
    schedule = meta["schedule"]
    if schedule == "spindle":
        schedule = f"spindle({meta.get('lambda', 0.3):g})"
    # the text fields come from the checkpoint: made safe to show here, for the CLI and the TUI alike
    return Entry(name, path, size, meta.get("parameters"), schedule, meta.get("time", "none"),
                 safe_text(meta.get("created", "?"), 40), step=meta.get("step"), val_ppl=_val_ppl(path, meta),
                 quality=(quality(meta) or (None, None))[1])


def quality(meta: dict) -> tuple[float, str] | None:
    """A checkpoint's one quality figure, (perplexity per token, what it is), where its dbert.json records one
    (`quality`: measured on held-out text after training, e.g. the shipped model's exact 128-step bound on 200
    held-out whole stories); the README, `dbert checkpoints list` and the TUI show the same figure."""
    q = meta.get("quality")
    if isinstance(q, dict) and isinstance(q.get("ppl_token"), (int, float)) and not isinstance(q["ppl_token"], bool):
        what = safe_text(" ".join(str(q.get("what") or "held-out bound").split()), 120)
        when = safe_text(str(q.get("measured") or ""), 10)
        return float(q["ppl_token"]), what + (f", {when}" if when else "")
    return None


def _val_ppl(path: Path, meta: dict) -> float | None:
    """The checkpoint's quality figure (quality()), else the last validation bound: dbert.json's (saved since
    dbert records it), else the trainer state's."""
    measured = quality(meta)
    if measured is not None:
        return measured[0]
    if isinstance(meta.get("val_ppl_token"), (int, float)):
        return float(meta["val_ppl_token"])
    from ..disk.jsonfile import read_json

    try:  # jsonfile's limits: a FIFO, a huge or a deep file is no bound, never a hang
        history = read_json(path / layout.STATE / layout.STATE_JSON, max_bytes=16 << 20).get("history", [])
        vals = [h["val_ppl_token"] for h in history if isinstance(h, dict) and "val_ppl_token" in h]
        return float(vals[-1]) if vals else None
    except (OSError, DbertError, ValueError, TypeError, AttributeError):
        return None


def tui_checkpoint() -> Path | None:
    """The checkpoint the TUI last used ($DBERT_HOME/tui.json, layout.TUI_STATE), if it names one."""
    from ..disk.jsonfile import read_json

    try:
        last = read_json(home() / layout.TUI_STATE, max_bytes=1 << 20).get("checkpoint")
        return Path(last) if isinstance(last, str) and last else None
    except (OSError, DbertError, AttributeError):
        return None


def entries() -> list[Entry]:
    """The shipped checkpoints first (the default leading), then the store's entries by name.

    Listing is a store operation: it first recovers or removes what killed operations left
    (temp_folders.clean). A folder that is not a usable checkpoint is listed with `broken` set.
    """
    out = []
    for name in SHIPPED:
        path = shipped(name)
        if path is not None:
            out.append(_entry(name, path))
    root = store_dir()
    if root.is_dir():
        temp_folders.clean(root)
        for p in sorted(root.iterdir()):
            if p.is_dir() and is_name(p.name) and _nonempty(p):
                out.append(_entry(p.name, p))
    return out


def _nonempty(folder: Path) -> bool:
    try:
        return any(folder.iterdir())
    except OSError:  # unreadable: listed, and its row says why
        return True


# ------------------------------------------------------------------------------ operations
# Every entry enters the store through `commit` (fetch.py downloads, then commits here) and
# leaves it through `remove`; each operation first tidies what killed ones left (temp_folders.clean).
SKIP_DIRS = (layout.STATE,)  # never fetched, never checked for pickles: the trainer state's own folder


def target(name: str) -> Path:
    """Where a new entry called name goes; DbertError if the name is not a plain free one."""
    if not is_name(name) or name in SHIPPED:
        raise DbertError(f"invalid checkpoint name {name!r} (a plain name, not a shipped one "
                         f"({', '.join(SHIPPED)}), no '/', not hidden)")
    path = store_dir() / name
    refuse_held(path, "import into")
    if temp_folders.exists(path):
        raise DbertError(f"a checkpoint named {name!r} already exists in the store; choose another "
                         "$name or remove it first", refs=("name",))
    if os.path.lexists(path):  # a dangling link or a stray file of that name
        raise DbertError(f"{path} is in the way (a link or a file, not a checkpoint); remove it or choose another "
                         "$name", refs=("name",))
    return path


def _in_use(path: Path, doing: str, holder: str) -> DbertError:
    return DbertError(f"cannot {doing} {path.name!r}: a dbert training run ({holder}) is writing it; "
                      "wait for the run to end or stop it first")


def refuse_held(path: Path, doing: str) -> None:
    """DbertError naming the run when a training run holds path (its OutLock)."""
    who = holder(path)
    if who is not None:
        raise _in_use(path, doing, who)


def hold(path: Path, doing: str) -> OutLock:
    """Take path's output lock for a store operation, so no run starts writing it meanwhile;
    a run that holds it already is named in one DbertError."""
    try:
        return OutLock(path)
    except Busy as e:
        raise _in_use(path, doing, e.holder) from None


def _skipped(parts) -> bool:
    return any(p in SKIP_DIRS for p in parts)


def check_tree(path: Path) -> None:
    """Only plain files and folders: no links, devices or FIFOs (a FIFO would hang a copy), no
    code, and pickles only in a skipped trainer_state/ folder."""
    for dirpath, dirnames, filenames in tree.walk(path):  # links not followed; a huge or deep tree refused
        for name in dirnames + filenames:
            f = Path(dirpath) / name
            rel = f.relative_to(path)
            mode = os.lstat(f).st_mode
            if stat.S_ISLNK(mode):
                raise DbertError(f"refusing {rel}: links are not allowed in a checkpoint")
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise DbertError(f"refusing {rel}: not a regular file")
            if is_code(name):
                raise DbertError(f"refusing {rel}: a checkpoint may not carry custom code")
            if name.lower().endswith(PICKLE_SUFFIXES) and not _skipped(rel.parts):
                raise DbertError(f"refusing {rel}: pickle weights are not accepted (safetensors only)")
            if stat.S_ISREG(mode) and not _skipped(rel.parts):
                with open(f, "rb") as fh:
                    if pickled(name, fh.read(8)):
                        raise DbertError(f"refusing {rel}: it is a pickle, whatever its name (safetensors only)")


def validate(path: Path) -> None:
    """Raise DbertError unless path holds a loadable checkpoint with safetensors weights only."""
    from .checkpoint import load

    check_tree(path)
    load(path)


def commit(ckpt_dir: Path, dest: Path) -> Path:
    """Put a checkpoint built in a temp folder into the store at dest (from `target`): validated,
    given the user's umask, renamed into place; every way into the store ends here."""
    validate(ckpt_dir)
    apply_umask(ckpt_dir)
    with put_off_stops():  # a Ctrl-C waits until `lock` holds it, so `finally` releases it
        lock = hold(dest, "import into")  # a run training into dest (started meanwhile) keeps it
    try:
        if temp_folders.exists(dest):
            raise DbertError(f"a checkpoint named {dest.name!r} appeared in the store meanwhile")
        os.rename(ckpt_dir, dest)
    finally:
        lock.release()
    return dest


def tidy() -> None:
    """What killed store operations left behind: recovered or removed (temp_folders.clean)."""
    temp_folders.clean(store_dir())


def import_dir(path, name: str | None = None) -> Path:
    """Copy a local checkpoint directory into the store (validated first); returns the entry."""
    src = Path(path).expanduser()
    if not src.is_dir():
        raise DbertError(f"not a directory: {src}")
    gaps = layout.missing(src)
    if gaps:  # the first thing to say about a folder that is no checkpoint
        raise DbertError(f"{src} is not a dbert checkpoint: it is missing {', '.join(gaps)}")
    check_tree(src)  # links, FIFOs and code refused before anything is read or copied
    from .checkpoint import load

    load(src)  # a clear error before copying anything
    tidy()
    dst = target(name or src.resolve().name)
    tmp = temp_folders.temp_dir(dst, "import")
    try:
        dest = tmp / "ckpt"
        shutil.copytree(src, dest, symlinks=True)
        return commit(dest, dst)
    finally:
        temp_folders.discard(tmp)


def remove(name: str) -> Path:
    """Delete a store entry by name (shipped checkpoints cannot be removed); returns its old path."""
    if name in SHIPPED:
        raise DbertError(f"the shipped checkpoint {name!r} cannot be removed")
    if not is_name(name):
        raise DbertError(f"not a store name: {name!r} (remove only deletes store entries, not paths)")
    tidy()
    path = store_dir() / name
    if not path.is_dir():
        raise DbertError(f"no checkpoint named {name!r} in {store_dir()}{did_you_mean(name)}")
    with put_off_stops():  # a Ctrl-C waits until `lock` holds it, so `finally` releases it
        lock = hold(path, "remove")  # a run training into it is named; none can start meanwhile
    try:
        # rename first, so the entry disappears at once even if deleting takes a while (or is killed)
        gone = temp_folders.temp_dir(path, "remove")
        os.rename(path, gone / "x")
    finally:
        lock.release()
    temp_folders.discard(gone)
    return path
