"""Messages workers post to the UI (thread-safe `post_message` is all a worker may do).

Fast producers use toolong's trick: a message whose `can_replace` is True for the next one of
its kind, so a burst of frames (or download chunks, or training steps) collapses into the
newest and the UI never floods. Nothing is lost by that: the sampling worker records every
frame in its Run and the training callback keeps every loss; the message only says "redraw".
"""

from __future__ import annotations

from pathlib import Path

from textual.message import Message


class FrameReady(Message, bubble=False):
    """Frame `index` of run `run_id` is recorded."""

    def __init__(self, run_id: int, index: int) -> None:
        super().__init__()
        self.run_id = run_id
        self.index = index

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FrameReady) and message.run_id == self.run_id


class RunFinished(Message):
    """The sampling worker of run `run_id` produced its last frame."""

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id


class CheckpointLoaded(Message):
    def __init__(self, db, path: Path) -> None:
        super().__init__()
        self.db = db
        self.path = path


class FetchProgress(Message):
    def __init__(self, done: int, total: int | None, what: str) -> None:
        super().__init__()
        self.done = done
        self.total = total
        self.what = what

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FetchProgress)


class StoreChanged(Message):
    """A fetch/import/train finished: `path` is the new (or updated) store entry."""

    def __init__(self, path: Path, verb: str) -> None:
        super().__init__()
        self.path = path
        self.verb = verb


class TrainProgress(Message):
    """New training metrics are in the screen's history (steps coalesce)."""

    def __init__(self, metrics: dict) -> None:
        super().__init__()
        self.metrics = metrics

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TrainProgress)


class TrainEval(Message):
    def __init__(self, metrics: dict) -> None:
        super().__init__()
        self.metrics = metrics


class TrainPreview(Message):
    def __init__(self, step: int, text: str) -> None:
        super().__init__()
        self.step = step
        self.text = text


class TrainFinished(Message):
    def __init__(self, path: Path, step: int, stopped: bool) -> None:
        super().__init__()
        self.path = path
        self.step = step
        self.stopped = stopped
