"""A trajectory file as something to play back without the model (`dbert-tui --replay FILE`).

`load(path)` reads a "dbert-trajectory/1" file (trajectory.py; written by `dbert sample
--trajectory` and by the TUI's export) into a `Replay`: its frames as sample.Frame objects
(int32 ids, float32 confidence, as the TUI keeps them), the reveal order, the settings, and a
`ReplayModel` that stands in for a loaded checkpoint wherever drawing needs one: a tokenizer that
spells the ids the file carries, the truecasing of its words, the schedule's name, T and
expected curve, each token's masking time. It samples nothing (`sampling` is False).

A file from before the replay fields (no "pieces") still plays, from its final tokens: the word
pieces of the last frame are known ("tokens"), earlier frames show the same tokens or masks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import DbertError
from .trajectory import FORMAT


class _Tokenizer:
    """The part of a Hugging Face tokenizer that drawing and decoding use."""

    def __init__(self, pieces: dict[int, str], special: dict) -> None:
        self.pieces = pieces
        self.sep_token, self.cls_token = special.get("sep", "[SEP]"), special.get("cls", "[CLS]")
        self.pad_token, self.unk_token = special.get("pad", "[PAD]"), special.get("unk", "[UNK]")
        self.mask_token = special.get("mask", "[MASK]")
        self.mask_token_id = next((i for i, p in pieces.items() if p == self.mask_token), -1)

    def convert_ids_to_tokens(self, ids):
        return [self.pieces.get(int(i), self.unk_token) for i in ids]


@dataclass
class _Schedule:
    name: str
    T: int


@dataclass
class _Model:
    mask_id: int
    max_length: int


@dataclass
class ReplayModel:
    """Stands in for checkpoint.DBert in the TUI's drawing: no network, nothing to sample."""

    tokenizer: _Tokenizer
    schedule: _Schedule
    model: _Model
    path: Path
    truecase: dict | None = None
    curve: list[float] | None = None              # expected masked fraction after each step
    masking: dict[int, float] = field(default_factory=dict)
    sampling = False

    def decode(self, ids, *, cased: bool = True, paragraph: str | None = None,
               verbatim: dict[int, str] | None = None) -> str:
        from ..text.detok import STORY_BREAK, detokenize, special_names

        names = special_names(self.tokenizer)
        return detokenize(self.tokenizer.convert_ids_to_tokens([int(i) for i in ids]),
                          paragraph=STORY_BREAK if paragraph is None else paragraph, placeholder=names["mask"],
                          cased=cased, truecase=self.truecase, verbatim=verbatim, **names)

    def masking_time(self, token_id: int) -> float | None:
        return self.masking.get(int(token_id))


@dataclass
class Replay:
    db: ReplayModel
    settings: dict
    frames: list           # sample.Frame, compact (int32 ids, float32 confidence)
    order: torch.Tensor    # (B, L) int32 reveal steps (0: given)
    data: dict             # the file as read


def _tensor(rows, dtype) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype)


def _confidence(rows) -> torch.Tensor:
    return torch.tensor([[math.nan if c is None else c for c in row] for row in rows], dtype=torch.float32)


def load(path) -> Replay:
    """The trajectory at `path` as a Replay; DbertError (one line) for a file that is not one."""
    from ..disk.jsonfile import read_json
    from .sample import Frame

    path = Path(path)
    try:
        data = read_json(path, max_bytes=1 << 30)
    except OSError as e:
        raise DbertError(f"cannot read {path}: {e.strerror or e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DbertError(f"{path} is not a dbert trajectory (format {FORMAT!r})")
    try:
        frames = []
        for fr in data["frames"]:
            ids = _tensor(fr["ids"], torch.int32)
            frames.append(Frame(ids=ids, masked=_tensor(fr["masked"], torch.bool),
                                revealed=_tensor(fr["revealed"], torch.bool), confidence=_confidence(fr["confidence"]),
                                step=int(fr["step"]), steps=int(fr["steps"]), t=int(fr["t"]), nfe=int(fr["nfe"]),
                                remasked=_tensor(fr["remasked"], torch.bool) if "remasked" in fr else None,
                                touch_up=bool(fr.get("touch_up", False))))
        if not frames:
            raise DbertError(f"{path} holds no frames")
        order = _tensor(data["reveal_step"], torch.int32)
        special = data.get("special") or {}
        pieces = {int(k): v for k, v in (data.get("pieces") or {}).items()}
        if not pieces:  # an older file: the last frame's tokens
            for ids_row, tok_row in zip(frames[-1].ids.tolist(), data.get("tokens", [])):
                pieces.update(zip(ids_row, tok_row))
        mask_id = int(data.get("mask_id", -1))
        pieces.setdefault(mask_id, special.get("mask", "[MASK]"))
        top = data.get("top")
        if top:
            ids_t = _tensor(top["ids"], torch.long)
            probs_t = torch.tensor([[[math.nan if p is None else p for p in cell] for cell in row] for row in top["probs"]],
                                   dtype=torch.float32)
            for f in frames:
                f.top_ids, f.top_probs = ids_t, probs_t
        steps = frames[-1].steps
        L = frames[-1].ids.shape[1]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise DbertError(f"{path} is not a readable dbert trajectory ({type(e).__name__}: {e})") from None
    db = ReplayModel(tokenizer=_Tokenizer(pieces, special), schedule=_Schedule(str(data.get("schedule")), int(data.get("T", steps))),
                     model=_Model(mask_id, L), path=path, truecase=data.get("truecase"),
                     curve=data.get("expected_masked"),
                     masking={int(k): float(v) for k, v in (data.get("masking_time") or {}).items()})
    if db.curve is None or len(db.curve) != steps + 1:  # the linear schedule's
        db.curve = [1.0 - k / steps for k in range(steps + 1)]
    return Replay(db, dict(data.get("settings") or {}), frames, order, data)
