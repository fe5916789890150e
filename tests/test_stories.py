"""Whole stories: documents read in every format users bring, whole-story windows with their end,
and a short training run on them."""

from __future__ import annotations

import json

import pytest
import re
import torch

from dbert_core.text.data import (EOT, DocumentStats, Special, Window, collate, read_documents, scored_tokens,
                             story_windows)
from dbert_core.errors import DbertError
from helpers import DATA, TINYSTORIES, cli_words, post_json, train_stories

HEAD = DATA / "tinystories" / "TinyStories-train-head.txt"


def test_the_tinystories_head_file_is_2016_stories():
    docs = read_documents([str(HEAD)])  # auto: the file holds <|endoftext|> lines
    assert len(docs) == 2016
    assert docs[0][0].startswith("One day, a little girl named Lily")
    assert all(EOT not in p for d in docs for p in d)
    stats = DocumentStats.of(docs)
    assert stats.count == 2016 and 140 <= stats.median_words <= 160 and stats.longest_words == 837
    assert stats.warning("eot") is None


def test_every_document_separator(tmp_path):
    blank = tmp_path / "a.txt"
    blank.write_text("One. Two.\nThree.\n\nFour.\n")
    eot = tmp_path / "b.txt"
    eot.write_text(f"First story.\n\nIts second paragraph.\n{EOT}\nSecond story.\n{EOT}\n")
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(json.dumps({"text": "A story.\nIts end."}) + "\n\n" + json.dumps({"text": "B."}) + "\n")
    assert read_documents([str(blank)]) == [["One. Two.", "Three."], ["Four."]]
    assert read_documents([str(eot)]) == [["First story.", "Its second paragraph."], ["Second story."]]
    assert read_documents([str(jsonl)]) == [["A story.", "Its end."], ["B."]]
    assert read_documents([str(blank)], "line") == [["One. Two."], ["Three."], ["Four."]]
    # an <|endoftext|> line always ends a document; blank lines too when asked
    assert read_documents([str(eot)], "blank") == [["First story."], ["Its second paragraph."], ["Second story."]]
    with pytest.raises(DbertError) as e:
        read_documents([str(blank)], "pages")
    assert "--doc-sep" in cli_words(e.value)
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"title": "no text"}\n')
    with pytest.raises(DbertError, match='d.jsonl:1: .*"text"'):
        read_documents([str(bad)])


def test_paragraphs_read_as_stories_are_flagged():
    """train.txt puts blank lines between paragraphs: read as blank-line documents they are too short."""
    stats = DocumentStats.of(read_documents([str(TINYSTORIES)], "blank"))
    warning = stats.warning("blank")
    assert warning is not None and "--doc-sep" in warning and "blank" in warning
    huge = DocumentStats.of([["word " * 200_000]])
    assert "200,000 words" in huge.warning("blank")


def test_story_windows_hold_whole_stories_and_their_end():
    SEP = 3
    short, long_ = list(range(10, 15)), list(range(100, 125))
    w = story_windows([short, long_], seq_len=10, sep_id=SEP, context=4)
    # a story that fits: [SEP] story [SEP] then [SEP] padding; only the opening [SEP] is given
    assert w[0] == [SEP, 10, 11, 12, 13, 14, SEP, SEP, SEP, SEP]
    assert (w[0].context, w[0].scored) == (1, 6)  # 5 tokens and the end mark
    # a longer one: its first 9 tokens, then windows carrying the 4 tokens before them
    assert w[1] == [SEP, *range(100, 109)] and (w[1].context, w[1].scored) == (1, 9)
    assert w[2] == [105, 106, 107, 108, *range(109, 115)] and (w[2].context, w[2].scored) == (4, 6)
    assert w[3] == [111, 112, 113, 114, *range(115, 121)]
    assert w[4] == [117, 118, 119, 120, 121, 122, 123, 124, SEP, SEP] and (w[4].context, w[4].scored) == (4, 5)
    assert all(len(x) == 10 for x in w)
    # every story token is scored exactly once, and each end mark once
    assert scored_tokens(w) == len(short) + len(long_) + 2
    # a story ending exactly at a window's edge gets its end mark in a next window
    edge = story_windows([list(range(20, 29))], seq_len=10, sep_id=SEP, context=4)
    assert edge[-1] == [25, 26, 27, 28, SEP, SEP, SEP, SEP, SEP, SEP] and edge[-1].scored == 1
    with pytest.raises(DbertError, match="story context"):
        story_windows([short], seq_len=10, sep_id=SEP, context=10)


def test_collate_keeps_a_windows_context_out_of_the_noise():
    special = Special(cls=2, sep=3, pad=0, mask=4)
    ids, att, noisable = collate([Window.of([7, 8, 9, 10], context=2, scored=2), [5, 6]], special)
    assert ids[0].tolist() == [2, 7, 8, 9, 10, 3]
    assert noisable[0].tolist() == [False, False, False, True, True, False]
    assert noisable[1].tolist() == [False, True, True, False, False, False]
    assert bool(att.all()) is False and att[1].tolist() == [True, True, True, True, False, False]


