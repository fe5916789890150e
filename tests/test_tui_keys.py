"""The TUI's keys are written once (dbert_tui/keymap.py's KeySpec catalogues): the bindings, the key
help (`?`), the key bar and the command palette all read them and agree; `duplicates` finds no
copy of them; and the Generate screen's key actions use only the public interface of their host."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from functools import partial

import pytest
from textual.actions import parse
from textual.style import Style

from dbert_tui.app import create_app
from dbert_tui.keymap import APP_KEYS
from dbert_tui.screens.checkpoints import CheckpointsScreen
from dbert_tui.screens.generate.keys import CATALOGUE, KeyActions, KeyHost
from dbert_tui.screens.generate.screen import GenerateScreen
from dbert_tui.screens.help import HelpScreen, key_rows
from dbert_tui.screens.train import TrainScreen
from dbert_tui.widgets.controls import ControlBar
from dbert_tui.widgets.keybar import COMMON, KeyBar
from helpers import ROOT, SIZE, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _without_shipped_default(monkeypatch):
    """No checkpoint at all: the app starts on the Checkpoints screen, with nothing to load."""
    from dbert_core.storage import store

    monkeypatch.setattr(store, "shipped", lambda name: None)


def _shown(app, spec) -> str:
    """How the key help names a spec's keys (Textual's names where the catalogue gives none)."""
    from textual.binding import Binding

    return spec.shown or " ".join(app.get_key_display(Binding(k, spec.action)) for k in spec.key.split(","))


async def test_the_bindings_the_key_help_the_key_bar_and_the_palette_read_one_catalogue():
    app = create_app(deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.current_mode == "checkpoints", what="the Checkpoints screen")
        g, tr = app.generate_screen, app.train_screen
        for screen, catalogue in ((g, CATALOGUE), (app.checkpoints_screen, CheckpointsScreen.CATALOGUE),
                                  (tr, TrainScreen.CATALOGUE)):
            bound = [s for s in catalogue if s.bound]
            assert [(b.key, b.action, b.description) for b in type(screen).BINDINGS] == \
                [(s.key, s.action, s.help) for s in bound]
            for s in bound:  # each key runs an action the screen has
                assert callable(getattr(screen, f"action_{parse(s.action)[1]}")), s.action
            # the key help: the screen's keys in the catalogue's order, then the app's (ctrl+p too)
            assert key_rows(app, screen) == [(_shown(app, s), s.help) for s in (*bound, *APP_KEYS)]
            # the key bar: the keys with a label, in their order, each running its own action
            bar = [s for s in catalogue if s.bar]
            shown = list(screen.query_one(KeyBar).keys) if screen is app.screen else list(type(screen).KEYS)
            assert [k.label for k in shown] == list(dict.fromkeys(s.bar for s in sorted(bar, key=lambda s: s.at)))
            for k in shown:
                spec = next(s for s in bar if s.bar == k.label)
                assert k.action == f"screen.{spec.action}" and spec.label in k.key
        assert [(k.key, k.label, k.action) for k in COMMON] == \
            [(s.label, s.bar, f"app.{s.action}") for s in sorted(APP_KEYS, key=lambda s: s.at)]
        # the palette: a command for each titled key, naming that key, running what the key runs
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        on_train = {c.title: c for c in app.get_system_commands(tr)}  # the Train screen's: offered there only
        assert not {s.palette for s in TrainScreen.CATALOGUE if s.palette} & set(commands)
        for host, catalogue, offered in ((app, APP_KEYS, commands), (g, CATALOGUE, commands),
                                         (tr, TrainScreen.CATALOGUE, on_train)):
            assert [s for s in catalogue if s.palette], "a catalogue with no palette entry: the check sees nothing"
            for s in (s for s in catalogue if s.palette):
                command = offered[s.palette]
                assert command.help.endswith(f"({s.label})"), command.help
                _, name, args = parse(s.action)
                callback = command.callback
                ran = (callback.func, callback.args) if isinstance(callback, partial) else (callback, ())
                assert ran == (getattr(host, f"action_{name}"), args)
                keyed = [b for b in type(host).BINDINGS if s.label in (b.key_display, *b.key.split(","))]
                assert [b.action for b in keyed] == [s.action]
        assert len([c for c in commands.values() if c.help.endswith(")")]) >= 20
        await pilot.resize_terminal(200, 30)  # room for every key of the bar
        await app.switch_mode("generate")  # no checkpoint: no setting is in force yet, and the bar says so
        await pilot.pause()
        assert g.query_one(ControlBar).plain() == "no checkpoint yet"
        keybar = g.query_one(KeyBar)  # a click on a key runs its action, arguments and all ("scrub(-1)")
        clicks = [Style.parse(str(span.style)).meta["@click"] for span in keybar.render().spans
                  if "@click" in str(span.style)]
        assert clicks == [k.action for k in keybar.shown()] and "screen.scrub(-1)" in clicks


def _drawn(app) -> list[str]:
    return [strip.text.rstrip() for strip in app.screen._compositor.render_strips()]


async def test_the_train_screens_keys_read_as_they_did_before_its_catalogue():
    """The Train screen wrote its bindings and bar keys by hand until its CATALOGUE: at 80x24 its
    key bar and its key help read word for word as they did then (^o Add file makes room)."""
    app = create_app(train_data=["corpus.txt"], deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.current_mode == "checkpoints", what="the Checkpoints screen")
        await app.switch_mode("train")
        await pilot.pause(0.2)
        assert _drawn(app)[-1] == " f5 Start  f6 Stop  f7 Resume  1 Gen  2 Ckpts  3 Train  ? Keys  ^q Quit"
        await pilot.press("escape", "question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the key help")
        await pilot.pause(0.2)
        lines = [line.strip("│ ") for line in _drawn(app)]
        rows = lines[lines.index("f5    Start training with the form's settings"):][:11]
        assert rows == [
            "f5    Start training with the form's settings",
            "f6    Stop (saves a checkpoint that F7 resumes)",
            "f7    Resume the run saved under the output name",
            "^o    Add a data file from a folder tree",
            "esc   Leave the text field (then 1/2/3 and ? work as keys)",
            "^q    Quit",
            "f1 1  Generate",
            "f2 2  Checkpoints",
            "f3 3  Train",
            "?     Keys",
            "^p    Command palette: every action and screen by name",
        ], _drawn(app)
        await pilot.resize_terminal(120, 24)  # room for the one key 80 columns leave out
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert _drawn(app)[-1].startswith(" f5 Start  f6 Stop  f7 Resume  ^o Add file  1 Gen")


def test_duplicates_finds_no_copy_of_the_key_catalogue():
    """The review found the keys written three times (keys.py's BINDINGS and KEYS, app.py's
    palette, keybar's COMMON): `duplicates` on dbert_tui pairs none of those places now. Two
    screens' catalogues alike in shape alone (rows of KeySpec(...) with other keys, then the
    same two lines that make BINDINGS and KEYS of them) are one catalogue per screen, not a copy."""
    if shutil.which("duplicates") is None:
        pytest.skip("the duplicates tool is not on PATH")
    out = subprocess.run(["duplicates", "--repo", str(ROOT / "dbert_tui"), "--most", "200", "--seconds", "120"],
                         capture_output=True, text=True, timeout=300).stdout
    assert "incomplete" not in out, out
    places = ("keymap.py", "screens/generate/keys.py", "widgets/keybar.py", "app.py", "screens/help.py",
              "screens/checkpoints.py")
    catalogues = ("screens/generate/keys.py", "screens/checkpoints.py", "screens/train.py")
    rows = [line for line in out.splitlines() if re.match(r"D\d+ ", line)]
    rows = [r for r in rows if not (r.endswith(" shape") and all(
        any(side.startswith(c) for c in catalogues) for side in r.split()[1::2][:2]))]
    assert not [r for r in rows if any(p in r for p in places)], out


def _self_names(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}


def test_the_key_actions_use_only_their_hosts_public_interface():
    """KeyActions (mixed into GenerateScreen) uses its own members and KeyHost's, which are all
    public and all the screen's; nothing else of the screen, none of its private methods."""
    tree = ast.parse((ROOT / "dbert_tui/screens/generate/keys.py").read_text(encoding="utf-8"))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    own = {n.name for n in classes["KeyActions"].body if isinstance(n, ast.FunctionDef)}
    host = {n.target.id for n in classes["KeyHost"].body if isinstance(n, ast.AnnAssign)}
    host |= {n.name for n in classes["KeyHost"].body if isinstance(n, ast.FunctionDef)}
    assert not [name for name in host if name.startswith("_")]
    used = _self_names(classes["KeyActions"])
    assert not used - own - host, f"KeyActions uses {sorted(used - own - host)} of its host outside KeyHost"
    screen = GenerateScreen()
    assert not [name for name in host if name not in vars(screen) and not hasattr(GenerateScreen, name)]
    assert issubclass(GenerateScreen, KeyActions) and KeyHost.__doc__
