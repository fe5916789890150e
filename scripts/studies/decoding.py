"""docs/decoding.md: every decoding strategy, how far from the model's law, and what it buys.

    python scripts/studies/decoding.py --judge runs/gpt2-baseline            # the full study, then the doc
    python scripts/studies/decoding.py --train-judge 400 --quick             # a small look with a stand-in judge
    python scripts/studies/decoding.py --doc-only                            # rebuild the doc from the runs

Two parts, each kept under --out so an interrupted run continues where it stopped:

    tv        on a tiny model (trained here in seconds, as tests/conftest.py trains it), every
              strategy's distribution over whole 3-token sequences (top-3 choices) against the
              exact ancestral sampler's, from --tv-draws draws each, beside the noise floor
              (ancestral against ancestral with as many draws): dbert_core/sampling/distance.py.
    frontier  on --checkpoint (the shipped default), each strategy at a few settings
              (temperature and steps for the exact samplers; steps, tau, gamma, eta for the
              others): network calls per sample, seconds, gen-PPL and entropy under the judge,
              BLEU-4 / Self-BLEU-4 on --samples + --samples samples, distinct-2 and the
              readability checks (metrics.quality), plus held-out human text under the judge.

The judge is --judge (any Hugging Face causal LM folder or hub id: the issue's same-budget
GPT-2 baseline, or gpt2-large), or with --train-judge STEPS a small GPT-2 trained here on
--judge-data with the checkpoint's tokenizer: a stand-in, labelled as such in the doc.
Then the doc is written from whatever runs are under --out (two PNGs when matplotlib is there).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository

DATA = ROOT.parent / "shared" / "data" / "tinystories"
NOTES = "<!-- notes: kept as they are when the script writes this file again -->"

# (key, sampler, steps, temperature, params): the frontier's settings
FULL = [
    ("first-hitting-T1.0", "first-hitting", 128, 1.0, None),
    ("first-hitting-S2048", "first-hitting", 2048, 1.0, None),  # the model's whole T-step law: ~a reveal per call
    ("first-hitting-T0.9", "first-hitting", 128, 0.9, None),
    ("first-hitting-T0.8", "first-hitting", 128, 0.8, None),
    ("first-hitting-T0.7", "first-hitting", 128, 0.7, None),
    ("first-hitting-S96", "first-hitting", 96, 1.0, None),
    ("first-hitting-S64", "first-hitting", 64, 1.0, None),
    ("first-hitting-S32", "first-hitting", 32, 1.0, None),
    ("first-hitting-S16", "first-hitting", 16, 1.0, None),
    ("confidence-S64", "confidence", 64, 1.0, None),
    ("confidence-S16", "confidence", 16, 1.0, None),
    ("margin-S64", "margin", 64, 1.0, None),
    ("margin-S16", "margin", 16, 1.0, None),
    ("entropy-S64", "entropy", 64, 1.0, None),
    ("entropy-S16", "entropy", 16, 1.0, None),
    ("threshold-0.5", "threshold", 128, 1.0, {"tau": 0.5}),
    ("threshold-0.7", "threshold", 128, 1.0, {"tau": 0.7}),
    ("threshold-0.9", "threshold", 128, 1.0, {"tau": 0.9}),
    ("eb-0.1", "entropy-bounded", 128, 1.0, {"gamma": 0.1}),
    ("eb-1", "entropy-bounded", 128, 1.0, {"gamma": 1.0}),
    ("eb-3", "entropy-bounded", 128, 1.0, {"gamma": 3.0}),
    ("remdm-cap-0.008", "remdm", 128, 1.0, {"schedule": "cap", "eta": 0.008}),
    ("remdm-cap-0.04", "remdm", 128, 1.0, {"schedule": "cap", "eta": 0.04}),
    ("remdm-loop-0.02", "remdm", 128, 1.0, {"schedule": "loop", "eta": 0.02}),
]
QUICK = ["first-hitting-T1.0", "first-hitting-T0.8", "first-hitting-S16", "confidence-S16", "entropy-S64",
         "threshold-0.7", "threshold-0.9", "eb-1", "remdm-cap-0.008", "remdm-loop-0.02"]
TV_ROWS = [("cached", None), ("first-hitting", None), ("confidence", None), ("margin", None), ("entropy", None),
           ("threshold", None), ("threshold", {"tau": 0.5}), ("entropy-bounded", None),
           ("entropy-bounded", {"gamma": 1.0}), ("remdm", None), ("remdm", {"schedule": "cap", "eta": 0.1}),
           ("remdm", {"schedule": "loop"})]


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_json(path: Path, data) -> None:
    from dbert_core.disk.atomic import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def cpu() -> str:
    from dbert_core.hardware import cpu_name

    return f"{cpu_name()}, {os.cpu_count()} cores, torch {__import__('torch').__version__}, {torch_threads()} thread(s)"


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# ---------------------------------------------------------------------------------- tv
def tiny_model(out: Path, data: Path) -> Path:
    """The tests' tiny model (tests/conftest.py: tiny preset, spindle, 150 steps), trained once."""
    from dbert_core.training.train import Trainer, TrainConfig

    path = out / "tiny"
    if not (path / "dbert.json").exists():
        say(f"tv: training the tiny model in {path}")
        Trainer(TrainConfig(data=[str(data)], out=str(path), preset="tiny", unit="sentence", seq_len=24, batch_size=16,
                            max_steps=150, lr=3e-3, warmup=10, eval_every=0, save_every=0, val_examples=64,
                            eval_steps=32, T=256, device="cpu", seed=0)).run()
    return path


