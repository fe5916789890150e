"""Issue 40, item 5: `dbert serve` against bad clients. Each test names its class (docs/security.md,
"The server", lists them with their numbers). Everything runs on 127.0.0.1; loops are bounded."""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dbert_core.config import SampleConfig
from dbert_core.sampling.sample import generate
from dbert_core.serving.logs import LOG_BURST, LOG_RATE, LogGuard
from dbert_core.serving.options import MAX_HEAD, Limits
from dbert_core.serving.serve import create_app

from helpers import ROOT, serving

TINY = Path(__file__).parent / "fixtures" / "tiny"
ESC = "\x1b]0;pwned\x07\x1b[2J"  # sets the window title, clears the screen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(home: Path, **extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DBERT_TEST_THREADS": "1",
            "DBERT_HOME": str(home), "HF_HUB_OFFLINE": "1", **extra}


def _hup_as_a_terminal() -> None:
    """The server starts with SIGHUP's default action, as from a terminal: a suite run under nohup
    would hand its ignored SIGHUP down, and a server that ignores SIGHUP (as dbert serve must under
    nohup) never drains on one."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_cli(home: Path, log: Path, *flags) -> tuple[subprocess.Popen, int]:
    """`dbert serve` on the committed tiny model in a child process, its stderr into `log`; waits
    until /health answers."""
    port = free_port()
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "dbert_core.cli", "serve", "--checkpoint", str(TINY),
                                 "--port", str(port), "--dtype", "fp32", *flags], env=env_for(home),
                                stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_hup_as_a_terminal)
    deadline = time.monotonic() + 90
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return proc, port
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the server did not start: {log.read_text(errors='replace')}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)


def raw(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send bytes on a fresh connection; everything the server answers until it closes (or the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            got += chunk
        return got


def post_bytes(body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def answer(data: bytes) -> tuple[int, dict]:
    """(status, JSON body) of a raw HTTP/1.1 answer; the body must be the API's error shape or JSON."""
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        size, _, rest = body.partition(b"\r\n")
        body = rest[:int(size, 16)]
    return status, json.loads(body)


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes the connection (EOF or reset) within `within` seconds."""
    sock.settimeout(0.05)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except (TimeoutError, BlockingIOError):
            continue
        except OSError:
            return True
    return False


def health(url_or_port, timeout: float = 5.0) -> int:
    port = url_or_port if isinstance(url_or_port, int) else int(url_or_port.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("GET", "/health")
    status = conn.getresponse().status
    conn.close()
    return status


def complete(port: int, body: dict, timeout: float = 30.0) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# ------------------------------------------------------------------ 1. options refused at start
@pytest.mark.parametrize("flags, env, needle", [
    (["--api-key", ""], {}, "--api-key is empty"),
    (["--api-key", "   "], {}, "--api-key is empty"),
    ([], {"DBERT_API_KEY": ""}, "DBERT_API_KEY is set but empty"),
    (["--timeout", "nan"], {}, "--timeout must be a number of seconds > 0, got nan"),
    (["--timeout", "inf"], {}, "--timeout must be a number of seconds > 0, got inf"),
    (["--grace", "nan"], {}, "--grace must be a number of seconds >= 0, got nan"),
    (["--max-connections", "0"], {}, "--max-connections must be >= 1"),
], ids=["empty-key", "blank-key", "empty-env-key", "timeout-nan", "timeout-inf", "grace-nan", "no-connections"])
def test_bad_start_options_are_one_line_before_serving(tmp_path, flags, env, needle):
    """Today an empty key serves without authentication, silently, and nan serves (with no
    deadline at all): both start a server instead of refusing."""
    child = env_for(tmp_path / "home", **env)
    if "DBERT_API_KEY" not in env:
        child.pop("DBERT_API_KEY", None)
    try:
        done = subprocess.run([sys.executable, "-m", "dbert_core.cli", "serve", "--checkpoint", str(TINY),
                               "--port", str(free_port()), *flags], env=child, capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"dbert serve {' '.join(flags)} started serving instead of refusing")
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and done.stdout == "" and len(lines) == 1, done.stderr
    assert needle in lines[0] and "Traceback" not in done.stderr


# ------------------------------------------------------------------ 2. idle and slow connections
def test_hundreds_of_idle_connections_make_room(tiny_db):
    """300 connections that send nothing, against a server that allows 8: each new connection
    past 8 closes the oldest idle one, so /health and a completion are answered at once and no
    more than 8 idle connections stay open. (Today: all 300 stay open, for ever.)"""
    limits = Limits(max_connections=8, keep_alive=60.0, max_tokens=8)
    app = create_app(tiny_db, "tiny", dtype="fp32", models=[], limits=limits)
    with serving(app) as (url, srv):
        port = port_of(url)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
        assert health(port, timeout=5) == 200
        status, body = complete(port, {"prompt": "once", "max_tokens": 2, "dbert": {"steps": 4}})
        assert status == 200 and len(body["choices"]) == 1
        still = [s for s in idle if not closed_by_server(s, 0.01)]
        assert len(still) <= limits.max_connections
        assert still == idle[len(idle) - len(still):]  # the oldest went first
        assert len(srv.server_state.connections) <= limits.max_connections
        for s in idle:
            s.close()


def test_slow_heads_and_bodies_are_cut_at_their_deadlines(tiny_db):
    """5 connections whose request head trickles in a byte every 0.05 s, 3 whose body stops
    half-way, 20 idle ones: /health is answered meanwhile; the trickling heads are closed after
    keep_alive although bytes keep coming, the half-sent bodies get a 408 in the API's shape at
    --timeout and are closed, the idle ones are closed after keep_alive. (Today none is ever
    closed: a half-sent body holds its connection past --timeout.)"""
    limits = Limits(max_connections=64, keep_alive=1.0, timeout=1.5, max_tokens=8)
    app = create_app(tiny_db, "tiny", dtype="fp32", models=[], limits=limits)
    with serving(app) as (url, srv):
        port = port_of(url)
        started = time.monotonic()
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        trickle = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        half = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{\"prompt\": \"on")
            half.append(s)
        assert health(port, timeout=5) == 200
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
        sent = 0
        while time.monotonic() - started < limits.keep_alive + 0.5:  # a byte each 0.05 s, past keep_alive
            for s in trickle:
                try:
                    s.send(head[sent:sent + 1])
                except OSError:
                    pass
            sent += 1
            time.sleep(0.05)
        assert all(closed_by_server(s, 1.5) for s in trickle), "a head trickling in held its connection"
        for s in half:
            s.settimeout(limits.timeout + 3)
            got = b""
            while b"\r\n\r\n" not in got or not got.endswith(b"}"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            status, body = answer(got)
            assert status == 408 and "did not arrive within 1.5 s" in body["error"]["message"]
            assert closed_by_server(s, 1.0)
        assert all(closed_by_server(s, 1.0) for s in idle)
        assert time.monotonic() - started < limits.timeout + 8  # a loaded machine: the deadlines above are the test
        deadline = time.monotonic() + 5
        while srv.server_state.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not srv.server_state.connections
        for s in idle + trickle + half:
            s.close()


def test_when_every_connection_is_busy_health_still_answers(tiny_db):
    """All max_connections connections hold a request in progress (bodies that stop half-way):
    a new connection may ask /health (200, then closed); anything else is a 503 in the API's
    shape, until the busy ones reach their deadline. (Today: nothing caps connections.)"""
    limits = Limits(max_connections=3, keep_alive=5.0, timeout=2.0, max_tokens=8)
    app = create_app(tiny_db, "tiny", dtype="fp32", models=[], limits=limits)
    with serving(app) as (url, srv):
        port = port_of(url)
        busy = []
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
            busy.append(s)
        time.sleep(0.2)
        got = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5)
        assert got.startswith(b"HTTP/1.1 200") and b"connection: close" in got.lower()
        status, body = answer(raw(port, post_bytes(b'{"prompt": "a", "max_tokens": 2}'), timeout=5))
        assert status == 503 and body["error"]["code"] == "too_many_connections"
        assert "--max-connections" in body["error"]["message"]
        for s in busy:
            assert closed_by_server(s, limits.timeout + 2)
            s.close()
        status, body = complete(port, {"prompt": "a", "max_tokens": 2, "dbert": {"steps": 4}})
        assert status == 200


# ------------------------------------------------------------------ 3. the log
def test_the_log_guard_escapes_and_limits_lines():
    """The filter on every handler of the server's logs, on its own (a fake clock): escapes what
    a client sent (ESC, BEL, C1 controls, over-long values) and keeps LOG_BURST lines at once,
    then LOG_RATE a second, counting the rest in one line."""
    now = [0.0]
    guard = LogGuard(clock=lambda: now[0])
    counted = []

    class Catch(logging.Handler):
        def emit(self, record):
            counted.append(record.getMessage())

    catcher = Catch()
    logging.getLogger("uvicorn.error").addHandler(catcher)
    try:
        record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                                   (ESC + "\x9b31m:0", "GET", "/" + "x" * 5000, "1.1", 200), None)
        assert guard.filter(record)
        line = record.getMessage()
        assert "\x1b" not in line and "\x07" not in line and "\x9b" not in line and "\\x1b]0;pwned\\x07" in line
        assert len(line) < 350
        kept = sum(guard.filter(logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "line %d", (i,), None))
                   for i in range(5000))
        assert kept == LOG_BURST - 1 and counted == []
        now[0] = 10.0
        assert guard.filter(logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "later", (), None))
        assert len(counted) == 1 and counted[0].startswith("4901 lines of the uvicorn.access log dropped")
        kept = sum(guard.filter(logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "x", (), None))
                   for i in range(1000))
        assert kept == min(LOG_BURST, int(10.0 * LOG_RATE)) - 1  # refilled over 10 s; one went to "later"
    finally:
        logging.getLogger("uvicorn.error").removeHandler(catcher)


@pytest.fixture(scope="module")
def cli_server(tmp_path_factory):
    """`dbert serve` in a child process with --timeout 2: (port, its log)."""
    tmp = tmp_path_factory.mktemp("serve")
    log = tmp / "serve.log"
    proc, port = start_cli(tmp / "home", log, "--timeout", "2", "--max-body", "65536")
    try:
        yield port, log
    finally:
        stop(proc)


def test_nothing_a_client_sends_reaches_the_log_raw(cli_server):
    """Escape codes in X-Forwarded-For (today written to the access log raw: it names the client
    when the peer is loopback), in other headers and in a path: the log holds none of them raw."""
    port, log = cli_server
    for value in (ESC.encode(), b"\x9b31mred", b"1.2.3.4, " + ESC.encode()):
        got = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: " + value
                  + b"\r\nUser-Agent: " + value + b"\r\nConnection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200")
    raw(port, b"GET /%1b]0;x%07 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    time.sleep(0.3)
    text = log.read_bytes()
    assert b"GET /health" in text
    assert b"\x1b" not in text and b"\x07" not in text and "\x9b".encode() not in text and b"pwned" not in text


def test_malformed_requests_get_a_4xx_in_the_api_shape(cli_server):
    """Lone surrogates in prompt, suffix and dbert.template (500 today), JSON nested 5000 deep
    (500), Content-Length with Transfer-Encoding (plain-text 400), a head over MAX_HEAD, a bad
    request line; and a body that ends early (a traceback in the log today): each a 4xx with
    {"error": {"message", "type", ...}}, and no traceback in the log."""
    port, log = cli_server
    cases = [
        (post_bytes(b'{"prompt": "once \\ud800 upon", "max_tokens": 2}'), 400, "lone surrogate"),
        (post_bytes(b'{"prompt": "once", "suffix": "\\udfff", "max_tokens": 2}'), 400, "lone surrogate"),
        (post_bytes(b'{"dbert": {"template": "a [MASK] \\ud83d"}, "max_tokens": 2}'), 400, "lone surrogate"),
        (post_bytes(b'{"prompt": "x", "n": ' + b"[" * 5000 + b"]" * 5000 + b"}"), 400, "nested too deeply"),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"0\r\n\r\n", 400, "both Content-Length and Transfer-Encoding"),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
         b"hello", 400, "invalid HTTP request"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEAD + 100) + b"\r\n\r\n", 431,
         f"over {MAX_HEAD} bytes"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, "invalid HTTP request"),
    ]
    for data, status, needle in cases:
        got, body = answer(raw(port, data))
        assert got == status and needle in body["error"]["message"], (data[:80], body)
        assert set(body["error"]) == {"message", "type", "param", "code"}
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # a big head, in pieces: h11's limit
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10000)
        time.sleep(0.2)
        s.sendall(b"a" * 10000)
        got, body = answer(_rest(s, 10))
        assert got == 431 and "invalid HTTP request" in body["error"]["message"], body
    for prefix in (b'{"prompt": "on', b""):  # a body that stops, then the client leaves
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + prefix)
            time.sleep(0.2)
    assert health(port) == 200
    time.sleep(0.3)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "Exception in ASGI" not in text, text[-3000:]


def test_content_length_with_transfer_encoding_is_one_400_and_one_log_line(cli_server):
    """Both framings in one request (the smuggling ambiguity), in either order, with a body whole,
    large, or half sent: a 400 in the API's shape, the connection closed, one access-log line a
    request and no traceback."""
    port, log = cli_server
    body = b'{"prompt": "' + b"a" * 100_000 + b'"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    before = log.read_text(errors="replace").count("\n")
    cases = [head + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
             head + b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n" % len(chunked) + chunked,
             head + b"Content-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"]
    for data in cases:
        got, answered = answer(raw(port, data, timeout=5))
        assert got == 400 and "both Content-Length and Transfer-Encoding" in answered["error"]["message"]
    time.sleep(0.3)
    lines = log.read_text(errors="replace").splitlines()[before:]
    assert "Traceback" not in "\n".join(lines), lines
    assert sum('"POST /v1/completions HTTP/1.1" 400' in line for line in lines) == len(cases)
    assert len([line for line in lines if "POST" not in line]) == 0, lines


def test_one_client_cannot_flood_the_log(cli_server):
    """3,000 requests on one keep-alive connection and 200 connections that send garbage (each a
    warning and a 400): the log keeps LOG_BURST lines, then LOG_RATE a second per log, and says
    how many it dropped. (Today: one line each, without end.)"""
    port, log = cli_server
    before = len(log.read_bytes().splitlines())
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(3000):
        conn.request("GET", "/health")
        assert conn.getresponse().read()
    conn.close()
    for _ in range(200):
        raw(port, b"\x16\x03\x01garbage\r\n\r\n", timeout=5)
    elapsed = time.monotonic() - started
    time.sleep(0.3)
    health(port)  # a line after the flood: it carries the count of what was dropped
    time.sleep(0.3)
    lines = log.read_bytes().splitlines()[before:]
    bound = 2 * (LOG_BURST + LOG_RATE * (elapsed + 1)) + 10
    assert len(lines) <= bound, (len(lines), bound, elapsed)
    assert any(b"lines of the uvicorn.access log dropped" in ln for ln in lines)


# ------------------------------------------------------------------ 4. [MASK*N] as in dbert sample
def test_mask_runs_mean_what_they_mean_in_dbert_sample(tiny_db):
    """[MASK*N] (any case) in a prompt, a suffix or dbert.template is N slots, as `dbert sample`
    reads it: the same seed gives the line `generate()` gives for that template. [MASK*A-B]
    (infill of unknown length) and more slots than the model has are a 400. (Today the run is
    counted as its five word pieces: the line is misaligned or longer, and a span comes back as
    text.)"""
    tok = tiny_db.tokenizer
    app = create_app(tiny_db, "tiny", dtype="fp32", models=[], limits=Limits(max_tokens=16))

    def expected(template: str, extra: int = 0) -> str:
        from dbert_core.sampling.prompt import expand_template, slots as _slots

        length = len(tok.encode(_slots(tok, expand_template(template)), add_special_tokens=False)) + extra
        lines, _ = generate(tiny_db, SampleConfig(n=1, steps=8, seed=3, length=length, prompt=template, dtype="fp32"))
        return lines[0]

    with serving(app) as (url, _):
        port = port_of(url)
        status, body = complete(port, {"prompt": "once upon a [MASK*3] there", "suffix": "was a [mask*2]",
                                       "max_tokens": 2, "seed": 3, "dbert": {"steps": 8}})
        assert status == 200
        assert body["choices"][0]["text"] == expected("once upon a [MASK*3] there [MASK] [MASK] was a [mask*2]")
        status, body = complete(port, {"max_tokens": 3, "seed": 3, "dbert": {"template": "once [mask*2] a time",
                                                                              "steps": 8}})
        assert status == 200 and body["choices"][0]["text"] == expected("once [mask*2] a time", 3)
        assert body["dbert"]["length"] == [len(tok.encode("once [MASK] [MASK] a time", add_special_tokens=False)) + 3]
        for field, value in (("prompt", "once [MASK*2-4] a time"), ("suffix", "[mask * 1 - 3]")):
            status, body = complete(port, {"prompt": "x", field: value, "max_tokens": 2})
            assert status == 400 and "[MASK*A-B]" in body["error"]["message"] and body["error"]["param"] == field
        started = time.monotonic()
        status, body = complete(port, {"prompt": "[MASK*99999] " * 2000, "max_tokens": 2})
        assert status == 400 and "[MASK] slots" in body["error"]["message"]
        assert time.monotonic() - started < 5  # counted, never written out


# ------------------------------------------------------------------ 5. signals
def _stream(port: int, steps: int = 128, tokens: int = 20) -> socket.socket:
    body = json.dumps({"prompt": "", "max_tokens": tokens, "n": 4, "stream": True,
                       "dbert": {"steps": steps, "sampler": "ancestral", "stream_steps": True}}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(post_bytes(body))
    got = b""
    while b"data:" not in got:  # the job is running
        got += s.recv(65536)
    return s


def _rest(s: socket.socket, within: float) -> bytes:
    s.settimeout(within)
    got = b""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    return got


@pytest.mark.slow
def test_sighup_drains_like_sigterm(tmp_path):
    """The terminal closing (SIGHUP) lets the running request finish, as SIGTERM does, and the
    drained server exits 0 with its last line. (Before: the request finished, then the process
    ended by the signal, exit 129.)"""
    proc, port = start_cli(tmp_path / "home", tmp_path / "log", "--grace", "30")
    try:
        s = _stream(port, steps=256, tokens=96)  # long enough to outlast the signals on a fast machine
        proc.send_signal(signal.SIGHUP)
        got = _rest(s, 60)
        assert b"data: [DONE]" in got and b'"finish_reason": "length"' in got
        proc.wait(30)
        err = (tmp_path / "log").read_text()
        assert "Traceback" not in err and "Shutting down" in err and "Finished server process" in err
        assert err.rstrip().endswith("dbert serve: stopped") and proc.returncode == 0
    finally:
        stop(proc)


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(tmp_path):
    """With --grace 30, a first Ctrl-C waits for the running request; a second one cancels it
    now: the stream ends with an error event saying why, the process within seconds, no
    traceback. (Today: a CancelledError traceback per request and a stream cut without a word.)"""
    proc, port = start_cli(tmp_path / "home", tmp_path / "log", "--grace", "30")
    try:
        s = _stream(port, steps=256, tokens=96)  # long enough to outlast the signals on a fast machine
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None  # the first one waits
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        got = _rest(s, 10)
        assert b"a second Ctrl-C" in got and b"data: [DONE]" not in got
        proc.wait(10)
        assert time.monotonic() - started < 8
        err = (tmp_path / "log").read_text()
        assert "Traceback" not in err and "dbert serve: stopped" in err
        assert proc.returncode == 0
    finally:
        stop(proc)
