"""Model cards: every placeholder filled, in the shipped cards and in what the renderer writes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("card", sorted(ROOT.glob("assets/*/MODEL_CARD.md")), ids=lambda p: p.parent.name)
def test_shipped_cards_have_no_unfilled_template(card):
    text = card.read_text(encoding="utf-8")
    assert "{" not in text and "}" not in text, re.findall(r".{0,30}[{}].{0,30}", text)[:3]


def _renderer():
    spec = importlib.util.spec_from_file_location("render_stories_card", ROOT / "scripts" / "render_stories_card.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _eval(ppl: float) -> dict:
    return {"ppl_token": ppl, "nats_per_token_se": 0.01, "ppl_word": ppl * 1.3, "bleu4": 0.2, "self_bleu4": 0.3,
            "distinct2": 0.4, "frac_sentence_start": 0.97, "frac_repeat": 0.02, "frac_quotes_balanced": 0.96,
            "nfe_per_sample": 120.0}


def _windows(ppl: float) -> dict:
    return {"ppl_token": ppl, "nats_per_token_se": 0.02, "examples": 184, "tokens": 22247}


def test_the_stories_card_renders_every_field():
    from dbert_core.evaluation.metrics import readability

    mod = _renderer()
    samples = ["Once upon a time, there was a cat named Tom.", '"Hi," she said. ¶ The dog ran.']
    row = {"temperature": 1.0, "top_k": 30, "top_p": 1.0, "block_repeats": True, "n": 200, **readability(samples),
           "distinct2": 0.5, "self_bleu4": 0.3, "unigram_entropy": 5.5, "seconds": 40.0}
    meta = {"lambda": 0.3, "T": 2048, "schedule": "spindle", "time": "none", "parameters": 16_200_000, "step": 3500,
            "tokens_seen": 13_000_000, "train_seconds": 5000.0, "train_examples": 14750, "train_tokens": 1_700_000,
            "seq_len": 128, "trim_vocab": {"vocab_before": 30522, "vocab_after": 13624},
            "train_config": {"seq_len": 128, "batch_size": 32, "lr": 3e-4, "warmup": 100, "max_steps": 3500,
                             "dtype": "bf16", "min_lr_ratio": 0.1, "seed": 0}}
    d = {"meta": meta, "curve": {100: 180.0, 500: 40.0, 3500: 20.0}, "cpu": "AMD EPYC", "bf16": True,
         "eval": _eval(25.0), "previous": _eval(49.7), "decoding": {"rows": [row], "why": "Chosen because."},
         "windows": {"stories": _windows(18.0), "previous": None},
         "shown": {"nfe": 120, "real": 8.5, "seconds": 6.0, "texts": samples * 5}, "checks200": readability(samples),
         "n200": 200, "defaults": {"steps": 128, "temperature": 1.0, "top_k": 30, "top_p": 1.0, "block_repeats": True},
         "train_examples": 14750, "mix": None}
    card = mod.render(d)
    assert "{" not in card and "}" not in card
    assert "3,500 optimizer steps" in card and "7.6 epochs" in card and "25.0 ± 0.5" in card and "49.7" in card
    assert "| this checkpoint | 18.0 ± 0.7 (128 tokens) | 25.0 ± 0.5 |" in card  # the windows, then the sentences
    assert "| previous default (64 tokens, sentences joined by [SEP]) | not evaluated | 49.7" in card
    assert "184 of them" in card and "--short-windows" not in card
    assert "1. Once upon a time, there was a cat named Tom." in card and "Chosen because." in card
    assert "CDLA-Sharing-1.0" in card and "Apache-2.0" in card
    # without a decoding study or a second stage, the card says so (and is still whole)
    bare = mod.render({**d, "decoding": None, "mix": None, "history": "Stopped once at step 400."})
    assert "{" not in bare and "was not run for this model" in bare and "Stopped once at step 400." in bare
    assert "were not compared under a judge" in bare
    # with the decoding study's rows: the default's steps against 128 and the readability pick, with the ratio
    fr = {k: {"rows_per_sample": c, "gen_ppl": g, "bleu4": b} for k, c, g, b in (
        ("first-hitting-T1.0", 80.0, 30.0, 0.26), ("first-hitting-S96", 70.0, 30.5, 0.26), ("threshold-0.9", 126.0, 19.5, 0.28))}
    card = mod.render({**d, "frontier": fr, "defaults": {**d["defaults"], "steps": 96}})
    assert "{" not in card and "first-hitting (exact), 96 steps" in card and "70.0 calls per sample, gen-PPL 30.50" in card
    assert "1.8x the default's calls" in card


def test_a_stage_two_card_counts_both_stages():
    """A run that continued a shipped release (`stories_model.sh continue`): steps, tokens and the
    validation curve run on from stage 1's, and stage 1 alone gets its own evaluation row."""
    from dbert_core.evaluation.metrics import readability

    mod = _renderer()
    old_card = ("### Validation during training\n\n| step | held-out bound per token |\n|---|---|\n"
                "| 500 | 51.7 |\n| 5,400 | 22.4 |\n\nThe Gutenberg...\n\n## Evaluation\n| 1 | 2.0 |\n")
    assert mod.card_curve(old_card) == {500: 51.7, 5400: 22.4}
    samples = ["Once upon a time, there was a cat named Tom.", "The dog ran."]
    cfg = {"seq_len": 128, "batch_size": 32, "warmup": 100, "dtype": "auto", "min_lr_ratio": 0.1}
    parent = {"commit": "abc1234", "cpu": "AMD EPYC", "curve": {500: 51.7, 5400: 22.4}, "first": True,
              "total_step": 5400, "total_tokens_seen": 20_000_000, "total_train_seconds": 11_580.0,
              "meta": {"step": 5400, "tokens_seen": 20_000_000, "train_seconds": 11_580.0,
                       "train_config": {**cfg, "lr": 3e-4, "max_steps": 5400, "seed": 0}}}
    meta = {"lambda": 0.3, "T": 2048, "schedule": "spindle", "time": "none", "parameters": 16_200_000, "step": 6500,
            "tokens_seen": 24_000_000, "train_seconds": 5400.0, "train_tokens": 1_760_000, "seq_len": 128,
            "trim_vocab": {"vocab_before": 30522, "vocab_after": 13624},
            "train_config": {**cfg, "lr": 1e-4, "max_steps": 6500, "seed": 1}}
    d = {"meta": meta, "curve": {200: 22.8, 6500: 20.0}, "cpu": "Intel Xeon", "bf16": True,
         "eval": _eval(30.0), "previous": _eval(48.4), "parent_eval": _eval(34.1), "parent": parent,
         "windows": {"stories": _windows(20.0), "previous": _windows(27.0)}, "parent_windows": _windows(22.4),
         "decoding": None, "mix": None, "frontier": {},
         "shown": {"nfe": 70, "real": 8.5, "seconds": 6.0, "texts": samples * 5}, "checks200": readability(samples),
         "n200": 200, "defaults": {"steps": 96, "temperature": 1.0, "top_k": 30, "top_p": 1.0, "block_repeats": True},
         "train_examples": 14860}
    card = mod.render(d)
    assert "{" not in card and "}" not in card
    assert "11,900 optimizer steps of 32 windows in two stages, 44.00 M tokens = 25.0 epochs" in card
    assert "Stage 1, the release at commit abc1234: 5,400 steps" in card and "6,500 more steps" in card
    assert "| 5,600 | 22.8 |" not in card  # the table keeps every 500th step and the last
    assert "| 5,400 | 22.4 |" in card and "| 11,900 | 20.0 |" in card and "Best: 20.0 at step 11,900" in card
    assert "| stage 1 alone (the release at abc1234, 5,400 steps) | 22.4 ± 0.9 (128 tokens) | 34.1 ± 0.7" in card
    assert "| previous default (64 tokens, sentences joined by [SEP]) | 27.0 ± 1.1 (64 tokens) | 48.4" in card
    assert "--init <the earlier release's folder>" in card and "--max-steps 6500 --seed 1" in card
    assert "scripts/stories_model.sh continue" in card and "git show abc1234:" in card
    assert "not repeated since" in card and "not redrawn since" in card
    # a third stage: the release it continues had a parent itself; its steps count in full
    assert mod.total({"step": 6500, "parent": {"step": 5400}}, "step") == 11_900
    short = {**meta, "train_config": {**meta["train_config"], "short_windows": 0.15},
             "trim_vocab": {"vocab_before": 13624, "vocab_after": 13624}}  # a later stage trims nothing more
    third = mod.render({**d, "meta": short, "parent": {**parent, "first": False, "total_step": 11_900,
                                                       "total_tokens_seen": 44e6, "curve": {5400: 22.4, 11_900: 19.2}}})
    assert "18,400 optimizer steps" in third and "The earlier stages, the release at commit abc1234: 11,900 steps" in third
    assert "| 18,400 | 20.0 |" in third and "the release it continues (the release at abc1234, 11,900 steps)" in third
    assert "Stage 1" not in third and "{" not in third
    assert "13,624 pieces, cut from MiniLM's in stage 1" in third and "13,624 -> 13,624" not in third
    assert "the card of the release at abc1234 names them" in third
    assert "--seed 1 --dtype auto --short-windows 0.15`" in third and "In this stage, 15% of the windows" in third
    assert 'PARENT=abc1234 LR=1e-4 WARMUP=100 MAX_STEPS=6500 SEED=1 EXTRA="--short-windows 0.15" \\\n' in third
    one = mod.render({**d, "parent": None, "parent_eval": None})  # a single run has no stage lines
    assert "Stage 1" not in one and "stage 1 alone" not in one and "6,500 optimizer steps" in one