@pytest.mark.slow
def test_training_on_stories_reports_their_documents(tmp_path, capsys):
    from dbert_core.config import TrainConfig
    from dbert_core.training.train import Trainer

    stories = tmp_path / "stories.txt"
    docs = read_documents([str(HEAD)])[:60]
    stories.write_text("".join("\n".join(d) + f"\n{EOT}\n" for d in docs))
    cfg = TrainConfig(data=[str(stories)], out=str(tmp_path / "run"), preset="tiny", unit="story", seq_len=48,
                      batch_size=8, max_steps=3, eval_every=3, log_every=1, val_examples=8)
    trainer = Trainer(cfg)
    trainer.prepare()
    assert trainer.prepared.documents[0] == "training data: " + DocumentStats.of(docs).line()
    assert all(len(e) == 48 for e in trainer.train_examples)
    assert any(e.context > 1 for e in trainer.train_examples)  # stories longer than a window continue
    result = trainer.run()
    assert trainer.step == 3 and all(torch.isfinite(torch.tensor(h.get("loss_elbo", 0.0))) for h in trainer.history)
    assert "val_ppl_token" in result or any("val_ppl_token" in h for h in trainer.history)


def test_story_measures_read_real_stories_as_whole():
    from dbert_core.text.data import story_texts
    from dbert_core.evaluation.story_metrics import changed_name, doubled_name, one_story, quartiles, story_report

    real = story_texts(read_documents([str(HEAD)]))[-200:]
    report = story_report(real)
    assert report["frac_one_story"] >= 0.95 and report["frac_doubled_name"] == 0.0
    assert 135 <= report["words_median"] <= 170
    # what the issue saw in samples cut from several stories
    assert not one_story("She was three, old, and she had a toy he had found.")["start"]
    glued = "Tom ran home. He was happy. \u00b6 Once upon a time, there was a boy named Joe."
    assert one_story(glued)["single"] is False
    assert one_story("Tom ran home. Once upon a time, there was a boy named Joe. He sang.")["single"] is False
    assert not one_story("Once upon a time, Tom had a kite. He flew it and")["end"]
    assert one_story('Once upon a time, Tom had a kite. "I love it!" he said. The End')["ok"]
    assert doubled_name("Lily and Lily went to the park.") and not doubled_name("Lily and Tom went to the park.")
    forgot = ("Once upon a time there was a girl named Lily. Lily had a red ball and she loved it very much. " +
              "She played with it every day in the big green park near her house. " * 2 +
              "Then Sue took the ball. Sue ran to the tree. Sue was happy and the ball was hers.")
    kept = forgot.replace("Sue", "Lily")
    assert changed_name(forgot) and not changed_name(kept)
    assert quartiles([1, 2, 3, 4, 5]) == (2.0, 3.0, 4.0)


def test_the_end_rule_makes_the_rest_of_a_row_end_padding():
    from dbert_core.sampling.blocks import end_fill

    E, M = 3, 4
    x = torch.tensor([[E, 10, M, E, M, 12, M], [E, 10, M, M, M, M, M], [E, 11, 12, 13, 14, 15, 16]])
    masked = x == M
    free = masked.clone()
    free[:, 1:] = True  # the opening [SEP] is given
    free[2] = False  # a row that is all given: its [SEP]s are no end
    filled = end_fill(x, masked, free, E)
    assert x[0].tolist() == [E, 10, M, E, E, E, E]  # masks and text after the end become [SEP]
    assert masked[0].tolist() == [False, False, True, False, False, False, False]  # before the end: still open
    assert filled[0].tolist() == [False, False, False, False, True, True, True]
    assert x[1].tolist() == [E, 10, M, M, M, M, M] and not filled[1].any()  # no end yet
    assert not filled[2].any()


@pytest.fixture(scope="module")
def story_model(tmp_path_factory):
    """A tiny model trained for a few steps on whole stories (windows of 24 tokens)."""
    return train_stories(tmp_path_factory.mktemp("story"))


def test_a_story_sample_opens_with_the_start_and_ends_at_its_end(story_model):
    from dbert_core.sampling.blocks import is_story_model, story_of
    from dbert_core.sampling.sample import default_length, frames

    db = story_model
    assert is_story_model(db) and default_length(db) == 23 + 12  # a window after its opening [SEP], and a continuation
    sep = db.tokenizer.sep_token_id
    last = None
    for last in frames(db, n=6, steps=8, seed=1, pair_quotes=False, fix_contractions=False, known_words=False):
        ids = last.ids
        assert (ids[:, 0] == sep).all()  # the given story start
        for row, m in zip(ids, last.masked):  # nothing but end padding after a revealed end
            ends = [i for i in range(1, len(row)) if row[i] == sep and not m[i]]
            if ends:
                assert (row[ends[0]:] == sep).all()
    assert last.done and not last.masked.any()
    texts = [db.decode(story_of(r, sep)) for r in last.ids]
    assert all("\u00b6" not in t and "[SEP]" not in t for t in texts)


