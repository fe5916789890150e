"""Token pieces -> the text a reader sees, defined once (torch-free).

`dbert sample` (through `DBert.decode`), `generate()` and the TUI's token views all lay text
out here:

- a WordPiece continuation (`##ing`) joins the piece before it: `play ##ing` -> `playing`;
- no space before closing punctuation (`. , ! ? ; : ) ] } %`) or after an opening bracket;
- contractions close up: `it ' s` -> `it's`, `didn ' t` -> `didn't`; a plural possessive
  keeps its apostrophe (`dogs ' bone` -> `dogs' bone`);
- curly quotes (a few TinyStories files have them, so a model can write one) are read and
  printed as `"` and `'`, so one story does not mix `"` and `”`, the quote pairing sees them all and
  `couldn ’ t` closes up as `couldn't`;
- a double quote opens or closes by where it stands (`_quote_roles`): at a paragraph's start
  or after an opening bracket it opens, at its end or before . , ! ? it closes, after a comma
  or a sentence end and before a speech tag (`, " she said`) it closes; where its neighbours do
  not tell, it is the other of the quote before it (a sample that starts inside a quotation
  is read from the first quote whose place is clear). An opening quote attaches to the next
  word, a closing one to the previous;
- `.`, `:` or `/` between two numbers joins them (`3 . 5` -> `3.5`, `10 : 30` -> `10:30`), and
  so does `,` before three digits (`1 , 000` -> `1,000`, but `3, 2, 1` stays a list); a hyphen
  or dash between two words joins them (`well - known` -> `well-known`: in the story corpora
  compounds outnumber spaced dashes);
- [SEP] ends a paragraph or story (the caller says what a break is: a newline on screen,
  STORY_BREAK on a one-line output); [CLS], [PAD] and [UNK] vanish;
- cased=True writes words as the training text did (truecase.py: "Lily", "I", a capital at
  every sentence start, after [SEP] and inside an opening quote); `verbatim` gives positions
  whose text is the user's own (a prompt's words, case and accents as typed; a prompt's quote
  opens or closes as it did in the prompt).
- a masked position is a placeholder of fixed width (`░░░`), whatever token will land there.

`spans` says where each token goes, so a view can colour every token on its own;
`detokenize` joins the spans into a string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .truecase import cased as _cased_word, compound

MASK_GLYPH = "░░░"
STORY_BREAK = " ¶ "                          # a [SEP] in one-line output (`dbert sample`)
_CLOSE = frozenset(".,!?;:)]}%…")           # attach to what precedes them
_OPEN = frozenset("([{")                     # what follows attaches to them
_ENDS = frozenset(".!?…")                    # a sentence ends: the next word takes a capital
_JOIN = frozenset({"-", "—", "–"})           # word - word -> word-word
_NUMBER_JOINERS = frozenset(".:/")           # 3 . 5, 10 : 30, 1 / 2
_CONTRACTIONS = frozenset({"s", "t", "m", "d", "re", "ve", "ll"})
_SPEECH_VERBS = frozenset({"said", "says", "asked", "replied", "shouted", "cried", "whispered", "yelled", "called",
                           "exclaimed", "answered", "added", "thought", "laughed", "explained", "told", "screamed",
                           "sang", "begged", "giggled", "agreed", "announced", "wondered", "suggested", "continued"})
_SPEECH_TAGS = _SPEECH_VERBS | {"she", "he", "they", "mom", "dad", "mommy", "daddy", "mum", "the", "his", "her"}
_NAMING = frozenset({"named"})     # "a dog named tucker": the next word is a name
# never a name, whatever follows "named" ("a boy named a timmy" must not write "A" everywhere after)
_NOT_NAMES = frozenset({"a", "an", "the", "his", "her", "my", "your", "our", "their", "its", "this", "that",
                        "him", "me", "us", "them", "it", "and", "or", "but", "so", "to", "of", "in", "on",
                        "at", "for", "with", "by", "as", "was", "is", "be", "after", "because", "he", "she",
                        "they", "we", "you", "i", "not", "no", "very", "too", "one", "two", "all"})
# curly quotes read as the straight ones: the model writes "couldn ’ t" where TinyStories had a curly
# apostrophe, and it prints "couldn't" as the straight one does
_PLAIN_QUOTES = {"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"}


def _plain(pieces: Sequence[str]) -> list[str]:
    return [_PLAIN_QUOTES.get(p, p) for p in pieces]


@dataclass(frozen=True)
class Span:
    """One token laid out: `gap` goes before `text`; `index` is the token's position."""

    index: int
    gap: str        # "", " " or the paragraph break
    text: str
    masked: bool = False


