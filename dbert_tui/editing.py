"""The token inspector and editing by remasking, without Textual.

- `Draft`: one sample being edited: its token ids (the shown frame's, then remasked, with slots
  inserted or deleted), the positions locked against remasking, where each position came
  from (so the shown frame's confidence, reveal step and candidates stay with their token, and
  a prompt's words stay as typed: `verbatim()`), the cursor and the selection. `recorded()` is the draft as a one-row frame to draw and to
  inspect; `template()` the ids the refill fills in: every [MASK] of the draft, conditioned
  on everything else (the sampler with a template, as `--prompt`).
- `Versions`: every text a refill made, in order, with undo and redo: a version is a run and
  the row of it chosen (a branch draws several refills and one is picked).

The Generate screen's editor (widgets/generate/editor.py) turns keys and mouse events into these calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .runs import Recorded, Run


@dataclass
class Draft:
    base: Recorded                 # the frame the draft started from
    row: int                       # its row
    mask_id: int
    ids: list[int]
    origin: list[int]              # per position: its position in base, -1 for an inserted slot
    locked: set[int] = field(default_factory=set)
    selected: set[int] = field(default_factory=set)
    cursor: int = 0
    anchor: int | None = None      # where a shift-selection started
    edited: bool = False           # something was remasked, inserted or deleted
    words: dict[int, str] = field(default_factory=dict)  # the prompt's words as typed, by base position

    @classmethod
    def of(cls, rec: Recorded, row: int, mask_id: int, locked: set[int] | None = None,
           words: dict[int, str] | None = None) -> "Draft":
        """The draft of row `row` of rec; words: the prompt's own words by rec's positions (drawn as typed)."""
        ids = [int(i) for i in rec.frame.ids[row]]
        return cls(rec, row, mask_id, ids, list(range(len(ids))), set(locked or ()), words=dict(words or {}))

    # ------------------------------------------------------------------ cursor and selection
    def move(self, delta: int, positions: list[int], extend: bool = False) -> None:
        """Move the cursor by delta among the drawn positions (a dropped [SEP] or [PAD] is not
        one); extend: shift-arrows, the selection runs from where it started to the cursor."""
        if not positions:
            return
        here = positions.index(self.cursor) if self.cursor in positions else 0
        target = positions[max(0, min(len(positions) - 1, here + delta))]
        if extend:
            if self.anchor is None:
                self.anchor = self.cursor
            self.select_range(self.anchor, target, positions)
        else:
            self.anchor = None
        self.cursor = target

    def select_range(self, a: int, b: int, positions: list[int]) -> None:
        lo, hi = min(a, b), max(a, b)
        self.selected = {p for p in positions if lo <= p <= hi}

    def toggle_select(self) -> None:
        self.selected ^= {self.cursor}

    def targets(self) -> list[int]:
        """What an edit applies to: the selection, else the token under the cursor."""
        return sorted(self.selected) if self.selected else [self.cursor]

    # ------------------------------------------------------------------ edits
    def remask(self) -> int:
        """Mask the targets again (locked ones stay); returns how many were masked."""
        done = 0
        for p in self.targets():
            if p not in self.locked and 0 <= p < len(self.ids) and self.ids[p] != self.mask_id:
                self.ids[p] = self.mask_id
                done += 1
        self.selected = set()
        self.anchor = None
        self.edited = self.edited or done > 0
        return done

    def toggle_lock(self) -> bool:
        """Lock the targets (or unlock them, when all are locked already); True when now locked."""
        targets = set(self.targets())
        if targets <= self.locked:
            self.locked -= targets
            return False
        self.locked |= targets
        self.selected = set()
        return True

    def _shift(self, at: int, by: int) -> None:
        self.locked = {p + by if p >= at else p for p in self.locked if not (by < 0 and p == at)}
        self.selected = set()
        self.anchor = None

    def insert(self, max_length: int) -> bool:
        """A masked slot before the cursor (False at the model's maximum length)."""
        if len(self.ids) >= max_length:
            return False
        at = self.cursor
        self._shift(at, 1)
        self.ids.insert(at, self.mask_id)
        self.origin.insert(at, -1)
        self.edited = True
        return True

    def delete(self) -> bool:
        """Delete the masked slot under the cursor (False if it is a token, or the last one)."""
        at = self.cursor
        if len(self.ids) <= 1 or self.ids[at] != self.mask_id:
            return False
        self.ids.pop(at)
        self.origin.pop(at)
        self._shift(at, -1)
        self.cursor = min(at, len(self.ids) - 1)
        self.edited = True
        return True

    @property
    def masked(self) -> int:
        return sum(i == self.mask_id for i in self.ids)

    def verbatim(self) -> dict[int, str] | None:
        """The prompt's words by the draft's positions, as typed: each one its token still holds
        (a remasked one is gone, a slot inserted before it moves it on); None when there are none."""
        kept = {i: self.words[o] for i, o in enumerate(self.origin)
                if o in self.words and self.ids[i] != self.mask_id}
        return kept or None

    # ------------------------------------------------------------------ as a frame
    def template(self):
        import torch

        return torch.tensor(self.ids, dtype=torch.long)

    def recorded(self) -> Recorded:
        """The draft as a one-row Recorded: tokens kept from the base keep its confidence,
        reveal step and candidates; masked and inserted slots have none."""
        import torch

        f = self.base.frame
        L = len(self.ids)
        src = torch.tensor(self.origin, dtype=torch.long)
        keep = src >= 0
        ids = torch.tensor(self.ids, dtype=f.ids.dtype).unsqueeze(0)
        masked = ids == self.mask_id
        conf = torch.full((1, L), float("nan"), dtype=f.confidence.dtype)
        order = torch.zeros((1, L), dtype=torch.int32)
        conf[0, keep] = f.confidence[self.row, src[keep]]
        order[0, keep] = self.base.order[self.row, src[keep]].to(torch.int32)
        conf[masked] = float("nan")
        order[masked] = 0
        top_ids = top_probs = None
        if f.top_ids is not None and f.top_probs is not None:  # a frame has both or neither
            k = f.top_ids.shape[-1]
            top_ids = torch.full((1, L, k), -1, dtype=f.top_ids.dtype)
            top_probs = torch.full((1, L, k), float("nan"), dtype=f.top_probs.dtype)
            top_ids[0, keep] = f.top_ids[self.row, src[keep]]
            top_probs[0, keep] = f.top_probs[self.row, src[keep]]
            top_ids[masked] = -1
        frame = replace(f, ids=ids, masked=masked, revealed=torch.zeros_like(masked), confidence=conf,
                        row_steps=None, remasked=None, top_ids=top_ids, top_probs=top_probs)
        return Recorded(frame, order, self.base.seconds)


@dataclass
class Version:
    run: Run
    row: int

    def final(self) -> Recorded:
        return self.run.frames[-1]


class Versions:
    """Texts made by refills, with undo/redo. index is the version shown."""

    def __init__(self) -> None:
        self.items: list[Version] = []
        self.index = -1

    def __len__(self) -> int:
        return len(self.items)

    def add(self, version: Version) -> None:
        """A new version after the one shown (the versions after it, undone ones, are dropped)."""
        self.items = self.items[:self.index + 1] + [version]
        self.index = len(self.items) - 1

    def current(self) -> Version | None:
        return self.items[self.index] if self.items else None

    def undo(self) -> Version | None:
        if self.index <= 0:
            return None
        self.index -= 1
        return self.items[self.index]

    def redo(self) -> Version | None:
        if self.index >= len(self.items) - 1:
            return None
        self.index += 1
        return self.items[self.index]

    def label(self) -> str:
        return f"version {self.index + 1}/{len(self.items)}" if self.items else ""
