"""The `dbert` command. stdout carries data only; progress and messages go to stderr.

Heavy imports (torch, transformers) happen inside the commands, so `dbert --help` is instant.
An expected failure (bad file, bad option, bad checkpoint) prints one line and exits 2.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import config, strategies
from .errors import DbertError, Interrupted

def flags_without_type() -> None:
    """Help lists a flag (--lowercase, --block-repeats/--allow-repeats, --help) without a `<bool>`
    type column: it takes no value."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "dbert", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.dbert = True
    TyperOption.display_type_rich = display_type_rich


flags_without_type()
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="DiffusionBERT: train, sample and evaluate text diffusion models.")
checkpoints_app = typer.Typer(no_args_is_help=True, help="List and manage stored checkpoints.")
app.add_typer(checkpoints_app, name="checkpoints")


def _choice(name: str, values: tuple[str, ...]) -> type[Enum]:
    """A Typer option type built from one of config's tuples of choices."""
    return Enum(name, [(v.replace("-", "_"), v) for v in values], type=str)


Schedule = _choice("Schedule", config.SCHEDULES)
Time = _choice("Time", config.TIME_MODES)
Device = _choice("Device", config.DEVICES)
Sampler = _choice("Sampler", config.STRATEGIES)
Unit = _choice("Unit", config.UNITS)
EvalUnit = _choice("EvalUnit", config.EVAL_UNITS)
DocSep = _choice("DocSep", config.DOC_SEPS)
Loss = _choice("Loss", config.LOSSES)
Decay = _choice("Decay", config.DECAYS)
Dtype = _choice("Dtype", config.DTYPES)
Preset = _choice("Preset", config.PRESETS)
TRAIN = config.TrainConfig(data=[], out="")  # the defaults the options below show
SAMPLE = config.SampleConfig()
TOPK = 5  # candidates recorded per reveal in a --trajectory file (the token inspector shows them)


