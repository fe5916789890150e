"""Settings declared once (dbert_core/settings.py) and errors with fields (errors.DbertError): the
same bad input said in each front end's own words (the CLI's flag, the server's JSON field, the
TUI form's label), and the command line's options agreeing with the schema, so a drift fails."""

from __future__ import annotations

from enum import Enum

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


def _options(command: str) -> dict:
    """`dbert COMMAND`'s options by their flags: {"--top-p": click.Option}."""
    import typer

    from dbert_core.cli import app

    group = typer.main.get_command(app)
    return {opt: p for p in group.commands[command].params for opt in p.opts}


def _default(value):
    return value.value if isinstance(value, Enum) else value


@pytest.mark.parametrize("command,table,bound", [("sample", settings.SAMPLE, SAMPLE_SETTINGS),
                                                 ("train", settings.TRAIN, TRAIN_SETTINGS)])
def test_the_cli_options_are_the_schemas(command, table, bound):
    """Every setting the schema gives a flag is an option of the command, with the schema's help
    and the dataclass's default; one named by its field alone (flag=name) is on no command line."""
    options = _options(command)
    for s in table:
        if s.cli == s.name:
            assert not any(s.name in opt for opt in options), s.name
            continue
        assert s.cli in options, f"{s.cli} is not an option of dbert {command}"
        option = options[s.cli]
        if s.name != "sampler":  # its help lists the registry's strategies (strategies.help_text)
            assert option.help == s.help, s.name
        default = _default(option.default)
        if s.name not in ("data", "out", "params", "cache_refresh", "cache_masked"):  # required, or repeatable
            assert default == bound[s.name].default, (s.name, default, bound[s.name].default)


def test_every_default_lives_in_the_dataclasses():
    assert SAMPLE_SETTINGS["top_k"].default is None and SAMPLE_SETTINGS["n"].default == SampleConfig().n
    assert TRAIN_SETTINGS["max_steps"].default == TrainConfig(data=[], out="").max_steps
    from dbert_core import config
    from dbert_core.text import data, sources

    assert data.DOC_SEPS is config.DOC_SEPS and sources.DOC_SEPS is config.DOC_SEPS  # one tuple, not two


def test_the_servers_dbert_fields_are_the_schemas():
    from dbert_core.serving import request

    served = [s.field.split(".", 1)[1] for s in settings.SAMPLE if (s.field or "").startswith("dbert.")]
    assert list(request.DBERT_FIELDS[:len(served)]) == served
    assert set(request.DBERT_FIELDS) - set(served) == {"template", "stream_steps", "lowercase"}


def test_dbert_tui_names_its_own_flags(capsys):
    """dbert-tui's command line checks its settings before the app starts, naming the flag."""
    from dbert_tui.app import main

    with pytest.raises(SystemExit) as e:
        main(["--top-p", "5"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == "dbert-tui: error: --top-p must be a finite number in (0, 1] (got 5.0)\n"
