"""Where a checkpoint lives on disk, and the temporary folders dbert keeps beside it.

A checkpoint is a folder holding dbert.json (the rest: checkpoint.py). Everything dbert writes
is built in a hidden temporary folder beside its destination and renamed into place:

    .NAME.dbert-KIND-PID-XXXXXXXX/     KIND: swap (a save), fetch, import or remove
        .dbert-temp                    marker: {"pid", "host", "created", "kind"}

A folder is dbert's own only when its name has that shape AND it holds the marker (or, killed
before the marker was written, it is empty). Recovery and cleaning touch nothing else: a user's
`NAME.old`, `.NAME.old` or any look-alike is never renamed or deleted.

A save moves the previous checkpoint into its swap folder (`swap/old`) and renames the new one
into place, so a crash leaves either NAME or `swap/old`. Readers use `readable` (no writes);
writers call `recover`, which puts `swap/old` back if NAME is missing and deletes the swap
folder, once its owner is gone (its pid has exited, or it is older than STALE_SECONDS).
`clean` does that for every temp folder of a directory: the store runs it on each operation.

Torch-free: listing the store and the TUI's start-up use it without loading any model.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

from . import trust
from ..errors import DbertError

# ------------------------------------------------------------------------------ file names
# Every name dbert gives a file on disk, here and nowhere else (tests/test_architecture.py pins it).
META = "dbert.json"                          # dbert's settings and provenance (schema.py)
CONFIG = "config.json"                       # the BERT's Hugging Face config
WEIGHTS = "model.safetensors"                # the BERT's weights
TOKENS = "dbert_tokens.safetensors"          # the token counts of the training data (the spindle schedule's)
TIME = "dbert_time.safetensors"              # the time-embedding weights of a time-conditioned model
DIGEST_FILES = (WEIGHTS, TOKENS, TIME)        # the weight files whose sha256 checkpoint.save records (schema.py)
TRUECASE = "dbert_truecase.json"             # optional: the truecasing table (truecase.py); older checkpoints lack it
TOKENIZER = "tokenizer.json"                 # the tokenizer: tokenizer.json or, in older BERT folders, vocab.txt
VOCAB = "vocab.txt"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS = "special_tokens_map.json"
STATE = "trainer_state"                      # folder: what --resume needs besides the weights
STATE_JSON = "state.json"                    #   the data position and counters
OPTIMIZER = "optimizer.pt"                   #   AdamW's state (torch.load with weights_only)
RNG = "rng.pt"                               #   every rank's random-number state
REQUIRED = (CONFIG, WEIGHTS, META, TOKENS)
UNCHECKED = (TOKENIZER,)                     # big (the vocabulary), and no loader reads code keys from it
TUI_STATE = "tui.json"                       # in $DBERT_HOME: the checkpoint the TUI last used
BENCH_JSON, BENCH_MD = "bench.json", "bench.md"  # `dbert bench --out DIR`'s report
MARK = ".dbert-temp"                         # in a temp folder: the marker that makes it dbert's own
LOCK = ".{name}.dbert-lock"                  # beside an output folder NAME: a training run's lock (OutLock)

KINDS = ("swap", "fetch", "import", "remove")
STALE_SECONDS = 24 * 3600  # an owner alive for longer is taken for a reused pid
MAX_META = 4 << 20  # bytes of dbert.json (a few kB; its data list names every training file)
MAX_TREE_DEPTH = 16  # folders within folders in a checkpoint (dbert's own use one: trainer_state/)
MAX_TREE_ENTRIES = 10_000  # files and folders in a checkpoint (as archive.MAX_MEMBERS)
_NAME = re.compile(r"^\.(?P<name>.+)\.dbert-(?P<kind>" + "|".join(KINDS) + r")-(?P<pid>\d+)-[A-Za-z0-9_]+$")


# ------------------------------------------------------------------------------ temp folders
def temp_dir(target: Path, kind: str) -> Path:
    """A new marked temp folder beside target, for an operation of this kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown temp folder kind {kind!r}")
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.dbert-{kind}-{os.getpid()}-", dir=target.parent))
    part = folder / (MARK + ".part")
    try:
        part.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "created": time.time(),
                                    "kind": kind}))
        os.replace(part, folder / MARK)  # the marker appears whole or not at all
    except OSError:  # a full disk: nothing left behind
        part.unlink(missing_ok=True)
        folder.rmdir()
        raise
    return folder