def test_long_stories_continue_block_by_block(story_model):
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.blocks import story_of
    from dbert_core.sampling.sample import generate, resolve, story_stream

    db = story_model
    sep = db.tokenizer.sep_token_id
    cfg = resolve(SampleConfig(n=4, steps=8, seed=0, length=60, pair_quotes=False, fix_contractions=False, known_words=False,
                               workers=1), db)  # one batch, as story_stream runs it
    seen = list(story_stream(db, cfg, torch.Generator().manual_seed(0)))
    assert all(f.ids.shape == (4, 61) for f in seen)  # one canvas: the opening [SEP] and 60 tokens
    assert [f.done for f in seen].count(True) == 1 and seen[-1].done and not seen[-1].masked.any()
    assert all(a.step <= b.step and a.nfe <= b.nfe for a, b in zip(seen, seen[1:]))
    for row in seen[-1].ids:
        story = story_of(row, sep)
        assert sep not in story and len(story) <= 60
        assert len(story) == 60 or (row[1 + len(story):] == sep).all()  # at --length, or ended: then padding
    texts, stats = generate(db, cfg)
    assert len(texts) == 4 and stats["nfe"] == seen[-1].nfe
    with pytest.raises(DbertError) as e:
        resolve(SampleConfig(length=10_000), db)
    assert "--length" in cli_words(e.value)


def test_each_continuation_window_carries_the_storys_last_tokens(story_model):
    """Block continuation with a stand-in sampler that writes 100, 101, ... and ends row 1's story
    in its second window: what each window is given, and the canvas the frames show."""
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.blocks import context, story_frames, story_of, story_template, window
    from dbert_core.sampling.sample import Frame, resolve

    db = story_model
    sep, mask = db.tokenizer.sep_token_id, db.model.mask_id
    ctx, L = context(db), window(db)
    windows = []
    counter = iter(range(100, 10_000))

    offsets, prefixes = [], []

    def fake_frames(db, cfg, generator, template, topk, offset, prefix):
        x = template.clone()
        windows.append(template.clone())
        offsets.append(offset)
        prefixes.append(prefix)
        for r in range(x.shape[0]):
            for c in range(x.shape[1]):
                if x[r, c] == mask:
                    x[r, c] = next(counter)
        if len(windows) == 2:  # row 1 of the second window ends its story five tokens in
            x[1, ctx + 5:] = sep
        yield Frame(ids=x, masked=torch.zeros_like(x, dtype=torch.bool), revealed=template == mask,
                    confidence=torch.full(x.shape, 0.5, dtype=torch.float64), step=4, steps=4, t=0, nfe=1,
                    rows=x.shape[0])

    cfg = resolve(SampleConfig(n=2, steps=4, length=60), db)
    shown = list(story_frames(db, cfg, fake_frames, torch.Generator(), story_template(db, None, cfg.length)))
    assert windows[0].shape == (2, L) and (windows[0][:, 0] == sep).all() and (windows[0][:, 1:] == mask).all()
    assert windows[1][0, :ctx].tolist() == shown[0].ids[0, L - ctx:L].tolist()  # the story's last ctx tokens
    assert (windows[1][:, ctx:] == mask).all()
    assert windows[-1].shape[0] == 1  # the ended story left the batch
    assert offsets == [0] + [(L - ctx) * k for k in range(1, len(windows))]  # each window's canvas column
    assert prefixes == [0] + [ctx] * (len(windows) - 1)  # the given context a --prefix-cache may keep
    assert (shown[0].ids[:, L:] == mask).all()  # columns no window has reached yet
    final = shown[-1]
    assert final.done and final.ids.shape == (2, 61) and final.nfe == len(windows)
    stories = [story_of(row, sep) for row in final.ids]
    assert len(stories[0]) == 60 and len(stories[1]) == L - 1 + 5
    assert stories[0][:L - 1] == shown[0].ids[0, 1:L].tolist()  # the first window's text, kept
    assert len(set(stories[0])) == 60  # every token written once: windows join without overlap or gap


def test_eval_scores_whole_stories_and_measures_story_samples(story_model, tmp_path, capsys, monkeypatch):
    from helpers import run

    held = tmp_path / "held.txt"
    docs = read_documents([str(HEAD)])[-6:]
    held.write_text("".join("\n".join(d) + f"\n{EOT}\n" for d in docs))
    code, out, err = run(["eval", "--checkpoint", str(story_model.path), "--data", str(held), "--unit", "story",
                          "--steps", "8", "--samples", "3", "--sample-steps", "4", "--json"], capsys, monkeypatch)
    assert code == 0, err
    result = json.loads(out)
    assert "6 documents, median" in err and result["documents"] == 6
    assert result["examples"] >= 6  # every story, in as many windows as it takes (24 tokens here)
    from dbert_core.text.data import encode_stories

    windows = encode_stories(docs, story_model.tokenizer, 24)
    assert result["tokens"] == scored_tokens(windows) == sum(len(w.scored * [0]) for w in windows)
    for key in ("frac_one_story", "words_median", "frac_doubled_name", "human_frac_one_story", "human_words_median"):
        assert key in result
    assert result["human_frac_one_story"] == 1.0


