"""dbert serve: the real openai client and plain HTTP against a server on a free loopback port."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from dbert_core.config import SampleConfig
from dbert_core.sampling.sample import generate, resolve
from dbert_core.serving.options import Limits, is_loopback
from dbert_core.serving.serve import create_app
from dbert_core.serving.serve_queue import Job

from helpers import ROOT, serving

STEPS = 16


@contextlib.contextmanager
def running(app):
    """The app on uvicorn in a thread, on a free 127.0.0.1 port; yields the base URL."""
    with serving(app) as (url, _):
        yield url


@pytest.fixture(scope="module")
def served(tiny_db):
    app = create_app(tiny_db, "tiny", dtype="fp32", limits=Limits(max_n=8, max_tokens=64, max_body=4096))
    with running(app) as url:
        yield app, url


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1] + "/v1", api_key="unused", max_retries=0, timeout=60)


def post(url: str, body, path: str = "/v1/completions", headers: dict | None = None):
    """Plain HTTP: (status, parsed JSON or the raw text)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text


def events(text: str) -> list:
    """The data of each server-sent event ([DONE] as the string)."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def template(prompt: str, span: int, suffix: str = "") -> str:
    return " ".join(t for t in (prompt, " ".join(["[MASK]"] * span), suffix) if t)


# ---------------------------------------------------------------------------------- the CLI's text
def test_same_seed_same_text_as_generate(served, client, tiny_db):
    tok = tiny_db.tokenizer
    prompt = "once upon a time"
    length = len(tok.encode(prompt, add_special_tokens=False)) + 8
    expected, _ = generate(tiny_db, SampleConfig(n=3, steps=STEPS, seed=5, length=length, prompt=template(prompt, 8),
                                                 dtype="fp32"))
    echoed = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, n=3, seed=5, echo=True,
                                       extra_body={"dbert": {"steps": STEPS}})
    assert [c.text for c in echoed.choices] == expected
    plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, n=3, seed=5,
                                      extra_body={"dbert": {"steps": STEPS}})
    assert [prompt + c.text for c in plain.choices] == expected  # the span's text: prompt + text is the line
    assert [c.index for c in plain.choices] == [0, 1, 2]
    assert plain.usage.completion_tokens == 24 and plain.usage.prompt_tokens == length - 8
    other = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, n=3, seed=6,
                                      extra_body={"dbert": {"steps": STEPS}})
    assert [c.text for c in other.choices] != [c.text for c in plain.choices]


def test_suffix_fills_the_middle(served, client, tiny_db):
    prompt, suffix = "the little girl", "and they were happy"
    r = client.completions.create(model="tiny", prompt=prompt, suffix=suffix, max_tokens=5, seed=2, n=2,
                                  extra_body={"dbert": {"steps": STEPS, "sampler": "ancestral"}})
    tok = tiny_db.tokenizer
    length = len(tok.encode(template(prompt, 5, suffix), add_special_tokens=False))
    lines, _ = generate(tiny_db, SampleConfig(n=2, steps=STEPS, seed=2, length=length, sampler="ancestral",
                                              prompt=template(prompt, 5, suffix), dtype="fp32"))
    for choice, line in zip(r.choices, lines):
        assert "[MASK]" not in line
        assert prompt + choice.text + suffix == line      # the middle, between prompt and suffix
        assert choice.text.strip()
    assert r.usage.completion_tokens == 10


def test_dbert_template_is_the_whole_line(served, tiny_db):
    tpl = "once [MASK] a time there [MASK] a"
    status, body = post(served[1], {"prompt": "", "max_tokens": 3, "seed": 4,
                                    "dbert": {"template": tpl, "steps": STEPS}})
    assert status == 200
    length = len(tiny_db.tokenizer.encode(tpl, add_special_tokens=False)) + 3
    lines, _ = generate(tiny_db, SampleConfig(n=1, steps=STEPS, seed=4, length=length, prompt=tpl, dtype="fp32"))
    assert body["choices"][0]["text"] == lines[0]


def test_a_list_of_prompts_and_n(served, client):
    r = client.completions.create(model="tiny", prompt=["the cat", "a big dog"], max_tokens=4, n=2, echo=True,
                                  extra_body={"dbert": {"steps": 8}})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert all(c.text.startswith("the cat") for c in r.choices[:2])
    assert all(c.text.startswith("a big dog") for c in r.choices[2:])


def test_frames_takes_one_template_per_row(tiny_db):
    """The engine side of batching: rows of different prompts in one call keep their own tokens."""
    import torch

    from dbert_core.sampling.sample import frames, parse_prompt

    rows = torch.stack([parse_prompt(tiny_db, "the cat [MASK] [MASK] happy", 10),
                        parse_prompt(tiny_db, "[MASK] dog went [MASK] the", 10)])
    last = list(frames(tiny_db, n=2, length=10, steps=8, seed=0, dtype="fp32", template=rows))[-1]
    given = rows != tiny_db.model.mask_id
    assert torch.equal(last.ids[given], rows[given]) and not last.masked.any()


# ---------------------------------------------------------------------------------- streaming
def test_stream_with_the_openai_client(served, client):
    kw = dict(model="tiny", prompt="one day", max_tokens=6, n=2, seed=9, extra_body={"dbert": {"steps": STEPS}})
    whole = client.completions.create(**kw)
    texts, finished, usage = {}, {}, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            finished[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert finished == {0: "length", 1: "length"}
    assert usage is not None and usage.completion_tokens == 12


def test_stream_steps_extension_over_plain_http(served):
    body = {"prompt": "once upon a time", "max_tokens": 10, "seed": 3, "stream": True,
            "dbert": {"steps": STEPS, "sampler": "ancestral", "stream_steps": True}}
    status, text = post(served[1], body)
    assert status == 200
    evs = events(text)
    assert evs[-1] == "[DONE]"
    steps = [e["choices"][0]["dbert"] for e in evs[:-1] if "dbert" in e["choices"][0]]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))  # ancestral: one event per reverse step
    masks = [s["text"].count("[MASK]") for s in steps]
    assert masks == sorted(masks, reverse=True) and masks[-1] == 0 and masks[0] <= 10
    assert all(e["choices"][0]["text"] == "" for e in evs[:-1] if "dbert" in e["choices"][0])
    final = [e["choices"][0] for e in evs[:-1] if "dbert" not in e["choices"][0]]
    assert len(final) == 1 and final[0]["finish_reason"] == "length"
    assert "once upon a time" + final[0]["text"] == steps[-1]["text"]
    status, echoed = post(served[1], {**body, "stream": False, "echo": True,
                                      "dbert": {"steps": STEPS, "sampler": "ancestral"}})
    assert echoed["choices"][0]["text"] == steps[-1]["text"]  # streaming changes nothing


def test_chat_completions_with_the_openai_client(served, client):
    """The last user message's text is the prompt (system and earlier messages are not read); the
    choices are the completion's texts as assistant messages, in OpenAI's chat shape."""
    kw = dict(max_tokens=6, n=2, seed=9, extra_body={"dbert": {"steps": STEPS}})
    plain = client.completions.create(model="tiny", prompt="one day", **kw)
    chat = client.chat.completions.create(model="tiny", messages=[
        {"role": "system", "content": "ignored"}, {"role": "user", "content": "once upon a time"},
        {"role": "assistant", "content": "ignored too"}, {"role": "user", "content": [{"type": "text", "text": "one day"}]}],
        **kw)
    assert chat.object == "chat.completion" and [c.index for c in chat.choices] == [0, 1]
    assert [c.message.content for c in chat.choices] == [c.text.lstrip() for c in plain.choices]
    assert all(c.message.role == "assistant" and c.finish_reason == "length" for c in chat.choices)
    assert chat.usage.completion_tokens == plain.usage.completion_tokens == 12
    again = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "one day"}],
                                           max_completion_tokens=6, n=2, seed=9, extra_body={"dbert": {"steps": STEPS}})
    assert [c.message.content for c in again.choices] == [c.message.content for c in chat.choices]
    for bad, match in (([], "non-empty list"), ([{"role": "user", "content": 3}], "string or a list of text parts"),
                       ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "text parts")):
        with pytest.raises(openai.BadRequestError, match=match):
            client.chat.completions.create(model="tiny", messages=bad, max_tokens=4)


# ---------------------------------------------------------------------------------- errors and limits
@pytest.mark.parametrize("kw, match", [
    (dict(temperature=-1), "temperature must be a finite number in \\[0"),
    (dict(n=9), "allows 8"),
    (dict(max_tokens=65), "max_tokens must be in"),
    (dict(top_p=1.5), "top_p must be"),
    (dict(seed=-1), "seed must be a whole number in \\[0, 4294967295\\]"),
    (dict(n=0), "n must be a whole number >= 1"),
    (dict(max_tokens=0), "max_tokens must be a whole number >= 1"),
    (dict(extra_body={"dbert": {"stpes": 3}}), "unknown dbert field 'stpes'"),
    (dict(extra_body={"dbert": {"steps": 10**6}}), "dbert.steps must be between 1 and T=256"),
    (dict(extra_body={"dbert": {"sampler": "greedy"}}), "dbert.sampler must be one of"),
])
def test_bad_values_are_a_400_with_one_message(client, kw, match):
    with pytest.raises(openai.BadRequestError, match=match) as e:
        client.completions.create(model="tiny", prompt="hello", **{"max_tokens": 4, **kw})
    assert e.value.status_code == 400 and e.value.body["message"]


def test_other_errors_keep_openai_shape(served, client):
    with pytest.raises(openai.NotFoundError, match="not loaded here"):
        client.completions.create(model="../../etc/passwd", prompt="x")  # a name, never a path
    url = served[1]
    for body, status, words in [
        (b"{not json", 400, "not valid JSON"),
        ({"prompt": [1, 2, 3]}, 400, "prompt must be"),
        ({"prompt": "x", "n": True}, 400, "n must be a whole number"),
        ({"prompt": "x" * 5000}, 413, "over 4096 bytes"),
        ({"prompt": "word " * 200, "max_tokens": 4}, 400, "this model takes at most 158"),
        ({"prompt": "the " * 30}, 400, "the prompt and suffix take 30 of the 24 tokens"),
        ({"prompt": "hi", "dbert": {"stream_steps": True}}, 400, "needs stream: true"),
    ]:
        got, answer = post(url, body)
        assert got == status and words in answer["error"]["message"], (body, answer)
    status, answer = post(url, {"prompt": "hi", "max_tokens": 2, "dbert": {"steps": 4}, "logprobs": 3, "user": "x",
                                "frequency_penalty": 0.5})
    assert status == 200 and len(answer["choices"]) == 1  # OpenAI fields dbert does not use are ignored


def test_models_and_health(served, client):
    ids = [m.id for m in client.models.list()]
    assert ids[0] == "tiny" and len(ids) == len(set(ids))
    assert "default" in ids  # the shipped checkpoint, listed from the store
    host, port = served[1].removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/health")
    assert json.loads(conn.getresponse().read())["status"] == "ok"


def test_api_key(tiny_db):
    app = create_app(tiny_db, "tiny", api_key="s3cret", dtype="fp32", models=[])
    with running(app) as url:
        bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="tiny", prompt="x", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert len(good.completions.create(model="tiny", prompt="x", max_tokens=2,
                                           extra_body={"dbert": {"steps": 4}}).choices) == 1
        assert post(url, {"prompt": "x"}, headers={})[0] == 401
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")


def _blocker(app, tiny_db):
    """A job that holds the worker at its first reverse step until released."""
    release, holding = threading.Event(), threading.Event()

    def notify(event):
        holding.set()
        release.wait(30)

    cfg = resolve(SampleConfig(n=1, steps=8, length=4, dtype="fp32"), tiny_db)
    app.state.scheduler.submit([Job(cfg, notify=notify, want_steps=True)])
    assert holding.wait(10)
    return release


def test_full_queue_is_a_429(tiny_db):
    app = create_app(tiny_db, "tiny", dtype="fp32", models=[], limits=Limits(max_queue=1))
    with running(app) as url:
        release = _blocker(app, tiny_db)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(post, url, {"prompt": "a", "max_tokens": 2, "dbert": {"steps": 4}})
            while app.state.scheduler.queued < 1:
                time.sleep(0.01)
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.RateLimitError, match="queue is full"):
                client.completions.create(model="tiny", prompt="b", max_tokens=2)
            release.set()
            assert waiting.result(30)[0] == 200  # the queued one is still answered


def test_time_limit_is_a_504(tiny_db):
    app = create_app(tiny_db, "tiny", dtype="fp32", models=[], limits=Limits(timeout=0.5))
    with running(app) as url:
        release = _blocker(app, tiny_db)
        status, body = post(url, {"prompt": "a", "max_tokens": 2, "dbert": {"steps": 4}})
        release.set()
        assert status == 504 and "time limit" in body["error"]["message"]


def test_a_client_that_goes_away_cancels_its_work(tiny_db):
    app = create_app(tiny_db, "tiny", dtype="fp32", models=[])
    sched = app.state.scheduler
    steps = 256
    with running(app) as url:
        host, port = url.removeprefix("http://").split(":")
        for stream in (True, False):
            before = len(sched.stopped)
            body = json.dumps({"prompt": "", "max_tokens": 100, "n": 8, "stream": stream,
                               "dbert": {"steps": steps, "sampler": "ancestral", "stream_steps": stream}}).encode()
            s = socket.create_connection((host, int(port)))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            if stream:
                got = b""
                while b"data:" not in got:  # the first reverse step arrived: the job is running
                    got += s.recv(4096)
            else:
                while not sched.busy:
                    time.sleep(0.005)
            s.close()
            deadline = time.monotonic() + 30
            while len(sched.stopped) == before:
                assert time.monotonic() < deadline, "the job was not cancelled"
                time.sleep(0.01)
            kind, step, total = sched.stopped[-1]
            assert kind == "cancelled" and step < total == steps
            while sched.busy:
                time.sleep(0.01)


def test_an_engine_failure_fails_one_request(tiny_db, monkeypatch):
    from dbert_core.serving import serve_queue

    real = serve_queue.generate
    calls = []

    def broken_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the model's outputs are not finite")
        return real(*args, **kwargs)

    monkeypatch.setattr(serve_queue, "generate", broken_once)
    app = create_app(tiny_db, "tiny", dtype="fp32", models=[])
    with running(app) as url:
        status, body = post(url, {"prompt": "a", "max_tokens": 2, "seed": 1, "dbert": {"steps": 4}})
        assert status == 500 and "not finite" in body["error"]["message"]
        status, body = post(url, {"prompt": "a", "max_tokens": 2, "seed": 1, "dbert": {"steps": 4}})
        assert status == 200 and len(body["choices"]) == 1  # the worker kept serving


# ---------------------------------------------------------------------------------- load
@pytest.mark.parametrize("batching", [True, False])
def test_load_nothing_lost_or_mixed(served, tiny_db, batching):
    """200 requests from 16 concurrent clients: every one answered with its own prompt's text;
    seeded ones exactly as alone; unseeded ones of equal settings share sampler calls.
    (Its figures are no benchmark: scripts/studies/serve_bench.py, docs/performance.md.)"""
    if batching:
        _load(*served, tiny_db, batching)
    else:
        app = create_app(tiny_db, "tiny", dtype="fp32", models=[], batching=False)
        with running(app) as url:
            _load(app, url, tiny_db, batching)


def _load(app, url, tiny_db, batching):
    sched = app.state.scheduler
    tok = tiny_db.tokenizer
    words = [w for w in ("cat", "dog", "girl", "boy", "ball", "tree", "sun", "mom", "dad", "park", "big", "red",
                         "happy", "sad", "toy", "bird", "fish", "cake", "car", "box", "day", "fun", "mouse", "bear")
             if len(tok.encode(w, add_special_tokens=False)) == 1][:16]  # one piece each: prompts of one length
    assert len(words) >= 8
    settings = {"steps": 8}
    seeded_prompts = {i: f"{words[i % len(words)]} and {words[(i + 1) % len(words)]}" for i in range(0, 200, 10)}
    expected = {}
    for i, p in seeded_prompts.items():
        status, body = post(url, {"prompt": p, "max_tokens": 6, "n": 2, "seed": i, "echo": True, "dbert": settings})
        expected[i] = [c["text"] for c in body["choices"]]
    shared_before = sched.shared

    def one(i: int):
        if i in seeded_prompts:
            p, extra = seeded_prompts[i], {"seed": i}
        else:
            p, extra = f"{words[i % len(words)]} {words[(i // len(words)) % len(words)]}", {}
        start = time.perf_counter()
        status, body = post(url, {"prompt": p, "max_tokens": 6, "n": 2, "echo": True, "dbert": settings, **extra})
        return i, p, status, body, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(200)))
    seconds = time.perf_counter() - start
    latency = sorted(r[4] for r in results)
    print(f"batching={batching}: {200 / seconds:.0f} requests/s, p50 {latency[99] * 1000:.0f} ms, "
          f"p99 {latency[197] * 1000:.0f} ms, {sched.calls} sampler calls")
    assert len(results) == 200
    for i, p, status, body, _ in results:
        assert status == 200, body
        texts = [c["text"] for c in body["choices"]]
        assert len(texts) == 2 and all(t.startswith(p) and "[MASK]" not in t for t in texts), (p, texts)
        if i in expected:
            assert texts == expected[i]
    if batching:
        assert sched.shared > shared_before  # requests that arrived together shared sampler calls
    else:
        assert sched.shared == 0
    assert sched.queued == 0


# ---------------------------------------------------------------------------------- signals
def _start(tiny_checkpoint, *flags):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DBERT_TEST_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dbert_core.cli", "serve", "--checkpoint", str(tiny_checkpoint),
                             "--port", str(port), "--dtype", "fp32", *flags], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)


def _stream_then_signal(port: int, proc, sig) -> bytes:
    body = json.dumps({"prompt": "", "max_tokens": 100, "n": 8, "stream": True,
                       "dbert": {"steps": 256, "sampler": "ancestral", "stream_steps": True}}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while b"data:" not in got:  # the job is running
        got += s.recv(65536)
    proc.send_signal(sig)
    while chunk := s.recv(65536):
        got += chunk
    s.close()
    return got


@pytest.mark.slow
def test_sigterm_finishes_running_requests(tiny_checkpoint):
    proc, port = _start(tiny_checkpoint, "--grace", "30")
    got = _stream_then_signal(port, proc, signal.SIGTERM)
    assert b"data: [DONE]" in got and b'"finish_reason": "length"' in got  # finished, not cut
    out, err = proc.communicate(timeout=30)
    assert out == "" and "Traceback" not in err and "Finished server process" in err and "Cancel" not in err
    assert err.rstrip().endswith("dbert serve: stopped") and proc.returncode == 0  # drained: a clean end


@pytest.mark.slow
def test_sigint_with_no_grace_cancels_running_requests(tiny_checkpoint):
    proc, port = _start(tiny_checkpoint, "--grace", "0")
    got = _stream_then_signal(port, proc, signal.SIGINT)
    assert b"data: [DONE]" not in got and b"the server is shutting down" in got  # cancelled mid-run, told why
    out, err = proc.communicate(timeout=30)
    assert out == "" and "Traceback" not in err
    assert proc.returncode == 0 and "dbert serve: stopped" in err


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_exit_2(tiny_checkpoint):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "dbert_core.cli", "serve", "--checkpoint", str(tiny_checkpoint),
                               "--port", str(port)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert f"dbert: error: could not serve on 127.0.0.1:{port}" in done.stderr
