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


def test_the_stories_card_renders_every_field():
    from dbert_core.metrics import readability

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
         "shown": {"nfe": 120, "real": 8.5, "seconds": 6.0, "texts": samples * 5}, "checks200": readability(samples),
         "n200": 200, "defaults": {"steps": 128, "temperature": 1.0, "top_k": 30, "top_p": 1.0, "block_repeats": True},
         "train_examples": 14750, "mix": None}
    card = mod.render(d)
    assert "{" not in card and "}" not in card
    assert "3,500 optimizer steps" in card and "7.6 epochs" in card and "25.0 ± 0.5" in card and "49.7" in card
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