def run_tv(a) -> dict:
    from dbert_core.storage import checkpoint
    from dbert_core.sampling.distance import tv_table

    target = a.out / "tv.json"
    if target.exists() and json.loads(target.read_text()).get("draws") == a.tv_draws:
        return json.loads(target.read_text())
    db = checkpoint.load(tiny_model(a.out, a.tv_data))
    start = time.perf_counter()
    say(f"tv: {len(TV_ROWS)} strategies x {a.tv_draws} draws")
    result = tv_table(db, TV_ROWS, draws=a.tv_draws, length=3, steps=16, top_k=3, floor_pairs=5, seed=0)
    result.update(seconds=round(time.perf_counter() - start, 1), model="tests' tiny model (tiny preset, spindle, "
                  f"150 steps on {a.tv_data.name})", vocab=db.model.config.vocab_size, machine=cpu())
    write_json(target, result)
    return result


# ---------------------------------------------------------------------------------- judge
def train_judge(a, db) -> Path:
    """A small GPT-2 (transformers' GPT2LMHeadModel) trained here on --judge-data with the
    checkpoint's tokenizer: a stand-in for the same-budget baseline, good for ranking settings."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from dbert_core.text.data import read_examples
    from dbert_core.evaluation.judge import causal_batch

    out = a.out / f"judge-{a.train_judge}"
    if (out / "model.safetensors").exists():
        return out
    tok = db.tokenizer
    texts = read_examples([str(a.judge_data)], "line")
    rows = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False)
        for i in range(0, max(1, len(ids) - 8), 80):
            rows.append([tok.cls_token_id] + ids[i:i + 80])
    rows = [r for r in rows if len(r) > 8]
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=128, n_layer=2, n_head=2,
                        bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    model = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    gen = random.Random(0)
    start = time.perf_counter()
    for step in range(a.train_judge):
        lr = 2e-3 * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.train_judge)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, labels = causal_batch(gen.sample(rows, 16), tok.pad_token_id)
        loss = model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == a.train_judge - 1:
            say(f"judge: step {step} loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    write_json(out / "stand_in.json", {"steps": a.train_judge, "data": str(a.judge_data), "params": sum(
        p.numel() for p in model.parameters()), "seconds": round(time.perf_counter() - start, 1), "final_loss": loss.item()})
    return out


# ---------------------------------------------------------------------------------- frontier
def run_frontier(a) -> None:
    """Each setting's samples and figures into --out/frontier/KEY.json, with the samples themselves:
    a setting already drawn at this size is not drawn again, only scored under a new judge."""
    from dbert_core.storage import checkpoint
    from dbert_core.text.data import read_examples
    from dbert_core.evaluation.judge import Judge
    from dbert_core.evaluation.metrics import judged, quality
    from dbert_core.storage.store import resolve

    db = checkpoint.load(resolve(a.checkpoint))
    judge = None
    if not a.sample_only:
        judge = Judge(a.judge if a.judge else str(train_judge(a, db)), db.device)
    keys = QUICK if a.quick else [k for k, *_ in FULL]
    if a.settings:
        keys = a.settings.split(",")
    table = {k: (s, st, temp, p) for k, s, st, temp, p in FULL}
    length = a.length or int(db.meta.get("seq_len", 64))
    refs = None
    for key in keys:
        sampler, steps, temperature, params = table[key]
        target = a.out / "frontier" / f"{key}.json"
        if target.exists():
            prev = json.loads(target.read_text())
            if prev.get("samples") == a.samples and prev.get("sample_length") == length:
                if judge is None or prev.get("judge") == judge.name:
                    continue
                if prev.get("texts"):  # drawn already: scored under this judge, not drawn again
                    say(f"frontier: {key}: scoring its samples under {judge.name}")
                    refs = refs or read_examples([str(a.data)], "sentence")
                    prev.update(judged(judge, prev["texts"]["first"], refs, prev["words_per_sample"], db.device),
                                judge_stand_in=not a.judge)
                    write_json(target, prev)
                    continue
        say(f"frontier: {key} ({a.samples} + {a.samples} samples of {length} tokens)")
        texts: dict = {}
        start = time.perf_counter()
        row = quality(db, [str(a.data)], a.samples, steps=steps, length=length, top_k=a.top_k,
                      batch_size=a.batch_size, seed=a.seed, unit="sentence", sampler=sampler, params=params,
                      temperature=temperature, judge=judge, texts=texts)
        row.update(key=key, seconds_total=round(time.perf_counter() - start, 1), checkpoint=str(db.path),
                   judge_stand_in=judge is not None and not a.judge, machine=cpu(), examples=texts["first"][:3],
                   data=str(a.data), texts={"first": texts["first"], "second": texts["second"]})
        write_json(target, row)


# ---------------------------------------------------------------------------------- doc
def fmt(v, digits=3) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def setting(row) -> str:
    p = row.get("params") or {}
    parts = [f"S={row['sample_steps']}"] if row["sampler"] not in ("threshold", "entropy-bounded") else []
    if row["sampler"] in ("ancestral", "cached", "first-hitting") or row.get("temperature", 1.0) != 1.0:
        parts.append(f"T={row.get('temperature', 1.0):g}")
    parts += [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.items()]
    return ", ".join(parts)


def plots(rows, human, doc: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    img = doc.parent / "img"
    img.mkdir(parents=True, exist_ok=True)
    out = []
    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=110)
    for r in rows:
        ax.scatter(r["judge_entropy"], r["gen_ppl"], marker="o" if r.get("sampler_exact", r.get("exact")) else "^",
                   color="tab:blue" if r.get("sampler_exact", r.get("exact")) else "tab:orange")
        ax.annotate(r["key"], (r["judge_entropy"], r["gen_ppl"]), fontsize=6, xytext=(3, 2), textcoords="offset points")
    if human:
        ax.scatter(human["entropy"], human["gen_ppl"], marker="*", s=160, color="tab:green", label="held-out human text")
    ax.set_xlabel("entropy of a sample's judge tokens (nats, mean over samples)")
    ax.set_ylabel("gen-PPL under the judge")
    ax.set_yscale("log")
    ax.legend(handles=[plt.Line2D([], [], marker="o", ls="", color="tab:blue", label="exact"),
                       plt.Line2D([], [], marker="^", ls="", color="tab:orange", label="heuristic"),
                       plt.Line2D([], [], marker="*", ls="", ms=12, color="tab:green", label="human text")], fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(img / "decoding-ppl-entropy.png")
    out.append("img/decoding-ppl-entropy.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), dpi=110)
    for ax, key, label in ((axes[0], "gen_ppl", "gen-PPL under the judge (lower is better)"),
                           (axes[1], "bleu4", "BLEU-4 against held-out text (higher is better)")):
        for r in rows:
            ax.scatter(r["rows_per_sample"], r[key], marker="o" if r.get("sampler_exact", r.get("exact")) else "^",
                       color="tab:blue" if r.get("sampler_exact", r.get("exact")) else "tab:orange")
            ax.annotate(r["key"], (r["rows_per_sample"], r[key]), fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.set_xlabel("network calls per sample")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(img / "decoding-quality-calls.png")
    out.append("img/decoding-quality-calls.png")
    plt.close("all")
    return out


def within(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * abs(b)


def findings(rows) -> list[str]:
    by = {r["key"]: r for r in rows}
    base = by.get("first-hitting-T1.0")
    if base is None:
        return ["(no first-hitting T=1 run: nothing to compare against)"]
    lines = []
    se = base.get("log_gen_ppl_se", 0.0)
    lines.append(f"Reference: first-hitting at T=1, S={base['sample_steps']}: {base['rows_per_sample']:.1f} calls per "
                 f"sample, gen-PPL {base['gen_ppl']:.2f} (log standard error {se:.3f}, so about "
                 f"+-{100 * (math.exp(2 * se) - 1):.0f}% at two standard errors), BLEU-4 {base['bleu4']:.3f}.")
    fast = [r for r in rows if r["rows_per_sample"] * 2 <= base["rows_per_sample"]]
    hits = [r for r in fast if within(r["bleu4"], base["bleu4"], 0.10) and within(r["gen_ppl"], base["gen_ppl"], 0.10)]
    lines.append("Target (at least 2x fewer calls than first-hitting, BLEU-4 and gen-PPL within 10%): " + (
        "met by " + ", ".join(f"{r['key']} ({r['rows_per_sample']:.1f} calls, gen-PPL {r['gen_ppl']:.2f}, BLEU-4 "
                              f"{r['bleu4']:.3f})" for r in hits) if hits else
        "not met by any setting here" + (" (the settings with 2x fewer calls: " + ", ".join(
            f"{r['key']} {r['rows_per_sample']:.1f} calls, gen-PPL {r['gen_ppl']:.2f}, BLEU-4 {r['bleu4']:.3f}"
            for r in fast) + ")" if fast else "")) + ".")
    readable = sorted(rows, key=lambda r: (r["frac_doubled_word"] + r["frac_run3"] + r["frac_mask_or_unk"], r["gen_ppl"]))
    best = readable[0]
    lines.append(f"Fewest readability faults (doubled words + runs of 3 + leftover [MASK]/[UNK]): {best['key']} "
                 f"({best['frac_doubled_word']:.2f} + {best['frac_run3']:.2f} + {best['frac_mask_or_unk']:.2f} of samples).")
    speed = sorted(hits or fast or rows, key=lambda r: r["rows_per_sample"])[0]
    lines.append(f"Fewest calls{' within the target' if hits else ''}: {speed['key']} ({speed['rows_per_sample']:.1f} "
                 f"calls per sample, {speed['seconds_per_sample']:.2f} s per sample).")
    better = [r for r in rows if r["key"] != base["key"] and r["judge_entropy"] >= base["judge_entropy"] - 0.05 and
              math.log(r["gen_ppl"]) < math.log(base["gen_ppl"]) - 2 * math.hypot(se, r.get("log_gen_ppl_se", 0.0))]
    lines.append("Settings with a lower gen-PPL than the reference beyond two standard errors at no less entropy "
                 "(within 0.05 nats): " + (", ".join(r["key"] for r in better) if better else "none") + ".")
    human = base.get("human_gen_ppl")
    if human is not None:
        worse = [r["key"] for r in rows if r["gen_ppl"] > human]
        lines.append(f"Held-out human text: gen-PPL {human:.2f} at entropy {base['human_judge_entropy']:.3f}; " + (
            "every setting scores better than human text under this judge: it rewards the generic, frequent phrasing "
            "the denoiser favours, so a lower gen-PPL is not better text by itself (hence the entropy beside it)."
            if not worse else f"settings scoring worse than it: {', '.join(worse)}."))
    lines.append("The default: " + (
        "keep the exact first-hitting sampler; no setting reads measurably better at matched entropy." if not better else
        f"{', '.join(r['key'] for r in better)} read better than first-hitting beyond the noise here, at a cost in "
        "calls and with another law than the model's: the notes below weigh whether the default changes."))
    return lines


def baseline_section(a, rows, rel) -> list[str]:
    """The same-budget autoregressive baseline (scripts/studies/ar_baseline.py) beside the default:
    its exact held-out perplexity against the diffusion model's bound, its samples' figures."""
    base = Path(a.baseline)
    ev, sm = base / "eval.json", base / "samples.json"
    L = ["## The same-budget autoregressive baseline", ""]
    if not ev.exists():
        return L + [f"(not run yet: `python scripts/studies/ar_baseline.py train|eval|sample` into {rel(base)})", ""]
    e = json.loads(ev.read_text())
    s = json.loads(sm.read_text()) if sm.exists() else None
    d = json.loads(Path(a.diffusion_eval).read_text()) if Path(a.diffusion_eval).exists() else None
    done = "" if e["step"] >= e["steps"] else f" (**stopped at step {e['step']:,} of {e['steps']:,}**: not the full budget)"
    L += [f"`{rel(base)}`: transformers' GPT2LMHeadModel, 6 layers x 384, {e['params'] / 1e6:.1f} M parameters, "
          f"trained by `scripts/studies/ar_baseline.py` on the default model's own training files, sentence-start "
          f"windows, tokenizer, batch, learning-rate schedule and token budget: {e['tokens_seen'] / 1e6:.1f} M tokens in "
          f"{e['step']:,} steps{done}, {e['train_tokens_per_s']:,} tokens/s of training on {e['cpu']} "
          f"({e.get('train_seconds', 0) / 3600:.1f} h; bf16 autocast). Its perplexity is exact (the chain rule); the "
          "diffusion model's figure is its 128-step ELBO, an upper bound on its perplexity: the diffusion model is "
          "at least as good as its bound says, and may be better.", "",
          "| model | held-out sentences | tokens | perplexity per token |", "|---|---:|---:|---|"]
    L.append(f"| same-budget GPT-2 (left to right) | {e['sentences']:,} | {e['tokens']:,} | {e['ppl_token']:.2f} (exact) |")
    if d:
        L.append(f"| default diffusion model | {d['examples']:,} | {d['tokens']:,} | <= {d['ppl_token']:.2f} "
                 f"({d['steps']}-step bound) |")
    L.append("")
    sp = base / "speed.json"
    if sp.exists():
        v = json.loads(sp.read_text())
        L += [f"Training speed, both measured in one run (`python scripts/studies/ar_baseline.py speed`: "
              f"{v['steps_each']} optimizer steps of each, interleaved in {v['rounds']} rounds on the same windows, "
              f"batch {v['batch_size']} x {v['seq_len']} tokens, bf16 autocast {'on' if v['bf16'] else 'off'}, "
              f"{v['threads']} thread(s), {v['cpu']}): the diffusion model's trainer {v['diffusion_tokens_per_s']:,} "
              f"tokens/s, the GPT-2 {v['gpt2_tokens_per_s']:,} tokens/s: the baseline trains "
              f"{v['ratio_gpt2_over_diffusion']:g}x as many tokens per second "
              f"({v['diffusion_params'] / 1e6:.1f} M and {v['gpt2_params'] / 1e6:.1f} M parameters).", ""]
    if s:
        fh = next((r for r in rows if r["key"] == "first-hitting-T1.0"), None)
        L += [f"Samples: {s['samples']} + {s['samples']} windows of {s['length']} tokens from a [SEP] (a sentence "
              f"start), top-k {s['top_k']} at T={s['temperature']:g}, no repeat block and no quote touch-up (those are "
              f"the diffusion sampler's); shown with the same detokenizer and truecasing; {s['sample_tokens_per_s']:,} "
              f"tokens/s sampling with the KV cache at batch {s['batch_size']} ({s['threads']} thread(s), "
              f"{s['cpu']}). The diffusion row is first-hitting at the CLI defaults from the table above.", "",
              "| model | BLEU-4 | Self-BLEU-4 | distinct-2 | word entropy | words | sentence start | repeats a word | "
              "quotes balanced | ends a sentence | s/sample |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in (("same-budget GPT-2", s), ("default diffusion model", fh)):
            if r:
                L.append(f"| {name} | {r['bleu4']:.3f} | {r['self_bleu4']:.3f} | {r['distinct2']:.3f} | "
                         f"{r['unigram_entropy']:.3f} | {r['words_per_sample']:.1f} | {r['frac_sentence_start']:.1%} | "
                         f"{r['frac_repeat']:.1%} | {r['frac_quotes_balanced']:.1%} | {r['frac_ends_sentence']:.1%} | "
                         f"{r['seconds_per_sample']:.2f} |")
        L += ["", "Three of its samples, unedited:", ""] + [f"- {t[:300]}" for t in s["examples"][:3]] + [""]
    return L


def write_doc(a) -> None:
    tv_path = a.out / "tv.json"
    tv = json.loads(tv_path.read_text()) if tv_path.exists() else None
    rows = [json.loads(p.read_text()) for p in sorted((a.out / "frontier").glob("*.json"))]
    unscored = sorted(r["key"] for r in rows if "gen_ppl" not in r)  # drawn with --sample-only, no judge yet
    rows = [r for r in rows if "gen_ppl" in r]
    order = {k: i for i, (k, *_) in enumerate(FULL)}
    rows.sort(key=lambda r: order.get(r["key"], 99))
    from dbert_core import strategies

    doc = a.doc
    old = doc.read_text() if doc.exists() else ""
    notes = old[old.index(NOTES):] if NOTES in old else NOTES + "\n"
    def rel(path) -> str:
        try:
            return str(Path(path).resolve().relative_to(ROOT))
        except ValueError:
            return str(path)

    L = ["# Decoding strategies: exact or heuristic, and measured", "",
         "Written by `python scripts/studies/decoding.py` (see its docstring; `--doc-only` rebuilds this page from the "
         "runs under `--out`). Every strategy runs on the one frame generator (`dbert_core/sampling/sample.py`); the "
         "registry (`dbert_core/strategies.py`) names each, says whether it is exact, and gives its parameters, and "
         "`dbert sample --sampler NAME --param KEY=VALUE`, the TUI's `m` key, `--stats`, the trajectory file and "
         "`dbert bench` read it.", "",
         "| strategy | label | parameters (defaults) | what it does | what law it samples | reference |",
         "|---|---|---|---|---|---|"]
    for s in map(strategies.get, strategies.NAMES):  # the built-in strategies
        ps = ", ".join(f"{p.name}={'per schedule' if p.default is None else p.default}" for p in s.params) or "none"
        L.append(f"| `{s.name}` | {s.label} | {ps} | {s.summary} | {s.law} | {s.reference} |")
    L += ["", "Temperature, top-k, top-p and the repeat block shape only the token drawn at a revealed position; "
          "which positions a heuristic reveals is decided from the model's raw p, so a colder temperature never "
          "reorders the reveals. ReMDM's defaults are those of the paper's scripts (kuleshov-group/remdm: cap "
          "eta 0.008, rescale 0.015, loop eta 0.02 with t_on 0.55, t_off 0.05, alpha_on 0.9, at 1,024 steps on "
          "OpenWebText); the loop's alpha_on is mapped to the time at which this model's schedule leaves that "
          "fraction visible (frequency-weighted). EB-sampler's paper sweeps gamma from 1e-3 to 1; 0.1 is our "
          "default. Fast-dLLM's threshold is 0.9.", ""]
    L += ["## How far from the model's law", ""]
    if tv:
        f = tv["floor"]
        L += [f"The {tv['model']} (vocabulary {tv['vocab']}): whole sequences of {tv['length']} tokens, top-"
              f"{tv['top_k']} choices, S={tv['steps']} steps, {tv['draws']:,} draws per strategy; the reference is "
              f"`{tv['reference']}` (it produced {tv['support_reference']} distinct sequences). Noise floor: TV "
              f"between two independent `{tv['reference']}` runs of {tv['draws']:,} draws, {len(f['pairs'])} pairs: "
              f"{f['mean']:.4f} +- {f['sd']:.4f} ({', '.join(map(str, f['pairs']))}). A strategy is *outside* when "
              f"its TV exceeds {f['limit']:.4f} (the mean plus the larger of 4 standard deviations and a fifth of the "
              f"mean). {tv['seconds']} s on {tv['machine']}.", "",
              "| strategy | label | parameters | TV to the model's law | outside the floor? | distinct sequences |",
              "|---|---|---|---:|---|---:|"]
        for r in tv["rows"]:
            ps = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items()) or "-"
            L.append(f"| `{r['sampler']}` | {r['label']} | {ps} | {r['tv']:.4f} | {'**yes**' if r['outside'] else 'no'} "
                     f"| {r['support']} |")
        L += ["", "`tests/test_strategies.py::test_tv_distance_exact_within_the_floor_heuristic_outside` pins the "
              "same measurement at 3,000 draws: the exact samplers stay inside the floor and confidence ordering "
              "and parallel threshold decoding are detected outside it.", ""]
    else:
        L += ["(not run yet)", ""]
    L += ["## Quality against calls", ""]
    if unscored:
        L += [f"Drawn but not yet scored under a judge (`--judge MODEL` scores them without drawing again): "
              f"{', '.join(unscored)}.", ""]
    if rows:
        r0 = rows[0]
        stand_in = any(r.get("judge_stand_in") for r in rows)
        jinfo = ""
        sj = Path(r0["judge"]) / "stand_in.json"
        if stand_in and sj.exists():
            j = json.loads(sj.read_text())
            jinfo = (f" The judge is a **stand-in**: a {j['params'] / 1e6:.1f} M-parameter GPT-2 trained here for "
                     f"{j['steps']} steps ({j['seconds']:.0f} s) on {Path(j['data']).name} with the checkpoint's "
                     f"tokenizer, final training loss {j['final_loss']:.2f}; not the same-budget baseline the issue "
                     "asks for (item 4), so read its gen-PPL as a ranking of settings, not as a figure to compare "
                     "with papers.")
        L += [f"Checkpoint `{rel(r0['checkpoint'])}`; {r0['samples']} + {r0['samples']} samples of {r0['sample_length']} "
              f"tokens per setting (BLEU-4 on the first set against the held-out sentences, Self-BLEU-4 on the "
              f"second), top-k {r0['top_k']}, repeat block {'on' if r0['block_repeats'] else 'off'}, batch "
              f"{a.batch_size}; on {r0['machine']}. Calls per sample: the network calls that evaluated the "
              f"sample's row (a batch's call count is its slowest row's). Judge: `{rel(r0['judge'])}`.{jinfo}", ""]
        if a.preliminary:
            L += ["**Preliminary**: " + a.preliminary, ""]
        L += ["| setting | strategy | label | parameters | calls/sample | s/sample | gen-PPL | judge entropy | word "
              "entropy | BLEU-4 | Self-BLEU-4 | distinct-2 | words | doubled word | run of 3 | [MASK]/[UNK] |",
              "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            L.append(f"| {r['key']} | `{r['sampler']}` | {'exact' if r.get('sampler_exact', r.get('exact')) else 'heuristic'} | {setting(r)} | "
                     f"{r['rows_per_sample']:.1f} | {r['seconds_per_sample']:.2f} | {r['gen_ppl']:.2f} | "
                     f"{r['judge_entropy']:.3f} | {r['unigram_entropy']:.3f} | {r['bleu4']:.3f} | {r['self_bleu4']:.3f} "
                     f"| {r['distinct2']:.3f} | {r['words_per_sample']:.1f} | {r['frac_doubled_word']:.2f} | "
                     f"{r['frac_run3']:.2f} | {r['frac_mask_or_unk']:.2f} |")
        h = r0
        L += [f"| human text | held-out, {h['human_texts']} pieces of about the samples' length in words | | | | | "
              f"{h['human_gen_ppl']:.2f} | {h['human_judge_entropy']:.3f} | {h['human_unigram_entropy']:.3f} | "
              "| | | | | | |", ""]
        human = {"gen_ppl": h["human_gen_ppl"], "entropy": h["human_judge_entropy"]}
        for p in plots(rows, human, doc):
            L += [f"![{p}]({p})", ""]
        if not (doc.parent / "img" / "decoding-ppl-entropy.png").exists():
            L += ["(matplotlib is not installed: `pip install matplotlib`, then `python scripts/studies/decoding.py "
                  "--doc-only` draws gen-PPL against entropy and quality against calls.)", ""]
        L += ["### What the numbers say", ""] + [f"- {x}" for x in findings(rows)] + [""]
        L += ["A first sample of each setting:", ""]
        for r in rows:
            if r.get("examples"):
                L.append(f"- **{r['key']}**: {r['examples'][0][:300]}")
        L.append("")
    else:
        L += ["(not run yet)", ""]
    L += baseline_section(a, rows, rel)
    from dbert_core.disk.atomic import atomic_write_text

    doc.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(doc, "\n".join(L) + "\n" + notes)
    say(f"wrote {doc}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="default", help="the model of the frontier (a store name or folder) [the shipped default]")
    heldout = ROOT / "runs" / "data" / "stories-heldout.txt"  # scripts/stories_model.sh data: the default's held-out slice
    p.add_argument("--data", type=Path, default=heldout if heldout.exists() else DATA / "valid.txt",
                   help="held-out text: BLEU references and human text [the stories model's held-out slice]")
    p.add_argument("--judge", help="a Hugging Face causal LM (folder or hub id) to score the samples")
    p.add_argument("--sample-only", action="store_true",
                   help="draw and keep each setting's samples without a judge (a later run with --judge scores them)")
    p.add_argument("--train-judge", type=int, default=0, metavar="STEPS", help="without --judge: train a stand-in GPT-2 here")
    p.add_argument("--judge-data", type=Path, default=DATA / "train.txt", help="the stand-in judge's training text")
    p.add_argument("--samples", type=int, default=200, help="samples per set (two sets per setting)")
    p.add_argument("--length", type=int, default=None, help="tokens per sample [the checkpoint's training length]")
    p.add_argument("--top-k", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} settings of the frontier")
    p.add_argument("--settings", help="comma-separated frontier settings to run (default: all, or --quick's)")
    p.add_argument("--tv-draws", type=int, default=20000)
    p.add_argument("--tv-data", type=Path, default=DATA / "train.txt")
    p.add_argument("--skip", default="", help="comma-separated parts not to run: tv, frontier")
    p.add_argument("--doc-only", action="store_true", help="only rebuild the doc from the runs under --out")
    p.add_argument("--preliminary", default="", help="a line saying what this run is, shown above the table")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "decoding")
    p.add_argument("--baseline", type=Path, default=ROOT / "runs" / "ar-baseline",
                   help="the same-budget GPT-2 (scripts/studies/ar_baseline.py) whose eval.json / samples.json the doc shows")
    p.add_argument("--diffusion-eval", type=Path, default=ROOT / "runs" / "eval_stories_stories.json",
                   help="the default model's `dbert eval --json` on the same held-out sentences (its bound)")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "decoding.md")
    a = p.parse_args(argv)
    import torch

    from dbert_core.errors import DbertError

    if a.threads:
        torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        if not a.doc_only:
            skip = set(filter(None, a.skip.split(",")))
            if "tv" not in skip:
                run_tv(a)
            if "frontier" not in skip:
                if not a.judge and not a.train_judge and not a.sample_only:
                    raise DbertError("the frontier needs --judge MODEL, or --train-judge STEPS for a stand-in "
                                     "(or --sample-only)")
                run_frontier(a)
                if a.sample_only:
                    say("samples kept; run again with --judge to score them and write the doc")
                    return 0
        if a.preliminary:
            write_json(a.out / "preliminary.json", {"note": a.preliminary})
        elif (a.out / "preliminary.json").exists():
            a.preliminary = json.loads((a.out / "preliminary.json").read_text())["note"]
        write_doc(a)
    except DbertError as e:
        from dbert_core.settings import flag  # a setting named by the script's option, as dbert does

        say(f"decoding: error: {e.said(flag)}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
