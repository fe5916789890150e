"""Settings declared once (dbert_core/settings.py) and errors with fields (errors.DbertError): the
same bad input said in each front end's own words (the CLI's flag, the server's JSON field, the
TUI form's label), and the command line's options made from the schema: a setting declared there
is an option, with its help, default and range check."""

from __future__ import annotations

import pytest

from dbert_core import settings
from dbert_core.config import SAMPLE_SETTINGS, TRAIN_SETTINGS, SampleConfig, TrainConfig
from dbert_core.errors import DbertError
from helpers import SIZE, TINYSTORIES, fill_dialog, finished, make_app, run, wait_for


def test_an_error_carries_its_setting_and_each_front_end_names_it():
    e = DbertError("must be in (0, 1] (got 1.5)", "top_p", 1.5)
    assert (e.setting, e.value) == ("top_p", 1.5) and str(e) == "top_p must be in (0, 1] (got 1.5)"
    assert e.said(settings.flag) == "--top-p must be in (0, 1] (got 1.5)"
    assert e.said(settings.field) == "top_p must be in (0, 1] (got 1.5)"
    other = DbertError("is more than $length ($$5): no story", "min_length", 9, ("length",))
    assert other.said(settings.flag) == "--min-length is more than --length ($5): no story"
    assert other.said(settings.field) == "min_tokens is more than max_tokens ($5): no story"
    assert other.said(lambda name: settings.label(name)) == "shortest story is more than length ($5): no story"


def test_library_messages_name_no_cli_flag():
    """The engine's words are the library's: a setting is its field, the CLI adds the flag."""
    for cfg in (SampleConfig(top_p=1.5), SampleConfig(params={"tau": 1}), SampleConfig(workers=0)):
        with pytest.raises(DbertError) as e:
            cfg.validate()
        assert "--" not in str(e.value) and e.value.setting in ("top_p", "params", "workers")
    with pytest.raises(DbertError) as e:
        TrainConfig(data=["x.txt"], out="o", trim_vocab=True).validate()
    assert str(e.value) == "trim_vocab needs init (a preset learns a vocabulary from the data anyway)"
    assert e.value.said(settings.flag).startswith("--trim-vocab needs --init ")


CLI_BAD = [
    (["--top-p", "1.5"], "--top-p must be a finite number in (0, 1] (got 1.5)"),
    (["--steps", "100000"], "--steps must be between 1 and T="),
    (["--min-length", "5"], "--min-length needs a story checkpoint"),
    (["--length", "10", "a b c d e f g h i j k l"], "longer than --length 10"),
]


@pytest.mark.parametrize("args,said", CLI_BAD, ids=[a[0] for a, _ in CLI_BAD])
def test_the_cli_names_the_flag(tiny_checkpoint, capsys, monkeypatch, args, said):
    code, out, err = run(["sample", "-c", str(tiny_checkpoint), "-n", "1", *args], capsys, monkeypatch)
    assert code == 2 and out == "" and err.strip().splitlines() == [err.strip()]
    assert err.startswith("dbert: error: ") and said in err, err


# a bad value of a samples' setting that `dbert eval` shares with `dbert sample`: eval's words, sample's
EVAL_BAD = [(["--seed", "-1"], ["--seed", "-1"]), (["--batch-size", "0"], ["--batch-size", "0"]),
            (["--top-k", "-1"], ["--top-k", "-1"]), (["--top-p", "1.5"], ["--top-p", "1.5"]),
            (["--sample-steps", "0"], ["--steps", "0"]), (["--sample-length", "0"], ["--length", "0"])]


@pytest.mark.parametrize("given,in_sample", EVAL_BAD, ids=[g[0] for g, _ in EVAL_BAD])
def test_eval_says_a_bad_sample_setting_as_sample_does(tiny_checkpoint, tmp_path, capsys, monkeypatch, given,
                                                       in_sample):
    """`dbert eval`'s options for its samples are `dbert sample`'s settings (settings.SAMPLE: their
    type, range and check), --sample-steps and --sample-length under eval's own names."""
    data = tmp_path / "held-out.txt"
    data.write_text("once upon a time there was a cat\n")
    code, out, said = run(["sample", "-c", str(tiny_checkpoint), "-n", "1", *in_sample], capsys, monkeypatch)
    assert code == 2 and out == "" and said.startswith(f"dbert: error: {in_sample[0]} must be "), said
    if given[0] != in_sample[0]:  # eval's own name for it, then the one `dbert sample` knows it by
        said = said.replace(in_sample[0], f"{given[0]} (the samples' {in_sample[0]})", 1)
    code, out, err = run(["eval", "-c", str(tiny_checkpoint), "--data", str(data), *given], capsys, monkeypatch)
    assert (code, out, err) == (2, "", said)


