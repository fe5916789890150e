"""Infill of unknown length: [MASK*A-B] spans, candidates for every length ranked by the model's
ELBO per token (dbert_core.sampling.infill), and `dbert sample` printing the best --n with scores."""

import json
import sys

import pytest

from dbert_core.config import SampleConfig
from dbert_core.errors import DbertError
from dbert_core.sampling.infill import bound, has_range, infill, ranges, variants
from dbert_core.sampling.sample import resolve
from dbert_core.sampling.sample import parse_prompt


def test_spans_and_variants():
    assert has_range("a [MASK*1-3] b") and has_range("a [mask * 2 - 4]") and not has_range("a [MASK*3] b")
    assert ranges("x [MASK*1-3] y [MASK*2-2]") == [(1, 3), (2, 2)]
    v = variants("x [MASK*1-3] y [mask*2-3]")
    assert [lengths for lengths, _ in v] == [(1, 2), (1, 3), (2, 2), (2, 3), (3, 2), (3, 3)]
    assert v[0][1] == "x [MASK*1] y [MASK*2]"
    with pytest.raises(DbertError, match="1 <= A <= B"):
        ranges("[MASK*3-1]")
    with pytest.raises(DbertError, match="at most"):
        variants("[MASK*1-9] [MASK*1-9]")


def test_infill_ranks_every_length_by_elbo_per_token(tiny_db):
    prompt = "once upon a time [MASK*1-3] was a girl"
    cfg = resolve(SampleConfig(prompt=prompt, seed=4, steps=16, sampler="ancestral"), tiny_db)
    got = infill(tiny_db, cfg, per_length=3, score_steps=8)
    base = len(parse_prompt(tiny_db, "once upon a time was a girl", 7))
    assert {c.lengths for c in got} <= {(1,), (2,), (3,)} and len({c.lengths for c in got}) >= 2
    for c in got:
        assert c.tokens == base + c.lengths[0] == len(c.ids)
        assert c.text.lower().startswith("once upon a time") and c.text.lower().endswith("a girl")
    scores = [c.score for c in got]
    assert scores == sorted(scores)  # best (lowest nats per token) first
    assert len({c.text for c in got}) == len(got)  # each text once
    best = got[0]
    again = bound(tiny_db, [best.ids], 8, 4)[0]
    assert abs(again - best.nats) < 1e-3  # the score is the bound, reproducible from the seed
    same = infill(tiny_db, cfg, per_length=3, score_steps=8)
    assert [c.text for c in same] == [c.text for c in got]


def test_the_bound_of_texts_scored_together_is_each_scored_alone(tiny_db):
    """The ranking batches every text's corruptions into shared forwards, and still gives each text
    the score of diffusion.elbo on that text alone, its corruptions drawn from the seed (the
    ranking before batching); texts of one length see the same masks."""
    import torch

    import dbert_core.sampling.infill as infill_module
    from dbert_core.maths.diffusion import elbo
    from dbert_core.text.data import Special, collate

    tok = tiny_db.tokenizer
    rows = [tok.encode(t, add_special_tokens=False) for t in
            ("once upon a time there was a girl", "the dog ran", "the cat sat", "a big red ball was in the park today")]

    def alone(row, steps, seed, draws):
        ids, att, noisable = collate([row] * draws, Special.of(tok), tiny_db.device)
        gen = torch.Generator().manual_seed(seed)
        with torch.inference_mode():
            return float(elbo(tiny_db.model, ids, att, noisable, tiny_db.schedule, steps, gen, exact=True).mean())

    expected = [alone(r, 6, 3, 5) for r in rows]
    cost: dict = {}
    seen = []
    got = bound(tiny_db, rows, 6, 3, 5, cost=cost, on_progress=lambda done, f: seen.append((done, f)))
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-4)
    assert cost["forwards"] == 6 and cost["rows"] == 6 * 4 * 5 and cost["flops"] > 0  # one forward a step
    assert seen[0] == (0, 0.0) and seen[-1] == (4, 1.0) and [f for _, f in seen] == sorted(f for _, f in seen)
    monkeypatch_budget = infill_module.CHUNK_POSITIONS
    try:  # in pieces of at most a few texts: the same scores
        infill_module.CHUNK_POSITIONS = 5 * 12
        assert bound(tiny_db, rows, 6, 3, 5) == pytest.approx(expected, rel=1e-5, abs=1e-4)
    finally:
        infill_module.CHUNK_POSITIONS = monkeypatch_budget
    assert infill_module.chunks([3, 3, 9, 1], 2, budget=2 * 2 * 5) == [range(0, 2), range(2, 3), range(3, 4)]


