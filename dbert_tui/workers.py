"""The one place worker failures are handled.

Workers run with exit_on_error=False, so an exception in one (a bad checkpoint, out of memory,
a failed or cancelled download, a bad training setting, a bug) never crashes the app: it reaches
`on_worker_state_changed`, which screens (and the Generate screen's player, whose workers they
are) share through this mixin and the app defines too, and `DbertApp.report_worker` turns it into
one readable notification: `one_line`, a sentence for a person, never a library's raw message nor
one cut mid-word; an unexpected error's traceback goes to $DBERT_HOME/tui-errors.log (files.log_error).
"""

from __future__ import annotations

from textual.worker import Worker

MOST = 200  # characters of a notification's line


class ReportWorkerErrors:
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.report_worker(event.worker, event.state)  # type: ignore[attr-defined]  # a screen's: DbertApp's


def clip(text: str, most: int = MOST) -> str:
    """text in at most `most` characters, cut after a whole word (and marked …) when longer."""
    if len(text) <= most:
        return text
    cut = text[:most - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > most // 2 else cut).rstrip(" ,;:") + "…"


def one_line(error: BaseException, log=None) -> str:
    """A user-facing single line for an exception: dbert's own errors say what to do already; a
    file system error says which file; running out of memory says so; anything else is an
    internal error, named by its type, with where its traceback went (`log`, if anywhere)."""
    from dbert_core.display import safe_text
    from dbert_core.errors import DbertError
    from dbert_core.hardware import is_out_of_memory

    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = safe_text(text, None)  # messages quote checkpoint fields, file names and URLs
    if isinstance(error, DbertError):
        return clip(text)
    if is_out_of_memory(error):
        return "out of memory: try fewer samples, a shorter length or a smaller batch"
    if isinstance(error, OSError) and error.strerror:
        where = f" ({safe_text(str(error.filename), 80)})" if error.filename else ""
        return clip(f"{error.strerror}{where}")
    where = f"; the traceback is in {safe_text(str(log), 120)}" if log else ""  # a path is never cut at a word
    return f"an internal error ({safe_text(type(error).__name__, 40)}), please report it{where}"
