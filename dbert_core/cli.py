"""The `dbert` command. stdout carries data only; progress and messages go to stderr.

Heavy imports (torch, transformers) happen inside the commands, so `dbert --help` is instant.
An expected failure (bad file, bad option, bad checkpoint) prints one line and exits 2.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from .errors import DbertError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="DiffusionBERT: train, sample and evaluate text diffusion models.")
checkpoints_app = typer.Typer(no_args_is_help=True, help="List and manage stored checkpoints.")
app.add_typer(checkpoints_app, name="checkpoints")


class Schedule(str, Enum):
    linear = "linear"
    spindle = "spindle"


class Time(str, Enum):
    none = "none"
    prefix = "prefix"
    layerwise = "layerwise"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"


class Sampler(str, Enum):
    ancestral = "ancestral"
    cached = "cached"
    first_hitting = "first-hitting"


class Unit(str, Enum):
    line = "line"
    sentence = "sentence"


def say(message: str) -> None:
    """A message for the user: stderr, never stdout."""
    print(message, file=sys.stderr, flush=True)


def _version(value: bool):
    if value:
        from . import __version__

        print(f"dbert {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                 help="Print the version and exit.")] = False):
    pass


def _device(gpu: bool, device: Device) -> str:
    return "cuda" if gpu else device.value


def _load(checkpoint: str | None, device: str):
    from . import checkpoint as ckpt
    from .store import resolve
    from .train import pick_device

    return ckpt.load(resolve(checkpoint), device=pick_device(device))


# ---------------------------------------------------------------------------------- train
@app.command()
def train(
    data: Annotated[list[str], typer.Option("--data", help="Training text files or globs (repeatable).")],
    out: Annotated[str, typer.Option(help="Output checkpoint: a directory, or a bare NAME for the store.")],
    preset: Annotated[str, typer.Option(help="Model size for a random init: tiny, mini, small, base.")] = "tiny",
    init: Annotated[Optional[str], typer.Option(help="Start from a pretrained BERT (path or hub id).")] = None,
    from_scratch: Annotated[bool, typer.Option("--from-scratch", help="With --init: its architecture and tokenizer, random weights.")] = False,
    trim_vocab: Annotated[bool, typer.Option("--trim-vocab", help="With --init: keep only the word pieces the training data uses (faster).")] = False,
    max_steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 1000,
    batch_size: Annotated[int, typer.Option(help="Examples per optimizer step (all processes).")] = 32,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per optimizer step.")] = 1,
    seq_len: Annotated[int, typer.Option(help="Content tokens per example.")] = 64,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 5e-4,
    warmup: Annotated[int, typer.Option(help="Warm-up steps.")] = 100,
    decay: Annotated[str, typer.Option(help="LR after warm-up: cosine or constant.")] = "cosine",
    schedule: Annotated[Schedule, typer.Option(help="Noise schedule.")] = Schedule.spindle,
    spindle_lambda: Annotated[float, typer.Option("--lambda", help="Spindle strength (0..1/pi).")] = 0.3,
    T: Annotated[int, typer.Option("--T", help="Diffusion steps of the forward process.")] = 2048,
    time: Annotated[Time, typer.Option(help="Time conditioning.")] = Time.none,
    loss: Annotated[str, typer.Option(help="hybrid (ELBO + 0.01 CE, the paper's), elbo, or ce.")] = "hybrid",
    unit: Annotated[Unit, typer.Option(help="An example is a line or a sentence.")] = Unit.line,
    pack: Annotated[bool, typer.Option(help="Join examples with [SEP] into full-length sequences.")] = False,
    vocab_size: Annotated[Optional[int], typer.Option(help="WordPiece size learnt from the data (presets).")] = None,
    dropout: Annotated[Optional[float], typer.Option(help="Override the model's dropout rates.")] = None,
    val_data: Annotated[Optional[list[str]], typer.Option(help="Held-out files (default: a slice of --data).")] = None,
    eval_every: Annotated[int, typer.Option(help="Validation ELBO every N steps (0: never).")] = 200,
    eval_steps: Annotated[Optional[int], typer.Option(help="Step budget of the validation ELBO [default: min(128, T)].")] = None,
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps.")] = 500,
    log_every: Annotated[int, typer.Option(help="Progress line every N steps (non-terminal stderr).")] = 10,
    gpu: Annotated[bool, typer.Option("--gpu", help="Train on CUDA; an error if there is none.")] = False,
    device: Annotated[Device, typer.Option(help="auto, cpu, cuda or mps.")] = Device.auto,
    dtype: Annotated[str, typer.Option(help="auto (bf16 autocast where native: CUDA, CPUs with AVX512-BF16/AMX), fp32 or bf16.")] = "auto",
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run saved in --out exactly.")] = False,
):
    """Train a DiffusionBERT on your text files (stdout stays empty)."""
    from .progress import TrainProgress
    from .store import out_path
    from .train import Trainer, TrainConfig

    if decay not in ("cosine", "constant"):
        raise DbertError(f"--decay must be cosine or constant, got {decay!r}")
    if dtype not in ("auto", "fp32", "bf16"):
        raise DbertError(f"--dtype must be auto, fp32 or bf16, got {dtype!r}")
    cfg = TrainConfig(
        data=data, out=str(out_path(out)), preset=None if init else preset, init=init, from_scratch=from_scratch, trim_vocab=trim_vocab,
        vocab_size=vocab_size,
        unit=unit.value, pack=pack, seq_len=seq_len, batch_size=batch_size, grad_accum=grad_accum,
        max_steps=max_steps, lr=lr, warmup=warmup, decay=decay, schedule=schedule.value, lam=spindle_lambda, T=T,
        time=time.value, loss=loss, val_data=val_data, eval_every=eval_every, eval_steps=eval_steps,
        save_every=save_every, log_every=log_every, device=_device(gpu, device), dtype=dtype, seed=seed,
        resume=resume, dropout=dropout,
    )
    trainer = Trainer(cfg, [TrainProgress(log_every)])
    result = trainer.run()
    if result.get("stopped"):
        say(f"stopped at step {trainer.step}; checkpoint saved in {cfg.out} (continue with --resume)")
        raise typer.Exit(130)


# ---------------------------------------------------------------------------------- sample
@app.command()
def sample(
    checkpoint: Annotated[Optional[str], typer.Option(help="Store name or directory (default: the shipped model).")] = None,
    n: Annotated[int, typer.Option("--n", help="Number of samples (lines on stdout).")] = 10,
    steps: Annotated[int, typer.Option(help="Reverse steps S (1..T).")] = 128,
    temperature: Annotated[float, typer.Option(help="Softmax temperature of the token choice (> 0).")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Keep the k most likely tokens (0: off).")] = 30,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass in (0, 1].")] = 1.0,
    length: Annotated[Optional[int], typer.Option(help="Tokens per sample [default: the length the checkpoint was trained on].")] = None,
    batch_size: Annotated[int, typer.Option(help="Samples per network call.")] = 32,
    seed: Annotated[Optional[int], typer.Option(help="Random seed (same seed, same output).")] = None,
    prompt: Annotated[Optional[str], typer.Option(help="Template with [MASK] slots; masks are appended up to --length.")] = None,
    sampler: Annotated[Optional[Sampler], typer.Option(help="ancestral; cached (skips calls when nothing changed); first-hitting (one call per reveal) [default: first-hitting where the model allows it, else ancestral].")] = None,
    stats: Annotated[bool, typer.Option("--stats", help="Print {nfe, rows, gflop, seconds, samples, steps} as JSON on stderr.")] = False,
    device: Annotated[Device, typer.Option(help="auto, cpu, cuda or mps.")] = Device.auto,
):
    """Generate N samples, one per line on stdout."""
    from .sample import default_length, default_sampler, generate, parse_prompt

    if n < 1:
        raise DbertError("--n must be >= 1")
    if batch_size < 1:
        raise DbertError("--batch-size must be >= 1")
    db = _load(checkpoint, device.value)
    if length is None:
        length = default_length(db)
    if sampler is None:
        sampler = Sampler(default_sampler(db))
    template = parse_prompt(db, prompt, length) if prompt is not None else None
    texts, st = generate(db, n=n, batch_size=batch_size, seed=seed, length=length, steps=steps,
                         temperature=temperature, top_k=top_k, top_p=top_p, sampler=sampler.value, prompt=template)
    sys.stdout.write("".join(t.replace("\n", " ") + "\n" for t in texts))
    sys.stdout.flush()
    if stats:
        say(json.dumps(st))


# ---------------------------------------------------------------------------------- eval
@app.command("eval")
def evaluate(
    data: Annotated[list[str], typer.Option("--data", help="Text file(s) to score: one example per line.")],
    checkpoint: Annotated[Optional[str], typer.Option(help="Store name or directory (default: the shipped model).")] = None,
    steps: Annotated[int, typer.Option(help="Step budget S of the ELBO.")] = 128,
    limit: Annotated[Optional[int], typer.Option(help="Score only the first N examples.")] = None,
    exact: Annotated[bool, typer.Option("--exact", help="Sum all S terms per example (slow).")] = False,
    mc_samples: Annotated[int, typer.Option(help="Monte-Carlo draws per example (without --exact).")] = 1,
    unit: Annotated[Unit, typer.Option(help="An example is a line or a sentence.")] = Unit.line,
    samples: Annotated[int, typer.Option(help="Also draw N samples for BLEU-4 / Self-BLEU-4 / distinct-n.")] = 0,
    sample_steps: Annotated[int, typer.Option(help="Reverse steps for those samples.")] = 128,
    sample_length: Annotated[int, typer.Option(help="Tokens per sample (the paper: 64).")] = 64,
    top_k: Annotated[int, typer.Option(help="top-k of the samples (the paper: 30).")] = 30,
    batch_size: Annotated[int, typer.Option(help="Examples per batch.")] = 32,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
    device: Annotated[Device, typer.Option(help="auto, cpu, cuda or mps.")] = Device.auto,
):
    """ELBO perplexity (per token and per word) and, with --samples, BLEU-4 / Self-BLEU-4."""
    from .metrics import perplexity, quality

    if limit is not None and limit < 1:
        raise DbertError("--limit must be >= 1")
    if samples < 0:
        raise DbertError("--samples must be >= 0")
    db = _load(checkpoint, device.value)
    result = {"checkpoint": str(db.path), **perplexity(db, data, steps=steps, limit=limit, exact=exact,
                                                       mc=mc_samples, batch_size=batch_size, seed=seed,
                                                       unit=unit.value)}
    if samples:
        result.update(quality(db, data, samples, steps=sample_steps, length=sample_length, top_k=top_k,
                              batch_size=batch_size, seed=seed, unit=unit.value))
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}  {value:.4f}" if isinstance(value, float) else f"{key:>22}  {value}")


# ---------------------------------------------------------------------------------- checkpoints
@checkpoints_app.command("list")
def checkpoints_list(as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False):
    """Stored checkpoints (the shipped default first) and the store's location."""
    from .store import entries, human_size, store_dir

    rows = entries()
    if as_json:
        for e in rows:
            row = {"name": e.name, "path": str(e.path), "size": e.size}
            row.update({"broken": e.broken} if e.broken else {"parameters": e.parameters, "schedule": e.schedule,
                                                               "time": e.time, "created": e.created})
            print(json.dumps(row))
        return
    header = f"{'NAME':<20} {'SIZE':>9} {'PARAMS':>8} {'SCHEDULE':<13} {'TIME':<9} {'CREATED':<25} PATH"
    print(header)
    for e in rows:
        if e.broken:  # a bad entry is a row saying why, never a crash
            print(f"{e.name:<20} {human_size(e.size):>9} {'?':>8} broken: {e.broken}  {e.path}")
            continue
        params = f"{e.parameters / 1e6:.1f}M" if e.parameters else "?"
        print(f"{e.name:<20} {human_size(e.size):>9} {params:>8} {e.schedule:<13} {e.time:<9} {e.created:<25} {e.path}")
    say(f"store: {store_dir()}")