SERVER_BAD = [
    ({"top_p": 1.5}, "top_p", "top_p must be a finite number in (0, 1] (got 1.5)"),
    ({"dbert": {"steps": 100000}}, "dbert.steps", "dbert.steps must be between 1 and T="),
    ({"min_tokens": 3}, "min_tokens", "min_tokens needs a story checkpoint"),
    ({"dbert": {"sampler": "nope"}}, "dbert.sampler", "dbert.sampler must be one of: "),
]


@pytest.mark.parametrize("body,param,said", SERVER_BAD, ids=[p for _, p, _ in SERVER_BAD])
def test_the_server_names_the_json_field(tiny_db, body, param, said):
    from dbert_core.serving.api_error import ApiError
    from dbert_core.serving.options import Limits
    from dbert_core.serving.request import parse

    with pytest.raises(ApiError) as e:
        parse({"prompt": "once upon a time", "max_tokens": 8, **body}, tiny_db, "tiny", Limits())
    assert e.value.status == 400 and e.value.param == param and e.value.message.startswith(said), e.value.message
    assert "--" not in e.value.message


def test_a_setting_given_a_dbert_field_is_a_request_field(tiny_db, monkeypatch):
    """A setting whose entry in settings.SAMPLE has a dbert.* field is a field of the server's
    requests with nothing written in serving/request.py: read, checked against its kind and range
    (a 400 naming the field) and handed to the SampleConfig. cache_refresh and cache_masked, the
    command line's only today, are given fields here."""
    from dataclasses import replace

    from dbert_core.serving.api_error import ApiError
    from dbert_core.serving.options import Limits
    from dbert_core.serving.request import parse

    body = {"prompt": "once upon a time", "max_tokens": 8, "dbert": {"cache_refresh": 2, "cache_masked": True}}
    with pytest.raises(ApiError, match="unknown dbert field 'cache_masked'"):  # not a field yet: the test can fail
        parse(body, tiny_db, "tiny", Limits())
    fields = {"cache_refresh": "dbert.cache_refresh", "cache_masked": "dbert.cache_masked"}
    monkeypatch.setattr(settings, "SAMPLE", tuple(replace(s, field=fields.get(s.name, s.field)) for s in settings.SAMPLE))
    cfg = parse(body, tiny_db, "tiny", Limits()).prompts[0].cfg
    assert (cfg.cache_refresh, cfg.cache_masked) == (2, True)
    cfg = parse({**body, "dbert": {"cache_refresh": None}}, tiny_db, "tiny", Limits()).prompts[0].cfg
    assert (cfg.cache_refresh, cfg.cache_masked) == (0, False)  # left out (or null): what `dbert sample` resolves
    for given, said in (({"cache_refresh": -1}, "dbert.cache_refresh must be a whole number in [0, 1000000] (got -1)"),
                        ({"cache_refresh": "2"}, 'dbert.cache_refresh must be a whole number in [0, 1000000] (got "2")'),
                        ({"cache_masked": 1}, "dbert.cache_masked must be true or false (got 1)"),
                        ({"cache_masks": 1}, "unknown dbert field 'cache_masks'; known: steps, top_k, sampler, "
                                             "params, cache_refresh, cache_masked, block_repeats, ")):
        with pytest.raises(ApiError) as e:
            parse({**body, "dbert": given}, tiny_db, "tiny", Limits())
        field = "dbert" if "cache_masks" in given else "dbert." + next(iter(given))
        assert e.value.status == 400 and e.value.param == field and e.value.message.startswith(said), e.value.message