def _ends_word(text: str) -> bool:
    return bool(text) and text[-1].isalnum()


def _word(pieces: Sequence[str], i: int, step: int) -> str:
    """The whole word whose piece at i ends (step -1) or starts (step 1) there."""
    if not 0 <= i < len(pieces):
        return ""
    if step < 0:
        j = i
        while j > 0 and pieces[j].startswith("##"):
            j -= 1
        i, j = j, i
    else:
        j = i
        while j + 1 < len(pieces) and pieces[j + 1].startswith("##"):
            j += 1
    return "".join(p[2:] if p.startswith("##") else p for p in pieces[i:j + 1])


def _quote_roles(pieces: Sequence[str], hidden: Sequence[bool], sep: str, drop: Sequence[str],
                 fixed: Mapping[int, bool] | None = None) -> dict[int, bool]:
    """{position of each visible double quote: True if it opens}. Decided by its neighbours where
    they tell (see the module docstring), else as the other of the quote before it; fixed: roles
    already decided (a prompt's own quotes, by the prompt's text)."""
    n = len(pieces)

    def neighbour(i: int, step: int) -> str | None:
        """The next shown piece from i in this paragraph ("" for a masked one, None past it)."""
        j = i + step
        while 0 <= j < n:
            if hidden[j]:
                return ""
            if pieces[j] == sep:
                return None
            if pieces[j] not in drop:
                return pieces[j]
            j += step
        return None

    def _back(i: int) -> int:
        """The position of the shown piece before i."""
        j = i - 1
        while j > 0 and pieces[j] in drop:
            j -= 1
        return j

    quotes = [i for i in range(n) if not hidden[i] and pieces[i] in ('"', "`")]
    clear: dict[int, bool | None] = {}
    for i in quotes:
        before, after = neighbour(i, -1), neighbour(i, 1)
        role = None
        if before is None or before in _OPEN:
            role = True
        elif after is None or after in _CLOSE or after in (")", "]"):
            role = False
        elif before in _SPEECH_VERBS or (before == "," and neighbour(_back(i), -1) in _SPEECH_VERBS):
            role = True                                  # said "hi / said, "hi
        elif before in _ENDS or before == ",":
            role = False if after in _SPEECH_TAGS else None   # "hi," she said / "stop!" he cried
        elif _ends_word(before) and after.startswith("##"):
            role = False
        clear[i] = fixed[i] if fixed is not None and i in fixed else role
    known = {i: role for i, role in clear.items() if role is not None}
    roles: dict[int, bool] = {}
    paragraph_start = {i: neighbour(i, -1) is None for i in quotes}
    state: bool | None = None  # is a quotation open?
    for k, i in enumerate(quotes):
        if paragraph_start[i]:
            state = None
        role = clear[i]
        if role is None:
            if state is None:  # the first quote of a paragraph, unclear: read back from the next clear one
                rest = []
                for j in quotes[k + 1:]:  # this paragraph's later quotes
                    if paragraph_start[j]:
                        break
                    rest.append(j)
                at = next((m for m, j in enumerate(rest) if j in known and not paragraph_start[j]), None)
                # quotes alternate: with m unclear ones between, this one is the clear one's role if m is odd
                role = True if at is None else (not known[rest[at]] if at % 2 == 0 else known[rest[at]])
            else:
                role = not state
        roles[i] = role
        state = role
    return roles