def say(message: str) -> None:
    """A message for the user: stderr, never stdout; made safe to show (display.safe_text: no
    escape codes from a checkpoint or URL reach the terminal). A closed or failing stderr loses
    the message but never fails the command."""
    from .display import safe_text

    try:
        print(safe_text(message, MAX_LINE), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


MAX_LINE = 2000  # characters of one message line; a longer one keeps its start and end


def _version(value: bool):
    if value:
        from . import __version__

        print(f"dbert {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                 help="Print the version and exit.")] = False):
    pass


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the command line gave the option `name` (not its default)."""
    return getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")


def _device(gpu: bool, device: Device) -> str:
    return "cuda" if gpu else device.value


def _load(checkpoint: str | None, device: str):
    from .storage import checkpoint as ckpt
    from .storage.store import resolve
    from .hardware import pick_device

    return ckpt.load(resolve(checkpoint), device=pick_device(device))


# ---------------------------------------------------------------------------------- train
@app.command()
def train(
    ctx: typer.Context,
    out: Annotated[str, typer.Option(help="Output checkpoint: a bare NAME goes to the store; anything with a path separator (./x, runs/x) is a directory.")] = ...,
    data: Annotated[Optional[list[str]], typer.Option("--data", help="Training text files or globs (repeatable; recorded as absolute paths; with --resume: the checkpoint's, or the same files moved).", rich_help_panel="Data")] = None,
    val_data: Annotated[Optional[list[str]], typer.Option(help="Held-out files (default: a slice of --data).", rich_help_panel="Data")] = TRAIN.val_data,
    unit: Annotated[Unit, typer.Option(help="An example is a line, a sentence, or a story: a whole document in windows that end with its end (--seq-len tokens; longer ones continue with earlier text as context).", rich_help_panel="Data")] = Unit(TRAIN.unit),
    doc_sep: Annotated[DocSep, typer.Option(help="What separates documents: auto (each file's own: <|endoftext|> lines, JSONL, else blank lines), blank, eot, line (one per line) or jsonl ({\"text\": ...} per line).", rich_help_panel="Data")] = DocSep(TRAIN.doc_sep),
    story_context: Annotated[Optional[int], typer.Option(help="With --unit story: tokens of earlier text a continuation window carries (default: half of --seq-len).", rich_help_panel="Data")] = TRAIN.story_context,
    pack: Annotated[bool, typer.Option(help="Join examples with [SEP] into full-length sequences.", rich_help_panel="Data")] = TRAIN.pack,
    seq_len: Annotated[int, typer.Option(help="Content tokens per example.", rich_help_panel="Data")] = TRAIN.seq_len,
    short_windows: Annotated[float, typer.Option(help="With --unit sentence --pack: this fraction of windows get a room drawn from 1..--seq-len, so some hold one sentence alone (BERT keeps 10% of sequences short).", rich_help_panel="Data")] = TRAIN.short_windows,
    preset: Annotated[Preset, typer.Option(help="Model size for a random init.", rich_help_panel="Model")] = Preset(TRAIN.preset),
    init: Annotated[Optional[str], typer.Option(help="Start from a pretrained BERT (path or hub id).", rich_help_panel="Model")] = TRAIN.init,
    from_scratch: Annotated[bool, typer.Option("--from-scratch", help="With --init: its architecture and tokenizer, random weights.", rich_help_panel="Model")] = TRAIN.from_scratch,
    trim_vocab: Annotated[bool, typer.Option("--trim-vocab", help="With --init: keep only the word pieces the training data uses (faster).", rich_help_panel="Model")] = TRAIN.trim_vocab,
    vocab_size: Annotated[Optional[int], typer.Option(help="WordPiece size learnt from the data (presets).", rich_help_panel="Model")] = TRAIN.vocab_size,
    dropout: Annotated[Optional[float], typer.Option(help="Override the model's dropout rates.", rich_help_panel="Model")] = TRAIN.dropout,
    schedule: Annotated[Schedule, typer.Option(help="Noise schedule.", rich_help_panel="Diffusion")] = Schedule(TRAIN.schedule),
    lam: Annotated[float, typer.Option("--lambda", help="Spindle strength (0..1/pi).", rich_help_panel="Diffusion")] = TRAIN.lam,
    T: Annotated[int, typer.Option("--T", help="Diffusion steps of the forward process.", rich_help_panel="Diffusion")] = TRAIN.T,
    time: Annotated[Time, typer.Option(help="Time conditioning.", rich_help_panel="Diffusion")] = Time(TRAIN.time),
    loss: Annotated[Loss, typer.Option(help="hybrid (ELBO + 0.01 CE, the paper's), elbo, or ce.", rich_help_panel="Diffusion")] = Loss(TRAIN.loss),
    max_steps: Annotated[int, typer.Option(help="Optimizer steps.", rich_help_panel="Optimization")] = TRAIN.max_steps,
    batch_size: Annotated[int, typer.Option(help="Examples per optimizer step (all processes).", rich_help_panel="Optimization")] = TRAIN.batch_size,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per optimizer step.", rich_help_panel="Optimization")] = TRAIN.grad_accum,
    lr: Annotated[float, typer.Option(help="Peak learning rate.", rich_help_panel="Optimization")] = TRAIN.lr,
    warmup: Annotated[int, typer.Option(help="Warm-up steps.", rich_help_panel="Optimization")] = TRAIN.warmup,
    decay: Annotated[Decay, typer.Option(help="LR after warm-up.", rich_help_panel="Optimization")] = Decay(TRAIN.decay),
    seed: Annotated[int, typer.Option(help="Random seed.", rich_help_panel="Optimization")] = TRAIN.seed,
    eval_every: Annotated[int, typer.Option(help="Validation ELBO every N steps (0: never).", rich_help_panel="Evaluation and checkpoints")] = TRAIN.eval_every,
    eval_steps: Annotated[Optional[int], typer.Option(help="Step budget of the validation ELBO (default: min(128, T)).", rich_help_panel="Evaluation and checkpoints")] = TRAIN.eval_steps,
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps (0: only at the end).", rich_help_panel="Evaluation and checkpoints")] = TRAIN.save_every,
    log_every: Annotated[int, typer.Option(help="Progress line every N steps (non-terminal stderr).", rich_help_panel="Evaluation and checkpoints")] = TRAIN.log_every,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run saved in --out exactly (its own settings; only --max-steps, --eval-every, --save-every, --log-every, --device and --dtype may change; --data / --val-data again only for the same files moved elsewhere, checked by size and hash).", rich_help_panel="Evaluation and checkpoints")] = False,
    gpu: Annotated[bool, typer.Option("--gpu", help="Train on CUDA; an error if there is none.", rich_help_panel="Hardware")] = False,
    device: Annotated[Device, typer.Option(help="Where to train.", rich_help_panel="Hardware")] = Device(TRAIN.device),
    dtype: Annotated[Dtype, typer.Option(help="auto (bf16 autocast where native: CUDA, CPUs with AVX512-BF16/AMX), fp32 or bf16.", rich_help_panel="Hardware")] = Dtype(TRAIN.dtype),
):
    """Train a DiffusionBERT on your text files (stdout stays empty).

    Example: dbert train --data stories.txt --unit sentence --preset tiny --max-steps 300 --lr 3e-3 --out tiny
    """
    from .config import TrainConfig
    from .text.data import absolute_patterns
    from .training.prepare import resume_config
    from .progress import TrainProgress
    from .storage.store import out_path
    from .training.train import Trainer

    # The options are named after TrainConfig's fields, so the config is built from them as they are.
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"out", "resume"}
    values = {k: v.value if isinstance(v, Enum) else v for k, v in ctx.params.items() if k in fields}
    values.update(data=absolute_patterns(data), val_data=absolute_patterns(val_data),  # a run resumes from anywhere
                  preset=None if init else preset.value, device=_device(gpu, device))
    if init is not None and _given(ctx, "preset"):
        raise DbertError("--preset and --init both choose the model; give one of them")
    target = str(out_path(out))
    if resume:  # the checkpoint's own config, changed only where the command line says so
        given = {k for k in fields if _given(ctx, k)} | ({"device"} if _given(ctx, "gpu") else set())
        if "init" in given:
            given.add("preset")
        cfg = resume_config(target, **{k: values[k] for k in given})
    else:
        if not data:
            raise DbertError("--data is required (a text file, or several)")
        cfg = TrainConfig(out=target, **values)
    trainer = Trainer(cfg, [TrainProgress(cfg.log_every)])
    result = trainer.run()
    if result.get("stopped"):
        say(f"stopped at step {trainer.step}; checkpoint saved in {cfg.out} (continue with --resume)")
        raise typer.Exit(130)


# ---------------------------------------------------------------------------------- sample
@app.command()
def sample(
    prompt_arg: Annotated[Optional[str], typer.Argument(metavar="[PROMPT]", show_default=False, help="A prompt template with [MASK] slots (\"Once upon a time [MASK*20]\"), or - to read prompts from stdin, one per line.")] = None,
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", "-c", help="A store name (see `dbert checkpoints list`) or, with a path separator (./x, runs/x), a directory (default: the shipped model).")] = None,
    n: Annotated[int, typer.Option("--n", "-n", help="Number of samples (lines on stdout), for each prompt.")] = SAMPLE.n,
    steps: Annotated[int, typer.Option(help="Reverse steps S (1..T).")] = SAMPLE.steps,
    temperature: Annotated[float, typer.Option(help="Softmax temperature of the token choice (0: greedy, the most likely token).")] = SAMPLE.temperature,
    top_k: Annotated[int, typer.Option(help="Keep the k most likely tokens (0: off).")] = SAMPLE.top_k,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass in (0, 1].")] = SAMPLE.top_p,
    length: Annotated[Optional[int], typer.Option(help="Tokens per sample (default: the checkpoint's training length: 128 for the shipped model).")] = SAMPLE.length,
    batch_size: Annotated[int, typer.Option(help="Samples per network call.")] = SAMPLE.batch_size,
    seed: Annotated[Optional[int], typer.Option(help="Random seed: the same seed gives the same output (default: a fresh one, written to --output).")] = SAMPLE.seed,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Template with [MASK] slots ([MASK*N]: N of them; [MASK*A-B]: A to B tokens, see --candidates); masks are appended up to --length.")] = SAMPLE.prompt,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", help="Prompts from a file, one per line (- : stdin); --n samples each.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Also write the samples to this JSON Lines file: text, prompt, seed and settings per sample.")] = None,
    sampler: Annotated[Optional[Sampler], typer.Option(help="Decoding strategy. " + strategies.help_text() + ". Default: first-hitting where the model allows it, else ancestral.")] = None,
    param: Annotated[Optional[list[str]], typer.Option("--param", metavar="NAME=VALUE", help="A parameter of the --sampler strategy (repeatable), e.g. --param tau=0.8.")] = None,
    block_repeats: Annotated[bool, typer.Option("--block-repeats/--allow-repeats", help="Never draw a token equal to an already revealed neighbour (no \"there there\"); --allow-repeats samples the model's own distribution.")] = SAMPLE.block_repeats,
    pair_quotes: Annotated[bool, typer.Option("--pair-quotes/--unpaired-quotes", help="Refill the quote marks that pair with none (quotes excluded) after sampling; --unpaired-quotes prints the model's own quotes.")] = SAMPLE.pair_quotes,
    fix_contractions: Annotated[bool, typer.Option("--fix-contractions/--raw-contractions", help="Refill the contractions English does not write (\"you't\", \"friends's\"; apostrophes excluded) after sampling; --raw-contractions prints the model's own.")] = SAMPLE.fix_contractions,
    lowercase: Annotated[bool, typer.Option("--lowercase", help="Print the model's raw lower-case words (no truecasing; a prompt's words stay as typed).")] = False,
    stats: Annotated[bool, typer.Option("--stats", help="Print {nfe, rows, gflop, seconds, samples, steps, sampler, exact, params} as JSON on stderr.")] = False,
    trajectory: Annotated[Optional[Path], typer.Option(help="Also write every frame of the run to this JSON file (one batch: --n <= --batch-size; format in dbert_core/sampling/trajectory.py).")] = None,
    device: Annotated[Device, typer.Option(help="auto, cpu, cuda or mps.")] = Device(SAMPLE.device),
    dtype: Annotated[Dtype, typer.Option(help="The network's precision: auto (bf16 where native: CUDA, CPUs with AVX512-BF16/AMX; draws stay float64), fp32 or bf16.")] = Dtype(SAMPLE.dtype),
    candidates: Annotated[int, typer.Option(help="Infill ([MASK*A-B] in the prompt): texts drawn for each length; all are ranked by the model's ELBO per token and the best --n printed, their scores on stderr.")] = 4,
):
    """Generate N samples, one per line on stdout; a story start inside a sample reads " ¶ ".

    Example: dbert sample "Once upon a time [MASK*20]" -n 3 --seed 1 -o stories.jsonl
    """
    from .text.detok import STORY_BREAK
    from .progress import SampleProgress
    from .sampling.sample import generate, resolve

    prompts = _prompts(prompt_arg, prompt, prompt_file)
    cfg = config.SampleConfig(n=n, steps=steps, temperature=temperature, top_k=top_k, top_p=top_p, length=length,
                              sampler=sampler.value if sampler else None, batch_size=batch_size, seed=seed,
                              params=strategies.parse_params(sampler.value, param) if sampler else _no_params(param),
                              device=device.value, prompt=None, block_repeats=block_repeats,
                              pair_quotes=pair_quotes, fix_contractions=fix_contractions,
                              dtype=dtype.value).validate()
    from .sampling.infill import has_range

    if trajectory is not None and any(has_range(p) for p in prompts):
        raise DbertError("--trajectory records one batch; an infill prompt ([MASK*A-B]) runs one per length")
    if trajectory is not None:
        if cfg.n > cfg.batch_size or len(prompts) > 1:
            raise DbertError("--trajectory records one batch: give --n <= --batch-size and one prompt")
        from .disk.layout import check_output

        check_output(trajectory, "--trajectory")  # before the run, not after it
    if output is not None:
        from .disk.layout import check_output

        check_output(output, "--output")
    if cfg.seed is None:  # drawn once here, so --output can say which seed made each sample
        import random

        cfg = replace(cfg, seed=random.SystemRandom().randrange(config.MAX_SEED))
    db = _load(checkpoint, cfg.device)
    from .sampling.preflight import check_sample

    check_sample(db, cfg, prompts, candidates)  # every prompt, infill length and batch, before the first step
    kept: list = []
    try:
        STORY_BREAK.encode(sys.stdout.encoding or "utf-8")
        paragraph = STORY_BREAK
    except (UnicodeEncodeError, LookupError):
        paragraph = " | "  # a terminal or pipe that cannot show the pilcrow
    from .sampling.infill import variants
    from .sampling.sample import prompt_notes

    for p in dict.fromkeys(x for x in prompts if x is not None):
        for note in prompt_notes(db, variants(p)[0][1] if has_range(p) else p):
            say(f"dbert: note: {note}" + (f" ({p[:40]!r})" if len(prompts) > 1 else ""))
    progress = SampleProgress(cfg.n * len(prompts), cfg.batch_size)
    texts, records, st = [], [], None

    def on_frame(frame):
        progress(frame)
        if trajectory is not None:
            kept.append(frame)

    for p in prompts:
        run = replace(cfg, prompt=p)
        if has_range(p):
            got = _infill(db, run, candidates, not lowercase, paragraph, records)
            texts.extend(got)
            continue
        resolved = resolve(run, db)
        got, st_p = generate(db, resolved, on_frame=on_frame, cased=not lowercase, paragraph=paragraph,
                             topk=TOPK if trajectory is not None else 0)
        texts.extend(got)
        records.extend({"text": t, "prompt": p, "index": i, "seed": cfg.seed, "checkpoint": str(db.path),
                        "settings": {k: getattr(resolved, k) for k in ("steps", "temperature", "top_k", "top_p", "length",
                                                                       "sampler", "params", "block_repeats", "dtype")},
                        "stats": st_p} for i, t in enumerate(got))
        st = st_p if st is None else {k: (st[k] + st_p[k] if k in ("nfe", "rows", "gflop", "seconds", "samples") else st_p[k])
                                      for k in st_p}
    progress.close()
    if trajectory is not None:
        from .disk.layout import atomic_write_text
        from .sampling.trajectory import trajectory as as_json

        atomic_write_text(trajectory, json.dumps(as_json(db, resolve(replace(cfg, prompt=prompts[0]), db), kept)) + "\n")
    if output is not None:
        from .disk.layout import atomic_write_text

        atomic_write_text(output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    for t in texts:  # a line at a time: one giant write to a pipe whose reader left can end "successfully"
        sys.stdout.write(t.replace("\n", " ") + "\n")
    sys.stdout.flush()
    if stats:
        say(json.dumps(st))


def _infill(db, cfg, candidates: int, cased: bool, paragraph: str, records: list) -> list[str]:
    """An infill prompt ([MASK*A-B]): every length drawn `candidates` times, ranked by ELBO per
    token (infill.py); the best cfg.n texts returned, their scores on stderr and in records."""
    from .sampling.infill import infill
    from .sampling.sample import resolve

    ranked = infill(db, resolve(cfg, db), per_length=candidates, cased=cased, paragraph=paragraph)
    best = ranked[:cfg.n]
    if len(best) < cfg.n:  # the same text drawn twice is kept once
        say(f"dbert: note: only {len(best)} different texts among those drawn for --n {cfg.n}; "
            "raise --candidates for more")
    for i, c in enumerate(best):
        say(f"dbert: infill #{i + 1}: {c.score:.4f} nats/token, lengths {','.join(map(str, c.lengths))}, "
            f"{c.tokens} tokens")
        records.append({"text": c.text, "prompt": cfg.prompt, "index": i, "seed": cfg.seed, "checkpoint": str(db.path),
                        "infill": c.record()})
    return [c.text for c in best]


def _no_params(param: list[str] | None) -> None:
    if param:
        raise DbertError("--param needs --sampler (the default sampler has no parameters)")
    return None


def _prompts(arg: str | None, option: str | None, file: Path | None) -> list[str | None]:
    """The prompts of a `dbert sample` run: the positional one, --prompt, or --prompt-file / - (stdin,
    one per line, blank lines skipped); [None] for an unconditional run."""
    given = [x for x in (arg, option, file) if x is not None]
    if len(given) > 1:
        raise DbertError("give one prompt source: PROMPT, --prompt or --prompt-file")
    if file is not None or arg == "-":
        from .sampling.prompt import prompt_lines

        if arg == "-" or str(file) == "-":
            raw = getattr(sys.stdin, "buffer", None)  # the bytes; a text stream without one (a test's StringIO) as text
            return prompt_lines(raw.read() if raw is not None else
                                sys.stdin.read().encode("utf-8", "surrogateescape"), "stdin")
        try:
            return prompt_lines(Path(file).read_bytes(), f"--prompt-file {file}")
        except OSError as e:
            raise DbertError(f"cannot read --prompt-file {file}: {e.strerror}") from None
    return [arg if arg is not None else option]


# ---------------------------------------------------------------------------------- eval
@app.command("eval")
def evaluate(
    data: Annotated[list[str], typer.Option("--data", help="Text file(s) to score: one example per line.")],
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", "-c", help="A store name (see `dbert checkpoints list`) or, with a path separator (./x, runs/x), a directory (default: the shipped model).")] = None,
    steps: Annotated[int, typer.Option(help="Step budget S of the ELBO.")] = 128,
    limit: Annotated[Optional[int], typer.Option(help="Score only the first N examples.")] = None,
    exact: Annotated[bool, typer.Option("--exact", help="Sum all S terms per example (slow).")] = False,
    mc_samples: Annotated[int, typer.Option(help="Monte-Carlo draws per example (without --exact).")] = 1,
    unit: Annotated[EvalUnit, typer.Option(help="An example is a line, a sentence, a story (a whole document, in the windows `dbert train --unit story` builds: the bound per token of text and end mark) or a window: the sentence-start windows of the checkpoint's length that `dbert train --unit sentence --pack` builds from the documents, its validation bound. Documents: <|endoftext|> lines, JSONL or blank lines, read from each file.")] = EvalUnit.line,
    samples: Annotated[int, typer.Option(help="Also draw N samples for BLEU-4 / Self-BLEU-4 / distinct-n.")] = 0,
    sample_steps: Annotated[int, typer.Option(help="Reverse steps for those samples.")] = SAMPLE.steps,
    sample_length: Annotated[Optional[int], typer.Option(help="Tokens per sample (default: the checkpoint's training length, as `dbert sample`; the paper: 64).")] = None,
    top_k: Annotated[int, typer.Option(help="top-k of the samples (the paper: 30).")] = SAMPLE.top_k,
    block_repeats: Annotated[bool, typer.Option("--block-repeats/--allow-repeats", help="As in `dbert sample`.")] = SAMPLE.block_repeats,
    pair_quotes: Annotated[bool, typer.Option("--pair-quotes/--unpaired-quotes", help="As in `dbert sample`.")] = SAMPLE.pair_quotes,
    fix_contractions: Annotated[bool, typer.Option("--fix-contractions/--raw-contractions", help="As in `dbert sample`.")] = SAMPLE.fix_contractions,
    sampler: Annotated[Optional[Sampler], typer.Option(help="Decoding strategy of the samples, as in `dbert sample`. Default: the model's fastest exact sampler.")] = None,
    param: Annotated[Optional[list[str]], typer.Option("--param", metavar="NAME=VALUE", help="A parameter of the --sampler strategy (repeatable).")] = None,
    temperature: Annotated[float, typer.Option(help="Softmax temperature of the samples' token choice.")] = SAMPLE.temperature,
    judge: Annotated[Optional[str], typer.Option(metavar="MODEL", help="Also score the samples and as much held-out --data text under this Hugging Face causal LM (a local folder or a hub id such as gpt2-large; safetensors only, no remote code): gen-PPL and unigram entropy.")] = None,
    batch_size: Annotated[int, typer.Option(help="Examples per batch.")] = 32,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    device: Annotated[Device, typer.Option(help="auto, cpu, cuda or mps.")] = Device.auto,
):
    """ELBO perplexity (per token and per word) and, with --samples, BLEU-4 / Self-BLEU-4 (and gen-PPL with --judge).

    Example: dbert eval --data held-out.txt --unit sentence --limit 200 --samples 20 --json
    """
    from .evaluation.metrics import perplexity, quality

    if limit is not None and limit < 1:
        raise DbertError("--limit must be >= 1")
    if samples < 0:
        raise DbertError("--samples must be >= 0")
    if batch_size < 1:
        raise DbertError("--batch-size must be >= 1")
    for option, value, lo, what in (("--steps", steps, 1, ""), ("--mc-samples", mc_samples, 1, ""),
                                    ("--sample-steps", sample_steps, 1, " (the samples' --steps)"),
                                    ("--sample-length", sample_length, 1, " (the samples' --length)"),
                                    ("--top-k", top_k, 0, "")):
        if value is not None and value < lo:  # checked whether or not --samples asks for them: never silently unused
            raise DbertError(f"{option} must be >= {lo}{what}, got {value}")
    if not 0 <= seed <= config.MAX_SEED:
        raise DbertError(f"--seed must be in [0, {config.MAX_SEED}], got {seed}")
    if judge is not None and not samples:
        raise DbertError("--judge scores samples: give --samples N")
    if judge is not None:
        from .evaluation.judge import check_judge

        check_judge(judge)  # missing, empty or not a causal LM: before the scoring and sampling
    params = strategies.parse_params(sampler.value, param) if sampler else _no_params(param)
    config.SampleConfig(sampler=sampler.value if sampler else None, params=params, temperature=temperature).validate()
    import math

    from .progress import CountProgress, SampleProgress

    db = _load(checkpoint, device.value)
    scoring = CountProgress(1, batch_size, label="scoring")

    def counted(done: int, total: int) -> None:
        scoring.total = total
        scoring.update(done)

    try:
        scored = perplexity(db, data, steps=steps, limit=limit, exact=exact, mc=mc_samples, batch_size=batch_size,
                            seed=seed, unit=unit.value, progress=counted)
    except OverflowError:  # math.exp of a bound past ~709 nats per token
        scored = {"nats_per_token": math.inf}
    finally:
        scoring.close()
    if "documents" in scored:
        say(f"{scored['documents']:,} documents, median {scored['document_words_median']:,} words, "
            f"longest {scored['document_words_longest']:,}")
    bad = [k for k, v in scored.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:  # a score of inf or NaN is no answer: the weights' outputs overflow
        raise DbertError(f"the checkpoint's scores are not finite ({', '.join(bad)}): its outputs overflow "
                         "(weights far too large, or a diverged run)")
    result = {"checkpoint": str(db.path), **scored}
    if samples:
        sampling = SampleProgress(2 * samples, batch_size)
        from .sampling.sample import default_length

        length = sample_length if sample_length is not None else default_length(db)
        result.update(quality(db, data, samples, steps=sample_steps, length=length, top_k=top_k,
                              batch_size=batch_size, seed=seed, unit=unit.value, block_repeats=block_repeats,
                              sampler=sampler.value if sampler else None, params=params, temperature=temperature,
                              judge=judge, on_frame=sampling, pair_quotes=pair_quotes,
                              fix_contractions=fix_contractions))
        sampling.close()
    if as_json:
        print(json.dumps(result))
    else:
        for line in eval_lines(result):
            print(line)


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


# ---------------------------------------------------------------------------------- checkpoints
@checkpoints_app.command("list")
def checkpoints_list(as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False):
    """Stored checkpoints (the shipped default first) and the store's location.

    Example: dbert checkpoints list --json
    """
    from .storage.store import entries, store_dir, tui_checkpoint

    rows = entries()
    in_tui = tui_checkpoint()
    in_tui = in_tui.resolve() if in_tui is not None else (rows[0].path.resolve() if rows else None)

    def used(e) -> bool:
        try:
            return in_tui is not None and e.path.resolve() == in_tui
        except OSError:
            return False

    if as_json:
        for e in rows:
            row = {"name": e.name, "path": str(e.path), "size": e.size, "tui": used(e)}
            row.update({"broken": e.broken} if e.broken else {"parameters": e.parameters, "schedule": e.schedule,
                                                               "time": e.time, "created": e.created, "step": e.step,
                                                               "val_ppl_token": e.val_ppl})
            print(json.dumps(row))
        return
    for line in list_lines(rows, used):
        print(line)
    say(f"store: {store_dir()}  (* the TUI's checkpoint; paths and settings: --json)")


def list_lines(rows, used, width: int = 80) -> list[str]:
    """`dbert checkpoints list` as a table that fits `width` columns: name, size, parameters (as the
    TUI counts them), steps, the last validation bound, the day it was created; * marks the TUI's."""
    from .storage.store import human_size

    fixed = 2 + 9 + 8 + 7 + 9 + 11  # mark, SIZE, PARAMS, STEPS, VAL PPL, CREATED with their gaps
    labels = [e.label for e in rows]
    name_w = max(4, min(max((len(x) for x in labels), default=4), width - fixed - 1))

    def cut(text: str) -> str:
        return text if len(text) <= name_w else text[:name_w - 1] + "…"

    out = [f"  {'NAME':<{name_w}} {'SIZE':>8} {'PARAMS':>7} {'STEPS':>6} {'VAL PPL':>8} {'CREATED':<10}"]
    for e, label in zip(rows, labels):
        mark = "* " if used(e) else "  "
        if e.broken:  # a bad entry is a row saying why, never a crash
            out.append(f"{mark}{cut(label):<{name_w}} {human_size(e.size):>8} broken: {e.broken}"[:width])
            continue
        params = f"{e.parameters / 1e6:.2f}M" if e.parameters else "?"
        steps = f"{e.step:,}" if isinstance(e.step, int) else "-"
        val = f"{e.val_ppl:.1f}" if e.val_ppl is not None else "-"
        out.append(f"{mark}{cut(label):<{name_w}} {human_size(e.size):>8} {params:>7} {steps:>6} {val:>8} "
                   f"{(e.created or '?')[:10]:<10}")
    return out


class _FetchProgress:
    """Download progress on stderr: a live bar on a terminal, a few plain lines otherwise."""

    def __init__(self):
        try:
            self.live = sys.stderr.isatty()
        except (OSError, ValueError):
            self.live = False
        self.last = -1

    def __call__(self, done: int, total: int | None, what: str) -> None:
        from .storage.store import human_size

        pct = int(100 * done / total) if total else None
        if self.live:
            shown = f"{pct:3d}%" if pct is not None else ""
            self._write(f"\r{what} {human_size(done):>9} {shown}")
        elif pct is not None and pct // 25 != self.last:
            self.last = pct // 25
            say(f"{what} {human_size(done)} ({pct}%)")

    def close(self) -> None:
        if self.live:
            self._write("\n")

    def _write(self, text: str) -> None:
        try:  # progress only: a failing stderr never fails the download
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            self.live = False


@checkpoints_app.command("fetch")
def checkpoints_fetch(
    source: Annotated[str, typer.Argument(metavar="REPO_ID_OR_URL", help="Hub repo id (user/model) or an https URL to a .tar.gz/.zip.")],
    revision: Annotated[Optional[str], typer.Option(help="Hub branch, tag or commit to pin.")] = None,
    name: Annotated[Optional[str], typer.Option(help="Store name (default: the repo's or archive's name).")] = None,
):
    """Download a checkpoint into the store; prints its path on stdout.

    Example: dbert checkpoints fetch user/my-dbert --name my-dbert
    """
    from .storage.fetch import fetch

    if source.strip().lower().startswith("http://"):
        say(f"dbert: warning: {source.strip()} is plain http: anyone on the way can read or change it; "
            "prefer https://")
    bar = _FetchProgress()
    try:
        path = fetch(source, revision=revision, name=name, progress=bar)
    finally:
        bar.close()
    print(path)


@checkpoints_app.command("import")
def checkpoints_import(
    directory: Annotated[str, typer.Argument(metavar="DIR", help="A checkpoint directory to copy into the store.")],
    name: Annotated[Optional[str], typer.Option(help="Store name (default: the directory's name).")] = None,
):
    """Copy a local checkpoint into the store; prints its path on stdout.

    Example: dbert checkpoints import runs/stories --name stories
    """
    from .storage.store import import_dir

    print(import_dir(directory, name=name))


@checkpoints_app.command("remove")
def checkpoints_remove(
    name: Annotated[str, typer.Argument(help="Store name of the checkpoint to delete.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
):
    """Delete a checkpoint from the store (asks first unless --yes).

    Example: dbert checkpoints remove stories --yes
    """
    from .storage.store import refuse_held, remove, resolve

    refuse_held(resolve(name), "remove")  # a clear error for an unknown name, or one a run holds, before asking
    if not yes:
        if not sys.stdin.isatty():
            raise DbertError(f"refusing to remove {name!r} without confirmation; pass --yes")
        if not typer.confirm(f"Remove checkpoint {name!r} from the store?", err=True):
            raise typer.Exit(1)
    path = remove(name)
    say(f"removed {path}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def tui(ctx: typer.Context):
    """Open the interactive terminal app: `dbert-tui` with every option it takes (dbert tui --help).

    Example: dbert tui --checkpoint dbert-minilm-wiki --steps 64
    """
    from importlib.metadata import entry_points

    found = [e for e in entry_points(group="console_scripts") if e.name == "dbert-tui"]
    if not found:  # the engine reaches the front end through its entry point, never by import
        raise DbertError("the terminal app is not installed (no dbert-tui entry point): pip install dbert")
    found[0].load()(list(ctx.args), prog_name="dbert tui")


# ---------------------------------------------------------------------------------- bench
def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise DbertError(f"{option} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise DbertError(f"{option} takes positive integers, got {text!r}")
    return values


MAX_BENCH_LENGTH = 4096  # tokens; the checkpoint's own position limit is checked when it is loaded


@app.command()
def bench(
    checkpoint: Annotated[Optional[str], typer.Option(help="A store name (see `dbert checkpoints list`) or, with a path separator (./x, runs/x), a directory (default: the shipped model).")] = None,
    out: Annotated[str, typer.Option(help="Directory for bench.json and bench.md.")] = "bench",
    quick: Annotated[bool, typer.Option("--quick", help="Steps 16,128 only, fewer repetitions (minutes, not an hour).")] = False,
    steps: Annotated[Optional[str], typer.Option(help="Step budgets, comma-separated (default 16,128,512,2048).")] = None,
    batch: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "1,32",
    samplers: Annotated[str, typer.Option(help="Samplers, comma-separated (any of: " + ", ".join(config.STRATEGIES) + "; each at its default parameters).")] = ",".join(config.SAMPLERS),
    length: Annotated[int, typer.Option(help="Tokens per sample.")] = 64,
    measure_train: Annotated[bool, typer.Option("--train/--no-train", help="Measure training tokens/s.")] = True,
    bf16: Annotated[bool, typer.Option(help="Also time the forward pass in bfloat16.")] = True,
    threads: Annotated[Optional[int], typer.Option(help="torch threads (default: torch's choice); the forward is also timed with 1..cores.")] = None,
    device: Annotated[Device, typer.Option(help="auto, cpu, cuda or mps.")] = Device.auto,
):
    """Measure sampling speed, training tokens/s and forward efficiency on this machine (Markdown on stdout).

    Example: dbert bench --quick --out bench-results
    """
    import os
    import time

    import torch

    from .evaluation.bench import markdown, run

    step_list = _int_list(steps, "--steps") if steps else ([16, 128] if quick else [16, 128, 512, 2048])
    batches = _int_list(batch, "--batch")
    if not 1 <= length <= MAX_BENCH_LENGTH:
        raise DbertError(f"--length must be in [1, {MAX_BENCH_LENGTH}], got {length}")
    from .disk.layout import check_output

    check_output(out, "--out", folder=True)  # before the hour of measuring, not after it
    chosen = [s.strip() for s in samplers.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in config.STRATEGIES]
    if unknown or not chosen:
        raise DbertError(f"--samplers: choose from {', '.join(config.STRATEGIES)}, got {samplers!r}")
    if threads is not None:
        from .evaluation.bench import check_threads

        check_threads(threads)
        torch.set_num_threads(threads)
    start = time.perf_counter()
    db = _load(checkpoint, device.value)
    load_seconds = time.perf_counter() - start
    if db.model.time != "none":
        chosen = [s for s in chosen if s != "cached"]
    from .evaluation.bench import check_batches

    check_batches(db, batches, length)  # before the first measurement
    say(f"bench: {db.path}, steps {step_list}, batch {batches}, samplers {chosen}; results in {out}/")
    result = run(db, Path(out), load_seconds, chosen, step_list, batches, length=length, quick=quick, train=measure_train,
                 bf16=bf16, threads=range(1, (os.cpu_count() or 1) + 1), report=say)
    sys.stdout.write(markdown(result))
    sys.stdout.flush()


# ---------------------------------------------------------------------------------- serve
@app.command()
def serve(
    checkpoint: Annotated[Optional[str], typer.Option(help="A store name (see `dbert checkpoints list`) or, with a path separator (./x, runs/x), a directory (default: the shipped model).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; anything but loopback is reachable from other machines (set --api-key).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    api_key: Annotated[Optional[str], typer.Option(envvar="DBERT_API_KEY", help="Require Authorization: Bearer KEY (or set DBERT_API_KEY, which stays out of the process list).")] = None,
    max_n: Annotated[int, typer.Option(help="Completions per request at most (prompts x n).")] = 16,
    max_tokens: Annotated[int, typer.Option(help="max_tokens (the span length) at most.")] = 256,
    max_queue: Annotated[int, typer.Option(help="Prompts waiting for the model at most; more get HTTP 429.")] = 64,
    timeout: Annotated[float, typer.Option(help="Seconds a request may take, queueing included; then HTTP 504.")] = 120.0,
    max_body: Annotated[int, typer.Option(help="Bytes of a request body at most; more get HTTP 413.")] = 65536,
    max_connections: Annotated[int, typer.Option(help="Connections with a request in progress at most; idle ones are closed to make room, past it only /health is answered.")] = 128,
    batch: Annotated[bool, typer.Option("--batch/--no-batch", help="Let unseeded requests with the same settings share a sampler call.")] = True,
    batch_rows: Annotated[int, typer.Option(help="Samples per shared sampler call at most.")] = 32,
    grace: Annotated[float, typer.Option(help="On SIGINT/SIGTERM/SIGHUP, seconds running requests may finish before they are cancelled (a second Ctrl-C: at once).")] = 10.0,
    device: Annotated[Device, typer.Option(help="auto, cpu, cuda or mps.")] = Device(SAMPLE.device),
    dtype: Annotated[Dtype, typer.Option(help="The network's precision, as in `dbert sample`.")] = Dtype(SAMPLE.dtype),
):
    """Serve the checkpoint over HTTP: OpenAI-compatible /v1/completions with infill (suffix).

    Example: dbert serve --port 8000 --api-key secret
    """
    from .serving.serve import Limits, check_options, create_app, is_loopback, run

    check_options(api_key=api_key, port=port, timeout=timeout, grace=grace, max_n=max_n, max_tokens=max_tokens,
                  max_queue=max_queue, max_body=max_body, batch_rows=batch_rows, max_connections=max_connections)
    if not is_loopback(host) and not api_key:
        say(f"dbert serve: warning: listening on {host} without --api-key: anyone who can reach this port can use it")
    name = checkpoint if checkpoint is None or "/" not in checkpoint else Path(checkpoint).name
    name = name or "default"
    db = _load(checkpoint, device.value)
    limits = Limits(max_n=max_n, max_tokens=max_tokens, max_queue=max_queue, timeout=timeout, max_body=max_body,
                    max_connections=max_connections)
    application = create_app(db, name, api_key=api_key, limits=limits, batching=batch, max_rows=batch_rows,
                             device=device.value, dtype=dtype.value)
    say(f"dbert serve: {name} ({db.path}) on http://{host}:{port}/v1 ; stop with Ctrl+C")
    _restore_signals()  # serve.server handles SIGINT, SIGTERM and SIGHUP itself (a grace period), then re-raises them
    try:
        run(application, host, port, grace=grace)  # SIGTERM: ends by the signal once shut down, as uvicorn does
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it shut down on
        pass
    except SystemExit as e:  # uvicorn's exit when it cannot start (its ERROR line says why)
        if e.code:
            raise DbertError(f"could not serve on {host}:{port} (the port in use, or the address not this machine's?)") from None
    say("dbert serve: stopped")


def _std_streams() -> None:
    """File descriptors 0-2 open, so a file dbert opens never takes the place of a closed stdout
    or stderr (and receives what was meant for them), and sys.stderr never None (print would
    then write messages to stdout). A closed stdout fails the first write of data with EBADF,
    one line; a closed stderr silences messages. Unencodable characters are escaped, not fatal
    (PYTHONIOENCODING=ascii, the C locale)."""
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = _Closed()
    elif not isinstance(sys.stdout, _Data):
        sys.stdout = _Data(sys.stdout)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    if sys.stdin is None:  # fd 0 was closed: reading it is reading nothing, isatty() is False
        sys.stdin = open(os.devnull)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    sys.argv[1:] = [_argument_text(a) for a in sys.argv[1:]]


def _argument_text(arg: str) -> str:
    """An argument as the user typed it. Under the C locale without UTF-8 coercion Python decodes
    argv as ASCII, so "Café" arrives holding surrogate escapes that no tokenizer or file name
    check accepts; its bytes are read again as UTF-8 (what terminals send), undecodable bytes
    as U+FFFD."""
    if not any("\udc80" <= ch <= "\udcff" for ch in arg):
        return arg
    import os

    return os.fsencode(arg).decode("utf-8", errors="replace")


class ReaderGone(Exception):
    """stdout's reader stopped early (`| head -1`): the command ends, status 141, nothing said."""


class _Data:
    """sys.stdout, with a closed pipe raised as ReaderGone: Click turns a BrokenPipeError inside a
    command into a silent exit 0, which tells a script the data was all delivered."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError as e:
            raise ReaderGone() from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError as e:
            raise ReaderGone() from e

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _Closed:
    """What sys.stdout is when fd 1 was closed at start: writing data fails, as it would."""

    encoding = "utf-8"
    errors = "strict"

    def write(self, text: str) -> int:
        import errno

        raise OSError(errno.EBADF, "stdout is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(9, "stdout is closed")


def _on_signal(signum, frame) -> None:
    import signal

    raise Interrupted(signal.Signals(signum).name)


_saved_handlers: dict = {}  # what main() found, put back by _restore_signals


def _restore_signals() -> None:
    """The signal handlers as main() found them (serve hands its signals to uvicorn)."""
    import signal

    for sig, handler in _saved_handlers.items():
        signal.signal(sig, handler)


def _stop_signals() -> dict:
    """Ctrl-C, SIGTERM and SIGHUP end a command through Interrupted: its `finally` blocks clean up
    (a fetch deletes its temp folder), then one line. `train` installs its own handlers while it
    runs (a stop saves a checkpoint); a SIGHUP ignored by the caller (nohup) stays ignored."""
    import signal

    old = {}
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None or (name == "SIGHUP" and signal.getsignal(sig) == signal.SIG_IGN):
            continue
        try:
            old[sig] = signal.signal(sig, _on_signal)
        except (ValueError, OSError):  # not the main thread, or not allowed here
            pass
    return old


def _quiet_exit() -> None:
    """When main() is the process itself (`dbert`, `python -m dbert_core.cli`), a stop signal
    after the command has ended (a second fast Ctrl-C while the interpreter shuts down) is
    ignored: the status is decided, and Python's default handler would print a
    KeyboardInterrupt traceback and end with -2 instead. Inside another program main() leaves
    the handlers as it found them."""
    import signal

    entry = sys.modules.get("__main__")
    spec = getattr(entry, "__spec__", None)
    if getattr(spec, "name", None) != "dbert_core.cli" and Path(getattr(entry, "__file__", "") or "").name != "dbert":
        return
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            try:
                signal.signal(sig, signal.SIG_IGN)
            except (ValueError, OSError):
                pass


def _exit_code(error: BaseException) -> int:
    """The exit status for what ended a command, after one line on stderr (none for a closed pipe)."""
    import errno

    if isinstance(error, Interrupted):
        say(f"dbert: interrupted ({error})" if str(error) not in ("", "SIGINT") else "dbert: interrupted")
        return 130
    if isinstance(error, ReaderGone):  # the reader stopped early (| head): nothing to say
        return 141
    if isinstance(error, DbertError):
        say(f"dbert: error: {error}")
        return 2
    if isinstance(error, OSError):
        if error.errno == errno.EPIPE:  # the reader stopped early (| head): nothing to say
            return 141
        where = f" ({error.filename})" if error.filename else ""
        say(f"dbert: error: {error.strerror or error}{where}")
        return 2
    from .hardware import is_out_of_memory

    if is_out_of_memory(error) and not isinstance(error, MemoryError):  # torch's allocators
        say("dbert: error: out of memory; lower --batch-size (or --n, --candidates, --length; bench: --batch)")
        return 2
    if isinstance(error, (RecursionError, MemoryError)):
        say(f"dbert: error: {'out of memory' if isinstance(error, MemoryError) else 'input nested too deeply'}")
        return 2
    say(f"dbert: internal error: {type(error).__name__}: {str(error).strip()[:300]} "
        "(please report it; DBERT_TRACEBACK=1 shows where)")
    return 1


def main() -> None:
    """Entry point: run the app; every failure becomes one line on stderr and a non-zero exit
    (2: an expected failure, 130: interrupted, 141: stdout closed early, 1: a bug), never a
    traceback, and stdout carries only data."""
    import os

    given = sys.stdout
    _std_streams()
    _saved_handlers.update(_stop_signals())
    code = 0
    try:  # typer itself prints usage errors and help, and exits (SystemExit) for them
        app()
    except SystemExit as e:
        code = e.code
    except BaseException as e:  # noqa: BLE001 - the one place every failure ends
        if os.environ.get("DBERT_TRACEBACK") == "1" and not isinstance(e, (DbertError, Interrupted)):
            raise
        code = _exit_code(e)
    try:
        sys.stdout.flush()
    except (OSError, ValueError, ReaderGone) as e:
        code = _exit_code(e) if isinstance(e, (OSError, ReaderGone)) else 2
    if code:  # nothing more may reach a broken stdout: the interpreter's own flush at exit stays quiet
        try:
            if sys.stdout.fileno() == 1:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.close(null)
        except (OSError, ValueError, AttributeError):
            pass
    _restore_signals()  # as they were (main() runs inside other programs' tests too)
    _saved_handlers.clear()
    _quiet_exit()
    if isinstance(sys.stdout, _Data) and not isinstance(given, _Data):
        sys.stdout = given
    sys.exit(code if isinstance(code, int) else 0 if code is None else 1)


if __name__ == "__main__":
    main()