def discard(folder: Path) -> None:
    """Delete a temp folder, its marker last: killed halfway, it is still recognisably ours."""
    folder = Path(folder)
    try:
        children = list(folder.iterdir())
    except OSError:
        return
    for child in children:
        if child.name == MARK:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    try:
        (folder / MARK).unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        pass


def _parse(folder: Path) -> tuple[str, str, int] | None:
    m = _NAME.match(folder.name)
    return (m["name"], m["kind"], int(m["pid"])) if m else None


def _marker(folder: Path) -> dict | None:
    from .jsonfile import read_json

    try:
        data = read_json(folder / MARK, max_bytes=1 << 16)
    except (OSError, DbertError):
        return None
    return data if isinstance(data, dict) else None


def is_ours(folder: Path) -> bool:
    """A temp folder dbert made: the name's shape and dbert's marker inside."""
    folder = Path(folder)
    return folder.is_dir() and not folder.is_symlink() and _parse(folder) is not None and _marker(folder) is not None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    try:  # a killed child its parent has not reaped yet is a zombie: gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _gone(folder: Path, pid: int, marker: dict | None) -> bool:
    """Whether the process that made folder can no longer be using it."""
    created = marker.get("created") if marker else None
    try:
        age = time.time() - (float(created) if created is not None else folder.stat().st_mtime)
    except (TypeError, ValueError, OSError):
        age = 0.0
    if age > STALE_SECONDS:
        return True
    if marker and marker.get("host") not in (None, socket.gethostname()):
        return False  # another machine's process (a shared disk): only age tells
    return not _alive(pid)


def _half_made(folder: Path) -> bool:
    """Killed between mkdtemp and writing the marker: nothing in it but, at most, the marker's draft."""
    try:
        return {p.name for p in folder.iterdir()} <= {MARK + ".part"}
    except OSError:
        return False


def _ours_and_stale(folder: Path) -> tuple[str, str] | None:
    """(name, kind) of a temp folder dbert made whose owner is gone, else None."""
    parsed = _parse(folder)
    if parsed is None or folder.is_symlink() or not folder.is_dir():
        return None
    name, kind, pid = parsed
    marker = _marker(folder)
    if marker is None and not _half_made(folder):
        return None  # our name's shape but not our marker: not provably ours, so not touched
    return (name, kind) if _gone(folder, pid, marker) else None


def _finish(folder: Path, name: str, kind: str) -> None:
    """Finish what a dead owner left: put a swapped-out checkpoint back, then delete the folder."""
    target = folder.parent / name
    if kind == "swap" and (folder / "old").is_dir() and not target.exists():
        os.rename(folder / "old", target)
    discard(folder)


def clean(parent: Path, name: str | None = None) -> None:
    """Recover and remove the stale temp folders in parent (only those of `name` if given)."""
    parent = Path(parent)
    try:
        children = list(parent.iterdir())
    except OSError:
        return
    for folder in children:
        if _stale_lock(folder, name):
            with contextlib.suppress(OSError):
                folder.unlink()  # OutLock's inode check makes a run that opened it just now retry
            continue
        found = _ours_and_stale(folder)
        if found is not None and (name is None or found[0] == name):
            try:
                _finish(folder, *found)
            except OSError:
                pass  # e.g. a read-only store: left for a later operation, never fatal


_LOCK_NAME = re.compile(r"^\.(?P<name>.+)\.dbert-lock$")