def spans(pieces: Sequence[str], masked: Sequence[bool] | None = None, *, sep: str = "[SEP]",
          drop: Sequence[str] = ("[CLS]", "[PAD]", "[UNK]"), mask: str = "[MASK]", paragraph: str = "\n",
          placeholder: str = MASK_GLYPH, cased: bool = False, truecase: dict | None = None,
          verbatim: Mapping[int, str] | None = None) -> list[Span]:
    """The spans of `pieces` (WordPiece tokens; `masked[i]` True where position i is still
    masked, or the piece is `mask`). [SEP]s (`sep`) become one `paragraph` gap before the next
    token; `drop` pieces are left out. cased: words in their written form (truecase.cased with
    `truecase`, or its fallback); verbatim: {position: the text to show there}."""
    pieces = _plain(pieces)
    n = len(pieces)
    hidden = [bool(masked[i]) if masked is not None else False for i in range(n)]
    hidden = [hidden[i] or pieces[i] == mask for i in range(n)]
    given = None
    if verbatim:  # a prompt's own quote opens or closes as it did in the prompt, whatever the model wrote next to it
        typed = _quote_roles(pieces, [hidden[i] or i not in verbatim for i in range(n)], sep, drop)
        given = {i: role for i, role in typed.items() if i in verbatim}
    roles = _quote_roles(pieces, hidden, sep, drop, given)

    def visible(i: int) -> str | None:
        """Piece i as text when it is a revealed, ordinary token (None: masked, special or past the end)."""
        if i >= n or hidden[i] or pieces[i] == sep or pieces[i] in drop:
            return None
        p = pieces[i]
        return p[2:] if p.startswith("##") and len(p) > 2 else p

    out: list[Span] = []
    joined: list[bool] = []  # span continues the word before it (a ## piece)
    starts: set[int] = set()  # spans that begin a story (after a [SEP]), whatever `paragraph` reads as
    broken = False         # a [SEP] since the last span
    glue_next = False      # the last span wants no space after it
    single_open = False
    for i, piece in enumerate(pieces):
        if piece == sep and not hidden[i]:
            broken = bool(out)
            continue
        if piece in drop and not hidden[i] and not (verbatim and i in verbatim):
            continue
        prev = out[-1] if out and not broken else None
        cont = False
        if hidden[i]:
            text, glue = placeholder, False
            gap = "" if prev is not None and glue_next else " "
        else:
            cont = piece.startswith("##") and len(piece) > 2
            text = piece[2:] if cont else piece
            prev_text = None if prev is None or prev.masked else prev.text
            gap, glue, single_open = _spacing(pieces, i, text, cont, prev_text, visible(i + 1), glue_next,
                                              single_open, roles, truecase)
        if prev is None:
            gap = paragraph if broken else ""
            if broken:
                starts.add(len(out))
        if verbatim is not None and i in verbatim:
            text = verbatim[i]
        out.append(Span(i, gap, text, hidden[i]))
        joined.append(cont and prev is not None and not prev.masked and gap == "")
        broken, glue_next = False, glue
    if cased:
        out = _cased(out, joined, roles, starts, truecase, verbatim or {})
    return out


def _spacing(pieces: Sequence[str], i: int, text: str, cont: bool, prev_text: str | None, after: str | None,
             glue_next: bool, single_open: bool, roles: dict[int, bool], truecase: dict | None) -> tuple[str, bool, bool]:
    """How revealed piece i (`text`; cont: a ## piece) meets its neighbours (prev_text: the span
    before it, None when masked or none; after: the next piece's text, visible()): the gap before
    it, whether the next one glues to it (no space after), and whether a single quote is open."""
    glue = False
    if cont or glue_next or text in _CLOSE:
        gap = ""
    else:
        gap = " "
    if text in _OPEN:
        glue = True
    elif i in roles:
        if roles[i]:
            glue = True
        else:
            gap = ""
    elif text == "'":
        if prev_text is not None and _ends_word(prev_text) and after in _CONTRACTIONS:
            gap, glue = "", True                           # it's, didn't, we're
        elif prev_text is not None and prev_text.endswith("s") and not single_open:
            gap = ""                                       # the dogs' bone
        elif single_open:
            gap, single_open = "", False
        else:
            glue, single_open = True, True
    elif text in _JOIN and prev_text is not None and _ends_word(prev_text) and _ends_word(after or "") and (
            text != "-" or compound(_word(pieces, i - 1, -1), _word(pieces, i + 1, 1), truecase)):
        gap, glue = "", True                               # well-known, a word—or two
    elif prev_text is not None and prev_text[-1:].isdigit() and after is not None and after[:1].isdigit() and (
            text in _NUMBER_JOINERS or (text == "," and len(after) == 3 and after.isdigit())):
        gap, glue = "", True                               # 3.5, 10:30, 1,000
    return gap, glue, single_open


