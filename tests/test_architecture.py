"""The house rules of dbert's structure, read from the code itself (ast) or from a fresh interpreter.

- dbert_core is in packages by role (docs/architecture.md): a module imports only the floor
  (errors, config, settings, strategies, display, hardware, heap), its own package and the packages LAYERS lets
  its package import; only the `dbert` command (cli/) imports anything. The import
  graph (lazy imports inside functions included) has no cycle. docs/architecture.md and every
  package's docstring say the same packages, modules and layers as the code;
- config.py sits at the bottom: it imports errors.py, settings.py (the settings declared once) and
  strategies.py (the torch-free registry of choices) and nothing else, so resolving a SampleConfig against a checkpoint is the sampler's job;
- the old flat module names (dbert_core.sample, ...) import the moved modules, with a
  DeprecationWarning, for one release (dbert_core/_compat.py), and nothing of ours uses them;
- `import dbert_core.config` leaves torch out; only the CLI's modules (cli/)
  import typer or rich, and no engine module imports textual or dbert_tui;
- the TUI's modules that hold state and rules without widgets import no Textual;
- every on-disk file name is a constant of disk/layout.py;
- a sampling run resolves its settings once and hands them down;
- the TUI's state has one owner, the App (the checkpoint, the generation session, the replay,
  the last load error): no screen assigns those names, only the Session's methods set its fields, only the App (applying
  the dialogs' messages) and the Generate screen (its keys) call the methods that change it, no module outside screens/ sets a screen's
  attributes and none reaches into a screen's private ones; a worker thread only posts messages
  (or hands a callable to call_from_thread), so widgets and screen lists change on the UI thread;
- no test module imports another (shared helpers: tests/helpers.py);
- the engine's rooms stay small: no module of dbert_core over 500 lines (issue 37);
- no function or method of dbert_core or dbert_tui over 80 lines, def line to last (issue 60);
- the TUI's rooms stay small: no module of dbert_tui over 500 lines, no widget module over 400;
  a widget imports no screen and calls nothing on its screen (it posts a message upward; the
  screen calls it back), so the Generate screen's parts (widgets/generate/) each own their state.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

CORE = ROOT / "dbert_core"
TUI = ROOT / "dbert_tui"
FLOOR = {"__init__", "_compat", "errors", "stopping", "config", "settings", "strategies", "display", "hardware", "heap"}  # dbert_core/*.py below all
CLI_MODULES = {"cli"}                      # the `dbert` command (cli/): on top, and the only engine modules on typer and rich
LAYERS = {  # each package of dbert_core -> the packages it may import besides the floor and itself
    "disk": set(),
    "text": {"disk"},
    "maths": set(),
    "sampling": {"disk", "text", "maths"},
    "storage": {"disk", "text", "maths"},
    "training": {"disk", "text", "maths", "storage"},
    "evaluation": {"disk", "text", "maths", "sampling", "storage", "training"},
    "serving": {"disk", "text", "maths", "sampling", "storage"},
}
TEXTUAL_FREE = ("controller.py", "runs.py", "editing.py", "files.py", "forms.py", "render.py")  # dbert_tui's modules without widgets
NAMES = ("dbert.json", "config.json", "model.safetensors", "dbert_tokens.safetensors", "dbert_time.safetensors",
         "dbert_truecase.json", "dbert_words.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
         "trainer_state", "state.json", "optimizer.pt", "rng.pt", "tui.json", "bench.json", "bench.md")


def _name(path: Path) -> str:
    """dbert_core/sampling/sample.py -> "sampling.sample"; a package's __init__.py -> its package
    ("sampling"); dbert_core/__init__.py -> "__init__"."""
    parts = path.relative_to(CORE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _modules(package: Path = CORE) -> dict[str, ast.Module]:
    return {_name(p): ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(package.rglob("*.py"))}


def _typing_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under `if TYPE_CHECKING:`: imports for the type checker, never run."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for stmt in node.body for n in ast.walk(stmt)}


def _imports(tree: ast.Module, package: str = "dbert_core", typing: bool = True) -> set[str]:
    """Every module an ast imports, top level or inside a function, as absolute dotted names
    (a relative import is made absolute from `package`, the importing module's package);
    typing=False leaves out the ones under `if TYPE_CHECKING:`."""
    found = set()
    unrun = set() if typing else _typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in unrun:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from . import store` names a module
    return found


def _package_of(name: str) -> str:
    """The dotted package a module's relative imports start from."""
    if name == "__init__":
        return "dbert_core"
    if (CORE / name.replace(".", "/")).is_dir():
        return f"dbert_core.{name}"
    return ".".join(["dbert_core"] + name.split(".")[:-1])


def _graph(typing: bool = True) -> dict[str, set[str]]:
    """module -> the dbert_core modules it imports (a package's __init__ only when nothing under it is named);
    typing=False: the imports that run (not the ones under `if TYPE_CHECKING:`)."""
    mods = _modules()
    dotted = {("dbert_core" if m == "__init__" else f"dbert_core.{m}"): m for m in mods}
    graph = {}
    for name, tree in mods.items():
        hits = {i for i in _imports(tree, _package_of(name), typing) if i in dotted}
        hits -= {h for h in hits if any(o.startswith(h + ".") for o in hits)}
        graph[name] = {dotted[h] for h in hits} - {name}
    return graph


def _group(name: str) -> str:
    """Where a module stands: "floor", "cli" or its package."""
    head = name.split(".")[0]
    if head in LAYERS:
        return head
    if name in FLOOR:
        return "floor"
    if head in CLI_MODULES:  # cli/: the app, its helpers and commands/, one module per command
        return "cli"
    pytest.fail(f"dbert_core/{name.replace('.', '/')}.py stands in no package of LAYERS, the floor or the CLI")


def test_the_engine_import_graph_has_no_cycle():
    """At run time: the caches (maths/prefix_cache.py, decided_cache.py) import the model, and the
    model names their types for the type checker only (under TYPE_CHECKING)."""
    graph = _graph(typing=False)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        trail = path + [node]
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import cycle in dbert_core: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail)
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_every_module_imports_only_its_floor_its_package_and_the_layers_below():
    packages = {p.name for p in CORE.iterdir() if (p / "__init__.py").is_file()} - CLI_MODULES
    assert packages == set(LAYERS), f"packages LAYERS lacks: {sorted(packages - set(LAYERS))}; " \
                                    f"gone: {sorted(set(LAYERS) - packages)}"
    below: dict[str, set[str]] = {}  # every package a package reaches, so the layers themselves have no circle

    def reach(p: str, path: tuple[str, ...] = ()) -> set[str]:
        assert p not in path, "LAYERS has a circle: " + " -> ".join(path + (p,))
        if p not in below:
            below[p] = set().union(*({q} | reach(q, path + (p,)) for q in LAYERS[p]))
        return below[p]

    for p in LAYERS:
        reach(p)
    graph = _graph()
    wrong = []
    for m in sorted(graph):
        g = _group(m)
        allowed = {"floor", g} | LAYERS.get(g, set()) if g != "cli" else None
        wrong += [f"{m} ({g}) -> {d} ({_group(d)})" for d in sorted(graph[m]) if allowed is not None and
                  _group(d) not in allowed]
    assert not wrong, "imports across dbert_core's layers (docs/architecture.md):\n" + "\n".join(wrong)


