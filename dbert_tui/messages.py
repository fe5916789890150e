"""Messages workers and widgets post to the UI, as dataclasses (thread-safe `post_message` is
all a worker may do).

A sampling worker posts every frame it computes in a `FrameReady` to the Generate screen's
player (widgets/generate/player.py), which records it on the UI thread and tells the screen in a
`RunAdvanced`; the screen redraws at most once per burst. Widgets talk to their screen the same
way: a message posted upward (a card clicked, a token pointed at); the screen calls them back. A
dialog that changes the generation Session (the settings and prompt dialogs) posts what was
chosen to the App, which owns the Session and applies it. Other fast producers use toolong's
trick: a message whose `can_replace` is True for the next one of its kind, so a burst of
download chunks or training steps collapses into the newest and the UI never floods; nothing
is lost by that (a training step's message hands its losses on to the one that replaces it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from dbert_core.storage.checkpoint import DBert


@dataclass
class FrameReady(Message, bubble=False):
    """Frame number `index` of run `run_id`, computed by its worker (a runs.Recorded)."""

    run_id: int
    index: int
    rec: object


@dataclass
class RunFinished(Message, bubble=False):
    """The sampling worker of run `run_id` produced its last frame (posted after that frame)."""

    run_id: int


@dataclass
class RunFailed(Message):
    """The sampling worker of run `run_id` (0: the infill being ranked) raised; `text` says it in
    one line (the app's worker report has notified already)."""

    run_id: int
    text: str


@dataclass
class SampleChosen(Message):
    """A sample's card was clicked: show sample `index` large."""

    index: int


@dataclass
class SettingsChosen(Message):
    """The settings dialog (`e`) was applied: the text of its fields by setting name
    (forms.settings_form), checked when it was applied; the App sets them on the side the keys
    change and the Generate screen starts new runs."""

    values: dict


@dataclass
class PromptChosen(Message):
    """The prompt dialog (`p`) was applied: the template for every side ("": unconditional); the
    App checks it against the checkpoint, sets it and the Generate screen starts new runs."""

    prompt: str


@dataclass
class CheckpointLoaded(Message):
    db: DBert
    path: Path


@dataclass
class FetchProgress(Message):
    done: int
    total: int | None
    what: str

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FetchProgress)


@dataclass
class StoreChanged(Message):
    """A fetch/import/train finished: `path` is the new (or updated) store entry."""

    path: Path
    verb: str


@dataclass
class TrainProgress(Message):
    """The latest training metrics and the (step, loss) points since the last message, which the
    screen appends to its history on the UI thread. Steps coalesce: a replaced message's points
    go to the newer one first, so none is lost; a run's first message (`fresh`: the charts start
    anew) is never replaced."""

    metrics: dict
    losses: list = field(default_factory=list)
    fresh: bool = False

    def can_replace(self, message: Message) -> bool:
        if not isinstance(message, TrainProgress) or self.fresh:
            return False
        message.losses[:0] = self.losses  # (UI thread) the newer message carries these points on
        return True


@dataclass
class TrainPrepare(Message):
    """The run's corpus being tokenized into the token cache, or where its entry is: a report of
    token_cache.cached (stage "tokenize": bytes, total, tokens, seconds) or of story_data.entry
    (stage "built" or "cached": tokens, documents, folder). A tokenizing report replaces the one
    before it that the screen has not drawn yet."""

    info: dict

    def can_replace(self, message: Message) -> bool:
        return (isinstance(message, TrainPrepare) and self.info.get("stage") == "tokenize"
                and message.info.get("stage") == "tokenize")


@dataclass
class TrainEval(Message):
    metrics: dict


@dataclass
class TrainPreview(Message):
    step: int
    text: str


@dataclass
class TrainFailed(Message):
    """The training worker ended with an error (before or during the run): `text` says it;
    `notify` is False when the app's worker report already says it (an unexpected error)."""

    text: str
    notify: bool = True


@dataclass
class TrainFinished(Message):
    path: Path
    step: int
    stopped: bool


@dataclass
class TokenPointed(Message):
    """The mouse over the token at `position` of the token view: `press` a button went down on
    it, `drag` it moved there with a button down (a selection), neither: a hover."""

    position: int
    press: bool = False
    drag: bool = False


@dataclass
class InfillReady(Message, bubble=False):
    """An infill prompt's candidates ([MASK*A-B]; dbert_core.sampling.infill), best first, and the frames
    of each length's batch (`keep`), for the run `token` the screen started."""

    token: int
    candidates: list
    keep: dict


@dataclass
class RunAdvanced(Message):
    """The player recorded a frame of run `run_id`, or the run `finished`: the screen draws
    (once per burst of these)."""

    run_id: int
    finished: bool = False


@dataclass
class InfillChosen(Message):
    """The player ranked an infill's candidates: the best one's batch, its recorded `frames` (compact)
    and reveal `order`, the `template` its length made and its `row`; the screen makes it the
    session's run (controller.Session.play_infill) and plays it."""

    frames: list
    order: object
    template: str
    row: int