def _stale_lock(file: Path, name: str | None) -> bool:
    """An OutLock file (of `name` if given) that no process holds, made by dbert (a regular
    file of its "pid N" record): what a run killed with -9 leaves; a store operation removes it."""
    m = _LOCK_NAME.match(file.name)
    if m is None or (name is not None and m["name"] != name):
        return False
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size <= OutLock.RECORD):
            return False
        if re.fullmatch(rb"(pid \d+ *\n?)?", os.pread(fd, OutLock.RECORD + 1, 0)) is None:
            return False
    except OSError:
        return False
    finally:
        os.close(fd)
    return holder(file.with_name(m["name"])) is None


def recover(path: Path) -> None:
    """Finish a save a crash interrupted (writers only: save, training)."""
    path = Path(path)
    clean(path.parent, path.name)


def _swapped_out(path: Path) -> Path | None:
    """The previous checkpoint a save of path has moved aside, if any (newest first)."""
    try:
        found = [f / "old" for f in path.parent.glob(f".{glob_escape(path.name)}.dbert-swap-*")
                 if is_ours(f) and (f / "old" / META).is_file()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def readable(path: Path) -> Path:
    """Where a checkpoint can be read now without writing: path itself or, between a save's two
    renames (or after a crash there), the previous checkpoint in its swap folder."""
    path = Path(path)
    if path.exists():
        return path
    return _swapped_out(path) or path


def exists(path: Path) -> bool:
    """A checkpoint is at path, or mid-swap there."""
    path = Path(path)
    return path.exists() or _swapped_out(path) is not None


# ------------------------------------------------------------------------------ walking a tree
def walk(root, max_depth: int = MAX_TREE_DEPTH, max_entries: int = MAX_TREE_ENTRIES, strict: bool = True):
    """(folder, dirs, others) for root and every folder under it, top down, like os.walk but
    never following a link (a link is listed among `others`, whatever it points to) and without
    recursion. A tree deeper than max_depth or with more than max_entries entries is refused
    (DbertError) when strict, else walked only that far: a checkpoint holds a dozen files, and a
    link to / or 990 nested folders must not turn a listing into a walk of the disk."""
    root = Path(root)
    stack, seen = [(root, 0)], 0
    while stack:
        folder, level = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        seen += len(entries)
        if seen > max_entries:
            if strict:
                raise DbertError(f"{root} holds more than {max_entries} files and folders; refusing it")
            return
        dirs, others = [], []
        for e in entries:
            try:
                (dirs if e.is_dir(follow_symlinks=False) else others).append(e.name)
            except OSError:
                others.append(e.name)
        yield folder, dirs, others
        if dirs and level + 1 > max_depth:
            if strict:
                raise DbertError(f"{root} nests folders more than {max_depth} deep; refusing it")
            continue
        stack.extend((folder / d, level + 1) for d in reversed(dirs))


# ------------------------------------------------------------------------------ checkpoints
def read_meta(path) -> dict:
    """dbert.json of a checkpoint folder, checked against the schema (at most MAX_META bytes)."""
    from .jsonfile import read_json
    from .schema import check

    path = Path(path)
    try:
        meta = read_json(path / META, f"checkpoint {path}: {META}", max_bytes=MAX_META)
    except FileNotFoundError:
        raise DbertError(f"not a dbert checkpoint (no {META}): {path}") from None
    return check(meta, path)


def missing(path) -> list[str]:
    """The files a checkpoint folder needs and lacks (nothing is opened or read)."""
    path = Path(path)
    gaps = [f for f in REQUIRED if not (path / f).is_file()]
    if not ((path / TOKENIZER).is_file() or (path / VOCAB).is_file()):
        gaps.append(f"{TOKENIZER} or {VOCAB}")
    return gaps


def inspect(path) -> dict:
    """The quick checks of a checkpoint folder (files present, no code, dbert.json valid): its
    meta, or DbertError with the reason. The tensors are checked by checkpoint.load."""
    path = Path(path)
    if not path.is_dir():
        raise DbertError(f"checkpoint directory not found: {path}")
    gaps = missing(path)
    if gaps:
        raise DbertError(f"checkpoint {path} is missing {', '.join(gaps)}")
    refuse_code(path)
    return read_meta(path)


def refuse_code(path: Path, files: bool = True) -> None:
    """Refuse a model folder that asks for custom code in its JSON configs or, with files=True,
    holds a code file anywhere inside it."""
    from .jsonfile import read_json

    path = Path(path)

    if files:
        for folder, dirs, others in walk(path):  # links are not followed; a huge or deep tree is refused
            for name in dirs + others:
                if trust.is_code(name):
                    raise DbertError(f"{path} holds custom code ({(folder / name).relative_to(path)}); dbert never "
                                     "runs code from a checkpoint and does not accept folders that carry it")

    for f in sorted(path.glob("*.json")):
        if f.name in UNCHECKED or f.is_dir():
            continue
        # a config too large, too deep or too broken to check is refused, never passed: a loader
        # with other limits might still read the code keys in it
        try:
            data = read_json(f, f"{path}/{f.name}", max_bytes=trust.MAX_CONFIG_BYTES)
        except FileNotFoundError:
            continue  # a dangling link: whoever needs the file says it is missing
        except DbertError as e:
            raise DbertError(f"{e} (a JSON config dbert cannot check for custom code is refused)") from None
        trust.refuse_config(data, f"{path}/{f.name}")


def is_checkpoint(path) -> bool:
    return (Path(path) / META).is_file()


# ------------------------------------------------------------------------------ permissions
def umask() -> int:
    """The process umask, read without changing it where the system allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore at once
    os.umask(mask)
    return mask


def apply_umask(root: Path) -> None:
    """Give root and everything in it the modes a fresh file or folder gets under the user's
    umask (0644/0755 under the usual 022, 0600/0700 under 077): never executable files, and
    never modes copied from an archive or another user's folder."""
    mask = umask()
    root = Path(root)
    for dirpath, _, others in walk(root):
        for name in others:
            f = os.path.join(dirpath, name)
            if not os.path.islink(f):
                os.chmod(f, 0o666 & ~mask)
        os.chmod(dirpath, 0o777 & ~mask)


def make_folders(folder: Path) -> list[Path]:
    """mkdir -p folder; the folders it made, outermost first (remove_empty takes them back)."""
    folder = Path(folder)
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    made = []
    try:
        for f in reversed(missing):
            f.mkdir()
            made.append(f)
    except OSError as e:
        remove_empty(made)
        raise DbertError(f"cannot write checkpoints to {missing[0]}: {e.strerror or e}") from None
    return made


def remove_empty(made: list[Path]) -> None:
    """Remove the folders make_folders made, innermost first, as long as they are empty."""
    for f in reversed(made):
        try:
            f.rmdir()
        except OSError:
            return


def check_writable(folder: Path) -> None:
    """Create folder if need be and write a test file in it: a training run fails before step 1,
    not at the first save after an hour of training."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".dbert-write-test-"):
            pass
    except OSError as e:
        raise DbertError(f"cannot write checkpoints to {folder}: {e.strerror or e}") from None


class Busy(DbertError):
    """An output folder another dbert run holds (OutLock); `holder` names it ("pid N")."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


def holder(out: Path) -> str | None:
    """Who holds out's OutLock ("pid N" of a run training into it), or None when nobody does.
    Only looks: the lock file is opened read-only (no link followed, a FIFO never waited on)
    and locked shared for an instant, never created or changed."""
    try:
        import fcntl
    except ImportError:
        return None
    path = Path(out).with_name(LOCK.format(name=Path(out).name))
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None  # no lock file (or not one dbert could have made): nobody is training into out
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, OutLock.RECORD + 1, 0).decode("ascii", "replace").strip()
            return text if re.fullmatch(r"pid \d+", text) else "another process"
        return None
    finally:
        os.close(fd)  # drops the shared lock too


