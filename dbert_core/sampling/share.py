"""Sharing a run: an asciinema cast of it filling in, and its final text as HTML coloured by
reveal order. Both read the frames the sampler (or a replay) made; no terminal, no Textual.

cast(...)  asciinema's v2 format: a JSON header line {version: 2, width, height, title, ...},
           then one event per frame, [seconds, "o", text]: the screen cleared and the frame
           drawn with ANSI colours (24-bit): blue for early reveals, green, red for late ones,
           the tokens new at that frame black on yellow, the prompt bold and underlined, masks
           grey bars as wide as their final word (stable.py: nothing moves). `asciinema play
           FILE` plays it, `asciinema cat FILE` prints it.
html(...)  one self-contained page: each row's final text, every word in the colour of its
           reveal step (a tooltip says the step), the prompt underlined.
"""

from __future__ import annotations

import html as _html
import json

from ..text.detok import spans, special_names
from ..text.stable import stable_spans

EARLY, MID, LATE = (95, 135, 255), (95, 215, 135), (255, 95, 95)
GREY = (108, 108, 108)


def order_rgb(step: int, steps: int) -> tuple[int, int, int]:
    """Early reveals blue, middle green, late red (the TUI's reveal-order colours)."""
    x = 0.0 if steps <= 1 else (step - 1) / (steps - 1)

    def blend(a, b, y):
        return tuple(round(a[i] + (b[i] - a[i]) * y) for i in range(3))

    return blend(EARLY, MID, x * 2) if x < 0.5 else blend(MID, LATE, (x - 0.5) * 2)


def _spans(db, frame, b: int, verbatim=None, paragraph: str = "\n"):
    pieces = db.tokenizer.convert_ids_to_tokens([int(i) for i in frame.ids[b]])
    return spans(pieces, frame.masked[b].tolist(), paragraph=paragraph, cased=True, truecase=db.truecase,
                 verbatim=verbatim, **special_names(db.tokenizer))


def _wrap(tokens: list[tuple[str, str, str]], width: int) -> list[list[tuple[str, str]]]:
    """(gap, text, sgr) tokens into lines of at most `width` columns (a word wider than a line
    gets one of its own); a gap holding a line break starts a new line."""
    lines: list[list[tuple[str, str]]] = [[]]
    col = 0
    for gap, text, sgr in tokens:
        if "\n" in gap:
            lines.append([])
            col = 0
            gap = ""
        if col and col + len(gap) + len(text) > width:
            lines.append([])
            col = 0
            gap = ""
        if not col:
            gap = ""
        lines[-1].append((gap, ""))
        lines[-1].append((text, sgr))
        col += len(gap) + len(text)
    return lines


def _sgr(rgb, *extra: int, bg=None) -> str:
    codes = [str(e) for e in extra] + [f"38;2;{rgb[0]};{rgb[1]};{rgb[2]}"]
    if bg is not None:
        codes.append(f"48;2;{bg[0]};{bg[1]};{bg[2]}")
    return "\x1b[" + ";".join(codes) + "m"


def frame_lines(db, frame, order, b: int, final, width: int, verbatim=None) -> list[str]:
    """Row b of a frame as ANSI lines on the final frame's layout."""
    laid = stable_spans(_spans(db, frame, b, verbatim), _spans(db, final, b, verbatim))
    tokens = []
    for s in laid:
        if s.masked:
            sgr = _sgr(GREY)
        elif bool(frame.revealed[b, s.index]):
            sgr = _sgr((0, 0, 0), 1, bg=(255, 215, 0))
        elif int(order[b, s.index]) == 0:
            sgr = "\x1b[1;4m"
        else:
            sgr = _sgr(order_rgb(int(order[b, s.index]), frame.steps))
        tokens.append((s.gap, s.text, sgr))
    out = []
    for line in _wrap(tokens, width):
        out.append("".join(text if not sgr else f"{sgr}{text}\x1b[0m" for text, sgr in line))
    return out


def cast(db, frames, order, *, width: int = 80, height: int = 24, pace_s: float = 0.08, hold_s: float = 2.0,
         title: str = "dbert", rows: list[int] | None = None, verbatim=None) -> str:
    """The frames (sample.Frame or compact copies) as an asciinema v2 cast, one event per frame."""
    final = frames[-1]
    rows = list(range(final.ids.shape[0])) if rows is None else rows
    screens = []
    for f in frames:
        lines = []
        for b in rows:
            if len(rows) > 1:
                lines.append(f"\x1b[2msample {b + 1}\x1b[0m")
            lines.extend(frame_lines(db, f, order, b, final, width, verbatim))
        head = f"\x1b[1mstep {f.step}/{f.steps}\x1b[0m · masked {int(f.masked.sum())}/{f.masked.numel()} · nfe {f.nfe}"
        screens.append([head, ""] + lines)
    tall = max(height, max(len(s) for s in screens) + 1)
    header = {"version": 2, "width": width, "height": tall, "title": title,
              "env": {"TERM": "xterm-256color"}}
    out = [json.dumps(header)]
    t = 0.0
    for screen in screens:
        out.append(json.dumps([round(t, 3), "o", "\x1b[2J\x1b[H" + "\r\n".join(screen)]))
        t += pace_s
    out.append(json.dumps([round(t + hold_s, 3), "o", "\r\n"]))
    return "\n".join(out) + "\n"


def html(db, frames, order, *, title: str = "dbert", verbatim=None) -> str:
    """The final texts as one HTML page, each word coloured by its reveal step."""
    final = frames[-1]
    body = []
    for b in range(final.ids.shape[0]):
        parts = []
        for s in _spans(db, final, b, verbatim):
            gap = "<br>" if "\n" in s.gap else _html.escape(s.gap)
            step = int(order[b, s.index])
            text = _html.escape(s.text)
            if s.masked:
                parts.append(f'{gap}<span class="mask">{text}</span>')
            elif step == 0:
                parts.append(f'{gap}<span class="prompt" title="prompt">{text}</span>')
            else:
                r, g, bl = order_rgb(step, final.steps)
                parts.append(f'{gap}<span style="color:#{r:02x}{g:02x}{bl:02x}" title="step {step}/{final.steps}">'
                             f'{text}</span>')
        body.append(f'<p>{"".join(parts)}</p>')
    legend = "".join(f'<span style="color:#{c[0]:02x}{c[1]:02x}{c[2]:02x}">■</span>'
                     for c in (order_rgb(k, 5) for k in range(1, 6)))
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + _html.escape(title) + "</title>\n"
            "<style>body{background:#111;color:#ddd;font:16px/1.6 monospace;max-width:50em;margin:2em auto}"
            ".prompt{text-decoration:underline;font-weight:bold}.mask{color:#666}"
            ".legend{color:#888;font-size:80%}</style></head><body>\n"
            f'<p class="legend">reveal order: early {legend} late · <span class="prompt">prompt</span></p>\n'
            + "\n".join(body) + "\n</body></html>\n")
