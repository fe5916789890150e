"""Unpacking a downloaded checkpoint archive without trusting it.

The format comes from the file's first bytes (zip, gzip/bzip2/xz-compressed tar, plain tar),
never from a URL's suffix or a server's Content-Type. Members are written one by one: absolute
paths, `..`, links, devices, code files and pickles are refused, a `trainer_state/` folder
(pickled optimizer state) is skipped. Bombs are refused before and while writing: at most
MAX_MEMBERS entries and MAX_UNPACKED bytes, and no more than MAX_RATIO times the archive's own
size once past RATIO_FLOOR (checkpoint weights hardly compress; a bomb compresses a thousandfold).
A member nested more than layout.layout.MAX_TREE_DEPTH folders deep is refused too.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from ..disk import layout
from ..errors import DbertError
from ..disk.trust import PICKLE_SUFFIXES, is_code, pickled

MAX_UNPACKED = 10 * 1024**3  # 10 GiB
MAX_MEMBERS = 10_000
MAX_RATIO = 100
RATIO_FLOOR = 64 << 20  # below 64 MiB unpacked the ratio is not checked (tokenizer files compress well)
SKIP_DIRS = (layout.STATE,)
CHUNK = 1 << 16


def kind(path: Path) -> str:
    """'zip' or 'tar' (plain or compressed), from the file's magic numbers."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")) or head[257:262] == b"ustar":
        return "tar"
    raise DbertError("the download is not a .tar.gz, .tgz, .tar or .zip archive (judged by its first bytes)")


class _Budget:
    """Counts members and bytes as they are unpacked; raises when a limit is passed."""

    def __init__(self, packed: int):
        self.packed = max(packed, 1)
        self.members = 0
        self.bytes = 0

    def member(self) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise DbertError(f"the archive holds more than {MAX_MEMBERS} files; refusing it")

    def check(self, total: int) -> None:
        if total > MAX_UNPACKED:
            raise DbertError(f"the archive unpacks to more than {MAX_UNPACKED / 1e6:.1f} MB; refusing it")
        if total > RATIO_FLOOR and total > MAX_RATIO * self.packed:
            raise DbertError(f"the archive unpacks {self.packed / 1e6:.1f} MB into more than {total / 1e6:.1f} MB: "
                             "a decompression bomb, refused")

    def copy(self, src, out: Path, name: str) -> None:
        first = True
        with open(out, "wb") as f:
            while chunk := src.read(CHUNK):
                if first and pickled(out.name, chunk[:8]):
                    raise DbertError(f"refusing archive member {name!r}: it is a pickle, whatever its name "
                                     "(safetensors only)")
                first = False
                self.bytes += len(chunk)
                self.check(self.bytes)
                f.write(chunk)


def _brief(error: BaseException) -> str:
    return " ".join(str(error).split())[:160] or type(error).__name__


def member_path(dest: Path, name: str) -> Path | None:
    """dest/name for a safe relative member name; None for a skipped member; raises otherwise."""
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise DbertError(f"refusing archive member {name!r}: absolute path")
    parts = [p for p in pure.parts if p not in ("", ".")]
    if ".." in parts:
        raise DbertError(f"refusing archive member {name!r}: it points outside the target folder")
    if not parts or any(p in SKIP_DIRS for p in parts) or parts[-1] == ".DS_Store" or "__MACOSX" in parts:
        return None
    if len(parts) > layout.MAX_TREE_DEPTH + 1:
        raise DbertError(f"refusing archive member {name!r}: nested more than {layout.MAX_TREE_DEPTH} folders deep")
    if parts[-1].lower().endswith(PICKLE_SUFFIXES):
        raise DbertError(f"refusing archive member {name!r}: pickle weights are not accepted (safetensors only)")
    if is_code(parts[-1]):
        raise DbertError(f"refusing archive member {name!r}: code files are not accepted in a checkpoint")
    return dest.joinpath(*parts)


def unpack(archive: Path, dest: Path) -> None:
    """Unpack archive into the existing folder dest, refusing anything unsafe (see above)."""
    budget = _Budget(archive.stat().st_size)
    if kind(archive) == "zip":
        _unzip(archive, dest, budget)
    else:
        _untar(archive, dest, budget)


def _untar(archive: Path, dest: Path, budget: _Budget) -> None:
    try:
        tf = tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DbertError(f"the download is not a readable tar archive ({_brief(e)})") from None
    with tf:
        declared = 0
        try:
            for m in tf:
                budget.member()
                if m.issym() or m.islnk():
                    raise DbertError(f"refusing archive member {m.name!r}: links are not allowed")
                if not (m.isfile() or m.isdir()):
                    raise DbertError(f"refusing archive member {m.name!r}: not a regular file")
                out = member_path(dest, m.name)
                if out is None:
                    continue
                if m.isdir():
                    out.mkdir(parents=True, exist_ok=True)
                    continue
                declared += m.size
                budget.check(declared)
                out.parent.mkdir(parents=True, exist_ok=True)
                with tf.extractfile(m) as src:
                    budget.copy(src, out, m.name)
        except (tarfile.TarError, EOFError, OSError, ValueError) as e:
            raise DbertError(f"the tar archive is corrupt ({_brief(e)})") from None


def _unzip(archive: Path, dest: Path, budget: _Budget) -> None:
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise DbertError(f"the download is not a readable zip archive ({_brief(e)})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise DbertError(f"the archive holds more than {MAX_MEMBERS} files; refusing it")
        budget.check(sum(i.file_size for i in infos))
        try:
            for info in infos:
                budget.member()
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise DbertError(f"refusing archive member {info.filename!r}: links are not allowed")
                out = member_path(dest, info.filename)
                if out is None:
                    continue
                if info.is_dir():
                    out.mkdir(parents=True, exist_ok=True)
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src:
                    budget.copy(src, out, info.filename)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
            raise DbertError(f"the zip archive is corrupt ({_brief(e)})") from None

