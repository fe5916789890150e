"""The entropy panel (`h`): how unsure the model was of the tokens each reverse step revealed.

For a frame, the mean over the positions revealed at its step (every sample of the run) of the
entropy in nats of p', the law the token was drawn from (the model's, shaped by temperature,
top-k and top-p), read from the frame's recorded candidates (`top_probs`, the k = runs.TOPK most
likely ids). Only the top-k's terms are summed, not renormalised: -sum_i p_i log p_i over the k
is a lower bound of the entropy of p' (every term left out is >= 0) and equals it where the k hold
all of p' (top-k <= k, or a model sure of its token). Renormalised it would be the entropy of
another law (p' given the top-k), at most log k whatever the model's doubt, neither above nor
below the real one.

`EntropyPanel` plots the value over the steps recorded up to the frame the screen draws, with
that frame's value as a number; scrubbed back, paused or replayed, it follows that frame.
"""

from __future__ import annotations

from rich.text import Text

from ...runs import TOPK, Recorded
from ..chart import Chart

TITLE = f"entropy of p', top-{TOPK} (nats)"  # its top-k terms, not renormalised (the module's docstring)


def reveal_entropy(frame) -> float | None:
    """The mean over the positions `frame` revealed of -sum p log p over their recorded top-k
    candidates (a missing candidate, nan, adds nothing); None where it revealed none or recorded
    no candidates."""
    import torch

    if frame.top_probs is None or not bool(frame.revealed.any()):
        return None
    p = frame.top_probs[frame.revealed].double().nan_to_num(0.0)  # (K, k)
    return float(-torch.special.xlogy(p, p).sum(-1).mean())


class EntropyPanel(Chart):
    """The chart of reveal_entropy over a run's frames up to the one drawn; each frame's value is
    computed once (a run's frames are only ever appended)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(TITLE, style="magenta", **kwargs)
        self.display = False  # hidden until `h`
        self._frames: list[Recorded] | None = None
        self._values: list[float | None] = []
        self.now: tuple[int, int, float | None] | None = None  # (step, steps, value) of the frame drawn

    def toggle(self) -> bool:
        """Show or hide the panel; True when it is shown now."""
        self.display = not self.display
        return self.display

    def show(self, frames: list[Recorded], index: int | None) -> None:
        """Plot the run `frames` up to frames[index] (None: nothing drawn yet)."""
        if frames is not self._frames:
            self._frames, self._values = frames, []
        if index is None or not frames:
            self.now, self.points = None, ()
            return
        index = min(index, len(frames) - 1)
        self._values.extend(reveal_entropy(rec.frame) for rec in frames[len(self._values):index + 1])
        shown = frames[:index + 1]
        self.points = tuple((rec.frame.step, v) for rec, v in zip(shown, self._values) if v is not None)
        f = frames[index].frame
        self.now = (f.step, f.steps, self._values[index])
        self.refresh()

    def headline(self) -> Text:
        """'title · step s/S: V · min A · max B', V in nats (tests read this)."""
        text = Text(self.title, style="bold")
        if self.now is None:
            return text
        step, steps, value = self.now
        text.append(f" · step {step}/{steps}: " + ("no reveal" if value is None else f"{value:.3f}"))
        if self.points:
            values = [v for _, v in self.points]
            text.append(f" · min {min(values):.3f} · max {max(values):.3f}", style="dim")
        return text
