"""Drawing, and nothing else: token views, colours, the legend, the noise schedule as a chart
and as a strip. Pure functions returning Rich Text; no Textual, no state (controller.py), no
files (files.py)."""

from __future__ import annotations

import math

from rich.color import Color
from rich.style import Style
from rich.text import Text

from dbert_core.display import step_label, window_step  # noqa: F401 - the TUI's names for them
from dbert_core.text.detok import MASK_GLYPH, spans, special_names

from .runs import Recorded

EARLY, MID, LATE = (95, 135, 255), (95, 215, 135), (255, 95, 95)
LOW, HIGH = (255, 95, 95), (95, 215, 135)


# ------------------------------------------------------------------------------ colours
def _blend(a, b, x: float):
    return tuple(round(a[i] + (b[i] - a[i]) * x) for i in range(3))


def order_colour(step: int, steps: int) -> Color:
    """Early reveals blue, middle green, late red (dbert_core.sampling.share.order_rgb: the cast and the
    HTML export use the same colours)."""
    from dbert_core.sampling.share import order_rgb

    return Color.from_rgb(*order_rgb(step, steps))


BANDS = 5                          # confidence colours: quintiles of the run
FIXED_EDGES = (0.2, 0.4, 0.6, 0.8)  # before any token has a confidence


def confidence_edges(confidence) -> tuple[float, ...]:
    """The band edges of the confidence colouring: the quintiles of the confidences recorded so
    far (nan: masked or given tokens are left out). A model that is rarely sure (the default
    model's p' is mostly under 0.2) still spreads over all five colours; the legend prints the
    edges, so a colour keeps a number."""
    import torch

    c = confidence.double().flatten()
    c = c[~torch.isnan(c)]
    if c.numel() < BANDS:
        return FIXED_EDGES
    q = torch.quantile(c, torch.linspace(0, 1, BANDS + 1, dtype=torch.float64)[1:-1])
    return tuple(float(x) for x in q)


def confidence_band(p: float, edges: tuple[float, ...]) -> int:
    """0 (lowest) .. len(edges): how many edges p reaches."""
    return sum(p >= e for e in edges)


def confidence_colour(p: float, edges: tuple[float, ...] = FIXED_EDGES) -> Color:
    """The colour of p's band: red (the run's least sure fifth) to green (its surest)."""
    return band_colour(confidence_band(p, edges), len(edges))


def band_colour(band: int, top: int) -> Color:
    return Color.from_rgb(*_blend(LOW, HIGH, band / max(1, top)))


def token_pieces(tokenizer, ids) -> list[str]:
    return tokenizer.convert_ids_to_tokens([int(i) for i in ids])


def token_style(rec: Recorded, b: int, pos: int, mode: str, edges: tuple[float, ...] = FIXED_EDGES) -> str:
    """The style of a revealed token: new this step, given by the prompt, or coloured by when it
    was revealed (mode 'order') or by the model's confidence in it."""
    f = rec.frame
    if bool(f.revealed[b, pos]):
        return "bold black on yellow"
    step = int(rec.order[b, pos])
    if step == 0:
        return "bold underline"  # given by the prompt
    if mode == "confidence":
        c = float(f.confidence[b, pos])
        return confidence_colour(c, edges).name if not math.isnan(c) else "white"
    return order_colour(step, f.steps).name


CURSOR, SELECTED, LOCKED = "reverse", "bold white on #2f5f9f", "bold white on #2f6f3f"


def row_spans(db, rec: Recorded, b: int, paragraph: str = "\n", verbatim: dict[int, str] | None = None,
              final: Recorded | None = None):
    """The detok spans of sample b; with `final` (the run's last frame, when it is known) laid
    out on the final text's line breaks (dbert_core.text.stable: nothing moves while it fills in)."""
    def of(r: Recorded):
        f = r.frame
        return spans(token_pieces(db.tokenizer, f.ids[b]), f.masked[b].tolist(), paragraph=paragraph, cased=True,
                     truecase=db.truecase, verbatim=verbatim, **special_names(db.tokenizer))

    now = of(rec)
    if final is None or final is rec or final.frame.ids.shape != rec.frame.ids.shape:
        return now
    from dbert_core.text.stable import stable_spans

    return stable_spans(now, of(final))


