"""A stable layout while a text fills in: every token drawn as wide as its final word.

`detok.spans` lays a frame out as a reader sees it, a masked position as the fixed-width
MASK_GLYPH; as the masks turn into words of other widths, the words after them move, and a
word near the end of a line jumps to the next one and back. When the final text is known (a
replay, a finished run scrubbed back, an export), `stable_spans` lays every frame out on the
final frame's spans instead: the final gaps, each masked position as a bar of its final word's
width, each revealed token filled out to it with bars (a token differs from its final one only
where it is masked again later). Every frame then has the same line breaks as the
final text at any width, so nothing moves while the text fills in.
"""

from __future__ import annotations

from .detok import Span

BAR = "░"


def stable_spans(now: list[Span], final: list[Span]) -> list[Span]:
    """The spans of a frame (`now`) on the final frame's layout (`final`, detok.spans of it)."""
    current = {s.index: s for s in now}
    out = []
    for f in final:
        s = current.get(f.index)
        width = len(f.text)
        if s is None or s.masked:
            out.append(Span(f.index, f.gap, BAR * width, masked=True))
        else:
            # a token that will change (remasked later: the quote touch-up, remdm) is filled out with bars, not
            # spaces, which would be places to break the line the final text does not have; a longer one stays whole
            out.append(Span(f.index, f.gap, s.text + BAR * (width - len(s.text)), masked=False))
    return out