class _FetchProgress:
    """Download progress on stderr: a live bar on a terminal, a few plain lines otherwise."""

    def __init__(self):
        self.live = sys.stderr.isatty()
        self.last = -1

    def __call__(self, done: int, total: int | None, what: str) -> None:
        from .store import human_size

        pct = int(100 * done / total) if total else None
        if self.live:
            shown = f"{pct:3d}%" if pct is not None else ""
            sys.stderr.write(f"\r{what} {human_size(done):>9} {shown}")
            sys.stderr.flush()
        elif pct is not None and pct // 25 != self.last:
            self.last = pct // 25
            say(f"{what} {human_size(done)} ({pct}%)")

    def close(self) -> None:
        if self.live:
            sys.stderr.write("\n")


@checkpoints_app.command("fetch")
def checkpoints_fetch(
    source: Annotated[str, typer.Argument(metavar="REPO_ID_OR_URL", help="Hub repo id (user/model) or an https URL to a .tar.gz/.zip.")],
    revision: Annotated[Optional[str], typer.Option(help="Hub branch, tag or commit to pin.")] = None,
    name: Annotated[Optional[str], typer.Option(help="Store name (default: the repo's or archive's name).")] = None,
):
    """Download a checkpoint into the store; prints its path on stdout."""
    from .hub import fetch

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
    """Copy a local checkpoint into the store; prints its path on stdout."""
    from .hub import import_dir

    print(import_dir(directory, name=name))