def test_the_openai_fields_are_checked_by_their_settings(tiny_db, monkeypatch):
    """max_tokens, min_tokens, temperature, top_p, n and seed are read as the settings whose field they
    are (length, min_length, ...): their type and range from settings.SAMPLE, so a range changed
    there is the server's; only the server's own bounds (--max-tokens, --max-n) are its code's."""
    from dataclasses import replace

    from dbert_core.serving.api_error import ApiError
    from dbert_core.serving.options import Limits
    from dbert_core.serving.request import parse

    body = {"prompt": "once upon a time", "max_tokens": 8}
    assert parse({**body, "seed": 7}, tiny_db, "tiny", Limits()).prompts[0].cfg.seed == 7
    monkeypatch.setattr(settings, "SAMPLE", tuple(replace(s, hi=5) if s.name == "seed" else s for s in settings.SAMPLE))
    for given, field, said in (({"seed": 7}, "seed", "seed must be a whole number in [0, 5] (got 7)"),
                               ({"seed": 1.5}, "seed", "seed must be a whole number in [0, 5] (got 1.5)"),
                               ({"n": 0}, "n", "n must be a whole number >= 1 (got 0)"),
                               ({"n": 9}, "n", "this request asks for 9 completions"),
                               ({"max_tokens": 0}, "max_tokens", "max_tokens must be a whole number >= 1 (got 0)"),
                               ({"max_tokens": 10**6}, "max_tokens", "max_tokens must be in [1, 64] (got 1000000)"),
                               ({"min_tokens": -1}, "min_tokens", "min_tokens must be a whole number >= 0 (got -1)"),
                               ({"top_p": 0}, "top_p", "top_p must be a finite number in (0, 1] (got 0)")):
        with pytest.raises(ApiError) as e:
            parse({**body, **given}, tiny_db, "tiny", Limits(max_tokens=64, max_n=8))
        assert e.value.status == 400 and e.value.param == field and e.value.message.startswith(said), e.value.message


@pytest.mark.anyio
async def test_the_settings_dialog_names_its_field(tiny_db):
    from dbert_tui.screens.dialogs import FormDialog

    app = make_app(tiny_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="the first run")
        for values, key, said in (({"top_p": "1.5"}, "top_p", "top-p must be a finite number in (0, 1] (got 1.5)"),
                                  ({"min_length": "5"}, "min_length", "shortest story needs a story checkpoint"),
                                  ({"steps": "100000"}, "steps", "steps must be between 1 and T=")):
            await pilot.press("e")
            await wait_for(pilot, lambda: isinstance(app.screen, FormDialog), what="the settings dialog")
            await fill_dialog(pilot, values)
            dialog = app.screen
            assert isinstance(dialog, FormDialog) and dialog.error[0] == key, dialog.error
            assert dialog.error[1].startswith(said) and "--" not in dialog.error[1], dialog.error
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, FormDialog))