@pytest.mark.anyio
async def test_the_tui_writes_a_long_story_window_after_window(story_model):
    """dbert-tui on a story model with --length past its window: one canvas, continued live."""
    from dbert_core.text.detok import MASK_GLYPH
    from helpers import SIZE, finished, make_app, wait_for

    app = make_app(story_model, length=50, steps=6, sampler="first-hitting")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="the story to finish")
        await pilot.pause()
        g = app.generate_screen
        frames = [r.frame for r in g.run.frames]
        assert all(f.ids.shape == (1, 51) for f in frames)  # one canvas: [SEP] and 50 tokens
        assert frames[-1].done and [f.done for f in frames].count(True) == 1
        text = g.shown_text()
        assert text and MASK_GLYPH not in text and "\u00b6" not in text


def test_the_prefix_cache_writes_continuation_windows_for_fewer_flops(story_model):
    """--prefix-cache: the first window is sampled exactly as without it (the same draws, the same
    text); continuation windows compute only their new block after the window's first call, so the
    same stories cost fewer FLOPs, and the run is labelled approximate."""
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.blocks import story_of, window
    from dbert_core.sampling.sample import generate, resolve, story_stream

    db = story_model
    sep = db.tokenizer.sep_token_id
    runs = {}
    for cached in (False, True):
        cfg = resolve(SampleConfig(n=4, steps=8, seed=3, length=70, min_length=60, pair_quotes=False,
                                   fix_contractions=False, known_words=False, prefix_cache=cached), db)
        final = list(story_stream(db, cfg, torch.Generator().manual_seed(3)))[-1]
        runs[cached] = ([story_of(r, sep) for r in final.ids], final)
        texts, stats = generate(db, cfg)
        assert len(texts) == 4 and stats["exact"] is (not cached) and stats.get("prefix_cache", False) is cached
    (exact, f_exact), (approx, f_approx) = runs[False], runs[True]
    first = window(db) - 1
    assert [s[:first] for s in approx] == [s[:first] for s in exact]  # window 1 has no prefix: untouched
    assert all(len(s) >= 60 for s in approx)  # the stories go on past the first window
    assert f_approx.flops < 0.9 * f_exact.flops and f_approx.nfe > 0


@pytest.fixture
def eager_end(story_model):
    """The story model with the end ([SEP]) made by far its most likely token everywhere."""
    sep = story_model.tokenizer.sep_token_id

    def push(module, args, out):
        out = out.clone()
        out[..., sep] += 40.0
        return out

    handle = story_model.model.register_forward_hook(push)
    yield story_model
    handle.remove()


def test_min_length_holds_the_end_back_across_windows(eager_end):
    """A model that wants to end at once writes stories of one token; --min-length N makes every
    story at least N tokens, in the first window and in continuation windows, and keeps the end
    rule after it (the story still ends, at the first position it may)."""
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.blocks import FINALS, no_end_columns, story_of, window
    from dbert_core.sampling.sample import generate, resolve, story_stream

    db = eager_end
    sep = db.tokenizer.sep_token_id
    assert no_end_columns(5, 0, 0) is None
    assert no_end_columns(6, 0, 3).tolist() == [False, True, True, True, False, False]  # column 0: the start
    assert no_end_columns(4, 10, 12).tolist() == [True, True, True, False]

    def stories(least, at_sentence=False):
        cfg = resolve(SampleConfig(n=6, steps=8, seed=2, length=70, min_length=least, pair_quotes=False,
                                   fix_contractions=False, known_words=False, end_at_sentence=at_sentence), db)
        final = list(story_stream(db, cfg, torch.Generator().manual_seed(2)))[-1]
        return [story_of(row, sep) for row in final.ids]

    assert max(len(s) for s in stories(0)) <= 2  # the eager model alone ends at once
    short = [len(s) for s in stories(5)]
    assert min(short) >= 5 and max(short) < 70, short  # not before the floor, and still ending
    across = window(db) + 10  # past the first window: the floor holds in a continuation window
    long = [len(s) for s in stories(across)]
    assert min(long) >= across and max(long) < 70, long
    finals = {db.tokenizer.backend_tokenizer.token_to_id(t) for t in FINALS}
    for least in (0, 7):  # the sentence-end rule: the story's last token ends a sentence, never one token alone
        got = stories(least, at_sentence=True)
        assert all(len(s) >= max(least, 2) and s[-1] in finals for s in got), got
    texts, _ = generate(db, SampleConfig(n=3, steps=8, seed=1, length=40, min_length=12))
    assert all(len(t.split()) >= 3 for t in texts)
    with pytest.raises(DbertError) as e:
        resolve(SampleConfig(length=10, min_length=11), db)
    assert re.search("--min-length .* more than --length", cli_words(e.value))