class OutLock:
    """An exclusive lock on an output folder, so two runs never write one checkpoint.

    The lock is a hidden file beside the folder, locked with flock: the kernel drops it when its
    holder exits, even by kill -9, so a stale lock cannot exist. The holder removes the file
    when done; a process that opened it just before is told to retry by the inode check.

    The file is opened with O_NOFOLLOW and never truncated: a link planted at its name (to a
    user's file) is refused, and so is anything but a small file of dbert's own "pid N" text,
    so taking the lock can never change a file that is not dbert's.
    """

    RECORD = 32  # bytes of the "pid N" record, padded: rewriting it in place needs no truncation

    def __init__(self, out: Path):
        self.path = Path(out).with_name(LOCK.format(name=Path(out).name))
        self.file = None
        try:
            import fcntl
        except ImportError:  # Windows: no flock; runs are not protected from each other there
            return
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | \
            getattr(os, "O_NONBLOCK", 0)  # non-blocking: a FIFO planted there cannot hang the open
        for _ in range(100):
            try:
                fd = os.open(self.path, flags, 0o666)
            except OSError as e:
                what = "a symbolic link" if os.path.islink(self.path) else (e.strerror or str(e))
                raise DbertError(f"cannot lock {out}: {self.path}: {what}; dbert will not open it "
                                 "(remove it if it is not yours)") from None
            f = os.fdopen(fd, "r+b", buffering=0)
            try:
                holder = self._check(f)
            except DbertError:
                f.close()
                raise
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise Busy(f"{out} is being written by another dbert run ({holder or 'another process'}); "
                           "wait for it or choose another --out", holder or "another process") from None
            try:
                same = os.fstat(f.fileno()).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.pwrite(f.fileno(), f"pid {os.getpid()}".ljust(self.RECORD - 1).encode() + b"\n", 0)
                self.file = f
                return
            f.close()  # the previous holder removed the file after we opened it: try again
        raise DbertError(f"cannot lock {out}")

    def _check(self, f) -> str:
        """The holder recorded in an open lock file ("" when empty); DbertError unless it is a
        regular file with one name, of this user, holding only dbert's record."""
        st = os.fstat(f.fileno())
        text = os.pread(f.fileno(), self.RECORD + 1, 0) if stat.S_ISREG(st.st_mode) else b""
        ours = (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid()
                and st.st_size <= self.RECORD and re.fullmatch(rb"(pid \d+ *\n?)?", text) is not None)
        if not ours:
            raise DbertError(f"cannot lock the output folder: {self.path} exists and is not a dbert lock file; "
                             "dbert will not change it (remove it if it is not yours)")
        return text.decode().strip()

    def release(self) -> None:
        if self.file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.file.close()
            self.file = None


