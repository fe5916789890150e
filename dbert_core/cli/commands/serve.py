"""`dbert serve`: the options checked before the model loads, then the OpenAI-compatible server
(dbert_core/serving) until a signal; the signals go back to uvicorn's handling while it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ... import config
from ...errors import DbertError
from .. import options
from ..ending import restore_signals
from ..options import plain, with_settings
from ..streams import say


# --help's order: the server's own options, then `dbert sample`'s --device and --dtype (settings.SAMPLE)
LAYOUT: dict[str | None, tuple[str, ...]] = {None: (
    "checkpoint", "host", "port", "api_key", "max_n", "max_tokens", "max_queue", "timeout", "max_body",
    "max_connections", "batch", "batch_rows", "grace", "device", "dtype")}


@with_settings(config.SAMPLE_SETTINGS, LAYOUT, {"dtype": {"help": "The network's precision, as in `dbert sample`."}},
               rest=False)
def serve(
    checkpoint: Annotated[Optional[str], typer.Option(help="A store name (see `dbert checkpoints list`) or, with a path separator (./x, runs/x), a directory (default: the shipped model).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; anything but loopback is reachable from other machines (set --api-key).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    api_key: Annotated[Optional[str], typer.Option(envvar="DBERT_API_KEY", help="Require Authorization: Bearer KEY (or set DBERT_API_KEY, which stays out of the process list).")] = None,
    max_n: Annotated[int, typer.Option(help="Completions per request at most (prompts x n).")] = 16,
    max_tokens: Annotated[Optional[int], typer.Option(help="max_tokens (the span length) at most. Default: the checkpoint's story length, `dbert sample`'s default --length (383 for the shipped model), at least 256.", show_default=False)] = None,
    max_queue: Annotated[int, typer.Option(help="Prompts waiting for the model at most; more get HTTP 429.")] = 64,
    timeout: Annotated[float, typer.Option(help="Seconds a request may take, queueing included; then HTTP 504.")] = 120.0,
    max_body: Annotated[int, typer.Option(help="Bytes of a request body at most; more get HTTP 413.")] = 65536,
    max_connections: Annotated[int, typer.Option(help="Connections with a request in progress at most; idle ones are closed to make room, past it only /health is answered.")] = 128,
    batch: Annotated[bool, typer.Option("--batch/--no-batch", help="Let unseeded requests with the same settings share a sampler call.")] = True,
    batch_rows: Annotated[int, typer.Option(help="Samples per shared sampler call at most.")] = 32,
    grace: Annotated[float, typer.Option(help="On SIGINT/SIGTERM/SIGHUP, seconds running requests may finish before they are cancelled (a second Ctrl-C: at once).")] = 10.0,
    **declared,  # --device and --dtype: `dbert sample`'s settings (settings.SAMPLE: options.with_settings)
):
    """Serve the checkpoint over HTTP: OpenAI-compatible /v1/completions with infill (suffix).

    Example: dbert serve --port 8000 --api-key secret
    """
    from ...serving.options import Limits, check_options, is_loopback
    from ...serving.serve import create_app
    from ...serving.server import run

    check_options(api_key=api_key, port=port, timeout=timeout, grace=grace, max_n=max_n,
                  **({} if max_tokens is None else {"max_tokens": max_tokens}), max_queue=max_queue, max_body=max_body, batch_rows=batch_rows, max_connections=max_connections)
    if not is_loopback(host) and not api_key:
        say(f"dbert serve: warning: listening on {host} without --api-key: anyone who can reach this port can use it")
    name = checkpoint if checkpoint is None or "/" not in checkpoint else Path(checkpoint).name
    name = name or "default"
    given = plain(declared)
    device, dtype = given["device"], given["dtype"]
    db = options.load(checkpoint, device)
    limits = Limits(max_n=max_n, max_tokens=max_tokens, max_queue=max_queue, timeout=timeout, max_body=max_body,
                    max_connections=max_connections)
    application = create_app(db, name, api_key=api_key, limits=limits, batching=batch, max_rows=batch_rows,
                             device=device, dtype=dtype)
    say(f"dbert serve: {name} ({db.path}) on http://{host}:{port}/v1 ; stop with Ctrl+C")
    restore_signals()  # serving.server handles SIGINT, SIGTERM and SIGHUP itself: each drains, then run() returns
    try:
        run(application, host, port, grace=grace)
    except KeyboardInterrupt:  # a Ctrl-C before uvicorn took the signals
        pass
    except SystemExit as e:  # uvicorn's exit when it cannot start (its ERROR line says why)
        if e.code:
            raise DbertError(f"could not serve on {host}:{port} (the port in use, or the address not this machine's?)") from None
    say("dbert serve: stopped")
