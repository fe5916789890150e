"""The one place worker failures are handled.

Workers run with exit_on_error=False, so an exception in one (a bad checkpoint, out of memory,
a failed or cancelled download, a bad training setting) never crashes the app: it reaches
`on_worker_state_changed`, which screens share through this mixin and the app defines too,
and `DbertApp.report_worker` turns it into one readable notification.
"""

from __future__ import annotations

from textual.worker import Worker


class ReportWorkerErrors:
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.report_worker(event.worker, event.state)


def one_line(error: BaseException) -> str:
    """A user-facing single line for an exception."""
    from dbert_core.errors import DbertError

    from dbert_core.display import safe_text

    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = safe_text(text, 500)  # messages quote checkpoint fields, file names and URLs
    if isinstance(error, DbertError):
        return text
    name = type(error).__name__
    if "OutOfMemory" in name or "out of memory" in text.lower():
        return f"out of memory: {text[:160]}"
    return f"{name}: {text[:200]}" if text else name