@checkpoints_app.command("remove")
def checkpoints_remove(
    name: Annotated[str, typer.Argument(help="Store name of the checkpoint to delete.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
):
    """Delete a checkpoint from the store (asks first unless --yes)."""
    from .hub import remove
    from .store import resolve

    resolve(name)  # a clear error for an unknown name before asking anything
    if not yes:
        if not sys.stdin.isatty():
            raise DbertError(f"refusing to remove {name!r} without confirmation; pass --yes")
        if not typer.confirm(f"Remove checkpoint {name!r} from the store?", err=True):
            raise typer.Exit(1)
    path = remove(name)
    say(f"removed {path}")


@app.command()
def tui(
    checkpoint: Annotated[Optional[str], typer.Option(help="Store name or directory to start with.")] = None,
):
    """Open the interactive terminal app (same as `dbert-tui`)."""
    from dbert_tui.app import run

    if checkpoint is not None:
        from .store import resolve

        resolve(checkpoint)  # a bad name is one line and exit 2, before the screen opens
    raise typer.Exit(run(checkpoint=checkpoint))


# ---------------------------------------------------------------------------------- bench
def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise DbertError(f"{option} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise DbertError(f"{option} takes positive integers, got {text!r}")
    return values


@app.command()
def bench(
    checkpoint: Annotated[Optional[str], typer.Option(help="Store name or directory (default: the shipped model).")] = None,
    out: Annotated[str, typer.Option(help="Directory for bench.json and bench.md.")] = "bench",
    quick: Annotated[bool, typer.Option("--quick", help="Steps 16,128 only, fewer repetitions (minutes, not an hour).")] = False,
    steps: Annotated[Optional[str], typer.Option(help="Step budgets, comma-separated (default 16,128,512,2048).")] = None,
    batch: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "1,32",
    samplers: Annotated[str, typer.Option(help="Samplers, comma-separated.")] = "ancestral,cached,first-hitting",
    length: Annotated[int, typer.Option(help="Tokens per sample.")] = 64,
    measure_train: Annotated[bool, typer.Option("--train/--no-train", help="Measure training tokens/s.")] = True,
    bf16: Annotated[bool, typer.Option(help="Also time the forward pass in bfloat16.")] = True,
    threads: Annotated[Optional[int], typer.Option(help="torch threads (default: torch's choice); the forward is also timed with 1..cores.")] = None,
    device: Annotated[Device, typer.Option(help="auto, cpu, cuda or mps.")] = Device.auto,
):
    """Measure sampling speed, training tokens/s and forward efficiency on this machine (Markdown on stdout)."""
    import os
    import time

    import torch

    from .bench import markdown, run
    from .sample import SAMPLERS

    step_list = _int_list(steps, "--steps") if steps else ([16, 128] if quick else [16, 128, 512, 2048])
    batches = _int_list(batch, "--batch")
    chosen = [s.strip() for s in samplers.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SAMPLERS]
    if unknown or not chosen:
        raise DbertError(f"--samplers: choose from {', '.join(SAMPLERS)}, got {samplers!r}")
    if threads is not None:
        if threads < 1:
            raise DbertError("--threads must be >= 1")
        torch.set_num_threads(threads)
    start = time.perf_counter()
    db = _load(checkpoint, device.value)
    load_seconds = time.perf_counter() - start
    if db.model.time != "none":
        chosen = [s for s in chosen if s != "cached"]
    say(f"bench: {db.path}, steps {step_list}, batch {batches}, samplers {chosen}; results in {out}/")
    result = run(db, Path(out), load_seconds, chosen, step_list, batches, length=length, quick=quick, train=measure_train,
                 bf16=bf16, threads=range(1, (os.cpu_count() or 1) + 1))
    sys.stdout.write(markdown(result))
    sys.stdout.flush()


def main() -> None:
    """Entry point: run the app; expected failures become one line on stderr."""
    try:
        app()
    except DbertError as e:
        say(f"dbert: error: {e}")
        sys.exit(2)
    except KeyboardInterrupt:
        say("dbert: interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
