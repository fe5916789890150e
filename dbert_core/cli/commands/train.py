"""`dbert train`: a TrainConfig built from the options (named after its fields), or a run resumed
with only the options given changed; progress on stderr, stdout stays empty."""

from __future__ import annotations

from typing import Annotated

import typer

from ... import config
from ...errors import DbertError
from ..options import is_given, plain, with_settings
from ..streams import say

LAYOUT = {None: ("out",),  # --help's panels, each in its order; a setting not named here comes last
          "Data": ("data", "val_data", "unit", "doc_sep", "story_context", "hide_end_padding", "pack", "seq_len",
                   "short_windows"),
          "Model": ("preset", "init", "from_scratch", "trim_vocab", "vocab_size", "dropout"),
          "Diffusion": ("schedule", "lam", "T", "time", "loss"),
          "Optimization": ("max_steps", "batch_size", "grad_accum", "lr", "warmup", "decay", "seed"),
          "Evaluation and checkpoints": ("eval_every", "eval_steps", "save_every", "log_every", "resume"),
          "Hardware": ("gpu", "device", "dtype")}


CHANGED = {"data": {"default": None}}  # none with --resume: the checkpoint's


@with_settings(config.TRAIN_SETTINGS, LAYOUT, CHANGED)
def train(
    ctx: typer.Context,
    gpu: Annotated[bool, typer.Option("--gpu", help="Train on CUDA; an error if there is none.")] = False,
    **declared,  # the settings (settings.TRAIN), each an option named after its TrainConfig field
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

    values = plain(declared)  # TrainConfig's fields, as the options are named
    out, resume, init = values.pop("out"), values.pop("resume"), values["init"]
    values.update(data=absolute_patterns(values["data"]), val_data=absolute_patterns(values["val_data"]),  # a run
                  preset=None if init else values["preset"], device="cuda" if gpu else values["device"])  # resumes anywhere
    if init is not None and is_given(ctx, "preset"):
        raise DbertError("--preset and --init both choose the model; give one of them")
    target = str(out_path(out))
    if resume:  # the checkpoint's own config, changed only where the command line says so
        given = {k for k in values if is_given(ctx, k)} | ({"device"} if is_given(ctx, "gpu") else set())
        if "init" in given:
            given.add("preset")
        cfg = resume_config(target, **{k: values[k] for k in given})
    else:
        if not values["data"]:
            raise DbertError("--data is required (a text file, or several)")
        cfg = TrainConfig(out=target, **values)
    trainer = Trainer(cfg, [TrainProgress(cfg.log_every)])
    result = trainer.run()
    if result.get("stopped"):
        say(f"stopped at step {trainer.step}; checkpoint saved in {cfg.out} (continue with --resume)")
        raise typer.Exit(130)
