"""Prompts on a story model (the shipped one: 255-token windows, continuation windows carrying the
previous 128 tokens): a prompt longer than --length is refused in one line, as a line model's
is; a prompt longer than one window is given text in every window it reaches, and the story
goes on after it (docs/stories.md, "Sampling a story")."""

from __future__ import annotations


import pytest
import torch

from helpers import ROOT, cli_words, post_json, run

SHIPPED = ROOT / "assets" / "dbert-minilm-stories"
SENTENCE = "Once upon a time there was a little girl named Lily. She loved to play with her dog Max in the park. "
FAST = ["--steps", "2", "--seed", "1", "-n", "1", "--workers", "1", "--made-up-words", "--raw-contractions",
        "--unpaired-quotes"]


@pytest.fixture(scope="module")
def shipped():
    from dbert_core.storage import checkpoint

    return checkpoint.load(SHIPPED)


def long_prompt(db, tokens: int) -> str:
    """Whole sentences of SENTENCE, at least `tokens` tokens."""
    text = ""
    while len(db.tokenizer.encode(text, add_special_tokens=False)) < tokens:
        text += SENTENCE
    return text.strip()


def test_a_prompt_longer_than_the_length_is_refused_on_a_story_model(capsys, monkeypatch):
    """It was cut to --length silently (a line model refuses it)."""
    code, out, err = run(["sample", "-c", str(SHIPPED), SENTENCE, "--length", "10", *FAST], capsys, monkeypatch)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and out == "" and len(lines) == 1 and "Traceback" not in err, (code, out, err)
    assert lines[0] == "dbert: error: the prompt is 24 tokens, longer than --length 10"


def test_a_prompt_longer_than_the_length_is_refused_by_the_library(shipped):
    from dbert_core.errors import DbertError
    from dbert_core.sampling.sample import generate

    with pytest.raises(DbertError) as e:
        generate(shipped, prompt=SENTENCE, length=10, steps=2, n=1, seed=1, workers=1)
    assert "the prompt is 24 tokens, longer than --length 10" in cli_words(e.value)


def test_a_prompt_longer_than_a_window_reaches_every_window_it_spans(shipped, capsys, monkeypatch):
    """A 290-token prompt at --length 330: only its first 255 tokens reached the model, the rest
    was drawn over and patched back with the prompt's words ("her dogMax ... parkOnce")."""
    db = shipped
    prompt = long_prompt(db, 290)
    n_tokens = len(db.tokenizer.encode(prompt, add_special_tokens=False))
    assert n_tokens > 255
    code, out, err = run(["sample", "-c", str(SHIPPED), prompt, "--length", "330", "--min-length", "0", *FAST],
                         capsys, monkeypatch)
    assert code == 0, err
    text = out.strip()
    assert text.startswith(prompt), text[:len(prompt) + 80]
    assert len(text) > len(prompt) + 1  # the story goes on after its prompt


def test_each_window_is_given_the_prompts_tokens_it_holds(shipped):
    """The frames' canvas holds the prompt's tokens in every frame, in every window."""
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.prompt import prompt_ids
    from dbert_core.sampling.sample import resolve, story_stream

    db = shipped
    prompt = long_prompt(db, 290)
    ids = prompt_ids(db, prompt)
    cfg = resolve(SampleConfig(n=1, steps=2, seed=0, length=len(ids) + 20, workers=1, prompt=prompt, pair_quotes=False,
                               fix_contractions=False, known_words=False), db)
    seen = list(story_stream(db, cfg, torch.Generator().manual_seed(0)))
    assert all(f.ids[0, 1:1 + len(ids)].tolist() == ids.tolist() for f in seen)
    assert db.tokenizer.sep_token_id not in seen[-1].ids[0, :1 + len(ids) + 1].tolist()[1:]  # no end inside it


def test_a_story_does_not_end_inside_its_prompt(shipped):
    """A [MASK] slot before the prompt's last words is never the story's end (the words after
    it fell after the end and were lost): here with a model that wants to end everywhere."""
    from dbert_core.sampling.sample import generate

    sep = shipped.tokenizer.sep_token_id

    def eager(module, args, out):
        out = out.clone()
        out[..., sep] += 40.0
        return out

    handle = shipped.model.register_forward_hook(eager)
    try:
        texts, _ = generate(shipped, prompt="Tom [MASK*6] the end of the road", length=40, steps=4, n=3, seed=1,
                            workers=1, min_length=0, end_at_sentence=False, known_words=False)
    finally:
        handle.remove()
    assert all(t.startswith("Tom ") and "the end of the road" in t for t in texts), texts


def test_serve_echoes_a_prompt_longer_than_a_window_intact(shipped):
    from dbert_core.serving.serve import create_app
    from helpers import serving

    prompt = long_prompt(shipped, 290)
    with serving(create_app(shipped, "story", models=[])) as (url, _):
        code, body = post_json(f"{url}/v1/completions", {"model": "story", "prompt": prompt, "max_tokens": 30, "echo": True,
                                                    "seed": 1, "dbert": {"steps": 2}})
        assert code == 200, body
        (choice,) = body["choices"]
        assert choice["text"].startswith(prompt), choice["text"][:len(prompt) + 80]