def _layers_of_docstring(text: str) -> set[str]:
    line = re.search(r"^May import: (.*)$", text, re.M)
    assert line, "no 'May import:' line"
    text = re.sub(r"\(.*?\)|\bonly\b", "", line.group(1))
    return {w.strip(" .") for w in text.split(",")} - {"the floor"}


def test_every_package_says_what_lives_there_and_what_it_may_import():
    mods = _modules()
    for package, allowed in LAYERS.items():
        doc = ast.get_docstring(mods[package]) or ""
        assert _layers_of_docstring(doc) == allowed, f"dbert_core/{package}/__init__.py"
        unnamed = [m for m in mods if m.startswith(package + ".") and not re.search(rf"\b{m.split('.')[1]}\b", doc)]
        assert not unnamed, f"dbert_core/{package}/__init__.py does not name {unnamed}"
        assert len(mods[package].body) == 1, f"dbert_core/{package}/__init__.py holds more than its docstring"


def test_docs_architecture_names_the_packages_modules_and_layers_of_the_code():
    """docs/architecture.md's table: | `package/` | modules | may import |, one row a package,
    and the floor's row for the top-level modules; the command's row names cli/'s modules
    (commands/train for cli/commands/train.py)."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {m.group(1): ({w.strip() for w in m.group(2).split(",")}, {w.strip() for w in m.group(3).split(",")})
            for m in re.finditer(r"^\| `([a-z_]+)/?` \| ([^|]+) \| ([^|]+) \|$", doc, re.M)}
    code = {p: {m.split(".")[1] for m in _modules() if m.startswith(p + ".")} for p in LAYERS}
    code["floor"] = FLOOR - {"__init__", "_compat"}
    code["cli"] = {m.split(".", 1)[1].replace(".", "/") for m in _modules()
                   if m.startswith("cli.") and m not in ("cli.__main__", "cli.commands")}
    assert {p: mods for p, (mods, _) in rows.items()} == code
    assert {p: layers - {"floor", "-"} for p, (_, layers) in rows.items() if p in LAYERS} == LAYERS
    for path in re.findall(r"dbert_core/[\w/]+\.py", doc):
        assert (ROOT / path).is_file(), f"docs/architecture.md names {path}, which is not there"


def test_the_old_module_names_import_the_moved_modules_with_a_warning():
    """One release of grace: the three ways to import an old name each give the very module, and a
    DeprecationWarning that names the new name and the importing line."""
    code = """if True:
        import importlib, sys, warnings
        from dbert_core._compat import MOVED
        ways = ["import dbert_core.{0} as m", "from dbert_core import {0} as m",
                "from dbert_core.{0} import __doc__; m = sys.modules['dbert_core.{0}']"]
        for i, (old, package) in enumerate(sorted(MOVED.items())):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                scope = {"sys": sys}
                exec(compile(ways[i % 3].format(old), "<user>", "exec"), scope)
            new = importlib.import_module(f"dbert_core.{package}.{old}")
            assert scope["m"] is new and new.__spec__.name == new.__name__ == f"dbert_core.{package}.{old}", old
            assert [(w.category, w.filename) for w in seen] == [(DeprecationWarning, "<user>")], (old, seen)
            assert f"dbert_core.{package}.{old}" in str(seen[0].message), seen[0].message
        print(len(MOVED))
        """
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    from dbert_core._compat import MOVED

    assert int(out.stdout) == len(MOVED) and all((CORE / p / f"{m}.py").is_file() for m, p in MOVED.items())


def test_nothing_of_ours_imports_an_old_module_name():
    from dbert_core._compat import OLD

    found = []
    for folder in ("dbert_core", "dbert_tui", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            package = ".".join(path.relative_to(ROOT).parent.parts)
            names = _imports(ast.parse(path.read_text(encoding="utf-8")), package)
            found += [f"{path.relative_to(ROOT)}: {n}" for n in sorted(names & set(OLD))]
    assert not found, "old module names (dbert_core/_compat.py):\n" + "\n".join(found)


def test_config_is_a_leaf():
    assert _graph()["config"] <= {"errors", "settings", "strategies"}
    assert _graph()["settings"] <= {"errors"}
    assert _graph()["strategies"] <= {"errors"}


def test_importing_config_leaves_torch_out():
    code = "import sys, dbert_core.config; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=120).returncode == 0


def test_only_the_cli_imports_typer_or_rich_and_nothing_imports_the_front_end():
    for name, tree in _modules().items():
        roots = {i.split(".")[0] for i in _imports(tree)}
        assert not roots & {"textual", "dbert_tui"}, f"dbert_core/{name}.py imports the front end"
        if name.split(".")[0] not in CLI_MODULES:
            assert not roots & {"typer", "rich", "click"}, f"dbert_core/{name}.py imports {roots & {'typer', 'rich'}}"


@pytest.mark.parametrize("name", TEXTUAL_FREE)
def test_the_tuis_state_modules_import_no_textual(name):
    roots = {i.split(".")[0] for i in _imports(ast.parse((TUI / name).read_text(encoding="utf-8")))}
    assert "textual" not in roots


def test_every_file_name_is_a_layout_constant():
    """In the engine and in the TUI: a file name a checkpoint or the store holds is written once,
    in disk/layout.py."""
    found = []
    trees = {f"dbert_core/{name.replace('.', '/')}.py": tree for name, tree in _modules().items()}
    trees.update({f"dbert_tui/{name}": tree for name, tree in _tui_modules().items()})
    for where, tree in trees.items():
        if where == "dbert_core/disk/layout.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert not found, "file names outside disk/layout.py:\n" + "\n".join(found)


def test_a_sampling_run_checks_its_settings_once(tiny_db, monkeypatch):
    from dbert_core.sampling import sample, settings

    calls = []
    real = settings.validate
    monkeypatch.setattr(settings, "validate", lambda *a, **k: calls.append(a) or real(*a, **k))
    texts, _ = sample.generate(tiny_db, n=3, batch_size=1, steps=4, seed=0)
    assert len(texts) == 3 and len(calls) == 1
    cfg = sample.resolve(sample.SampleConfig(n=2, steps=4, seed=0), tiny_db)
    calls.clear()
    assert len(list(sample.frames(tiny_db, cfg))) >= 1 and calls == []  # handed a resolved config: taken as it is
    cfg.steps = 10 ** 6  # changed since: resolved again, and refused
    with pytest.raises(sample.DbertError) as e:
        next(sample.frames(tiny_db, cfg))
    assert e.value.setting == "steps"
    assert list(sample.frames(tiny_db, n=2, steps=4, seed=0))  # the README's form


def test_no_test_module_imports_another():
    """Shared helpers live in tests/helpers.py; a test module never imports a test module or conftest."""
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        roots = {i.split(".")[0] for i in _imports(ast.parse(path.read_text(encoding="utf-8")))}
        bad = {r for r in roots if r.startswith("test_") or r == "conftest"}
        assert not bad, f"tests/{path.name} imports {sorted(bad)}"


# ------------------------------------------------------------------------------ the engine's rooms
CORE_MAX_LINES = 500


def test_no_core_module_is_a_house_of_its_own():
    """serving/serve.py was 853 lines and disk/layout.py 704, each split since into modules of its
    package, one idea each (issue 37): a module of dbert_core is read whole, or split by what
    changes together."""
    big = []
    for path in sorted(CORE.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > CORE_MAX_LINES:
            big.append(f"dbert_core/{path.relative_to(CORE)}: {lines} lines (at most {CORE_MAX_LINES})")
    assert not big, "\n".join(big)


FUNCTION_MAX_LINES = 80  # a function is read on one screen (issue 60)


def test_no_function_is_a_house_of_its_own():
    """`dbert sample` was one function of 139 lines, request.parse 108: each split since into
    helpers that do one thing (issue 60). A function or method of dbert_core or dbert_tui, from
    its def line to its last (a command's option signature included), is at most 80 lines."""
    long = []
    for package in (CORE, TUI):
        for path in sorted(package.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > FUNCTION_MAX_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines "
                                    f"(at most {FUNCTION_MAX_LINES})")
    assert not long, "\n".join(long)


# ------------------------------------------------------------------------------ the TUI's state
APP_STATE = {"db", "session", "replay", "load_error"}  # DbertApp's: screens read them from the App
THREAD_SAFE = {"post_message", "call_from_thread"}    # all a worker thread may call on its screen or app
INJECTED = {"loader"}                                  # callables handed to the App (DbertApp.loader): no UI in them


def _tui_modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(TUI)): ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(TUI.rglob("*.py"))}


