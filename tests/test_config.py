"""One source of truth: the choices, defaults, range checks and the resume rule in config.py,
and that the CLI, the TUI and the library resolve the same settings from them."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import sys

import pytest
import torch
import typer
from helpers import TINYSTORIES, tiny_config

from dbert_core.storage import checkpoint
from dbert_core import config
from dbert_core.config import SampleConfig
from dbert_core.errors import DbertError
from dbert_core.settings import flag
from dbert_core.sampling.sample import resolve
from dbert_core.disk.lock import OutLock
from dbert_core.training.prepare import resume_config
from dbert_core.training.train import Trainer

BAD_TRAIN = [
    (dict(grad_accum=0), "--grad-accum"), (dict(log_every=0), "--log-every"), (dict(lam=5.0), "--lambda"),
    (dict(lam=-0.1), "--lambda"), (dict(dropout=2.0), "--dropout"), (dict(dropout=1.0), "--dropout"),
    (dict(seed=2**40), "--seed"), (dict(seed=-1), "--seed"), (dict(lr=math.inf), "--lr"), (dict(lr=math.nan), "--lr"),
    (dict(lr=0.0), "--lr"), (dict(T=0), "--T"), (dict(eval_steps=10_000), "--eval-steps"), (dict(decay="linear"), "--decay"),
    (dict(dtype="fp8"), "--dtype"), (dict(batch_size=10, grad_accum=3), "--batch-size"), (dict(max_steps=0), "--max-steps"),
    (dict(seq_len=0), "--seq-len"), (dict(warmup=-1), "--warmup"), (dict(eval_every=-1), "--eval-every"),
    (dict(save_every=-5), "--save-every"), (dict(schedule="cosine"), "--schedule"), (dict(time="clock"), "--time"),
    (dict(loss="mse"), "--loss"), (dict(unit="word"), "--unit"), (dict(device="tpu"), "--device"),
    (dict(preset="huge"), "--preset"), (dict(trim_vocab=True), "--trim-vocab needs --init"),
    (dict(from_scratch=True), "--from-scratch needs --init"), (dict(max_steps=2.5), "--max-steps"),
    (dict(clip=0.0), "clip"), (dict(vocab_size=3), "--vocab-size"), (dict(seq_len="64"), "--seq-len"),
]


@pytest.mark.parametrize("change,needle", BAD_TRAIN, ids=[f"{next(iter(c))}={list(c.values())[0]!r}" for c, _ in BAD_TRAIN])
def test_train_config_names_the_bad_field(tmp_path, change, needle):
    """The error carries the setting (a field of TrainConfig); the CLI names it by its flag."""
    cfg = tiny_config(tmp_path / "o", **change)
    with pytest.raises(DbertError) as e:
        cfg.validate()
    assert e.value.setting in change and needle in e.value.said(flag)
    with pytest.raises(DbertError) as e:  # before anything is read or written
        Trainer(cfg).prepare()
    assert needle in e.value.said(flag)
    assert not (tmp_path / "o").exists()


def test_validate_does_not_mutate(tmp_path):
    cfg = tiny_config(tmp_path / "o", eval_steps=None, T=64)
    before = dataclasses.asdict(cfg)
    assert cfg.validate() is cfg and dataclasses.asdict(cfg) == before
    assert cfg.eval_steps is None and cfg.eval_budget == 64


BAD_SAMPLE = [
    (dict(n=0), "--n"), (dict(steps=0), "--steps"), (dict(temperature=-0.5), "--temperature"),
    (dict(temperature=math.nan), "--temperature"), (dict(top_k=-1), "--top-k"), (dict(top_p=0.0), "--top-p"),
    (dict(top_p=1.5), "--top-p"), (dict(length=0), "--length"), (dict(sampler="magic"), "--sampler"),
    (dict(batch_size=0), "--batch-size"), (dict(seed=2**40), "--seed"), (dict(device="tpu"), "--device"),
]


@pytest.mark.parametrize("change,needle", BAD_SAMPLE, ids=[f"{next(iter(c))}" for c, _ in BAD_SAMPLE])
def test_sample_config_names_the_bad_field(change, needle):
    with pytest.raises(DbertError) as e:
        SampleConfig(**change).validate()
    assert e.value.setting in change and e.value.said(flag).startswith(needle + " ")
    assert "--" not in str(e.value)  # the library's own words name no flag


def test_cli_choices_are_the_config_tuples():
    from dbert_core import cli

    pairs = [(cli.Schedule, config.SCHEDULES), (cli.Time, config.TIME_MODES), (cli.Device, config.DEVICES),
             (cli.Unit, config.UNITS), (cli.Loss, config.LOSSES),
             (cli.Decay, config.DECAYS), (cli.Dtype, config.DTYPES), (cli.Preset, config.PRESETS)]
    for enum, values in pairs:
        assert tuple(e.value for e in enum) == values
    from dbert_core import strategies

    assert cli.options.strategy_name("remdm") == "remdm"  # --sampler: the registry's names when the line is read
    with pytest.raises(typer.BadParameter, match="one of: " + ", ".join(strategies.names())):
        cli.options.strategy_name("nope")
    from dbert_core.maths.model import PRESETS

    assert tuple(PRESETS) == config.PRESETS


def test_cli_tui_and_library_resolve_the_same_defaults(tiny_db, tiny_checkpoint, monkeypatch, capsys):
    from dbert_core.sampling.sample import generate
    from dbert_tui.controller import Settings

    lib = resolve(SampleConfig(), tiny_db)
    tui = resolve(Settings(), tiny_db)
    assert lib.sampler == "first-hitting" and lib.length == tiny_db.meta["seq_len"] and lib.top_k == 30
    overridden = {"n", "seed", "prompt", "pace_ms"}  # the TUI's visible overrides (controller.Settings)
    for f in dataclasses.fields(SampleConfig):
        if f.name not in overridden:
            assert getattr(tui, f.name) == getattr(lib, f.name), f.name
    # the CLI's option defaults are SampleConfig's: same seed, same texts as the library
    assert _cli(monkeypatch, "sample", "--checkpoint", str(tiny_checkpoint), "--n", "3", "--seed", "5") == 0
    printed = capsys.readouterr().out.splitlines()
    texts, _ = generate(tiny_db, n=3, seed=5)
    assert printed == [t.replace("\n", " ") for t in texts]


def test_tui_command_line_defaults_are_settings(monkeypatch):
    from dbert_tui import app as tui_app
    from dbert_tui.controller import Settings

    seen = {}
    monkeypatch.setattr(tui_app, "run", lambda checkpoint, settings: seen.setdefault("s", settings) and 0)
    with pytest.raises(SystemExit):
        tui_app.main([])
    assert seen["s"] == Settings()


def test_time_conditioned_checkpoint_same_rule_everywhere(tmp_path):
    Trainer(tiny_config(tmp_path / "pte", max_steps=3, time="prefix")).run()
    db = checkpoint.load(tmp_path / "pte")
    assert resolve(SampleConfig(), db).sampler == "ancestral"
    with pytest.raises(DbertError, match="cached"):
        resolve(SampleConfig(sampler="cached"), db)


def _cli(monkeypatch, *args) -> int:
    """Run `dbert ARGS` in this process; its exit status."""
    from dbert_core.cli import main

    monkeypatch.setattr(sys, "argv", ["dbert", *args])
    try:
        main()
    except SystemExit as e:
        return e.code or 0
    return 0


# ---------------------------------------------------------------------------------- resume
def test_resume_takes_the_checkpoints_settings(tmp_path):
    out = tmp_path / "run"
    Trainer(tiny_config(out, max_steps=4, T=128, lr=2e-3, save_every=0)).run()
    cfg = resume_config(out, max_steps=6, log_every=3)
    assert (cfg.T, cfg.lr, cfg.max_steps, cfg.log_every, cfg.resume) == (128, 2e-3, 6, 3, True)
    tr = Trainer(cfg)
    tr.run()
    assert tr.step == 6 and checkpoint.read_meta(out)["train_config"]["max_steps"] == 6


@pytest.mark.parametrize("change,option", [(dict(T=2048), "--T"), (dict(schedule="linear"), "--schedule"),
                                           (dict(time="layerwise"), "--time"), (dict(seq_len=48), "--seq-len"),
                                           (dict(lr=1e-4), "--lr"), (dict(pack=True), "--pack"),
                                           (dict(hybrid_weight=0.5), "hybrid_weight")])  # no option: its name
def test_resume_refuses_a_conflicting_setting(tmp_path, change, option):
    out = tmp_path / "run"
    Trainer(tiny_config(out, max_steps=2, save_every=0)).run()
    with pytest.raises(DbertError) as e:
        resume_config(out, max_steps=4, **change)
    assert re.match(f"{option} is .* in the checkpoint, .* a resumed run \\(--resume\\) may change only --max-steps",
                    e.value.said(flag)) and e.value.setting in change
    with pytest.raises(DbertError) as e:  # a hand-built config too
        Trainer(tiny_config(out, max_steps=4, resume=True, **change)).prepare()
    assert re.match(f"{option} is .* in the checkpoint", e.value.said(flag))


def test_resume_checks_the_model_when_no_settings_were_saved(tmp_path):
    out = tmp_path / "run"
    Trainer(tiny_config(out, max_steps=2, save_every=0)).run()
    meta = json.loads((out / checkpoint.META).read_text())
    del meta["train_config"]  # as dbert wrote before it kept them
    (out / checkpoint.META).write_text(json.dumps(meta))
    with pytest.raises(DbertError) as e:
        Trainer(tiny_config(out, max_steps=4, resume=True, T=1024)).prepare()
    assert e.value.said(flag).startswith("--T 1024 does not continue the checkpoint (--resume)")


def test_cli_resume_needs_only_out(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert _cli(monkeypatch, "train", "--data", str(TINYSTORIES), "--out", str(out), "--seq-len", "16", "--T", "64",
                "--batch-size", "8", "--eval-every", "0", "--device", "cpu", "--unit", "sentence", "--max-steps", "2") == 0
    assert _cli(monkeypatch, "train", "--out", str(out), "--resume", "--max-steps", "3") == 0
    assert checkpoint.load_trainer_state(out)["state"]["step"] == 3
    capsys.readouterr()
    assert _cli(monkeypatch, "train", "--out", str(out), "--resume", "--max-steps", "4", "--T", "128") == 2
    assert "--T is 64 in the checkpoint, not 128" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- safety
def test_one_writer_per_output_folder(tmp_path):
    out = tmp_path / "run"
    lock = OutLock(out)
    with pytest.raises(DbertError, match="being written by another dbert run"):
        Trainer(tiny_config(out, max_steps=2)).prepare()
    lock.release()
    Trainer(tiny_config(out, max_steps=2)).run()
    assert not list(tmp_path.glob(".*lock*"))  # released and removed when the run ends


def test_unwritable_out_fails_before_training(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(DbertError, match="cannot"):
        Trainer(tiny_config(tmp_path / "file" / "run", max_steps=2)).prepare()


def test_divergence_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "run"
    original = Trainer.loss

    def poisoned(self, examples):
        loss, m = original(self, examples)
        return (loss * math.nan, m) if self.step >= 3 else (loss, m)

    monkeypatch.setattr(Trainer, "loss", poisoned)
    with pytest.raises(DbertError, match="diverged at step 4.*last good checkpoint"):
        Trainer(tiny_config(out, max_steps=10, save_every=2)).run()
    db = checkpoint.load(out)
    assert checkpoint.load_trainer_state(out)["state"]["step"] == 2
    assert all(torch.isfinite(p).all() for p in db.model.parameters())
    assert not list(tmp_path.glob(".*lock*"))


def test_sampler_refuses_a_non_finite_model(tiny_db):
    from dbert_core.sampling.sample import generate

    db = copy.deepcopy(tiny_db)
    with torch.no_grad():
        next(db.model.parameters()).fill_(math.nan)
    for sampler in config.SAMPLERS:
        with pytest.raises(DbertError, match="not finite"):
            generate(db, n=2, length=8, steps=16, seed=0, sampler=sampler)


def test_store_names_win_over_a_local_folder(tmp_path, monkeypatch, tiny_checkpoint):
    import shutil
    from pathlib import Path

    from dbert_core.storage import store

    shutil.copytree(tiny_checkpoint, store.store_dir() / "mine")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()  # a folder here with the same name
    assert store.resolve("mine") == store.store_dir() / "mine"
    assert Path(store.resolve("./mine")).resolve() == (tmp_path / "mine").resolve()
    (tmp_path / "other").mkdir()
    assert store.out_path("other") == store.store_dir() / "other"  # a bare --out is a store entry
    assert store.out_path("./other") == Path("./other")