def test_a_checkpoint_recommends_its_shortest_story(story_model, tiny_db):
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.sample import resolve

    db = story_model
    recorded = db.meta.pop("sampling")  # the training run's (story_defaults)
    try:
        assert resolve(SampleConfig(), db).min_length == 0  # it says nothing: the model alone chooses
        db.meta["sampling"] = {"min_length": 9}
        assert resolve(SampleConfig(), db).min_length == 9
        assert resolve(SampleConfig(length=5), db).min_length == 5  # never more than the length asked for
        assert resolve(SampleConfig(min_length=0), db).min_length == 0  # the user's word wins
        db.meta["sampling"] = {"min_length": "9"}
        assert resolve(SampleConfig(), db).min_length == 0  # a hand-edited file's wrong type: ignored
    finally:
        db.meta["sampling"] = recorded
    with pytest.raises(DbertError) as e:
        resolve(SampleConfig(min_length=4), tiny_db)
    assert "--min-length needs a story checkpoint" in cli_words(e.value)
    assert resolve(SampleConfig(), tiny_db).min_length == 0


def test_serve_continues_a_story_to_its_end(story_model):
    from dbert_core.serving.serve import create_app
    from helpers import serving

    app = create_app(story_model, "story", models=[])
    with serving(app) as (url, _):
        code, body = post_json(f"{url}/v1/completions", {"model": "story", "prompt": "Tom had a red kite.",
                                                    "max_tokens": 40, "n": 2, "seed": 3, "dbert": {"steps": 6}})
        assert code == 200, body
        choices = body["choices"]
        assert len(choices) == 2
        for c in choices:
            assert c["finish_reason"] in ("stop", "length") and "\u00b6" not in c["text"] and "[SEP]" not in c["text"]
            assert not c["text"].lstrip().startswith("Tom had a red kite")  # the prompt is not repeated
        # a suffix is the story's last words: the span between is filled, the story ends with the suffix
        code, body = post_json(f"{url}/v1/completions", {"model": "story", "prompt": "Tom had a kite.", "suffix": "The end.",
                                                    "max_tokens": 8, "seed": 1, "dbert": {"steps": 6}})
        assert code == 200, body
        (c,) = body["choices"]
        assert c["finish_reason"] == "length" and c["text"].strip() and "[SEP]" not in c["text"]  # the 8 tokens filled
        code, body = post_json(f"{url}/v1/completions", {"model": "story", "prompt": "Tom", "suffix": "The end.",
                                                    "max_tokens": 40})
        assert code == 400 and body["error"]["param"] == "max_tokens" and "one window" in body["error"]["message"]
        code, body = post_json(f"{url}/v1/completions", {"model": "story", "prompt": "Tom", "min_tokens": 10,
                                                    "max_tokens": 20, "seed": 1, "dbert": {"steps": 6}})
        assert code == 200, body
        code, body = post_json(f"{url}/v1/completions", {"model": "story", "prompt": "Tom had a kite.", "min_tokens": 30,
                                                    "max_tokens": 20})
        assert code == 400 and body["error"]["param"] == "min_tokens"  # the client's own numbers, not the story's
        assert body["error"]["message"] == "min_tokens (30) is more than max_tokens (20): no story could end"


def test_cli_min_length_needs_a_story_model(tiny_checkpoint, capsys, monkeypatch):
    from helpers import run

    code, out, err = run(["sample", "-c", str(tiny_checkpoint), "--n", "1", "--min-length", "5"], capsys, monkeypatch)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--min-length needs a story checkpoint" in err
    code, out, err = run(["sample", "-c", str(tiny_checkpoint), "--n", "1", "--min-length", "-1"], capsys, monkeypatch)
    assert code == 2 and "--min-length" in err and "Traceback" not in err


def test_story_defaults_come_from_the_training_stories():
    from dbert_core.training.story_defaults import recommend

    stories = [[7 if i % 2 else 8] + [5] * (n - 1) for i, n in enumerate(range(1, 201))]
    stories += [[9, 5, 5]]  # one story opens with 9: under the share, not an opening
    got = recommend(stories + [[]])
    assert got["min_length"] == 3  # the 1st percentile of 201 lengths (1..200 and 3)
    assert got["openings"] == [7, 8] and got["from_stories"] == 201 and got["openings_cover"] == round(200 / 201, 4)
    assert recommend([]) == {}


def test_a_run_without_recorded_sampling_gets_it_from_its_training_files(story_model):
    """story_defaults.of_run: what a run records wins; a run from before runs recorded it (the export
    and the card of an older run) gets the same figures from the training files it names."""
    from dbert_core.training.story_defaults import of_run

    meta = dict(story_model.meta)
    assert of_run(meta, story_model.tokenizer) is meta["sampling"]
    older = {k: v for k, v in meta.items() if k != "sampling"}
    assert of_run(older, story_model.tokenizer) == meta["sampling"]


def test_a_story_opens_as_its_training_stories_do(story_model):
    """A training run records its sampling defaults; with a model that pushes one token that opens
    no training story everywhere, the first token is still an opening (and is that token with
    --start-anyhow)."""
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.sample import resolve, story_stream

    db = story_model
    rec = db.meta["sampling"]
    assert rec["min_length"] >= 2 and rec["openings"] and rec["from_stories"] == 40
    odd = next(i for i in range(200, db.model.config.vocab_size)
               if i not in rec["openings"] and i not in db.model.forbidden)

    def push(module, args, out):
        out = out.clone()
        out[..., odd] += 40.0
        return out

    handle = db.model.register_forward_hook(push)
    try:
        def firsts(as_trained):
            cfg = resolve(SampleConfig(n=5, steps=8, seed=4, length=20, min_length=0, start_as_trained=as_trained,
                                       block_repeats=False, pair_quotes=False, fix_contractions=False, known_words=False), db)
            return list(story_stream(db, cfg, torch.Generator().manual_seed(4)))[-1].ids[:, 1].tolist()

        assert all(t in rec["openings"] for t in firsts(True))
        assert firsts(False) == [odd] * 5
    finally:
        handle.remove()


