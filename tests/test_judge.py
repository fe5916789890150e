"""gen-PPL under a causal judge (dbert_core/evaluation/judge.py, `dbert eval --judge`), offline: the judge is a
tiny GPT-2 the test trains in seconds on TinyStories with a WordPiece tokenizer of its own."""

from __future__ import annotations

import json
import random
import sys

import pytest
import torch
from helpers import TINYSTORIES, TINYSTORIES_VALID

from dbert_core.errors import DbertError
from dbert_core.evaluation.judge import causal_batch


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    from dbert_core.text.data import read_examples, train_tokenizer

    out = tmp_path_factory.mktemp("judge") / "gpt"
    texts = read_examples([str(TINYSTORIES)], "sentence")[:6000]
    tok = train_tokenizer(texts[:3000], 512)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=48, n_layer=2, n_head=2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rows = [[tok.cls_token_id] + tok.encode(t, add_special_tokens=False)[:31] for t in texts]
    rows = [r for r in rows if len(r) > 4]
    gen = random.Random(0)
    for _ in range(150):
        ids, labels = causal_batch(gen.sample(rows, 32), tok.pad_token_id)
        loss = model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)  # safetensors
    tok.save_pretrained(out)
    return out


def test_judge_prefers_human_text_to_shuffled_words(judge_dir):
    from dbert_core.text.data import read_examples
    from dbert_core.evaluation.judge import Judge, human_chunks, token_entropy

    judge = Judge(str(judge_dir))
    human = human_chunks(read_examples([str(TINYSTORIES_VALID)], "sentence"), 40, 20)
    assert len(human) == 40 and all(len(h.split()) == 20 for h in human)
    gen = random.Random(1)
    shuffled = [" ".join(gen.sample(h.split(), 20)) for h in human]
    repeated = ["the " * 20 for _ in human]
    a, b, c = judge.score(human), judge.score(shuffled), judge.score(repeated)
    assert a["gen_ppl"] < 0.7 * b["gen_ppl"]  # the order of words is what the judge scores
    assert abs(a["entropy"] - b["entropy"]) < 1e-9  # the same words: the same unigram entropy
    assert c["entropy"] == 0.0 and token_entropy([1, 2, 1, 2]) == pytest.approx(0.6931, abs=1e-4)
    nats, counts, _ = judge.nll(human[:3])
    assert all(n > 0 for n in nats) and counts == [len(judge.encode(h)) for h in human[:3]]  # from [CLS] on


def test_eval_judge_reports_samples_and_human_text(tiny_checkpoint, judge_dir, capsys, monkeypatch):
    from dbert_core.cli import main

    monkeypatch.setattr(sys, "argv", ["dbert", "eval", "--checkpoint", str(tiny_checkpoint), "--data",
                                      str(TINYSTORIES_VALID), "--unit", "sentence", "--steps", "8", "--limit", "16",
                                      "--samples", "12", "--sample-steps", "16", "--sample-length", "16",
                                      "--sampler", "confidence", "--judge", str(judge_dir), "--json"])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr().out
    assert e.value.code in (0, None)
    r = json.loads(out)
    assert r["sampler"] == "confidence" and r["sampler_exact"] is False and r["exact"] is False and r["judge"] == str(judge_dir)
    assert r["gen_ppl"] > 1 and r["human_gen_ppl"] > 1 and r["human_texts"] == 12
    assert 0 < r["judge_entropy"] and 0 < r["human_judge_entropy"] and r["human_unigram_entropy"] > 0
    # the tiny denoiser writes worse text than the stories the judge learnt from
    assert r["gen_ppl"] > r["human_gen_ppl"]


def test_eval_judge_needs_samples_and_refuses_code(tiny_checkpoint, judge_dir, tmp_path, capsys, monkeypatch):
    import shutil

    from dbert_core.cli import main
    from dbert_core.evaluation.judge import Judge

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["dbert", "eval", "--checkpoint", str(tiny_checkpoint), "--data",
                                          str(TINYSTORIES_VALID), "--limit", "4", *args])
        with pytest.raises(SystemExit) as e:
            main()
        return e.value.code, capsys.readouterr().err

    code, err = run("--judge", str(judge_dir))
    assert code == 2 and "--samples" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "remote"
    shutil.copytree(judge_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling.Evil"}
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(DbertError, match="custom code"):
        Judge(str(bad))
    pickled = tmp_path / "pickled"
    shutil.copytree(judge_dir, pickled)
    (pickled / "model.safetensors").unlink()
    with pytest.raises(DbertError, match="safetensors"):
        Judge(str(pickled))
    code, err = run("--samples", "2", "--sample-steps", "4", "--sample-length", "8", "--judge", str(tmp_path / "none"))
    assert code == 2 and "no such directory" in err