def _screenish(node: ast.AST) -> bool:
    """`self.generate_screen`, `app.checkpoints_screen`, `screen`, `self.screen`: an expression naming a screen."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name == "screen" or name.endswith("_screen")


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _targets(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            yield from ((node, t) for t in node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            yield node, node.target


def test_the_app_owns_the_tuis_state():
    found = []
    for name, tree in _tui_modules().items():
        for node in ast.walk(tree):  # nobody reaches into a screen's private attributes
            if (isinstance(node, ast.Attribute) and _screenish(node.value) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                found.append(f"dbert_tui/{name}:{node.lineno}: reads or writes a screen's private {node.attr}")
        for node, target in _targets(tree):
            if not isinstance(target, ast.Attribute):
                continue
            if not name.startswith("screens/") and _screenish(target.value):
                found.append(f"dbert_tui/{name}:{node.lineno}: sets a screen's {target.attr} from outside the screens")
            if name.startswith("screens/") and target.attr in APP_STATE and _root(target) == "self":
                found.append(f"dbert_tui/{name}:{node.lineno}: a screen keeps its own {target.attr} (the App's)")
    assert not found, "\n".join(found)


def _sessionish(node: ast.AST) -> bool:
    """`session`, `self.session`, `self.app.session`: an expression naming the generation Session."""
    return (isinstance(node, ast.Name) and node.id == "session") or (isinstance(node, ast.Attribute) and node.attr == "session")


def test_the_session_owns_its_fields():
    """The generation Session (controller.Session) changes its fields in its own methods only: no
    widget, screen or key action assigns them or draws run ids from its private counter; a widget
    tells its screen in a message (messages.py) and the screen asks the Session."""
    found = []
    for name, tree in _tui_modules().items():
        if name == "controller.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "_ids":
                found.append(f"dbert_tui/{name}:{node.lineno}: draws from the Session's private _ids")
        for node, target in _targets(tree):
            if isinstance(target, ast.Tuple):
                targets = target.elts
            else:
                targets = [target]
            for t in targets:
                if isinstance(t, ast.Attribute) and _sessionish(t.value):
                    found.append(f"dbert_tui/{name}:{node.lineno}: sets the Session's {t.attr}")
    assert not found, "\n".join(found)


SESSION_OWNERS = ("app.py", "screens/generate/")  # who asks the Session for a change (test below)


def _session_mutators() -> set[str]:
    """The Session's methods that change it: those that set a field of self (a tuple of them too),
    and those that call one that does."""
    tree = _tui_modules()["controller.py"]
    session = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    methods = {n.name: n for n in session.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")}
    changing = set()
    for name, fn in methods.items():
        for _, target in _targets(fn):
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    changing.add(name)
    calls = {name: {n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"} for name, fn in methods.items()}
    while True:
        more = {name for name, called in calls.items() if called & changing} - changing
        if not more:
            return changing
        changing |= more


def test_only_the_app_and_the_generate_screen_change_the_session():
    """The Session is the App's: the App applies what a dialog chose (the settings and prompt
    dialogs post messages.SettingsChosen / PromptChosen) and the Generate screen's keys ask it for
    their changes (screens/generate/). No widget, dialog or other screen calls a method that
    changes it, nor names one to be called (a bound method handed on): a widget posts a message
    to its screen, a dialog to the App."""
    mutators = _session_mutators()
    assert {"change", "set_all", "new_seed", "select", "zoom", "fit"} <= mutators, sorted(mutators)
    assert not mutators & {"active_playback", "shown_settings", "origins", "sides", "view_mode", "playback_of"}
    found = []
    for name, tree in _tui_modules().items():
        if name == "controller.py" or name.startswith(SESSION_OWNERS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in mutators and _sessionish(node.value):
                found.append(f"dbert_tui/{name}:{node.lineno}: calls the Session's {node.attr}")
    assert not found, "\n".join(found)


def _thread_bodies(tree: ast.Module):
    """The functions that run on a worker thread: @work(thread=True) methods and the methods
    handed to run_worker(..., thread=True) or to in_daemon_thread, by name."""
    handed = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run_worker"
                and any(k.arg == "thread" and getattr(k.value, "value", False) is True for k in node.keywords)):
            target = node.args[0]
            if isinstance(target, ast.Call) and target.args:  # partial(self._sample, ...)
                target = target.args[0]
            if isinstance(target, ast.Attribute):
                handed.add(target.attr)
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "in_daemon_thread" and node.args
                and isinstance(node.args[0], ast.Attribute)):  # app.py's own daemon thread (the checkpoint load)
            handed.add(node.args[0].attr)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            threaded = any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "work"
                           and any(k.arg == "thread" and getattr(k.value, "value", False) is True for k in d.keywords)
                           for d in node.decorator_list)
            if threaded or node.name in handed:
                yield node


def test_worker_threads_only_post_to_the_ui():
    found, bodies = [], 0
    for name, tree in _tui_modules().items():
        for fn in _thread_bodies(tree):
            bodies += 1
            for node, target in _targets(fn):
                if isinstance(target, ast.Attribute) and _root(target) == "self":
                    found.append(f"dbert_tui/{name}:{node.lineno}: {fn.name} (a worker thread) sets self.{target.attr}")
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _root(node.func) == "self":
                    if node.func.attr not in THREAD_SAFE | INJECTED:
                        found.append(f"dbert_tui/{name}:{node.lineno}: {fn.name} (a worker thread) calls "
                                     f"self...{node.func.attr}()")
    # the training callback runs on the training worker's thread: it only posts to its screen
    train = _tui_modules()["screens/train.py"]
    callback = next(n for n in ast.walk(train) if isinstance(n, ast.ClassDef) and n.name == "TuiCallback")
    for node in ast.walk(callback):
        if isinstance(node, ast.Attribute) and _screenish(node.value) and node.attr not in THREAD_SAFE:
            found.append(f"dbert_tui/screens/train.py:{node.lineno}: TuiCallback uses the screen's {node.attr}")
    # workers.py (the worker error report) touches no widget
    workers = _tui_modules()["workers.py"]
    if {i for i in _imports(workers) if i.startswith("textual.widget")} or any(
            isinstance(n, ast.Attribute) and n.attr in {"query", "query_one", "mount"} for n in ast.walk(workers)):
        found.append("dbert_tui/workers.py touches widgets")
    assert bodies >= 6, f"found only {bodies} worker bodies: the test no longer sees them"
    assert not found, "\n".join(found)


# ------------------------------------------------------------------------------ the TUI's rooms
TUI_MAX_LINES, WIDGET_MAX_LINES = 500, 400


def test_no_tui_module_is_a_house_of_its_own():
    """The Generate screen was one class of 1,212 lines; its parts are widgets now (widgets/generate/)."""
    big = []
    for path in sorted(TUI.rglob("*.py")):
        rel, lines = path.relative_to(TUI), len(path.read_text(encoding="utf-8").splitlines())
        limit = WIDGET_MAX_LINES if rel.parts[0] == "widgets" else TUI_MAX_LINES
        if lines > limit:
            big.append(f"dbert_tui/{rel}: {lines} lines (at most {limit})")
    assert not big, "\n".join(big)


def test_widgets_talk_to_their_screen_by_messages():
    """A widget imports no screen and calls nothing on `self.screen` (its size aside): it posts a
    message upward, and the screen, which composes it, calls its methods downward."""
    found = []
    for name, tree in _tui_modules().items():
        if not name.startswith("widgets/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and "screens" in (node.module or "").split("."):
                found.append(f"dbert_tui/{name}:{node.lineno}: imports {node.module}")
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "screen"
                    and _root(node.value) == "self" and node.attr != "size"):
                found.append(f"dbert_tui/{name}:{node.lineno}: uses self.screen.{node.attr}")
    assert "widgets/generate/player.py" in _tui_modules(), "the Generate screen's widgets moved: update this test"
    assert not found, "\n".join(found)

