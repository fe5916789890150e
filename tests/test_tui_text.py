"""Text as a reader sees it: dbert_core.text.detok (shared by `dbert sample` and the TUI) and the
TUI's coloured token view built on it."""

from __future__ import annotations

import pytest

from dbert_core.text.detok import MASK_GLYPH, STORY_BREAK, detokenize, spans


@pytest.mark.parametrize("pieces, text", [
    (["the", "play", "##ing", "dog", "##s", "ran", "."], "the playing dogs ran."),
    (["it", "'", "s", "fine", ",", "isn", "'", "t", "it", "?"], "it's fine, isn't it?"),
    (["didn", "'", "t", "we", "'", "re", "i", "'", "m", "you", "'", "ll", "she", "'", "d", "they", "'", "ve"],
     "didn't we're i'm you'll she'd they've"),
    (["the", "dogs", "'", "bone", "!"], "the dogs' bone!"),
    (["he", "said", ",", '"', "hi", ",", "tom", "!", '"', "and", "left", "."], 'he said, "hi, tom!" and left.'),
    (["she", "said", "'", "yes", "'", "to", "me"], "she said 'yes' to me"),
    (["a", "(", "small", ")", "cat", ";", "a", "[", "b", "]", "c", ":", "d", "%"], "a (small) cat; a [b] c: d%"),
    (["3", ".", "5", "kg", ",", "10", ":", "30", ",", "1", ",", "000", "and", "3", ",", "2", ",", "1"],
     "3.5 kg, 10:30, 1,000 and 3, 2, 1"),
    (["a", "hard", "lesson", "-", "to", "listen"], "a hard lesson - to listen"),  # a dash as often as a compound
    (["one", "[SEP]", "two", ".", "[SEP]", "[SEP]", "three"], "one\ntwo.\nthree"),
    (["[SEP]", "[CLS]", "one", "[PAD]", "[SEP]"], "one"),
    (["once", "[MASK]", "a", "[MASK]", ".", "[MASK]", "##s"], f"once {MASK_GLYPH} a {MASK_GLYPH}. {MASK_GLYPH}s"),
])
def test_detokenize(pieces, text):
    assert detokenize(pieces) == text


def test_masked_flags_and_paragraph_choice():
    pieces = ["it", "'", "s", "a", "dog", ".", "[SEP]", "the", "end"]
    masked = [False, False, False, True, True, False, False, False, False]
    assert detokenize(pieces, masked) == f"it's {MASK_GLYPH} {MASK_GLYPH}.\nthe end"
    assert detokenize(pieces, paragraph=" ") == "it's a dog. the end"
    assert detokenize(pieces, masked, placeholder="[MASK]", paragraph="\n\n") == "it's [MASK] [MASK].\n\nthe end"
    # one span per shown token, in order, with its own position: a view colours each one apart
    laid = spans(pieces, masked)
    assert [s.index for s in laid] == [0, 1, 2, 3, 4, 5, 7, 8]
    assert [s.masked for s in laid] == [False, False, False, True, True, False, False, False]
    assert [s.gap for s in laid] == ["", "", "", " ", " ", "", "\n", " "]
    # a placeholder has the same width whatever the hidden token is
    assert {len(s.text) for s in laid if s.masked} == {len(MASK_GLYPH)}


def test_dbert_decode_is_the_same_detokenisation(tiny_db):
    tok = tiny_db.tokenizer
    ids = tok.encode("once upon a time, tim's dog didn't play. \"hi!\" said sue.", add_special_tokens=False)
    ids = ids[:8] + [tok.sep_token_id] + ids[8:] + [tok.mask_token_id]
    pieces = tok.convert_ids_to_tokens(ids)
    text = tiny_db.decode(ids, cased=False, paragraph=" ")
    assert "\n" not in text and text == detokenize(pieces, paragraph=" ", placeholder="[MASK]")
    assert "didn't" in text and "tim's" in text and '"hi!" said sue.' in text and text.endswith(" [MASK]")
    assert " ##" not in text and "[SEP]" not in text
    # what `dbert sample` prints: cased by the checkpoint's table, the story start marked
    shown = tiny_db.decode(ids)
    assert shown == detokenize(pieces, paragraph=STORY_BREAK, placeholder="[MASK]", cased=True,
                               truecase=tiny_db.truecase)
    assert shown.startswith("Once upon a time, Tim's") and STORY_BREAK + "Dog didn't" in shown
    assert '"Hi!" said Sue.' in shown


