"""The quote touch-up (quotes.py): unpaired quotes found as the printed text reads them, masked
again and refilled without quotes, inside the run's frames."""

import torch

from dbert_core.text.contractions import join_ids
from dbert_core.text.detok import unpaired_quotes
from dbert_core.text.quotes import quote_ids, unpaired
from dbert_core.sampling.sample import frames, generate


def test_unpaired_quotes_as_the_text_reads_them():
    q = '"'
    assert unpaired_quotes([q, "hi", ",", q, "she", "said", "."]) == []
    assert unpaired_quotes(["she", "said", ",", q, "hi", "."]) == [3]                 # opened, never closed
    assert unpaired_quotes(["hi", "!", q, "she", "said", "."]) == [2]                 # closed, never opened
    assert unpaired_quotes([q, "a", ".", q, "[SEP]", q, "b", "."]) == [5]           # a paragraph closes what it opened
    assert unpaired_quotes([q, "a", "[SEP]", "b", "."]) == [0]                      # a story break ends a quotation
    assert unpaired_quotes([q, "a", ".", q, "b", q, "c", ".", q]) == []             # two quotations
    assert unpaired_quotes([q, "[MASK]", "[MASK]"]) == [0]                          # still open at the end


def test_curly_double_quotes_print_and_pair_as_straight_ones():
    """The card's first story had `friend," yes, please! ” Bob`: a curly quote the model wrote
    (TinyStories has a few) printed as itself and never paired. Now it reads as '"'."""
    from dbert_core.text.detok import detokenize

    left, right = "\u201c", "\u201d"
    pieces = ["he", "said", ",", left, "yes", ",", "please", "!", right, "bob", "smiled", "."]
    assert detokenize(pieces) == 'he said, "yes, please!" bob smiled.'
    assert unpaired_quotes(pieces) == []
    assert unpaired_quotes(["yes", "!", right, "bob", "said", "."]) == [2]   # closed, never opened
    assert unpaired_quotes(["he", "said", ",", '"', "yes", "!", right, "bob"]) == []  # one of each pairs


def test_a_curly_apostrophe_closes_up_as_the_straight_one():
    """100 default stories held `smiled couldn ’ t try`: the model wrote the curly apostrophe some
    TinyStories files have, and it printed with spaces round it. It reads as "'" now."""
    from dbert_core.text.detok import detokenize

    assert detokenize(["he", "couldn", "\u2019", "t", "go", "."]) == "he couldn't go."
    assert detokenize(["it", "\u2019", "s", "the", "dogs", "\u2019", "bone", "."]) == "it's the dogs' bone."
    assert detokenize(["he", "said", "\u2018", "hi", "\u2019", "."]) == "he said 'hi'."


def _frames(db, seed, **kw):
    kw = {"n": 48, "length": 16, "steps": 16, "temperature": 2.0, "top_k": 0, "known_words": False, **kw}
    return list(frames(db, generator=torch.Generator().manual_seed(seed), **kw))


def test_touch_up_refills_stray_quotes_inside_the_run(tiny_db):
    assert quote_ids(tiny_db.tokenizer)  # the tiny vocabulary has quote marks: the test can fail
    raw = _frames(tiny_db, 3, pair_quotes=False)
    fs = _frames(tiny_db, 3)
    free = torch.ones_like(raw[-1].masked)
    before = unpaired(tiny_db, raw[-1].ids, free)
    assert before.any()  # at this temperature the tiny model leaves quotes unpaired
    # the reverse process is the same run up to its end; then the touch-up frames follow
    assert all(torch.equal(a.ids, b.ids) for a, b in zip(raw, fs)) and len(fs) > len(raw)
    assert [f.done for f in fs].count(True) == 1 and fs[-1].done
    touch = fs[len(raw) - 1:]
    assert all(f.step == f.steps for f in touch) and all(f.touch_up for f in touch[:-1])
    assert torch.equal(touch[1].remasked, before) and torch.equal(touch[1].masked, before)
    assert all(b.nfe >= a.nfe for a, b in zip(fs, fs[1:])) and fs[-1].nfe > raw[-1].nfe
    after = unpaired(tiny_db, fs[-1].ids, free)
    assert int(after.sum()) < int(before.sum()) and not fs[-1].masked.any()
    # only the quotes changed, and nothing new is a quote where one was taken away
    changed = fs[-1].ids != raw[-1].ids
    assert not (changed & ~before).any()
    assert not torch.isin(fs[-1].ids[before], torch.tensor(quote_ids(tiny_db.tokenizer))).any()
    # nor a single quote or a lone suffix piece in a quote's place ("'The little girl")
    assert not torch.isin(fs[-1].ids[before], torch.tensor(join_ids(tiny_db.tokenizer))).any()


