"""What dbert's downloads accept from the network: http(s) only, redirects that stay on the
host they started from, and an answer within a timeout (DBERT_FETCH_TIMEOUT seconds, default
TIMEOUT) both to connect and between any two reads, for archive URLs and the Hugging Face Hub.
"""

from __future__ import annotations

import math
import os
import urllib.request
from urllib.parse import urljoin, urlparse

from .errors import DbertError

TIMEOUT = 30.0
SCHEMES = ("http", "https")


def timeout() -> float:
    """Seconds to wait for a connection or for the next bytes (DBERT_FETCH_TIMEOUT overrides)."""
    text = os.environ.get("DBERT_FETCH_TIMEOUT")
    if text is None or not text.strip():
        return TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise DbertError(f"DBERT_FETCH_TIMEOUT must be a positive number of seconds, got {text!r}")
    return value


def check_url(url: str) -> None:
    scheme = urlparse(url).scheme.lower()
    if scheme not in SCHEMES:
        raise DbertError(f"cannot fetch {url}: only http:// and https:// URLs are fetched"
                         + (f", not {scheme}://" if scheme else ""))


def check_redirect(url: str, new: str) -> None:
    """A redirect may change the path, or upgrade http to https; nothing else."""
    old_p, new_p = urlparse(url), urlparse(new)
    if new_p.scheme.lower() not in SCHEMES:
        raise DbertError(f"cannot fetch {url}: it redirects to {new_p.scheme or '?'}:// ({new[:120]}); "
                         "only http:// and https:// are fetched")
    same_host = (new_p.hostname or "").lower() == (old_p.hostname or "").lower()
    same_port = new_p.scheme != old_p.scheme or (new_p.port or _port(new_p.scheme)) == (old_p.port or _port(old_p.scheme))
    if not (same_host and same_port):
        raise DbertError(f"cannot fetch {url}: it redirects to another host ({new_p.hostname}); "
                         "fetch that URL directly if you trust it")
    if old_p.scheme == "https" and new_p.scheme == "http":
        raise DbertError(f"cannot fetch {url}: it redirects from https to plain http")


def _port(scheme: str) -> int:
    return 443 if scheme.lower() == "https" else 80


class _Redirects(urllib.request.HTTPRedirectHandler):
    def http_error_302(self, req, fp, code, msg, headers):
        location = headers.get("Location") or headers.get("URI")
        if location:
            check_redirect(req.full_url, urljoin(req.full_url, location))
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def open_url(url: str):
    """urlopen under the policy above; the response's reads time out too."""
    check_url(url)
    opener = urllib.request.build_opener(_Redirects)
    return opener.open(url, timeout=timeout())


def timed_out(error: BaseException) -> bool:
    """Whether an exception (or one it was raised from) is a timeout."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, TimeoutError) or "Timeout" in type(error).__name__ or \
                "timed out" in str(getattr(error, "reason", "")):
            return True
        error = error.__cause__ or error.__context__
    return False


def no_answer(where: str, host: str) -> DbertError:
    return DbertError(f"cannot fetch {where}: no answer from {host} within {timeout():g} s "
                      "(set DBERT_FETCH_TIMEOUT to wait longer)")


_configured: float | None = None


def configure_hub() -> None:
    """Give huggingface_hub's HTTP client our timeouts: it passes none for some requests (repo
    info, file listings), which then wait forever on a host that never answers."""
    global _configured
    seconds = timeout()
    if _configured == seconds:
        return
    try:
        import huggingface_hub
        from huggingface_hub.utils import _http

        default = _http.default_client_factory
    except (ImportError, AttributeError):  # an older huggingface_hub: it sets its own timeouts
        return

    def cap(request) -> None:
        given = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {k: seconds if given.get(k) is None else min(given[k], seconds)
                                         for k in ("connect", "read", "write", "pool")}

    def factory():
        client = default()
        client.event_hooks["request"].append(cap)
        return client

    huggingface_hub.set_client_factory(factory)
    _configured = seconds