def test_export_keeps_the_parent_of_a_continued_run(tiny_checkpoint, tmp_path):
    """scripts/export_default.py on a run whose --init was a dbert checkpoint: the shipped record keeps
    stage 1's step, tokens and time (its folder will not travel), and the weights load back as float32."""
    import json
    import subprocess
    import sys

    from dbert_core.storage import checkpoint

    db = checkpoint.load(tiny_checkpoint)
    db.meta["init"] = str(tiny_checkpoint)
    checkpoint.save(db, tmp_path / "run")
    card = tmp_path / "CARD.md"
    card.write_text("# card\n")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "export_default.py"), str(tmp_path / "run"),
                    str(tmp_path / "out"), "--card", str(card)], check=True, capture_output=True)
    meta = json.loads((tmp_path / "out" / "dbert.json").read_text())
    stage1 = json.loads((tiny_checkpoint / "dbert.json").read_text())
    assert meta["parent"]["step"] == stage1["step"] and meta["parent"]["tokens_seen"] == stage1["tokens_seen"]
    assert (tmp_path / "out" / "MODEL_CARD.md").read_text() == "# card\n"
    plain = checkpoint.load(tiny_checkpoint)  # a run from a BERT folder gets no parent
    checkpoint.save(plain, tmp_path / "run2")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "export_default.py"), str(tmp_path / "run2"),
                    str(tmp_path / "out2")], check=True, capture_output=True)
    assert "parent" not in json.loads((tmp_path / "out2" / "dbert.json").read_text())


