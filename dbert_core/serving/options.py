"""What `dbert serve` is started with, checked before the model loads: Limits (what one request
may ask for and send; each field a flag), MAX_HEAD (the size of a request's head, fixed),
check_options (the flags: one DbertError line naming the first bad one) and is_loopback (a host
only this machine reaches; anywhere else wants --api-key)."""

from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass

from ..errors import DbertError


@dataclass
class Limits:
    """What one request may ask for; every field is a `dbert serve` flag."""

    max_n: int = 16              # choices per request (prompts x n)
    max_tokens: int | None = None  # the span length max_tokens at most; None: request.max_span (383 for the shipped model)
    max_queue: int = 64          # jobs (prompts) waiting for the model; more: 429
    timeout: float = 120.0       # seconds per request, reading its body and queueing included; then 408/504
    max_body: int = 64 * 1024    # bytes of a request body; more: 413
    max_connections: int = 128   # connections with a request in progress; beyond, /health only (503)
    keep_alive: float = 5.0      # seconds a connection has to send a request's head, from its connect or
                                 # the end of its previous response, however it trickles; then closed


MAX_HEAD = 16 * 1024  # bytes of a request line and headers (h11's limit, set explicitly); more: 431


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_options(*, api_key: str | None, port: int, timeout: float, grace: float, **at_least_one: int) -> None:
    """The `dbert serve` options, checked before the model loads: one DbertError line naming the
    first bad one. An empty key (--api-key '' or DBERT_API_KEY=, which Click reads as no key at
    all) is refused: it would otherwise switch authentication off without a word."""
    if api_key is None and os.environ.get("DBERT_API_KEY") == "":
        raise DbertError("DBERT_API_KEY is set but empty: set it to a key, or unset it to serve without one")
    if api_key is not None:
        if not api_key.strip():
            raise DbertError("is empty: give a key, or leave the option out to serve without one", "api_key", api_key)
        if api_key != api_key.strip() or not all(" " <= c <= "~" for c in api_key):
            raise DbertError("must be printable ASCII without spaces at its ends (it travels in an HTTP header: "
                             "Authorization: Bearer KEY)", "api_key")
    for name, value in at_least_one.items():
        if value < 1:
            raise DbertError("must be >= 1", name, value)
    if not 0 < port < 65536:
        raise DbertError(f"must be in [1, 65535], got {port}", "port", port)
    if not (math.isfinite(timeout) and timeout > 0):
        raise DbertError(f"must be a number of seconds > 0, got {timeout}", "timeout", timeout)
    if not (math.isfinite(grace) and grace >= 0):
        raise DbertError(f"must be a number of seconds >= 0, got {grace}", "grace", grace)
