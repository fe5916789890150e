"""Fetching from hosts that misbehave: the archive format from its bytes, bombs, code in
archives, redirects and schemes, endpoints that never answer. Everything against 127.0.0.1."""

from __future__ import annotations

import io
import json
import socket
import tarfile
import time
import zipfile

import pytest

from dbert_core.storage import archive, fetch, net, store
from dbert_core.errors import DbertError
from helpers import HubServer, online, tar_bytes, zip_bytes


@pytest.fixture(autouse=True)
def _without_shipped(monkeypatch):
    monkeypatch.setattr(store, "shipped", lambda name: None)


@pytest.fixture
def server(tiny_checkpoint):
    with HubServer() as s:
        s.repos["acme/tiny-dbert"] = tiny_checkpoint
        yield s


def names() -> list[str]:
    return [e.name for e in store.entries()]


def no_leftovers() -> None:
    root = store.store_dir()
    assert not root.is_dir() or [p.name for p in root.iterdir() if p.name.startswith(".")] == []


# ------------------------------------------------------------------------------ format from the bytes
@pytest.mark.parametrize("kind,ctype,url_name", [
    ("tar.gz", "application/gzip", "ckpt.tar.gz"),
    ("tar.gz", "application/x-gzip", "ckpt.tgz"),
    ("tar.gz", "application/octet-stream", "download"),
    ("tar.gz", "application/zip", "misnamed.zip"),  # a lying header and name: the bytes decide
    ("tar", "application/x-tar", "ckpt.tar"),
    ("tar", "text/plain", "ckpt"),
    ("zip", "application/zip", "ckpt.zip"),
    ("zip", "application/octet-stream", "weights"),
    ("zip", "application/gzip", "labelled.tar.gz"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_archive_format_comes_from_the_bytes(server, tiny_checkpoint, kind, ctype, url_name):
    data = zip_bytes(tiny_checkpoint) if kind == "zip" else tar_bytes(
        tiny_checkpoint, compression="gz" if kind == "tar.gz" else "")
    server.files[url_name] = data
    server.types[url_name] = ctype
    path = fetch.fetch(f"{server.url}/files/{url_name}", name="got")
    assert (path / "model.safetensors").is_file()
    no_leftovers()


@pytest.mark.parametrize("data", [b"<html>not found</html>", b"", b"\x1f\x8bnot really gzip", b"PK\x03\x04junk"],
                         ids=["html", "empty", "bad-gzip", "bad-zip"])
def test_not_an_archive_is_one_clear_line(server, data):
    server.files["x.tar.gz"] = data
    with pytest.raises(DbertError, match="archive") as e:
        fetch.fetch(f"{server.url}/files/x.tar.gz")
    assert "\n" not in str(e.value)
    assert names() == [] and no_leftovers() is None


# ------------------------------------------------------------------------------ bombs and code
def zeros_member(name: str, size: int) -> dict[str, bytes]:
    return {name: b"\0" * size}


def zip_with(folder, extra: dict[str, bytes]) -> bytes:
    buf = io.BytesIO(zip_bytes(folder))
    with zipfile.ZipFile(buf, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in extra.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
def test_bombs_are_refused(server, tiny_checkpoint, monkeypatch, fmt):
    def build(extra):
        return tar_bytes(tiny_checkpoint, extra={f"ckpt/{k}": v for k, v in extra.items()}) if fmt == "tar.gz" \
            else zip_with(tiny_checkpoint, extra)

    monkeypatch.setattr(archive, "RATIO_FLOOR", 1 << 20)
    monkeypatch.setattr(archive, "MAX_RATIO", 10)
    server.files["ratio"] = build(zeros_member("padding.txt", 8 << 20))  # 8 MB of zeros: a few KB packed
    with pytest.raises(DbertError, match="bomb"):
        fetch.fetch(f"{server.url}/files/ratio")
    monkeypatch.setattr(archive, "MAX_MEMBERS", 40)
    server.files["many"] = build({f"n{i}.txt": b"" for i in range(60)})
    with pytest.raises(DbertError, match="more than 40 files"):
        fetch.fetch(f"{server.url}/files/many")
    monkeypatch.setattr(archive, "MAX_MEMBERS", 10_000)
    monkeypatch.setattr(archive, "MAX_UNPACKED", 100_000)  # the tiny checkpoint alone is bigger
    server.files["big"] = build({})
    with pytest.raises(DbertError, match="unpacks to more than"):
        fetch.fetch(f"{server.url}/files/big")
    assert names() == []
    no_leftovers()


def test_a_zip_that_lies_about_its_sizes_is_stopped_while_unpacking(tmp_path, monkeypatch):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("ckpt/blob.txt", b"\0" * 300_000)
    data = bytearray(buf.getvalue())
    # rewrite the declared uncompressed size (central directory and local header) to 10 bytes
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 24: cd + 28] = (10).to_bytes(4, "little")
    data[22:26] = (10).to_bytes(4, "little")
    (tmp_path / "a.zip").write_bytes(bytes(data))
    monkeypatch.setattr(archive, "MAX_UNPACKED", 1000)
    (tmp_path / "out").mkdir()
    with pytest.raises(DbertError):
        archive.unpack(tmp_path / "a.zip", tmp_path / "out")
    assert sum(f.stat().st_size for f in (tmp_path / "out").rglob("*") if f.is_file()) <= 1000


@pytest.mark.parametrize("member", ["ckpt/evil.py", "ckpt/modeling_evil.py", "ckpt/lib/evil.so", "ckpt/x.pyc"])
def test_code_in_an_archive_is_refused(server, tiny_checkpoint, member):
    server.files["code.tar.gz"] = tar_bytes(tiny_checkpoint, extra={member: b"print('pwned')\n"})
    with pytest.raises(DbertError, match="code"):
        fetch.fetch(f"{server.url}/files/code.tar.gz")
    assert names() == []
    no_leftovers()


@pytest.mark.parametrize("kind,why", [(tarfile.CHRTYPE, "not a regular file"), (tarfile.BLKTYPE, "not a regular file"),
                                      (tarfile.FIFOTYPE, "not a regular file"), (tarfile.LNKTYPE, "links"),
                                      (tarfile.SYMTYPE, "links")], ids=["chr", "blk", "fifo", "hardlink", "symlink"])
def test_special_members_are_refused(server, tiny_checkpoint, kind, why):
    buf = io.BytesIO(tar_bytes(tiny_checkpoint, compression=""))
    with tarfile.open(fileobj=buf, mode="a") as tf:
        info = tarfile.TarInfo("ckpt/special")
        info.type = kind
        info.linkname = "ckpt/config.json" if kind in (tarfile.LNKTYPE, tarfile.SYMTYPE) else ""
        tf.addfile(info)
    server.files["special.tar"] = buf.getvalue()
    with pytest.raises(DbertError, match=why):
        fetch.fetch(f"{server.url}/files/special.tar")
    assert names() == []
    no_leftovers()


def test_auto_map_in_a_fetched_config_is_refused(server, tiny_checkpoint, tmp_path, monkeypatch):
    import shutil

    evil = tmp_path / "evil"
    shutil.copytree(tiny_checkpoint, evil)
    config = json.loads((evil / "config.json").read_text())
    config["auto_map"] = {"AutoModelForMaskedLM": "evil.EvilModel"}
    (evil / "config.json").write_text(json.dumps(config))
    server.files["evil.tar.gz"] = tar_bytes(evil)
    with pytest.raises(DbertError, match="custom code"):
        fetch.fetch(f"{server.url}/files/evil.tar.gz")
    server.repos["acme/evil"] = evil
    online(monkeypatch, server)
    with pytest.raises(DbertError, match="custom code"):
        fetch.fetch("acme/evil")
    assert names() == []
    no_leftovers()


# ------------------------------------------------------------------------------ schemes and redirects
@pytest.mark.parametrize("source", ["ftp://127.0.0.1/ckpt.tar.gz", "file:///etc/passwd", "file:///tmp/x.tar.gz",
                                    "gopher://example.org/x.zip", "javascript:alert(1)"])
def test_only_http_urls_are_fetched(source):
    with pytest.raises(DbertError, match="http"):
        fetch.fetch(source)
    assert names() == []
    no_leftovers()


def test_redirects_stay_on_the_same_host(server, tiny_checkpoint):
    server.files["real.tar.gz"] = tar_bytes(tiny_checkpoint)
    server.redirects["/files/moved.tar.gz"] = "/files/real.tar.gz"  # same host: followed
    assert (fetch.fetch(f"{server.url}/files/moved.tar.gz", name="moved") / "dbert.json").is_file()
    port = server.url.rsplit(":", 1)[1]
    for target, why in [(f"http://localhost:{port}/files/real.tar.gz", "another host"),
                        ("http://example.org/files/real.tar.gz", "another host"),
                        ("ftp://127.0.0.1/files/real.tar.gz", "ftp"),
                        ("file:///etc/passwd", "file")]:
        server.redirects["/files/away.tar.gz"] = target
        with pytest.raises(DbertError, match=why):
            fetch.fetch(f"{server.url}/files/away.tar.gz", name="away")
    assert names() == ["moved"]
    no_leftovers()


# ------------------------------------------------------------------------------ timeouts
@pytest.fixture
def silent():
    """A port that accepts connections and never says a word."""
    sock = socket.create_server(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_a_silent_url_times_out_with_a_clear_message(silent, monkeypatch):
    monkeypatch.setenv("DBERT_FETCH_TIMEOUT", "0.5")
    start = time.monotonic()
    with pytest.raises(DbertError, match="no answer .* within 0.5 s"):
        fetch.fetch(f"{silent}/ckpt.tar.gz")
    assert time.monotonic() - start < 10
    no_leftovers()


def test_a_silent_hub_times_out_with_a_clear_message(silent, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setenv("DBERT_FETCH_TIMEOUT", "0.5")
    monkeypatch.setenv("HF_ENDPOINT", silent)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    start = time.monotonic()
    with pytest.raises(DbertError, match="no answer .* within 0.5 s"):
        fetch.fetch("acme/tiny-dbert")
    assert time.monotonic() - start < 15
    no_leftovers()


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf"])
def test_the_timeout_setting_is_checked(value, monkeypatch):
    monkeypatch.setenv("DBERT_FETCH_TIMEOUT", value)
    with pytest.raises(DbertError, match="DBERT_FETCH_TIMEOUT"):
        net.timeout()