def test_a_story_judge_trains_on_whole_stories_and_scores_sample_files(story_model, tmp_path, capsys, monkeypatch):
    """scripts/studies/ar_baseline.py on a story checkpoint reads its training files as whole stories,
    `[SEP] story [SEP]` cut into windows, trains a GPT-2 of the size asked for (the small story judge),
    and scripts/studies/stories.py --judge scores the held-out stories and sample files under it."""
    import sys

    from dbert_core.evaluation.judge import Judge
    from dbert_core.text.data import encode, story_texts
    from helpers import study_script as script

    ar, db = script("ar_baseline"), story_model
    sep, files = db.tokenizer.sep_token_id, db.meta["train_config"]["data"]
    stories = [s for s in encode(story_texts(read_documents(files)), db.tokenizer) if s]
    rows = ar.windows(db, files, 24)
    assert rows[0] == ([sep, *stories[0], sep])[:25] and all(len(r) <= 25 for r in rows)
    assert sum(len(r) for r in rows) - len(rows) == sum(len(s) + 1 for s in stories)  # each stream, cut, no overlap
    out = tmp_path / "judge"
    assert ar.main(["train", str(db.path), "--out", str(out), "--tokens", "400", "--layers", "2", "--hidden", "32",
                    "--heads", "2", "--seq-len", "32", "--batch", "4", "--lr", "1e-3", "--warmup", "2"]) == 0
    judge = Judge(str(out))
    assert (judge.model.config.n_layer, judge.model.config.n_embd, judge.context) == (2, 32, 33)
    assert judge.start == sep  # every window opens with the story's [SEP]
    samples = tmp_path / "samples.txt"
    samples.write_text("Once upon a time there was a cat. The cat was happy.\nLily saw a dog. The end.\n")
    held = tmp_path / "held.txt"
    held.write_text("".join("\n".join(d) + f"\n{EOT}\n" for d in read_documents([str(HEAD)])[-5:]))
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["stories.py", str(samples), "--heldout", str(held), "--judge", str(out)])
    assert script("stories").main() == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [g["file"] for g in got] == ["held-out stories", str(samples)]
    assert all(1 < g["gen_ppl"] < 2 * len(db.tokenizer) and g["judge_entropy"] > 0 for g in got)