def _cased(out: list[Span], joined: list[bool], roles: dict[int, bool], starts: set[int],
           table: dict | None, verbatim: Mapping[int, str]) -> list[Span]:
    """The spans with each word in its written form and a capital at every sentence start
    (starts: the spans that open a story)."""
    result = list(out)
    words = []  # (first span, end span, word)
    k = 0
    while k < len(out):
        end = k + 1
        while end < len(out) and joined[end]:
            end += 1
        words.append((k, end, "".join(x.text for x in out[k:end])))
        k = end
    names = {w for (_, _, before), (k, _, w) in zip(words, words[1:])
             if before in _NAMING and w.isalpha() and w not in _NOT_NAMES and not out[k].masked}
    if names:  # a name in this text is a name wherever it stands in it
        table = {**(table or {}), **{w: w[:1].upper() + w[1:] for w in names if (table or {}).get(w, w) == w}}
    capital = True
    for k, end, word in words:
        s = out[k]
        if k in starts:
            capital = True
        if s.masked:
            capital = False
        elif any(x.index in verbatim for x in out[k:end]):
            capital = word[-1:] in _ENDS
        elif word[:1].isalpha():
            form = _cased_word(word, table, capital)
            if len(form) == len(word) and form != word:
                at = 0
                for j in range(k, end):
                    w = len(out[j].text)
                    result[j] = Span(out[j].index, out[j].gap, form[at:at + w], out[j].masked)
                    at += w
            capital = False
        elif s.index in roles:
            if roles[s.index]:
                capital = True                                   # said, "Hello
            elif k > 0 and out[k - 1].text in ("!", "?", ",") and end < len(out) and \
                    out[end].text.lower() in _SPEECH_TAGS:
                capital = False                                  # "Hi!" said Sue / "Yes," she said
        elif word in _ENDS:
            capital = True
        elif word[:1].isdigit() or word not in _CLOSE:
            capital = False if word[:1].isalnum() else capital
        elif word in (",", ";", ":"):
            capital = False
    return result


def detokenize(pieces: Sequence[str], masked: Sequence[bool] | None = None, **options) -> str:
    """The text of `pieces` as a reader sees it (options: as for `spans`)."""
    return "".join(s.gap + s.text for s in spans(pieces, masked, **options))


def special_names(tokenizer) -> dict:
    """`spans` options naming a tokenizer's own special tokens."""
    return dict(sep=tokenizer.sep_token, drop=(tokenizer.cls_token, tokenizer.pad_token, tokenizer.unk_token),
                mask=tokenizer.mask_token)


def unpaired_quotes(pieces: Sequence[str], *, sep: str = "[SEP]", drop: Sequence[str] = ("[CLS]", "[PAD]", "[UNK]"),
                    mask: str = "[MASK]") -> list[int]:
    """Positions of the double quotes that pair with none, as `spans` lays them out
    (`_quote_roles`): within a paragraph an opening quote closes at the next closing one; a
    closing quote with none open, an opening one before another opening one, and one still open
    at the paragraph's end pair with nothing."""
    pieces = _plain(pieces)
    hidden = [p == mask for p in pieces]
    roles = _quote_roles(pieces, hidden, sep, drop)
    out: list[int] = []
    open_at: int | None = None
    for i, piece in enumerate(pieces):
        if piece == sep:
            if open_at is not None:
                out.append(open_at)
            open_at = None
        elif i in roles:
            if roles[i]:
                if open_at is not None:
                    out.append(open_at)
                open_at = i
            elif open_at is None:
                out.append(i)
            else:
                open_at = None
    if open_at is not None:
        out.append(open_at)
    return sorted(out)