def _story_renderer():
    spec = importlib.util.spec_from_file_location("render_story_card", ROOT / "scripts" / "render_story_card.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_story_card_renders_every_field():
    from dbert_core.evaluation.story_metrics import story_report
    from dbert_core.evaluation.metrics import readability, unigram_entropy

    mod = _story_renderer()
    samples = ["Once upon a time, there was a cat named Tom. Tom liked to play. The end.",
               "She ran home. ¶ Once upon a time, a dog barked."]
    m = {"n": 2, **story_report(samples), **readability(samples), "unigram_entropy": unigram_entropy(samples)}
    lengths = {"stories": 200, "words_q1": 120.0, "words_median": 153.0, "words_q3": 190.0, "words_max": 241,
               "tokens_median": 181.0, "whole": 0.9}
    c = {"lam": 0.3, "T": 2048, "schedule": "spindle", "time": "none", "batch_size": 16, "lr": 1e-4, "warmup": 50,
         "max_steps": 600, "seed": 5, "min_lr_ratio": 0.1, "hybrid_weight": 0.01, "story_context": 128,
         "data": ["/x/runs/data/head-train.txt", "/y/fables.txt"], "val_data": ["/x/runs/data/head-heldout.txt"]}
    meta = {"seq_len": 256, "parameters": 16_200_000, "train_examples": 9863, "train_tokens": 2_100_000, "step": 600,
            "tokens_seen": 2_457_600, "train_seconds": 4500.0, "train_config": c}
    d = {"meta": meta, "cpu": "AMD EPYC", "bf16": False, "curve": {300: 18.4, 600: 16.1},
         "parent": {"commit": "2b79eac", "meta": {"step": 14300}},
         "eval": {"ppl_token": 16.0, "nats_per_token_se": 0.01}, "parent_eval": {"ppl_token": 21.8, "nats_per_token_se": 0.02},
         "measures": {"held-out stories": m, "runs/story-samples.txt": m}, "timing": {"real": 30.5, "nfe": 180, "seconds": 25.0},
         "stories": samples, "long": ["Once upon a time " * 80], "lengths": {"training": lengths, "held out": lengths}}
    card = mod.render(d)
    assert "{" not in card and "}" not in card, re.findall(r".{0,30}[{}].{0,30}", card)[:3]
    assert "600 optimizer steps of 16 windows" in card and "2.46 M tokens" in card and "75 min on a 2-core AMD EPYC" in card
    assert "**16.0 ± 0.3**" in card and "21.8 ± 0.9" in card and "| 1 | 600 | 16.10 |" in card
    assert "| this model | 2 | 50% |" in card and "| held-out stories | 2 |" in card
    assert "1. Once upon a time, there was a cat named Tom." in card
    assert "(320 words, unedited;" in card and "--min-length 760" in card
    assert "commit 2b79eac" in card and "step 14,300" in card and "30.5 s end to end" in card
    assert "| held out | 200 | 120 / 153 / 190 | 241 | 181 | 90% |" in card
    assert "records no story rules" in card
    ruled = mod.render({**d, "meta": {**meta, "sampling": {"min_length": 93, "openings": list(range(35)),
                                                            "from_stories": 6207, "openings_cover": 0.9636}}})
    assert "the 35 tokens" in ruled and "6,207 training stories" in ruled and "before 93 tokens" in ruled
    assert "96% of them" in ruled and "records no story rules" not in ruled and "drawn with" not in ruled
    decoded = mod.render({**d, "meta": {**meta, "sampling": {"min_length": 93, "openings": [1, 2],
                                                              "decoding": {"top_k": 0, "top_p": 0.9}}}})
    assert "drawn with no top-k, nucleus (top-p) 0.9 (`sampling.decoding`" in decoded
    bare = mod.render({**d, "eval": None, "parent_eval": None, "timing": None, "parent": None})
    assert "{" not in bare and "not evaluated" in bare and "Not timed." in bare and "from all-MiniLM-L6-v2" in bare
    short = mod.render({**d, "long": ["The end."], "long4": [167, 17]})
    assert "None to show" in short and "wrote a story of 2 words" in short and "167, 17 words" in short
    c2 = {**c, "lr": 5e-5, "warmup": 20, "max_steps": 300, "seed": 6, "init": "/x/runs/init-stage1"}
    two = mod.render({**d, "meta": {**meta, "step": 300, "train_config": c2}, "curve": {150: 16.5, 300: 15.9},
                      "stage1": {"meta": meta, "curve": {300: 18.4, 600: 16.1}}})
    assert "{" not in two and "}" not in two, re.findall(r".{0,30}[{}].{0,30}", two)[:3]
    assert "MAX_STEPS=600 scripts/stories_model.sh story " in two and "MAX_STEPS=300 scripts/stories_model.sh story-end" in two
    assert "**Stage 1**: 600 steps at learning rate 0.0001" in two and "300 optimizer steps of 16 windows" in two
    assert "| 1 | 600 | 16.10 |" in two and "| 2 | 300 | 15.90 |" in two and "--init runs/init-stage1" in two
