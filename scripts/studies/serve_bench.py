"""Throughput and latency of `dbert serve`, with and without batching (docs/performance.md).

    python scripts/studies/serve_bench.py                                  # the shipped model, 200 x 16
    python scripts/studies/serve_bench.py --checkpoint runs/x --requests 400 --clients 32 --max-tokens 16

For each mode the script starts `dbert serve` in a subprocess on a free loopback port
(--batch, then --no-batch), waits for /health, sends --requests completions from --clients
concurrent clients (plain HTTP, one connection per request), checks that every answer came
back whole and with its own prompt (echo), then stops the server with SIGTERM. Prompts are
"<name> went to the" with a different one-piece name each, so all have the same length and
may share sampler calls. Prints a Markdown table: requests/s, p50/p99 latency, sampler calls.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
NAMES = ("Lily", "Tom", "Ben", "Sue", "Max", "Mia", "Sam", "Anna", "Tim", "Lucy", "Jack", "Amy", "Bob", "Sara",
         "Mom", "Dad")


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port: int, path: str, body: dict | None = None, timeout: float = 300):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if body is None:
        conn.request("GET", path)
    else:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    return resp.status, data


def start(args, batching: bool) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "dbert_core.cli", "serve", "--port", str(port), "--max-queue", str(args.requests),
           "--batch" if batching else "--no-batch", "--device", args.device]
    if args.checkpoint:
        cmd += ["--checkpoint", args.checkpoint]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if call(port, "/health", timeout=2)[0] == 200:
                return proc, port
        except OSError:
            time.sleep(0.2)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit(f"the server did not start: {' '.join(cmd)}")


def load(args, port: int) -> dict:
    settings = {"max_tokens": args.max_tokens, "echo": True, "dbert": {"steps": args.steps}}

    def one(i: int):
        prompt = f"{NAMES[i % len(NAMES)]} went to the"
        t = time.perf_counter()
        status, body = call(port, "/v1/completions", {"prompt": prompt, **settings})
        seconds = time.perf_counter() - t
        ok = status == 200 and len(body["choices"]) == 1 and body["choices"][0]["text"].startswith(prompt)
        return ok, seconds

    call(port, "/v1/completions", {"prompt": "warm up", **settings})
    start = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        results = list(pool.map(one, range(args.requests)))
    wall = time.perf_counter() - start
    lat = sorted(s for _, s in results)
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000  # noqa: E731
    return {"ok": sum(ok for ok, _ in results), "rps": len(results) / wall, "p50": pick(0.50), "p99": pick(0.99),
            "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="store name or directory (default: the shipped model)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    rows = []
    for batching in (True, False):
        proc, port = start(args, batching)
        try:
            r = load(args, port)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        rows.append((batching, r))
        print(f"batching={batching}: {r}", file=sys.stderr)
    print(f"`python scripts/studies/serve_bench.py --requests {args.requests} --clients {args.clients} "
          f"--max-tokens {args.max_tokens} --steps {args.steps}`"
          f"{' --checkpoint ' + args.checkpoint if args.checkpoint else ''}; {cpu()}, {os.cpu_count()} cores\n")
    print("| batching | answered | requests/s | p50 latency | p99 latency |")
    print("|---|---|---|---|---|")
    for batching, r in rows:
        print(f"| {'on' if batching else 'off'} | {r['ok']}/{args.requests} | {r['rps']:.1f} | {r['p50']:.0f} ms | "
              f"{r['p99']:.0f} ms |")
    on, off = rows[0][1], rows[1][1]
    print(f"\nbatching: {on['rps'] / off['rps']:.2f}x the throughput")


if __name__ == "__main__":
    main()