def render_row(db, rec: Recorded, b: int, mode: str = "order", paragraph: str = "\n",
               verbatim: dict[int, str] | None = None, edges: tuple[float, ...] | None = None,
               final: Recorded | None = None, marks: dict | None = None) -> Text:
    """Sample b as a reader sees it (dbert_core.text.detok: the words `dbert sample` prints, cased
    the same way, [SEP] a line break here), every token in its own colour, masked positions as fixed-width MASK_GLYPH.
    `edges`: the confidence bands (confidence_edges of the run; default: of this frame).
    `final`: lay it out on the final text's line breaks (row_spans). `marks` (the inspector):
    {"cursor": position, "selected": set, "locked": set}; with marks every token carries its
    position in its style's meta ("token"), so a mouse event says which token it is over."""
    f = rec.frame
    if mode == "confidence" and edges is None:
        edges = confidence_edges(f.confidence)
    out = Text()
    for span in row_spans(db, rec, b, paragraph, verbatim, final):
        out.append(span.gap)
        style = "grey42" if span.masked else token_style(rec, b, span.index, mode, edges or FIXED_EDGES)
        if marks is not None:
            i = span.index
            if i in marks.get("locked", ()):
                style = LOCKED
            if i in marks.get("selected", ()):
                style = SELECTED
            if i == marks.get("cursor"):
                style = style + " " + CURSOR
            out.append(span.text, style=Style.parse(style) + Style(meta={"token": i}))
        else:
            out.append(span.text, style=style)
    return out


def render_tokens(db, rec: Recorded, mode: str = "order", rows: list[int] | None = None,
                  verbatim: dict[int, str] | None = None, edges: tuple[float, ...] | None = None,
                  final: Recorded | None = None, marks: dict | None = None) -> Text:
    """Several samples (default: all of the batch) one below the other, each under a heading
    when there are more than one (final, marks: render_row's)."""
    rows = list(range(rec.frame.ids.shape[0])) if rows is None else rows
    out = Text()
    for i, b in enumerate(rows):
        if len(rows) > 1:
            out.append(f"{'' if i == 0 else chr(10)}sample {b + 1}\n", style="bold dim")
        out.append_text(render_row(db, rec, b, mode, verbatim=verbatim, edges=edges, final=final, marks=marks))
    return out


# ------------------------------------------------------------------------------ token inspector
def progress_line(pb, rec: Recorded, row: int | None = None, timed: bool = True, room: int | None = None) -> Text:
    """'[window w/W · ]step k/S · masked m/L · nfe N [· seconds] · state' for a run's shown frame
    (or one row of it); `pb` a runs.Playback, `timed` False hides the seconds (deterministic
    snapshots). A story's steps are per window, as the control bar's; its L is the length asked
    for (383, not the canvas's 384: the [SEP] that opens a story is no token of it). Within `room`
    cells (the status line's rest) it drops what it must: the masked count, the seconds, then the
    state's key hint (`done (Space: replay)`: `done`); never the step."""
    f = rec.frame
    width = f.masked.shape[1] - (f.masked.shape[1] == (pb.run.settings.length or 0) + 1)  # a story canvas: less its [SEP]
    if row is None:
        step, n_masked, total = f.step, int(f.masked.sum()), f.masked.shape[0] * width
    else:
        step = int(f.row_steps[row]) if f.row_steps is not None else f.step
        n_masked, total = int(f.masked[row].sum()), width
    label, state = step_label(step, f.steps, pb.run.settings.steps), pb.state()
    text = Text()
    for masked, seconds, hint in ((True, timed, True), (False, timed, True), (False, False, True), (False, False, False)):
        shown = state if hint else state.split(" (")[0]
        text = Text()
        text.append(label, style="bold")
        text.append((f" · masked {n_masked}/{total}" if masked else "") + f" · nfe {f.nfe}")
        if seconds:
            text.append(f" · {rec.seconds:.2f}s")
        text.append(f" · {shown}", style="bold green" if state.startswith("done") else "bold cyan")
        if room is None or text.cell_len <= room:
            break
    return text


def prompt_words_of(db, run, prompt: str | None, given: bool = False) -> dict[int, str] | None:
    """The prompt's own words by the frame's positions (drawn as typed, dbert_core.sampling.sample.prompt_words):
    of `prompt` when `given`, else of the run's (an infill's winning template, whose positions are
    the template's; a refill's, the words its draft kept: Run.words), else of `prompt` (the
    session's). A story checkpoint's run is a story canvas that opens with its [SEP]: the words
    sit one column on (dbert_core.sampling.blocks.canvas_words)."""
    from dbert_core.sampling.blocks import canvas_words
    from dbert_core.sampling.sample import prompt_words

    if not given and run is not None and run.source_prompt is not None:
        return prompt_words(db, run.source_prompt) if db is not None else None  # an infill: the winner's length
    if not given and run is not None and run.template is not None:
        return run.words  # a refill: the positions are the draft's, its words the ones the draft kept
    if not prompt or db is None:
        return None
    words = prompt_words(db, prompt)
    return canvas_words(words) if _story(db) else words


