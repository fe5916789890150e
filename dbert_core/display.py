"""Strings shown to a person: one function makes any untrusted text safe for a terminal.

Text from a checkpoint (metadata, token pieces, file names), a fetched file, a URL or an
exception's message may hold terminal escape codes (ESC ] 0 ; … sets a window title, ESC [ …
moves the cursor or recolours), other control characters, bidirectional overrides that reorder
what is read, or lone surrogates that cannot be encoded at all. `safe_text` writes each of
these as a visible escape (`\\x1b`, `\\u202e`) and shortens a long string to `limit` characters,
so a 10 MB field is one short line (its start and end kept). Every place the CLI and the TUI print such a string goes
through it: the error line, the store listing (store.Entry), token pieces
(WordPieceTokenizer.convert_ids_to_tokens) and the TUI's notifications and tables.

Times are written here too: `duration` (1:02:03, 4:05) and `eta`, the remaining time every
progress line shows; and a long story's step as its window and the step within it (`step_label`:
`window 1/2 · step 40/48`), as the TUI's status and the CLI's progress both say it.

Torch-free.
"""

from __future__ import annotations

import re

MAX_SHOWN = 300  # characters of one untrusted string in a message or a listing
ELLIPSIS = "..."  # ASCII, so a shortened string prints under any encoding

# C0 and C1 controls and DEL; line and paragraph separators; bidirectional marks, embeddings,
# overrides and isolates; the byte-order mark; lone surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff"
                     "\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(value, limit: int | None = MAX_SHOWN) -> str:
    """value as a string fit to print: control characters escaped, at most `limit` characters
    (None: any length); a longer one keeps its start and its end, with ELLIPSIS between."""
    text = value if isinstance(value, str) else str(value)
    if limit is None or len(text) <= limit:
        return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text
    tail = max(0, (limit - len(ELLIPSIS)) // 3)
    head = max(0, limit - len(ELLIPSIS) - tail)
    # cut before escaping (a 10 MB string costs what a short one does), then again after
    start, end = safe_text(text[:head], None)[:head], safe_text(text[len(text) - tail:], None) if tail else ""
    return start + ELLIPSIS + end[len(end) - tail:]


def is_safe(text: str) -> bool:
    """Whether text holds nothing safe_text would escape."""
    return _UNSAFE.search(text) is None


def duration(seconds: float) -> str:
    """Seconds as a progress line writes them: M:SS, or H:MM:SS from an hour on."""
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def eta(elapsed: float, done: float, left: float) -> float | None:
    """Seconds still to go when `done` units of work took `elapsed` seconds and `left` remain
    (at the pace so far); None before any is done."""
    return None if done <= 0 else elapsed / done * left


def window_step(step: int, steps: int, per_window: int) -> tuple[int, int, int]:
    """(window, windows, step within it) of a frame's `step` of `steps` counted on across a story's
    (or a long refill's) windows of `per_window` steps each (the control bar's steps); one window
    when `steps` is not a whole number of windows of more than one."""
    if per_window <= 0 or steps <= per_window or steps % per_window:
        return 1, 1, step
    window = min(steps // per_window, max(1, -(-step // per_window)))
    return window, steps // per_window, step - (window - 1) * per_window


def step_label(step: int, steps: int, per_window: int) -> str:
    """'window w/W · step k/S' for a run of several windows, else 'step k/S' (S: steps per window)."""
    window, windows, within = window_step(step, steps, per_window)
    if windows == 1:
        return f"step {step}/{steps}"
    return f"window {window}/{windows} · step {within}/{per_window}"


def tokenizing_line(info: dict) -> str:
    """A token cache being built (token_cache.cached's report of stage "tokenize"): MB read, MB/s,
    tokens, ETA; what `dbert train`, `dbert eval` and the TUI's Train screen show."""
    done, total, secs = info["bytes"], info.get("total") or 0, max(1e-9, info["seconds"])
    left = eta(secs, done, total - done) if total >= done else None
    return (f"tokenizing {done / 1e6:,.1f}" + (f"/{total / 1e6:,.1f}" if total >= done else "") +
            f" MB, {done / 1e6 / secs:,.1f} MB/s, {info['tokens']:,} tokens" +
            (f", eta {duration(left)}" if left is not None else ""))


def cache_line(info: dict) -> str:
    """Where the token cache entry is (a report of stage "built" or "cached")."""
    how = "tokenized now" if info.get("stage") == "built" else "reused, nothing tokenized"
    return f"token cache: {info['tokens']:,} tokens of {info['documents']:,} documents ({how}): {info['folder']}"