def test_token_view_colours_each_token_and_keeps_words(tiny_db):
    import torch

    from dbert_core.sampling.sample import Frame
    from dbert_tui.runs import Recorded
    from dbert_tui.render import render_row, render_tokens

    tok = tiny_db.tokenizer
    ids = torch.tensor([tok.encode("the dog didn't play. the cat ran", add_special_tokens=False)])
    L = ids.shape[1]
    masked = torch.zeros(1, L, dtype=torch.bool)
    masked[0, -1] = True
    shown = ids.clone()
    shown[masked] = tok.mask_token_id
    order = torch.arange(1, L + 1, dtype=torch.int32).unsqueeze(0)  # each token revealed at its own step
    order[masked] = 0
    frame = Frame(ids=shown, masked=masked, revealed=torch.zeros_like(masked), confidence=torch.full((1, L), 0.5),
                  step=L - 1, steps=L, t=1, nfe=L - 1)
    rec = Recorded(frame, order, 0.0)
    text = render_row(tiny_db, rec, 0)
    assert text.plain == detokenize(tok.convert_ids_to_tokens(shown[0]), masked[0].tolist(), cased=True,
                                    truecase=tiny_db.truecase)
    assert text.plain.startswith("The dog") and ". The cat" in text.plain  # cased as `dbert sample` prints
    assert "didn't" in text.plain and text.plain.endswith(MASK_GLYPH)
    styles = [str(s.style) for s in text.spans]
    assert len(styles) == L and len(set(styles[:-1])) == L - 1  # one colour per reveal step
    assert styles[-1] == "grey42"  # the placeholder
    many = render_tokens(tiny_db, Recorded(Frame(ids=shown.repeat(2, 1), masked=masked.repeat(2, 1),
                                                 revealed=torch.zeros(2, L, dtype=torch.bool),
                                                 confidence=torch.full((2, L), 0.5), step=1, steps=L, t=1, nfe=1),
                                           order.repeat(2, 1), 0.0))
    assert many.plain.count("sample ") == 2 and many.plain.count(MASK_GLYPH) == 2


def test_confidence_colouring_spreads_over_the_run_and_the_legend_gives_numbers(tiny_db):
    """The default model's p' is mostly under 0.2: on a fixed 0..1 scale nearly every token was
    red. The bands are the run's quintiles now, so each of the five colours gets a fifth."""
    import torch

    from dbert_core.sampling.sample import Frame
    from dbert_tui.runs import Recorded
    from dbert_tui.render import confidence_edges, legend, render_row

    tok = tiny_db.tokenizer
    ids = torch.tensor([tok.encode("the dog ran to the park and the cat sat on the mat in the sun", add_special_tokens=False)])
    L = ids.shape[1]
    conf = torch.linspace(0.01, 0.15, L).unsqueeze(0)  # a rarely sure model
    order = torch.arange(1, L + 1, dtype=torch.int32).unsqueeze(0)
    frame = Frame(ids=ids, masked=torch.zeros(1, L, dtype=torch.bool), revealed=torch.zeros(1, L, dtype=torch.bool),
                  confidence=conf, step=L, steps=L, t=0, nfe=L)
    text = render_row(tiny_db, Recorded(frame, order, 0.0), 0, mode="confidence")
    styles = [str(s.style) for s in text.spans]
    counts = {st: styles.count(st) for st in set(styles)}
    assert len(counts) == 5 and max(counts.values()) <= L // 5 + 1, counts  # all five colours, about a fifth each
    edges = confidence_edges(conf)
    assert len(edges) == 4 and 0.01 < edges[0] < edges[-1] < 0.15
    shown = legend("confidence", edges).plain
    labels = [w for w in shown.split() if w[0] in "■<≥"]
    assert f"■<{edges[0]:.2g}" in labels and f"■≥{edges[-1]:.2g}" in labels and len(set(labels)) == 5, shown
    # masked and given tokens (nan) do not count; with too few values the bands are fixed
    assert confidence_edges(torch.tensor([float("nan"), 0.5])) == (0.2, 0.4, 0.6, 0.8)
