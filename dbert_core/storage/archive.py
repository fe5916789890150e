"""Unpacking a downloaded checkpoint archive without trusting it.

The format comes from the file's first bytes (zip, gzip/bzip2/xz-compressed tar, plain tar),
never from a URL's suffix or a server's Content-Type. Members are written one by one: absolute
paths, `..`, links, devices, code files and pickles are refused, a `trainer_state/` folder
(pickled optimizer state) is skipped. Bombs are refused before and while writing: at most
MAX_MEMBERS entries and MAX_UNPACKED bytes, and no more than MAX_RATIO times the archive's own
size once past RATIO_FLOOR (checkpoint weights hardly compress; a bomb compresses a thousandfold).
A member nested more than tree.MAX_TREE_DEPTH folders deep is refused too.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from ..disk import layout, tree
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
                if first and nested(out.name, chunk[:512]):
                    raise DbertError(f"refusing archive member {name!r}: it is an archive inside the archive "
                                     f"({nested(out.name, chunk[:512])}); put the checkpoint's files in the archive itself")
                if first and pickled(out.name, chunk[:8]):
                    raise DbertError(f"refusing archive member {name!r}: it is a pickle, whatever its name "
                                     "(safetensors only)")
                first = False
                self.bytes += len(chunk)
                self.check(self.bytes)
                f.write(chunk)


def nested(name: str, head: bytes) -> str | None:
    """The format of a member that is itself an archive (zip, gzip, bzip2, xz, tar), else None. A
    zip whose first entry is a `data.pkl` is what torch.save writes: a pickle, not an archive."""
    from ..disk.trust import KNOWN_SUFFIXES

    if name.lower().endswith(KNOWN_SUFFIXES):
        return None
    if head.startswith(b"PK\x03\x04"):
        first = head[30:30 + int.from_bytes(head[26:28], "little")]
        return None if first.endswith(b"data.pkl") else "zip"
    for magic, fmt in ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz")):
        if head.startswith(magic):
            return fmt
    return "tar" if head[257:262] == b"ustar" else None


def _damaged(fmt: str, error: BaseException, dest: Path | None = None) -> DbertError:
    """What a failure while reading an archive means for the user: a file that cannot be written
    (a full disk: an OSError with an errno) says so, naming the member (never dbert's own temp
    folder `dest`); anything else the decompressors raise (zlib.error, lzma.LZMAError, EOFError for
    a truncated download, tarfile's and zipfile's own errors) is a damaged archive."""
    if isinstance(error, OSError) and error.errno is not None:
        name = error.filename
        if name and dest is not None and Path(name).is_relative_to(dest):
            name = f"member {Path(name).relative_to(dest).as_posix()!r}"
        where = f" ({name})" if name else ""
        return DbertError(f"cannot unpack the archive: {error.strerror or error}{where}")
    return DbertError(f"the {fmt} archive is corrupt or truncated ({_brief(error)})")


def _place(dest: Path, out: Path, name: str, folder: bool, source: str) -> None:
    """Refuse a member the archive holds both as a file and as a folder ("ck/sub" and
    "ck/sub/x.json"; "ck/sub/" and "ck/sub"), naming the user's archive and the member."""
    rel = out.relative_to(dest)
    both = rel if out.exists() and out.is_dir() != folder else \
        next((p for p in reversed(rel.parents) if p.parts and (dest / p).exists() and not (dest / p).is_dir()), None)
    if both is not None:
        raise DbertError(f"refusing archive member {name!r} of {source}: {both.as_posix()!r} is both a file and "
                         "a folder in it")


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
    if len(parts) > tree.MAX_TREE_DEPTH + 1:
        raise DbertError(f"refusing archive member {name!r}: nested more than {tree.MAX_TREE_DEPTH} folders deep")
    if parts[-1].lower().endswith(PICKLE_SUFFIXES):
        raise DbertError(f"refusing archive member {name!r}: pickle weights are not accepted (safetensors only)")
    if is_code(parts[-1]):
        raise DbertError(f"refusing archive member {name!r}: code files are not accepted in a checkpoint")
    return dest.joinpath(*parts)


def unpack(archive: Path, dest: Path, source: str | None = None) -> None:
    """Unpack archive into the existing folder dest, refusing anything unsafe (see above);
    `source` names the archive for the user (the URL it came from; default: its path)."""
    budget = _Budget(archive.stat().st_size)
    source = source or str(archive)
    if kind(archive) == "zip":
        _unzip(archive, dest, budget, source)
    else:
        _untar(archive, dest, budget, source)


def _untar(archive: Path, dest: Path, budget: _Budget, source: str) -> None:
    with open(archive, "rb") as f:
        head = f.read(6)
    fmt, mode = next(((f, m) for magic, f, m in ((b"\x1f\x8b", "tar.gz", "r:gz"), (b"BZh", "tar.bz2", "r:bz2"),
                                                 (b"\xfd7zXZ\x00", "tar.xz", "r:xz"))
                      if head.startswith(magic)), ("tar", "r:"))
    try:
        tf = tarfile.open(archive, mode)  # type: ignore[call-overload]  # one of r:, r:gz, r:bz2, r:xz: the format its bytes say, so a damaged one gets that format's error
    except Exception as e:  # noqa: BLE001 - whatever a damaged stream raises (zlib, lzma, bz2, EOF)
        raise _damaged(fmt, e) from None
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
                _place(dest, out, m.name, m.isdir(), source)
                if m.isdir():
                    out.mkdir(parents=True, exist_ok=True)
                    continue
                declared += m.size
                budget.check(declared)
                out.parent.mkdir(parents=True, exist_ok=True)
                with tf.extractfile(m) as src:
                    budget.copy(src, out, m.name)
            if fmt != "tar":  # read the compressed stream to its end: its checksum (gzip's CRC) is checked there
                while chunk := tf.fileobj.read(CHUNK):
                    budget.bytes += len(chunk)
                    budget.check(budget.bytes)
        except DbertError:
            raise
        except Exception as e:  # noqa: BLE001 - zlib.error, lzma.LZMAError, EOFError, tarfile.ReadError, ...
            raise _damaged(fmt, e, dest) from None


def _unzip(archive: Path, dest: Path, budget: _Budget, source: str) -> None:
    try:
        zf = zipfile.ZipFile(archive)
    except Exception as e:  # noqa: BLE001 - a truncated or damaged central directory
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
                _place(dest, out, info.filename, info.is_dir(), source)
                if info.is_dir():
                    out.mkdir(parents=True, exist_ok=True)
                    continue
                if info.flag_bits & 0x1:
                    raise DbertError(f"refusing archive member {info.filename!r}: it is encrypted (a password-"
                                     "protected zip); dbert unpacks only archives without a password")
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src:
                    budget.copy(src, out, info.filename)
        except DbertError:
            raise
        except NotImplementedError as e:
            raise DbertError(f"the zip archive uses a compression dbert cannot read ({_brief(e)}); "
                             "use deflate, or a .tar.gz") from None
        except Exception as e:  # noqa: BLE001 - zlib.error, BadZipFile (a CRC mismatch), EOFError, ...
            raise _damaged("zip", e, dest) from None