def test_a_prompts_own_quote_stays(tiny_db):
    texts, _ = generate(tiny_db, n=8, seed=1, length=12, steps=12, temperature=2.0, top_k=0,
                        prompt='she said, "[MASK*4]')
    assert all(t.startswith('She said, "') or t.startswith('she said, "') for t in texts)


def test_generate_prints_the_touched_up_text_and_counts_its_calls(tiny_db):
    kw = {"n": 16, "seed": 4, "length": 16, "steps": 16, "temperature": 2.0, "top_k": 0, "known_words": False}
    a, sa = generate(tiny_db, pair_quotes=False, **kw)
    b, sb = generate(tiny_db, **kw)
    assert a != b and sb["nfe"] > sa["nfe"]
    assert sum(t.count('"') for t in b) < sum(t.count('"') for t in a)


def test_cli_unpaired_quotes_prints_the_models_own(tiny_checkpoint):
    from typer.testing import CliRunner

    from dbert_core.cli import app

    args = ["sample", "--checkpoint", str(tiny_checkpoint), "--n", "16", "--seed", "4", "--length", "16",
            "--steps", "16", "--temperature", "2", "--top-k", "0"]
    raw = CliRunner().invoke(app, args + ["--unpaired-quotes"])
    paired = CliRunner().invoke(app, args)
    assert raw.exit_code == 0 and paired.exit_code == 0
    assert raw.stdout.count('"') > paired.stdout.count('"')


def test_progress_counts_a_batch_once_when_the_touch_up_follows(tiny_db):
    """The last step's frame (nothing masked) and the touch-up's last frame: one batch, counted once."""
    import io

    from dbert_core.cli.progress import SampleProgress

    stream = io.StringIO()
    bar = SampleProgress(48, 48, stream=stream)
    fs = _frames(tiny_db, 3)
    assert sum(not f.masked.any() for f in fs) > 1  # the touch-up ran
    for f in fs:
        bar(f)
    assert bar.done == 48 and bar.nfe == fs[-1].nfe
    assert stream.getvalue().count("\n") == 1


def test_a_prompts_quote_keeps_its_typed_role():
    """A prompt's opening quote stays an opening quote whatever the model writes after it: `she
    said, "` then a comma drawn by the model still prints `she said, "` (the neighbours alone
    would read a quote before a comma as closing)."""
    from dbert_core.text.detok import detokenize

    pieces = ["she", "said", ",", '"', ",", "##ing", "sam", "ran", "."]
    typed = {0: "she", 1: "said", 2: ",", 3: '"'}
    assert detokenize(pieces, verbatim=typed).startswith('she said, "')
    assert detokenize(pieces).startswith('she said,",')  # without the prompt: the neighbours decide
    # a prompt's closing quote closes, and a model's quote after it opens again
    pieces = ['"', "hi", '"', "she", "said", ".", '"', "run", "!", '"']
    typed = {0: '"', 1: "hi", 2: '"'}
    assert detokenize(pieces, verbatim=typed) == '"hi" she said. "run!"'
