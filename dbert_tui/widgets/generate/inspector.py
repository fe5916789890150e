"""The token inspector: what the model knew about the token under the cursor (inspect mode).

`TokenInspector` is the panel beside the text on a wide terminal; `InspectorLine` the same in
one line under it on a narrow one. The panel owns the inspected token's facts
(dbert_core.sampling.inspector.token_info: reveal step, p', top candidates, the spindle schedule's
masking time, whose table per checkpoint it keeps) and hands them to the line.
"""

from __future__ import annotations

from textual.widgets import Static

from ...render import inspector_lines


class TokenInspector(Static):
    """The panel: the inspected token in full."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.info: dict | None = None   # the facts last shown
        self._masking = None            # (db, (V,) masking time per token id) for the spindle schedule

    def masking_of(self, db):
        """masking(id) -> the token's mean masking time, for the spindle schedule (else None)."""
        if db is None or db.schedule.name != "spindle":
            return None
        if hasattr(db, "masking_time"):  # a replay: the file's
            return db.masking_time
        if self._masking is None or self._masking[0] is not db:
            import torch

            from dbert_core.sampling.inspector import masking_time

            self._masking = (db, masking_time(db.schedule, torch.arange(len(db.schedule.centered))))
        table = self._masking[1]
        return lambda i: float(table[i]) if 0 <= i < len(table) else None

    def inspect(self, db, draft) -> dict | None:
        """dbert_core.sampling.inspector.token_info of the token under the draft's cursor."""
        from dbert_core.sampling.inspector import token_info

        if draft is None or not draft.ids:
            return None
        rec = draft.recorded()
        tok = db.tokenizer
        info = token_info(rec.frame, rec.order, 0, min(draft.cursor, len(draft.ids) - 1),
                          lambda i: tok.convert_ids_to_tokens([int(i)])[0], self.masking_of(db))
        if info.get("masking_time") is None:
            info.pop("masking_time", None)
        return info

    def show(self, db, draft, steps: int, per_window: int = 0) -> dict | None:
        """The token under the draft's cursor, drawn; returns its facts (for the one-line view).
        per_window: a story's steps per window (its reveal step is told within its window)."""
        self.info = self.inspect(db, draft)
        self.update(inspector_lines(self.info, steps, db.schedule.T, compact=False, per_window=per_window))
        return self.info


class InspectorLine(Static):
    """The inspected token in one line (narrow terminals)."""

    def show(self, info: dict | None, steps: int, T: int | None, per_window: int = 0) -> None:
        self.update(inspector_lines(info, steps, T, compact=True, per_window=per_window))