def test_cli_infill_shows_progress_and_its_cost(tiny_checkpoint, capsys, monkeypatch):
    """`dbert sample` with a [MASK*A-B] prompt says on stderr what it is doing, the drawing then
    the ranking, and --stats reports both (it printed null)."""
    from helpers import run

    code, out, err = run(["sample", "--checkpoint", str(tiny_checkpoint), "once upon a time [MASK*1-3] girl", "-n", "2",
                          "--seed", "1", "--steps", "8", "--candidates", "2", "--stats"], capsys, monkeypatch)
    assert code == 0 and len(out.splitlines()) == 2, err
    assert "infill: 6 texts to draw (3 lengths x 2 candidates), then to rank by the 16-step bound over 4" in err
    assert "infill: drawing 2/6" in err and "infill: drawing 6/6" in err
    assert "infill: ranking 0/6" in err and "infill: ranking 6/6" in err
    stats = json.loads([line for line in err.splitlines() if line.startswith("{")][-1])
    assert stats["samples"] == 6 and stats["lengths"] == 3 and stats["nfe"] > 0 and stats["seconds"] > 0
    r = stats["ranking"]
    assert r["texts"] == 6 and r["steps"] == 16 and r["draws"] == 4 and r["forwards"] == 16
    assert r["rows"] == 16 * 6 * 4 and r["gflop"] > 0 and 0 < r["seconds"] <= stats["seconds"]


def test_cli_prints_the_top_n_with_scores(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    from dbert_core.cli import main

    out = tmp_path / "infill.jsonl"
    monkeypatch.setattr(sys, "argv", ["dbert", "sample", "--checkpoint", str(tiny_checkpoint), "--prompt",
                                      "once upon a time [MASK*1-4] girl", "--n", "3", "--seed", "1", "--steps", "16",
                                      "--candidates", "2", "-o", str(out)])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code in (0, None)
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 3 and all(line.lower().startswith("once upon a time") for line in lines)
    assert [line.split(":")[0] for line in captured.err.splitlines() if "infill #" in line] == \
        ["dbert", "dbert", "dbert"] and "nats/token" in captured.err
    records = [json.loads(x) for x in out.read_text().splitlines()]
    scores = [r["infill"]["nats_per_token"] for r in records]
    assert [r["text"] for r in records] == lines and scores == sorted(scores)
    monkeypatch.setattr(sys, "argv", ["dbert", "sample", "--checkpoint", str(tiny_checkpoint), "--prompt",
                                      "a [MASK*1-2]", "--trajectory", str(tmp_path / "t.json")])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and "infill" in capsys.readouterr().err


def test_a_story_model_fills_a_span_at_its_defaults(tmp_path, capsys, monkeypatch):
    """The README's `dbert sample "Tom had a [MASK*1-6] dog."` on a story model: its shortest story (min_length)
    is longer than the template, which is its own length, so no end falls inside it."""
    from helpers import run, train_stories

    db = train_stories(tmp_path, max_steps=2)
    assert db.meta["sampling"]["min_length"] > 8  # more than the template holds
    cfg = resolve(SampleConfig(prompt="tom had a [MASK*1-3] dog .", seed=2, steps=8), db)
    got = infill(db, cfg, per_length=2, score_steps=4)
    assert got and all(c.text.lower().startswith("tom had a") and c.text.lower().rstrip(" .").endswith("dog")
                       for c in got)
    code, out, err = run(["sample", "--checkpoint", str(db.path), "tom had a [MASK*1-3] dog .", "-n", "2",
                          "--seed", "1", "--steps", "8", "--candidates", "1"], capsys, monkeypatch)
    assert code == 0 and len(out.splitlines()) == 2, err