@pytest.mark.anyio
async def test_the_train_form_names_its_fields(tiny_db):
    from dbert_tui.app import create_app
    from dbert_tui.controller import Settings

    app = create_app(checkpoint=tiny_db.path, loader=lambda p: tiny_db, train_data=[str(TINYSTORIES)],
                     settings=Settings(pace_ms=0, steps=4, length=12, sampler="ancestral"), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await wait_for(pilot, lambda: app.current_mode == "train")
        tr = app.train_screen
        tr.query_one("#tr-out").value = "named"
        for setup, said in ((lambda: setattr(tr.query_one("#tr-trim"), "value", True),
                             "trim vocab needs init (a preset learns a vocabulary from the data anyway)"),
                            (lambda: setattr(tr.query_one("#tr-lam"), "value", "5"),
                             "lambda must be a finite number in [0, 0.31831]"),
                            (lambda: setattr(tr.query_one("#tr-steps"), "value", "many"),
                             "steps must be a whole number, got 'many'")):
            tr.query_one("#tr-trim").value = False
            tr.query_one("#tr-lam").value = "0.3"
            tr.query_one("#tr-steps").value = "6"
            setup()
            app.clear_notifications()
            await pilot.press("f5")
            await pilot.pause()
            messages = [n.message for n in app._notifications]
            assert any(m.startswith(said) for m in messages) and not any("--" in m for m in messages), messages
        assert tr.trainer is None


DECLARED = [  # a command, the table of its settings, the config it builds, what a run of it needs
    ("sample", "SAMPLE_SETTINGS", "SampleConfig", []),
    ("train", "TRAIN_SETTINGS", "TrainConfig", ["--data", str(TINYSTORIES), "--out", "patient"]),
]


@pytest.mark.parametrize("command,table,made,needs", DECLARED, ids=[c for c, *_ in DECLARED])
def test_a_setting_declared_once_is_an_option_with_its_help_default_and_range(command, table, made, needs, capsys,
                                                                              monkeypatch, tmp_path):
    """One entry in settings.py (bound to the field of the config it sets) is all `dbert COMMAND`
    needs: the command derived from its table as importing it does lists the new option with its
    help and default, hands its value to the config, and the config's range check names its flag."""
    import importlib
    from dataclasses import dataclass, replace

    import typer

    from dbert_core import cli, config
    from dbert_core.cli import options

    base = getattr(config, made)

    @dataclass
    class Patient(base):  # type: ignore[valid-type, misc]  # the config with the new setting's field
        patience: int = 3

    declared = replace(settings.Setting("patience", int, "How many steps a patient run waits.", 1, 9), default=3)
    monkeypatch.setattr(config, made, Patient)
    monkeypatch.setitem(getattr(config, table), "patience", declared)  # as config binds it: validate checks it
    module = importlib.import_module(f"dbert_core.cli.commands.{command}")
    function = getattr(module, command)
    derived = options.with_settings(getattr(config, table), module.LAYOUT, module.CHANGED)(function.__wrapped__)
    info = next(c for c in cli.app.registered_commands if c.callback is function)
    monkeypatch.setattr(info, "callback", derived)
    seen: list = []
    if command == "sample":  # the config as the command made it, before a checkpoint loads
        def checked(cfg, *rest):
            seen.append(cfg)
            raise typer.Exit()
        monkeypatch.setattr(module, "_check_files", checked)
    else:
        class Trainer:  # the config as the command made it, validated as the trainer does, and no run
            def __init__(self, cfg, callbacks):
                seen.append(cfg.validate())

            def run(self):
                return {}
        monkeypatch.setattr(importlib.import_module("dbert_core.training.train"), "Trainer", Trainer)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = run([command, "--help-all" if command == "sample" else "--help"], capsys, monkeypatch)
    assert code == 0 and "--patience" in out and "How many steps a patient run waits." in out, out
    assert "[default: 3]" in out and "min_lr_ratio" not in out and "--min-lr-ratio" not in out, out
    for given, patience in (([], 3), (["--patience", "5"], 5)):
        code, out, err = run([command, *needs, *given], capsys, monkeypatch)
        assert code == 0 and out == "", err
        assert isinstance(seen[-1], Patient) and seen[-1].patience == patience
    code, out, err = run([command, *needs, "--patience", "0"], capsys, monkeypatch)
    assert (code, out, err) == (2, "", "dbert: error: --patience must be a whole number in [1, 9] (got 0)\n")


def test_every_default_lives_in_the_dataclasses():
    assert SAMPLE_SETTINGS["top_k"].default is None and SAMPLE_SETTINGS["n"].default == SampleConfig().n
    assert TRAIN_SETTINGS["max_steps"].default == TrainConfig(data=[], out="").max_steps
    from dbert_core import config
    from dbert_core.text import data, sources

    assert data.DOC_SEPS is config.DOC_SEPS and sources.DOC_SEPS is config.DOC_SEPS  # one tuple, not two


def test_the_servers_dbert_fields_are_the_schemas():
    from dbert_core.serving import request

    served = [s.field.split(".", 1)[1] for s in settings.SAMPLE if (s.field or "").startswith("dbert.")]
    assert list(request.dbert_fields()[:len(served)]) == served
    assert set(request.dbert_fields()) - set(served) == {"template", "stream_steps", "lowercase"}


def test_dbert_tui_names_its_own_flags(capsys):
    """dbert-tui's command line checks its settings before the app starts, naming the flag."""
    from dbert_tui.app import main

    with pytest.raises(SystemExit) as e:
        main(["--top-p", "5"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == "dbert-tui: error: --top-p must be a finite number in (0, 1] (got 5.0)\n"


def test_dbert_tuis_first_run_options_are_the_settings(capsys, monkeypatch):
    """dbert-tui's --steps, --top-k, --device, ... are `dbert sample`'s settings (settings.SAMPLE,
    bound in config.SAMPLE_SETTINGS) with the app's defaults: a declaration's metavar and a
    choice's values show in its --help, and the values reach the first run's Settings."""
    from dataclasses import replace

    from dbert_core import config
    from dbert_tui import app as tui_app
    from dbert_tui.controller import Settings

    monkeypatch.setitem(config.SAMPLE_SETTINGS, "top_k", replace(config.SAMPLE_SETTINGS["top_k"], metavar="KEPT"))
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit) as e:
        tui_app.main(["--help"])
    shown = {line.split()[1]: line.split()[2] for line in capsys.readouterr().out.splitlines()
             if line.startswith("│ --") and len(line.split()) > 2}
    assert e.value.code == 0 and shown["--top-k"] == "KEPT" and shown["--device"] == "<auto|cpu|cuda|mps>", shown
    seen = {}
    monkeypatch.setattr(tui_app, "run", lambda checkpoint, settings: seen.setdefault("s", settings) and 0)
    with pytest.raises(SystemExit):
        tui_app.main(["--top-k", "7", "--device", "cpu", "--length", "20"])
    assert seen["s"] == Settings(top_k=7, device="cpu", length=20)