def _story(db) -> bool:
    """A story checkpoint (a replay's stand-in has no meta: its frames carry no prompt words)."""
    from dbert_core.sampling.blocks import is_story_model

    return isinstance(getattr(db, "meta", None), dict) and is_story_model(db)


def _p(x) -> str:
    return "—" if x is None else f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


def inspector_lines(info: dict | None, steps: int, T: int | None, compact: bool, per_window: int = 0) -> Text:
    """The token inspector (dbert_core.sampling.inspector.token_info of the token under the cursor): a
    panel (compact False) or two lines (an 80-column terminal). A story's reveal step is told per
    window of `per_window` steps, as the status line's (step_label)."""
    out = Text()
    if info is None:
        out.append("inspect: ←→ move · Enter select · ⌫ remask · f refill · Esc leave", style="dim")
        return out
    where = f"#{info['position'] + 1}"
    if info["masked"]:
        out.append(f"{where} ", style="bold")
        out.append("masked", style="grey50")
        out.append("  (refill: f)" if compact else "\n\nstill masked at this step", style="dim")
        return out
    piece, step = info["piece"], info.get("step", 0)
    when = "prompt (given)" if info.get("given") else step_label(step, steps, per_window)
    conf = info.get("confidence")
    top = [(w, p) for w, p in info.get("top") or [] if p > 0]  # ids top-k / top-p ruled out are no candidates
    tau = info.get("masking_time")
    if compact:
        out.append(f"{where} ", style="bold")
        out.append(piece, style="bold reverse")
        out.append(f" · {when}")
        if conf is not None:
            out.append(f" · p' {_p(conf)}")
        if tau is not None and T:
            out.append(f" · masks at t≈{tau:.0f}/{T}", style="dim")
        out.append("\n")
        if top:
            out.append("top: ", style="dim")
            out.append(" · ".join(f"{w} {_p(p)}" for w, p in top))
        return out
    out.append(f"token {where}\n", style="bold")
    out.append(piece + "\n", style="bold reverse")
    out.append(f"\nrevealed  {when}\n")
    if conf is not None:
        out.append(f"p'        {_p(conf)}\n")
    if tau is not None and T:
        out.append(f"masked at t≈{tau:.0f} of {T}\n", style="dim")
    if top:
        out.append("\ncandidates then\n", style="bold")
        for w, p in top:
            mark = "▸ " if w == piece else "  "
            out.append(f"{mark}{w[:18]:<18} {_p(p)}\n", style="bold" if w == piece else "")
    return out


def legend(mode: str, edges: tuple[float, ...] = FIXED_EDGES) -> Text:
    """What the colours mean; for confidence, each band's range of p' (the probability the
    sampler gave the chosen token when it revealed it), by quintile of the run."""
    t = Text()
    if mode == "confidence":
        t.append("p' ", style="dim")
        for band in range(len(edges) + 1):
            label = f"<{edges[0]:.2g}" if band == 0 else f"≥{edges[band - 1]:.2g}"  # 2 digits: 0.0031, 0.12
            t.append("■", style=band_colour(band, len(edges)).name)
            t.append(label + " ", style="dim")
    else:
        t.append("early ", style="dim")
        for k in range(1, 6):
            t.append("■", style=order_colour(k, 5).name)
        t.append(" late  ", style="dim")
    t.append("new", style="bold black on yellow")
    t.append("  ")
    t.append(MASK_GLYPH, style="grey42")
    t.append(" masked  ", style="dim")
    t.append("prompt", style="bold underline")
    return t


# ------------------------------------------------------------------------------ noise schedule
def schedule_chart(curve: list[float], width: int, height: int, step: int | None = None,
                   actual: float | None = None) -> Text:
    """A small plot of masked fraction (y, 1 at the top) over reverse steps (x):
    '•' the schedule's expectation, '·' the linear schedule, '│' the current step, '■' the run."""
    width, height = max(8, width), max(3, height)
    steps = len(curve) - 1
    grid = [[" "] * width for _ in range(height)]
    styles = [[""] * width for _ in range(height)]

    def put(x, y, ch, style):
        row = height - 1 - min(height - 1, max(0, round(y * (height - 1))))
        grid[row][x] = ch
        styles[row][x] = style

    xcol = None
    if step is not None and steps:
        xcol = min(width - 1, round(step / steps * (width - 1)))
        for r in range(height):
            grid[r][xcol], styles[r][xcol] = "│", "grey50"
    for x in range(width):
        k = round(x / (width - 1) * steps) if steps else 0
        put(x, 1.0 - k / steps if steps else 0.0, "·", "grey42")
        put(x, curve[k], "•", "cyan")
    if xcol is not None and actual is not None:
        put(xcol, actual, "■", "bold yellow")
    text = Text()
    for r in range(height):
        for c in range(width):
            text.append(grid[r][c], style=styles[r][c] or None)
        if r < height - 1:
            text.append("\n")
    return text


