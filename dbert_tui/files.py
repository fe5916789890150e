"""What the TUI writes: texts and trajectories (atomically), and its small state file
($DBERT_HOME/tui.json, the last checkpoint used). No Textual in here."""

from __future__ import annotations

import json
from pathlib import Path

from .runs import Recorded, Run


def texts_of(db, rec: Recorded) -> list[str]:
    return [db.decode(row) for row in rec.frame.ids]


def atomic_write(path, data: str) -> Path:
    """Write text whole or not at all (dbert_core.disk.atomic.atomic_write_text)."""
    from dbert_core.disk.atomic import atomic_write_text

    return atomic_write_text(path, data)


def trajectory(db, run: Run) -> dict:
    """Every recorded frame of a run, in the engine's trajectory format (dbert_core.sampling.trajectory)."""
    from dbert_core.sampling.trajectory import trajectory as as_json

    last = run.frames[-1] if run.frames else None
    return as_json(db, run.settings, [rec.frame for rec in run.frames], last.order if last else None)


def export_text(db, run: Run, suffix: str, rows: list[int] | None, width: int, verbatim, replay=None) -> str:
    """A run as a file of type suffix: .cast (asciinema, at most `width` columns), .html, else
    the JSON trajectory (a replayed file as it was read). rows: the rows a .cast shows (None:
    all); verbatim: the prompt's own words by position."""
    from dbert_core.sampling import share

    frames = [rec.frame for rec in run.frames]
    order = run.frames[-1].order
    name = Path(db.path).name if db.path else "dbert"
    if suffix == ".cast":
        return share.cast(db, frames, order, width=max(40, min(120, width)), title=f"dbert · {name}",
                          rows=rows, verbatim=verbatim)
    if suffix in (".html", ".htm"):
        return share.html(db, frames, order, title=f"dbert · {name}", verbatim=verbatim)
    if replay is not None and run.source is not None:  # the file as it was read
        return json.dumps(replay.data) + "\n"
    return json.dumps(trajectory(db, run)) + "\n"


EXPORT_TITLE = ("Export the run: .json the trajectory (every frame; dbert-tui --replay plays it), .cast an "
                "asciinema recording, .html the text coloured by reveal order")


def default_name(db, seed: int, ext: str, sample: int | None = None) -> str:
    """output_dir()/<checkpoint>-seed<seed>[-sample<k>].<ext> (one dbert- prefix at most: the
    shipped checkpoints' names carry one already; k: the one sample saved, 1-based), made unique."""
    name = Path(db.path).name if db is not None and db.path else "dbert"
    one = f"-sample{sample}" if sample is not None else ""
    return str(default_output(f"{name if name.startswith('dbert') else 'dbert-' + name}-seed{seed}{one}", ext))


def save_title(frame, rows: list[int] | None = None) -> str:
    """The save dialog's title: which texts (`rows`: one sample of several), that a header line
    with the settings leads them, and what a half-filled run writes, when it is one."""
    n = frame.ids.shape[0]
    left = int(frame.masked.sum() if rows is None else frame.masked[rows].sum())
    what = f"sample {rows[0] + 1} of {n}" if rows is not None and len(rows) == 1 else "the text(s), one per line"
    if not left:
        return f"Save {what}, after a header line with the seed and settings"
    total = frame.masked.numel() if rows is None else len(rows) * frame.ids.shape[1]
    return (f"The run is at step {frame.step}/{frame.steps}: {left} of {total} tokens are still masked "
            f"and are written as \\[MASK]. Save {what} so far?")


def _write(where: str, text, done: str) -> tuple[bool, str]:
    """text() written atomically to the file `where` names: (True, `done` and the path) or (False, why not)."""
    from dbert_core.errors import DbertError

    target = output_path(where)
    try:
        path = atomic_write(target, text())
    except (OSError, DbertError) as e:  # atomic_write_text: DbertError "cannot write ..."
        return False, str(e) if isinstance(e, DbertError) else f"cannot write {target}: {e.strerror or e}"
    return True, f"{done} to {Path(path).resolve()}"


HEADER = "# dbert-tui: "  # a saved .txt's first line: this, then the run's settings as one JSON object