def test_the_ar_baseline_keeps_its_best_held_out_weights(story_model, tmp_path, capsys):
    """--heldout --eval-every: the held-out stories scored every few steps (eval --unit story's exact
    perplexity) into the run's history, and the weights of the lowest kept in <out>.best, which eval
    scores to the same figure; the run itself goes on to its budget."""
    import math

    from helpers import study_script

    ar = study_script("ar_baseline")
    held = tmp_path / "held.txt"
    held.write_text("".join("\n".join(d) + f"\n{EOT}\n" for d in read_documents([str(HEAD)])[-3:]))
    out = tmp_path / "ar"
    assert ar.main(["train", str(story_model.path), "--out", str(out), "--tokens", "1200", "--layers", "1",
                    "--hidden", "32", "--heads", "2", "--seq-len", "32", "--batch", "4", "--lr", "3e-3",
                    "--warmup", "2", "--heldout", str(held), "--eval-every", "2"]) == 0
    state = json.loads((out / "state.json").read_text())
    scored = [h for h in state["history"] if "heldout_ppl" in h]
    assert [h["step"] for h in scored] == list(range(2, state["steps"] + 1, 2)) and len(scored) >= 3
    best = min(scored, key=lambda h: h["heldout_ppl"])
    assert state["best"]["step"] == best["step"] and state["step"] == state["steps"]
    kept = out.with_name("ar.best")
    assert (kept / "state.json").is_file() and not (kept / "optimizer.pt").exists()
    assert json.loads((kept / "state.json").read_text())["step"] == best["step"]
    capsys.readouterr()
    assert ar.main(["eval", str(kept), "--heldout", str(held), "--unit", "story"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert math.isclose(again["ppl_token"], best["heldout_ppl"], rel_tol=1e-3)


def test_the_ar_baseline_draws_past_its_window_from_the_cache(story_model):
    """A GPT-2 story longer than its window goes on from its last half window, read once, and then
    from the cache: a handful of re-reads, not one per token past the first window (which cost a
    half-window forward per token), and no position past the model's."""
    from helpers import study_script

    from dbert_core.storage import checkpoint

    ar = study_script("ar_baseline")
    db = checkpoint.load(story_model.path)
    model = ar.build(db, 8, layers=1, hidden=32, heads=2).eval()  # 9 positions
    reads = []
    forward = model.forward

    def counted(*args, **kwargs):
        reads.append(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    model.forward = counted
    rows = ar.draw(model, db.tokenizer.sep_token_id, 3, 40, 1.0, 0, 0, forbidden=ar._never_drawn(db.tokenizer))
    assert [len(r) for r in rows] == [40, 40, 40] and len(reads) == 40
    # 9 calls fill the 9 positions; then each re-read of the last 4 tokens is followed by 5 tokens from the cache
    assert reads.count(4) == 6 and set(reads) == {1, 4}


def test_the_ar_baseline_stops_early_once_held_out_stops_improving(story_model, tmp_path, monkeypatch, capsys):
    """--patience N: the run stops, saved, after N held-out evaluations in a row no better than its
    best (here the held-out figure falls to step 4, then rises), with the best weights kept; without
    it the same run trains to its budget."""
    from helpers import study_script

    ar = study_script("ar_baseline")
    held = tmp_path / "held.txt"
    held.write_text("".join("\n".join(d) + f"\n{EOT}\n" for d in read_documents([str(HEAD)])[-2:]))
    per_token = iter([3.0, 2.0, 2.2, 2.1, 2.4, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    monkeypatch.setattr(ar, "story_nats", lambda db, model, heldout, limit=1000: (next(per_token) * 100, 100, [], []))
    args = ["train", str(story_model.path), "--tokens", "2400", "--layers", "1", "--hidden", "32", "--heads", "2",
            "--seq-len", "32", "--batch", "4", "--lr", "3e-3", "--warmup", "2", "--heldout", str(held),
            "--eval-every", "2"]
    out = tmp_path / "ar"
    assert ar.main([*args, "--out", str(out), "--patience", "3"]) == 0
    state = json.loads((out / "state.json").read_text())
    assert state["steps"] > 10  # the budget goes well past the stop
    assert state["step"] == 10 and state["best"]["step"] == 4
    assert [h["step"] for h in state["history"] if "heldout_ppl" in h] == [2, 4, 6, 8, 10]
    assert json.loads((out.with_name("ar.best") / "state.json").read_text())["step"] == 4
    assert "no better than step 4's" in capsys.readouterr().err
    per_token = iter([3.0, 2.0, 2.2, 2.1, 2.4] + [2.5] * 40)
    whole = tmp_path / "whole"
    assert ar.main([*args, "--out", str(whole)]) == 0
    state = json.loads((whole / "state.json").read_text())
    assert state["step"] == state["steps"] and state["best"]["step"] == 4


def test_the_shaping_changes_the_words_not_the_storys_length(story_model):
    """natural_length (--natural-length): a story's end keeps the model's own chance, whatever the temperature,
    top-k or top-p; the other tokens share the rest as shaped. With the end the model's most likely token
    (a third of the mass), greedy decoding ends every story at once unless the end keeps its own chance."""
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.blocks import story_of
    from dbert_core.sampling.draw import shape_probs
    from dbert_core.sampling.sample import resolve, shaping, story_stream

    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    raw = torch.softmax(logits.double(), -1)
    for t, k, p in ((0.3, 0, 1.0), (0.0, 0, 1.0), (1.0, 2, 1.0), (0.7, 0, 0.5), (1.0, 0, 1.0)):
        kept = shape_probs(logits, t, k, p, keep=0)
        assert kept[0, 0] == pytest.approx(raw[0, 0]) and kept.sum() == pytest.approx(1.0)
        others = shape_probs(logits[:, 1:], t, k, p)[0]  # the rest: the shaping of the other ids alone
        assert torch.allclose(kept[0, 1:] / (1 - raw[0, 0]), others)
    assert shape_probs(torch.tensor([[0.0, float("-inf")]]), 0.5, keep=0)[0].tolist() == [1.0, 0.0]  # only the end
    sep = story_model.tokenizer.sep_token_id
    assert shaping(story_model, resolve(SampleConfig(natural_length=True), story_model))[3] == sep
    assert shaping(story_model, resolve(SampleConfig(), story_model))[3] == -1  # the default: the end shaped too

    def lengths(natural):
        def push(module, args, out):
            out = out.clone()
            top = out.max(-1, keepdim=True).values
            out[..., sep] = top[..., 0] + 0.5  # the end: the likeliest token everywhere, not the only one
            return out

        handle = story_model.model.register_forward_hook(push)
        try:
            cfg = resolve(SampleConfig(n=8, steps=8, seed=4, length=40, min_length=0, temperature=0.0,
                                       natural_length=natural, pair_quotes=False, fix_contractions=False,
                                       known_words=False, end_at_sentence=False), story_model)
            final = list(story_stream(story_model, cfg, torch.Generator().manual_seed(4)))[-1]
        finally:
            handle.remove()
        return [len(story_of(row, sep)) for row in final.ids]

    shaped, natural = lengths(False), lengths(True)
    assert max(shaped) <= 2, (shaped, natural)  # greedy on a shaped end: every story ends at its first chance
    assert sum(natural) > 4 * len(natural), (shaped, natural)  # its own chance: stories go on


def test_eval_scores_a_story_model_by_story_unless_told(story_model, tmp_path, capsys, monkeypatch):
    """Without --unit, dbert eval scores text the way the checkpoint trained on it (its dbert.json's unit),
    and says so on stderr; --unit still chooses."""
    from helpers import run

    held = tmp_path / "held.txt"
    docs = read_documents([str(HEAD)])[-4:]
    held.write_text("".join("\n".join(d) + f"\n{EOT}\n" for d in docs))
    args = ["eval", "--checkpoint", str(story_model.path), "--data", str(held), "--steps", "4", "--json"]
    code, out, err = run(args, capsys, monkeypatch)
    assert code == 0, err
    assert "scored by story: the checkpoint trained with --unit story (--unit chooses)" in err
    default = json.loads(out)
    code, out, err = run(args + ["--unit", "story"], capsys, monkeypatch)
    assert code == 0 and "scored by" not in err
    assert json.loads(out) == default  # the same examples, the same figures
    code, out, _ = run(args + ["--unit", "line"], capsys, monkeypatch)
    assert code == 0 and json.loads(out)["examples"] != default["examples"]


def test_the_unit_a_checkpoint_trained_on():
    from dbert_core.evaluation.metrics import trained_unit

    assert trained_unit({"unit": "story", "pack": False})[0] == "story"
    assert trained_unit({"unit": "sentence", "pack": True})[0] == "window"
    assert trained_unit({"unit": "sentence", "pack": False})[0] == "sentence"
    assert trained_unit({"unit": "line"})[0] == "line"
    assert trained_unit({}) == ("line", "the checkpoint records no training unit")


def test_chat_completions_stream_a_long_story_window_by_window(story_model):
    """POST /v1/chat/completions with the real openai client: the last user message opens the story,
    the assistant's message is its continuation; streamed, a story longer than a window arrives in
    more than one text chunk (each window's text once it is final), the chunks only ever add text and
    join into the message the same request gets unstreamed."""
    import openai

    from dbert_core.serving.serve import create_app
    from helpers import serving

    app = create_app(story_model, "story", models=[], dtype="fp32")
    with serving(app) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        kw = dict(model="story", max_tokens=60, seed=5, extra_body={"min_tokens": 55, "dbert": {"steps": 6}},
                  messages=[{"role": "system", "content": "You are a storyteller."},
                            {"role": "user", "content": "Tom had a red kite."}])
        whole = client.chat.completions.create(**kw)
        (choice,) = whole.choices
        assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
        assert choice.message.role == "assistant" and choice.message.content.strip()
        assert choice.finish_reason in ("stop", "length") and not choice.message.content.startswith(" ")
        assert whole.usage.prompt_tokens > 0 and whole.usage.completion_tokens == 60
        pieces, finish, roles = [], None, []
        for chunk in client.chat.completions.create(stream=True, **kw):
            assert chunk.object == "chat.completion.chunk"
            for c in chunk.choices:
                if c.delta.role:
                    roles.append(c.delta.role)
                if c.delta.content:
                    pieces.append(c.delta.content)
                finish = c.finish_reason or finish
        assert len(pieces) > 1, pieces  # the text as its windows settle, not in one chunk at the end
        assert "".join(pieces) == choice.message.content and finish == choice.finish_reason
        assert roles == ["assistant"]
        with pytest.raises(openai.BadRequestError, match="no user message"):
            client.chat.completions.create(model="story", messages=[{"role": "system", "content": "hi"}])
        # completions stream the same way: text chunks that add up to the unstreamed text
        plain = client.completions.create(model="story", prompt="Tom had a red kite.", max_tokens=60, seed=5,
                                          extra_body={"min_tokens": 55, "dbert": {"steps": 6}})
        texts = [c.choices[0].text for c in client.completions.create(
            model="story", prompt="Tom had a red kite.", max_tokens=60, seed=5, stream=True,
            extra_body={"min_tokens": 55, "dbert": {"steps": 6}}) if c.choices and c.choices[0].text]
        assert len(texts) > 1 and "".join(texts) == plain.choices[0].text


def test_max_tokens_reaches_the_story_length():
    """The shipped story model's requests may ask for its whole story length (`dbert sample`'s
    default --length, 383 tokens), not a fixed 256; --max-tokens still caps it."""
    from dbert_core.sampling.sample import default_length
    from dbert_core.serving.api_error import ApiError
    from dbert_core.serving.options import Limits
    from dbert_core.serving.request import max_span, parse
    from dbert_core.storage import checkpoint, store

    db = checkpoint.load(store.resolve("default"))
    assert max_span(db) == default_length(db) == 383
    plan = parse({"prompt": "Tom had a red kite.", "max_tokens": 383}, db, "default", Limits(), dtype="fp32")
    assert plan.prompts[0].cfg.length == plan.prompts[0].head + 383
    with pytest.raises(ApiError, match=r"max_tokens must be in \[1, 383\] \(got 384\)"):
        parse({"prompt": "Tom", "max_tokens": 384}, db, "default", Limits())
    with pytest.raises(ApiError, match=r"max_tokens must be in \[1, 40\]"):
        parse({"prompt": "Tom", "max_tokens": 41}, db, "default", Limits(max_tokens=40))