def schedule_chart_with_axes(curve: list[float], width: int, height: int, step: int | None = None,
                             actual: float | None = None) -> Text:
    """schedule_chart with a scale: the masked fraction on the left (100% at the top, 0% at the
    bottom) and the reverse steps below (0 at the left, the run's step budget at the right)."""
    gutter = 5  # "100%┤"
    inner = schedule_chart(curve, width - gutter, height - 1, step, actual)
    rows = inner.split("\n")
    out = Text()
    for r, row in enumerate(rows):
        label = "100%" if r == 0 else "  0%" if r == len(rows) - 1 else " 50%" if r == (len(rows) - 1) // 2 else ""
        out.append(label.rjust(gutter - 1), style="dim")
        out.append("┤" if label else "│", style="dim")
        out.append_text(row)
        out.append("\n")
    steps = len(curve) - 1
    right = f"{steps} steps"
    out.append(" " * gutter + "0" + " " * max(1, width - gutter - 1 - len(right)) + right, style="dim")
    return out


SPARK = "▁▂▃▄▅▆▇█"


def schedule_strip(curve: list[float], width: int, step: int | None = None, actual: float | None = None) -> Text:
    """The schedule in one line `width` wide: the expected masked fraction over the reverse steps
    as a sparkline (one bar per column, full height = all masked), the current step's column
    highlighted, then the run's masked fraction against the expectation there."""
    steps = len(curve) - 1
    tail = ""
    if step is not None and actual is not None and steps >= 0:
        tail = f" masked {actual:.0%} exp {curve[min(step, steps)]:.0%}"
    cols = max(4, width - len(tail))
    here = None if step is None or steps <= 0 else min(cols - 1, round(step / steps * (cols - 1)))
    out = Text()
    for x in range(cols):
        k = round(x / (cols - 1) * steps) if steps > 0 and cols > 1 else 0
        bar = SPARK[min(len(SPARK) - 1, max(0, round(curve[k] * (len(SPARK) - 1))))]
        out.append(bar, style="bold black on yellow" if x == here else "cyan")
    out.append(tail, style="dim")
    return out


# ------------------------------------------------------------------------------ training charts
def ema(values: list[float], weight: float) -> list[float]:
    """Exponential moving average (TensorBoard's smoothing, debiased so the start is not pulled
    towards 0); weight 0 returns the values unchanged."""
    out, acc = [], 0.0
    for i, v in enumerate(values, 1):
        acc = weight * acc + (1 - weight) * v
        out.append(acc / (1 - weight ** i) if weight else v)
    return out


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def line_chart(points: list[tuple[int, float]], width: int, height: int, smooth: float = 0.0,
               style: str = "cyan") -> Text:
    """A small chart with a scale: `points` (step, value), smoothed by an EMA of weight `smooth`,
    as bars of eighth blocks `height` rows high; the y range (max on the top row, min on the
    bottom one) on the left, and a step axis below (first and last step of the data). A column
    is placed by its step, so two points are two thin bars, not a full block."""
    width, height = max(12, width), max(1, height)
    if not points:
        return Text("no data yet", style="dim")
    steps = [s for s, _ in points]
    values = ema([v for _, v in points], smooth)
    lo, hi = min(values), max(values)
    labels = [_num(hi), _num(lo) if hi > lo else ""]
    gutter = max(len(x) for x in labels) + 1
    cols = width - gutter - 1
    s0, s1 = steps[0], steps[-1]
    buckets: list[list[float]] = [[] for _ in range(cols)]
    for s, v in zip(steps, values):
        x = 0 if s1 == s0 else round((s - s0) / (s1 - s0) * (cols - 1))
        buckets[x].append(v)
    column = [sum(b) / len(b) if b else None for b in buckets]
    levels = height * 8
    out = Text()
    for r in range(height):  # r = 0 is the top row
        label = labels[0] if r == 0 else labels[1] if r == height - 1 else ""
        out.append(label.rjust(gutter - 1) + " ", style="dim")
        out.append("┤" if label else "│", style="dim")
        for mean in column:
            if mean is None:
                out.append(" ")
                continue
            filled = 1 + round((mean - lo) / (hi - lo) * (levels - 1)) if hi > lo else levels // 2
            here = max(0, min(8, filled - (height - 1 - r) * 8))
            out.append(" " if here == 0 else SPARK[here - 1], style=style)
        out.append("\n")
    left, right = f"step {s0}", str(s1)
    axis = left + " " * max(1, cols - len(left) - len(right)) + right if s1 != s0 else left
    out.append(" " * (gutter + 1) + axis, style="dim")
    return out
