"""Token pieces -> the text a reader sees, defined once (torch-free).

`dbert sample` (through `DBert.decode`), `generate()` and the TUI's token views all lay text
out here:

- a WordPiece continuation (`##ing`) joins the piece before it: `play ##ing` -> `playing`;
- no space before closing punctuation (`. , ! ? ; : ) ] } %`) or after an opening bracket;
- contractions close up: `it ' s` -> `it's`, `didn ' t` -> `didn't`; a plural possessive
  keeps its apostrophe (`dogs ' bone` -> `dogs' bone`); other single quotes and double quotes
  open and close in turn (`said " hi "` -> `said "hi"`);
- `.`, `:` or `/` between two numbers joins them (`3 . 5` -> `3.5`, `10 : 30` -> `10:30`), and
  so does `,` before three digits (`1 , 000` -> `1,000`, but `3, 2, 1` stays a list); a hyphen
  keeps its spaces (`lesson - to` is a dash as often as `well - known` is a compound);
- [SEP] ends a paragraph (the caller says what a break is: a newline on screen, a space on a
  one-line output); [CLS] and [PAD] vanish;
- a masked position is a placeholder of fixed width (`░░░`), whatever token will land there.

`spans` says where each token goes, so a view can colour every token on its own;
`detokenize` joins the spans into a string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

MASK_GLYPH = "░░░"
_CLOSE = frozenset(".,!?;:)]}%…")           # attach to what precedes them
_OPEN = frozenset("([{")                     # what follows attaches to them
_QUOTES = frozenset('"`')                    # open and close in turn
_NUMBER_JOINERS = frozenset(".:/")           # 3 . 5, 10 : 30, 1 / 2
_CONTRACTIONS = frozenset({"s", "t", "m", "d", "re", "ve", "ll"})


@dataclass(frozen=True)
class Span:
    """One token laid out: `gap` goes before `text`; `index` is the token's position."""

    index: int
    gap: str        # "", " " or the paragraph break
    text: str
    masked: bool = False


def _ends_word(text: str) -> bool:
    return bool(text) and text[-1].isalnum()


def spans(pieces: Sequence[str], masked: Sequence[bool] | None = None, *, sep: str = "[SEP]",
          drop: Sequence[str] = ("[CLS]", "[PAD]"), mask: str = "[MASK]", paragraph: str = "\n",
          placeholder: str = MASK_GLYPH) -> list[Span]:
    """The spans of `pieces` (WordPiece tokens; `masked[i]` True where position i is still
    masked, or the piece is `mask`). [SEP]s (`sep`) become one `paragraph` gap before the next
    token; `drop` pieces are left out."""
    n = len(pieces)
    hidden = [bool(masked[i]) if masked is not None else False for i in range(n)]
    hidden = [hidden[i] or pieces[i] == mask for i in range(n)]

    def visible(i: int) -> str | None:
        """Piece i as text when it is a revealed, ordinary token (None: masked, special or past the end)."""
        if i >= n or hidden[i] or pieces[i] == sep or pieces[i] in drop:
            return None
        p = pieces[i]
        return p[2:] if p.startswith("##") and len(p) > 2 else p

    out: list[Span] = []
    broken = False         # a [SEP] since the last span
    glue_next = False      # the last span wants no space after it
    double_open = single_open = False
    for i, piece in enumerate(pieces):
        if piece == sep and not hidden[i]:
            broken = bool(out)
            continue
        if piece in drop and not hidden[i]:
            continue
        prev = out[-1] if out and not broken else None
        if hidden[i]:
            text, glue = placeholder, False
            gap = "" if prev is not None and glue_next else " "
        else:
            cont = piece.startswith("##") and len(piece) > 2
            text = piece[2:] if cont else piece
            after = visible(i + 1)
            prev_text = None if prev is None or prev.masked else prev.text
            glue = False
            if cont or glue_next or text in _CLOSE:
                gap = ""
            else:
                gap = " "
            if text in _OPEN:
                glue = True
            elif text in _QUOTES:
                if double_open:
                    gap = ""
                else:
                    glue = True
                double_open = not double_open
            elif text == "'":
                if prev_text is not None and _ends_word(prev_text) and after in _CONTRACTIONS:
                    gap, glue = "", True                           # it's, didn't, we're
                elif prev_text is not None and prev_text.endswith("s") and not single_open:
                    gap = ""                                       # the dogs' bone
                elif single_open:
                    gap, single_open = "", False
                else:
                    glue, single_open = True, True
            elif prev_text is not None and prev_text[-1:].isdigit() and (after or "")[:1].isdigit() and (
                    text in _NUMBER_JOINERS or (text == "," and len(after) == 3 and after.isdigit())):
                gap, glue = "", True                               # 3.5, 10:30, 1,000
        if prev is None:
            gap = paragraph if broken else ""
        out.append(Span(i, gap, text, hidden[i]))
        broken, glue_next = False, glue
    return out


def detokenize(pieces: Sequence[str], masked: Sequence[bool] | None = None, **options) -> str:
    """The text of `pieces` as a reader sees it (options: as for `spans`)."""
    return "".join(s.gap + s.text for s in spans(pieces, masked, **options))


def special_names(tokenizer) -> dict:
    """`spans` options naming a tokenizer's own special tokens."""
    return dict(sep=tokenizer.sep_token, drop=(tokenizer.cls_token, tokenizer.pad_token), mask=tokenizer.mask_token)