def settings_header(db, settings, rows: list[int] | None, n: int) -> str:
    """The first line of a saved .txt: HEADER and a JSON object with the checkpoint, the seed,
    the sampling settings and which samples of the run the file holds (1-based, of `n`)."""
    name = Path(db.path).name if db is not None and db.path else None
    fields = {"checkpoint": name, "seed": settings.seed, "steps": settings.steps,
              "temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p,
              "sampler": settings.sampler, "params": settings.params, "cache_refresh": settings.cache_refresh,
              "cache_masked": settings.cache_masked, "length": settings.length, "min_length": settings.min_length,
              "prompt": settings.prompt or None, "samples": [r + 1 for r in (rows if rows is not None else range(n))],
              "of": n}
    return HEADER + json.dumps({k: v for k, v in fields.items() if v is not None}) + "\n"


def save_texts(where: str, db, rec: Recorded, settings=None, rows: list[int] | None = None) -> tuple[bool, str]:
    """A frame's texts (`rows` of them; None: all), one per line (a [MASK] left written as such),
    after a header line with the run's `settings` (settings_header) when given: (ok, what to say)."""
    texts = texts_of(db, rec)
    n = len(texts)
    if rows is not None:
        texts = [texts[r] for r in rows]
    left = int(rec.frame.masked.sum() if rows is None else rec.frame.masked[rows].sum())
    what = f" (step {rec.frame.step}/{rec.frame.steps}, {left} [MASK] left)" if left else ""
    head = settings_header(db, settings, rows, n) if settings is not None else ""
    which = f"sample {rows[0] + 1} of {n}" if rows is not None and len(rows) == 1 else f"{len(texts)} text(s)"
    return _write(where, lambda: head + "".join(t + "\n" for t in texts), f"saved {which}{what}")


def export_run(where: str, db, run: Run, rows, width: int, verbatim, replay=None) -> tuple[bool, str]:
    """A run exported to the file `where` names, its type by suffix (export_text): (ok, what to say)."""
    suffix = output_path(where).suffix.lower()
    return _write(where, lambda: export_text(db, run, suffix, rows, width, verbatim, replay),
                  f"exported {len(run.frames)} frames")


def output_dir() -> Path:
    """Where saved texts and exported trajectories go by default: $DBERT_HOME/outputs (beside
    the store; docs/tui.md says so)."""
    from dbert_core.storage.store import home

    return home() / "outputs"


def output_path(typed: str) -> Path:
    """The file a typed name means: a bare file name lands in output_dir(), anything with a
    folder in it (or ~) is taken as given, relative to the launch directory."""
    p = Path(typed).expanduser()
    return output_dir() / p if p.parent == Path(".") and not typed.startswith(".") else p


def default_output(stem: str, ext: str) -> Path:
    """output_dir()/stem.ext, or stem-2.ext, stem-3.ext ... when that file exists already."""
    folder = output_dir()
    path, k = folder / f"{stem}.{ext}", 2
    while path.exists():
        path, k = folder / f"{stem}-{k}.{ext}", k + 1
    return path


def state_file() -> Path:
    from dbert_core.disk.layout import TUI_STATE
    from dbert_core.storage.store import home

    return home() / TUI_STATE


LOG_MOST = 1 << 20  # bytes the error log may reach before it starts anew


def log_error(where: str, error: BaseException) -> Path | None:
    """An unexpected error's traceback appended to $DBERT_HOME/tui-errors.log (started anew past
    LOG_MOST), for a bug report; its path, or None when it could not be written (never an error).
    Only a regular file is written, never through a link nor into a FIFO (which would block)."""
    import os
    import stat
    import time
    import traceback

    from dbert_core.disk.layout import TUI_ERRORS
    from dbert_core.storage.store import home

    path = home() / TUI_ERRORS
    entry = (f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {where}\n"
             + "".join(traceback.format_exception(type(error), error, error.__traceback__)))
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None
            if info.st_size > LOG_MOST:
                f.truncate(0)
            f.write(entry)
    except OSError:
        return None
    return path


def read_state() -> dict:
    """tui.json, or {} when it is missing or unusable: a FIFO, /dev/zero, a huge or deeply
    nested file is never read through (dbert_core.disk.jsonfile), it is simply a fresh start."""
    from dbert_core.errors import DbertError
    from dbert_core.disk.jsonfile import read_json

    try:
        data = read_json(state_file(), max_bytes=1 << 20)
        return data if isinstance(data, dict) else {}
    except (OSError, DbertError):
        return {}


def remember(**values) -> None:
    """Merge values into the app's small state file (last checkpoint used), atomically."""
    data = read_state()
    data.update(values)
    from dbert_core.errors import DbertError

    try:
        atomic_write(state_file(), json.dumps(data, indent=2) + "\n")
    except (OSError, DbertError):
        pass  # remembering is a convenience; never fail the app for it
