"""`dbert train`: a TrainConfig built from the options (named after its fields), or a run resumed
with only the options given changed; progress on stderr, stdout stays empty."""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Annotated, Optional

import typer

from ...errors import DbertError
from ..options import TRAIN, Decay, Device, DocSep, Dtype, Loss, Preset, Schedule, Time, Unit, device_of, is_given
from ..streams import say


def train(
    ctx: typer.Context,
    out: Annotated[str, typer.Option(help="Output checkpoint: a bare NAME goes to the store; anything with a path separator (./x, runs/x) is a directory.")] = ...,
    data: Annotated[Optional[list[str]], typer.Option("--data", help="Training text files, globs or folders, or hf:owner/name (a hub dataset, downloaded once) (repeatable; recorded as absolute paths; with --resume: the checkpoint's, or the same files moved).", rich_help_panel="Data")] = None,
    val_data: Annotated[Optional[list[str]], typer.Option(help="Held-out files (default: a slice of --data).", rich_help_panel="Data")] = TRAIN.val_data,
    unit: Annotated[Unit, typer.Option(help="An example is a line, a sentence, or a story: a whole document in windows that end with its end (--seq-len tokens; longer ones continue with earlier text as context).", rich_help_panel="Data")] = Unit(TRAIN.unit),
    doc_sep: Annotated[DocSep, typer.Option(help="What separates documents: auto (each file's own: <|endoftext|> lines, JSONL, else blank lines), blank, eot, line (one per line) or jsonl ({\"text\": ...} per line).", rich_help_panel="Data")] = DocSep(TRAIN.doc_sep),
    story_context: Annotated[Optional[int], typer.Option(help="With --unit story: tokens of earlier text a continuation window carries (default: half of --seq-len).", rich_help_panel="Data")] = TRAIN.story_context,
    hide_end_padding: Annotated[bool, typer.Option("--hide-end-padding", help="With --unit story: attention never reads a visible padding [SEP] after a story's end, so samplers leave a decided end out of the forward, exactly (faster stories; recorded in the checkpoint).", rich_help_panel="Data")] = TRAIN.hide_end_padding,
    pack: Annotated[bool, typer.Option(help="Join examples with [SEP] into full-length sequences.", rich_help_panel="Data")] = TRAIN.pack,
    seq_len: Annotated[int, typer.Option(help="Content tokens per example.", rich_help_panel="Data")] = TRAIN.seq_len,
    short_windows: Annotated[float, typer.Option(help="With --unit sentence --pack: this fraction of windows get a room drawn from 1..--seq-len, so some hold one sentence alone (BERT keeps 10% of sequences short).", rich_help_panel="Data")] = TRAIN.short_windows,
    preset: Annotated[Preset, typer.Option(help="Model size for a random init.", rich_help_panel="Model")] = Preset(TRAIN.preset),
    init: Annotated[Optional[str], typer.Option(help="Start from a pretrained BERT: a folder, a store name (default: the shipped model) or a hub id.", rich_help_panel="Model")] = TRAIN.init,
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
    from ...config import TrainConfig
    from ...text.data import absolute_patterns
    from ...training.prepare import resume_config
    from ..progress import TrainProgress
    from ...storage.store import out_path
    from ...training.train import Trainer

    # The options are named after TrainConfig's fields, so the config is built from them as they are.
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"out", "resume"}
    values = {k: v.value if isinstance(v, Enum) else v for k, v in ctx.params.items() if k in fields}
    values.update(data=absolute_patterns(data), val_data=absolute_patterns(val_data),  # a run resumes from anywhere
                  preset=None if init else preset.value, device=device_of(gpu, device))
    if init is not None and is_given(ctx, "preset"):
        raise DbertError("--preset and --init both choose the model; give one of them")
    target = str(out_path(out))
    if resume:  # the checkpoint's own config, changed only where the command line says so
        given = {k for k in fields if is_given(ctx, k)} | ({"device"} if is_given(ctx, "gpu") else set())
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
