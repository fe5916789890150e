"""`dbert eval`: the ELBO bound per token and per word, and with --samples the quality of
samples (BLEU-4, Self-BLEU-4, distinct-n, gen-PPL under a judge); lines for a reader or --json."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from ... import config, strategies
from ...errors import DbertError
from ...settings import flag
from .. import options
from ..options import SAMPLER, DocSep, EvalUnit, no_params, plain, renamed, with_settings
from ..streams import say

# the samples' settings of `dbert sample` (settings.SAMPLE), --steps and --length under eval's own names
# (its --steps is the ELBO's), each named in an error by eval's flag for it (SAID)
SETTINGS = {**config.SAMPLE_SETTINGS, **renamed(config.SAMPLE_SETTINGS, sample_steps="steps", sample_length="length")}
SAID = {"steps": "--sample-steps (the samples' --steps)", "length": "--sample-length (the samples' --length)"}
# --help's order: eval's own options and the samples' settings it takes
LAYOUT: dict[str | None, tuple[str, ...]] = {None: (
    "data", "checkpoint", "steps", "limit", "exact", "mc_samples", "unit", "doc_sep", "samples", "sample_steps",
    "sample_length", "top_k", "top_p", "block_repeats", "pair_quotes", "fix_contractions", "known_words", "sampler",
    "params", "temperature", "judge", "batch_size", "seed", "as_json", "device")}
AS_IN_SAMPLE = {"help": "As in `dbert sample`."}
CHANGED: dict[str, dict] = {  # those settings' help (and a default) in eval's words: they shape the samples
    "sample_steps": {"help": "Reverse steps for those samples (default: as `dbert sample`, the checkpoint's "
                             "recommendation, else 96).", "show_default": False},
    "sample_length": {"help": "Tokens per sample (default: as `dbert sample`, the checkpoint's training length; a "
                              "story model's: a window and a continuation window, 383 tokens for the shipped model; the paper: 64)."},
    "top_k": {"help": "top-k of the samples (0: off; default: as `dbert sample`, the checkpoint's recommendation, "
                      "else the paper's 30)."},
    "top_p": {"help": "Nucleus mass of the samples in (0, 1] (1: off; default: as `dbert sample`)."},
    "temperature": {"help": "Softmax temperature of the samples' token choice (default: as `dbert sample`)."},
    "sampler": {**SAMPLER, "help": "Decoding strategy of the samples, as in `dbert sample`. Default: the one the "
                                   "checkpoint recommends, else the model's fastest exact sampler."},
    "params": {"help": "A parameter of the --sampler strategy (repeatable)."},
    "block_repeats": AS_IN_SAMPLE, "pair_quotes": AS_IN_SAMPLE, "fix_contractions": AS_IN_SAMPLE,
    "known_words": AS_IN_SAMPLE,
    "batch_size": {"help": "Examples per batch."}, "seed": {"help": "Random seed.", "default": 0}}


@with_settings(SETTINGS, LAYOUT, CHANGED, rest=False)
def evaluate(
    data: Annotated[list[str], typer.Option("--data", help="Text file(s) to score: one example per line.")],
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", "-c", help="A store name (see `dbert checkpoints list`) or, with a path separator (./x, runs/x), a directory (default: the shipped model).")] = None,
    steps: Annotated[int, typer.Option(help="Step budget S of the ELBO.")] = 128,
    limit: Annotated[Optional[int], typer.Option(help="Score only the first N examples.")] = None,
    exact: Annotated[bool, typer.Option("--exact", help="Sum all S terms per example (slow).")] = False,
    mc_samples: Annotated[int, typer.Option(help="Monte-Carlo draws per example (without --exact).")] = 1,
    unit: Annotated[Optional[EvalUnit], typer.Option(help="An example is a line, a sentence, a story (a whole document, in the windows `dbert train --unit story` builds: the bound per token of text and end mark) or a window: the sentence-start windows of the checkpoint's length that `dbert train --unit sentence --pack` builds from the documents, its validation bound. Documents: <|endoftext|> lines, JSONL or blank lines, read from each file. Default: the unit the checkpoint trained on (dbert.json's unit; line where it records none), said on stderr.", show_default=False)] = None,
    doc_sep: Annotated[DocSep, typer.Option(help="What separates documents, as in `dbert train`: auto (each file's own: <|endoftext|> lines, JSONL, else blank lines), blank, eot, line (one per line) or jsonl ({\"text\": ...} per line; a line's text whatever the --unit).")] = DocSep("auto"),
    samples: Annotated[int, typer.Option(help="Also draw N samples for BLEU-4 / Self-BLEU-4 / distinct-n.")] = 0,
    judge: Annotated[Optional[str], typer.Option(metavar="MODEL", help="Also score the samples and as much held-out --data text under this Hugging Face causal LM (a local folder or a hub id such as gpt2-large; safetensors only, no remote code): gen-PPL and unigram entropy.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    **declared,  # the samples' settings, --batch-size, --seed and --device (SETTINGS: options.with_settings)
):
    """ELBO perplexity (per token and per word) and, with --samples, BLEU-4 / Self-BLEU-4 (and gen-PPL with --judge).

    Example: dbert eval --data held-out.txt --unit sentence --limit 200 --samples 20 --json
    """
    from ...evaluation.metrics import trained_unit

    decoding = plain(declared)  # the samples' settings, as quality() names them
    device, param, batch_size, seed = (decoding.pop(k) for k in ("device", "params", "batch_size", "seed"))
    sample_steps, sample_length = decoding.pop("sample_steps"), decoding.pop("sample_length")
    params = _checked(limit=limit, samples=samples, batch_size=batch_size, steps=steps, mc_samples=mc_samples,
                      sample_steps=sample_steps, sample_length=sample_length, top_k=decoding["top_k"],
                      top_p=decoding["top_p"], seed=seed, judge=judge, sampler=decoding["sampler"], param=param,
                      temperature=decoding["temperature"])
    db = options.load(checkpoint, device)
    note = None
    if unit is None:
        trained, why = trained_unit(db.meta)
        unit = EvalUnit(trained)
        note = f"dbert: note: scored by {trained}: {why} (--unit chooses)"  # said once the scores stand: an error is one line
    scored = _scored(db, data, steps=steps, limit=limit, exact=exact, mc=mc_samples, batch_size=batch_size,
                     seed=seed, unit=unit.value, doc_sep=doc_sep.value)
    if note:
        say(note)
    result = {"checkpoint": str(db.path), **scored}
    if samples:
        from ...evaluation.metrics import quality
        from ...sampling.sample import default_length
        from ...sampling.settings import default_decoding
        from ..progress import SampleProgress

        # a long story's frames count steps on across its windows: the line says the window and the step in it
        per_window = sample_steps if sample_steps is not None else default_decoding(db)["steps"]
        sampling = SampleProgress(2 * samples, batch_size, per_window=per_window)
        length = sample_length if sample_length is not None else default_length(db)
        result.update(quality(db, data, samples, steps=sample_steps, length=length, batch_size=batch_size, seed=seed,
                              unit=unit.value, params=params, judge=judge, on_frame=sampling, doc_sep=doc_sep.value,
                              **decoding))
        sampling.close()
    if as_json:
        print(json.dumps(result))
    else:
        for line in eval_lines(result):
            print(line)


def _checked(*, limit, samples, batch_size, steps, mc_samples, sample_steps, sample_length, top_k, top_p, seed,
             judge, sampler, param, temperature) -> dict | None:
    """The options of `dbert eval` checked before the checkpoint loads (one line for the first bad
    one, the judge's folder included); the --sampler's parameters returned, parsed (None without it). The samples'
    settings are checked as `dbert sample` checks them (SampleConfig.validate: their declared
    ranges), whether or not --samples asks for them: never silently unused."""
    if limit is not None and limit < 1:
        raise DbertError("--limit must be >= 1")
    if samples < 0:
        raise DbertError("--samples must be >= 0")
    for option, value in (("--steps", steps), ("--mc-samples", mc_samples)):
        if value < 1:
            raise DbertError(f"{option} must be >= 1, got {value}")
    if judge is not None and not samples:
        raise DbertError("--judge scores samples: give --samples N")
    if judge is not None:
        from ...evaluation.judge import check_judge

        check_judge(judge)  # missing, empty or not a causal LM: before the scoring and sampling
    params = strategies.parse_params(sampler, param) if sampler else no_params(param)
    try:
        config.SampleConfig(steps=sample_steps, length=sample_length, batch_size=batch_size, seed=seed,
                            sampler=sampler, params=params, temperature=temperature, top_k=top_k, top_p=top_p).validate()
    except DbertError as e:  # a setting named by eval's flag for it: the samples' steps are --sample-steps
        raise DbertError(e.said(lambda name: SAID.get(name, flag(name)))) from None
    return params


def _scored(db, data: list[str], *, batch_size: int, **how) -> dict:
    """The ELBO of the --data examples (metrics.perplexity, its progress on stderr, and the token
    cache's where it tokenizes the files; `how` its keywords), its document counts said on stderr; a
    bound that is not finite is refused."""
    import math

    from ...evaluation.metrics import perplexity
    from ..progress import CacheProgress, CountProgress

    scoring = CountProgress(1, batch_size, label="scoring")

    def counted(done: int, total: int) -> None:
        scoring.total = total
        scoring.update(done)

    try:
        scored = perplexity(db, data, batch_size=batch_size, progress=counted, report=CacheProgress(), **how)
    except OverflowError:  # math.exp of a bound past ~709 nats per token
        scored = {"nats_per_token": math.inf}
    finally:
        scoring.close()
    if "documents" in scored:
        say(f"{scored['documents']:,} documents, median {scored['document_words_median']:,} words, "
            f"longest {scored['document_words_longest']:,}")
    if "documents_warning" in scored:
        say(scored["documents_warning"])
    bad = [k for k, v in scored.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:  # a score of inf or NaN is no answer: the weights' outputs overflow
        raise DbertError(f"the checkpoint's scores are not finite ({', '.join(bad)}): its outputs overflow "
                         "(weights far too large, or a diverged run)")
    return scored


def eval_lines(result: dict) -> list[str]:
    """`dbert eval` for a reader: the bounds with their 95% intervals and what they mean, then
    every figure by name (--json gives the same figures as one object)."""
    import math

    out = []
    if "ppl_token" in result:
        for unit in ("token", "word"):
            ppl, se = result[f"ppl_{unit}"], result[f"nats_per_{unit}_se"]
            lo, hi = math.exp(math.log(ppl) - 1.96 * se), math.exp(math.log(ppl) + 1.96 * se)
            out.append(f"{'perplexity per ' + unit:>22}  <= {ppl:.2f}  (95%: {lo:.2f} to {hi:.2f})")
        out.append(f"{'':>22}  upper bounds: the {result['steps']}-step ELBO of {result['examples']} examples; "
                   "the model's true perplexity is lower")
    for key, value in result.items():
        if isinstance(value, dict):
            value = json.dumps(value)
        out.append(f"{key:>22}  {value:.4f}" if isinstance(value, float) else f"{key:>22}  {value}")
    return out