def check_output(path, option: str, folder: bool = False) -> Path:
    """Refuse, before any work, an output path that cannot be written: a folder where a file is
    wanted (or a file where a folder is), a path under a regular file, a block device (a disk:
    never written, see atomic_write_text), or a place this user cannot write (permissions, a
    read-only file system). One DbertError naming the option."""
    path = Path(path).expanduser()
    if not str(path).strip() or (not folder and str(path) == "."):  # Path("") is "."
        raise DbertError(f"{option} must name a {'folder' if folder else 'file'} (an empty name is the current folder)")
    if path.exists() and path.is_dir() != folder:
        raise DbertError(f"{option} {path} is {'a file, not a folder' if folder else 'a folder; give a file name'}")
    if not folder and path.is_block_device():
        raise DbertError(f"{option} {path} is a block device (a disk); dbert writes files, never disks")
    parent = path if folder and path.exists() else path.parent
    while not parent.exists() and parent != parent.parent:
        if os.path.lexists(parent):  # a dangling link
            break
        parent = parent.parent
    if not parent.is_dir():
        raise DbertError(f"{option} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DbertError(f"{option} {path}: {parent} is not writable")
    if not os.path.lexists(path) or folder:  # a file is made there: try one (root passes os.access, /sys does not)
        try:
            with tempfile.TemporaryFile(dir=parent, prefix=".dbert-write-test-"):
                pass
        except OSError as e:
            raise DbertError(f"{option} {path}: {parent} is not writable ({e.strerror or e})") from None
    return path


def atomic_write_text(path, text: str) -> Path:
    """Write a text file whole or not at all, and never replace what is not a regular file.

    A new path or a regular file is replaced atomically: a temp file beside it, fsync,
    os.replace, with the umask's mode (mkstemp alone would leave it 0600); through a symbolic
    link, the file it names is replaced and the link kept. Anything else is written through,
    never renamed over: a character device (/dev/null, /dev/full, a terminal), a FIFO (refused
    at once when no process reads it: never a hang), a socket (connected to), a link to one of
    these, and /dev/stdout, /dev/fd/N or /proc/self/fd/N (written to that descriptor, whatever
    it is open on). A block device (a disk) is refused. A failure (a full disk, /dev/full, a
    read-only folder) is one DbertError; a replaced file is then as it was."""
    path = Path(path).expanduser()
    data = text.encode("utf-8")
    try:
        fd = _own_fd(path)
        if fd is not None:
            _flush_std(fd)
            _write_all(fd, data)
            return path
        try:
            st = os.stat(path)  # through links
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise DbertError(f"cannot write {path}: it is a folder")
        if st is not None and stat.S_ISBLK(st.st_mode):
            raise DbertError(f"cannot write {path}: it is a block device (a disk); dbert writes files, never disks")
        if st is not None and (not stat.S_ISREG(st.st_mode) or _in_proc(path)):
            _write_through(path, st, data)
        else:
            _replace(Path(os.path.realpath(path)) if os.path.islink(path) else path, data)
    except OSError as e:
        raise DbertError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def _links(path: Path):
    """path, then each path its chain of symbolic links leads to (at most 40), made absolute."""
    p = os.path.abspath(path)
    for _ in range(40):
        yield p
        if not os.path.islink(p):
            return
        p = os.path.abspath(os.path.join(os.path.dirname(p), os.readlink(p)))


def _in_proc(path: Path) -> bool:
    """path leads into /proc (/dev/stdout -> /proc/self/fd/1): a process's open file, not a name."""
    return any(os.path.realpath(os.path.dirname(p)).startswith("/proc/") for p in _links(path))


def _own_fd(path: Path) -> int | None:
    """N when path is, or links to, this process's own descriptor N (/dev/stdout, /dev/fd/N,
    /proc/self/fd/N): written to directly, so it shares the stream's position with stdout."""
    own = {f"/proc/{os.getpid()}/fd", f"/proc/{os.getpid()}/task/{threading.get_native_id()}/fd"}
    for p in _links(path):
        folder, name = os.path.split(p)
        if name.isdigit() and os.path.realpath(folder) in own:
            try:
                os.fstat(int(name))
            except OSError:
                return None  # not open: opening the name gives the error
            return int(name)
    return None


def _flush_std(fd: int) -> None:
    """What Python holds for the stream on fd goes first (stdout, stderr)."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream.fileno() == fd:
                stream.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_through(path: Path, st: os.stat_result, data: bytes) -> None:
    """Write data into what path is (a device, a FIFO, a socket, another process's open file)
    without renaming or truncating anything."""
    if stat.S_ISSOCK(st.st_mode):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.sendall(data)
        return
    fifo = stat.S_ISFIFO(st.st_mode)
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if stat.S_ISREG(st.st_mode) else 0  # another process's file: added to, never cut
    try:
        fd = os.open(path, flags | (os.O_NONBLOCK if fifo else 0))
    except OSError as e:
        if fifo and e.errno == errno.ENXIO:
            raise DbertError(f"cannot write {path}: it is a FIFO and no process is reading it") from None
        raise
    try:
        now = os.fstat(fd)
        if stat.S_IFMT(now.st_mode) != stat.S_IFMT(st.st_mode):
            raise DbertError(f"cannot write {path}: it changed while being opened")
        if fifo:
            os.set_blocking(fd, True)
        _write_all(fd, data)
    finally:
        os.close(fd)


def _replace(path: Path, data: bytes) -> None:
    """A regular file or a new path, replaced whole: a temp file beside it, fsync, os.replace."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
