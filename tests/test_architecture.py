"""The house rules of dbert's structure, read from the code itself (ast) or from a fresh interpreter.

- dbert_core's import graph (lazy imports inside functions included) has no cycle and no arrow
  up the floors of the package docstring's reading map, and config.py
  sits at the bottom: it imports errors.py and strategies.py (the torch-free registry of choices)
  and nothing else, so resolving a SampleConfig against a checkpoint is the sampler's job;
- `import dbert_core.config` leaves torch out; only the CLI's modules (cli.py, progress.py)
  import typer or rich, and no engine module imports textual or dbert_tui;
- the TUI's modules that hold state and rules without widgets import no Textual;
- every on-disk file name is a constant of layout.py;
- a sampling run resolves its settings once and hands them down;
- no test module imports another (shared helpers: tests/helpers.py).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

CORE = ROOT / "dbert_core"
TUI = ROOT / "dbert_tui"
CLI_MODULES = {"cli", "progress"}          # the `dbert` command: the only engine modules on typer and rich
TEXTUAL_FREE = ("controller.py", "files.py", "render.py")  # dbert_tui's modules without widgets
NAMES = ("dbert.json", "config.json", "model.safetensors", "dbert_tokens.safetensors", "dbert_time.safetensors",
         "dbert_truecase.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
         "trainer_state", "state.json", "optimizer.pt", "rng.pt", "tui.json", "bench.json", "bench.md")


def _modules(package: Path) -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in sorted(package.glob("*.py"))}


def _imports(tree: ast.Module) -> set[str]:
    """Every module an ast imports, top level or inside a function, as absolute dotted names
    (a relative import of dbert_core is made absolute)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = "dbert_core" + ("." + base if base else "")
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from . import store` names a module
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules(CORE)
    return {name: {i.split(".")[1] for i in _imports(tree) if i.startswith("dbert_core.")} & set(mods) - {name}
            for name, tree in mods.items()}


def test_the_engine_import_graph_has_no_cycle():
    graph = _graph()
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


# The reading map of dbert_core/__init__.py: a module imports only its own floor and the ones below.
FLOORS = {
    "leaf": {"__init__", "errors", "config", "strategies", "display", "jsonfile", "hardware", "trust", "net", "truecase",
             "detok", "stable"},
    "maths": {"schedule", "model", "diffusion"},
    "sampling": {"sample", "quotes", "inspector", "trajectory", "replay", "share", "distance"},
    "files": {"layout", "schema", "tokenizer", "data", "vocab", "pretrained", "checkpoint", "archive"},
    "store": {"store", "fetch"},
    "runs": {"prepare", "train", "metrics", "judge", "infill", "bench", "serve_queue", "serve", "progress", "cli"},
}


def test_every_module_is_on_a_floor_and_imports_no_floor_above_its_own():
    graph = _graph()
    level = {m: i for i, floor in enumerate(FLOORS.values()) for m in floor}
    assert set(level) == set(graph), f"floors to name: {sorted(set(graph) - set(level))}; gone: {sorted(set(level) - set(graph))}"
    up = [f"{m} ({list(FLOORS)[level[m]]}) -> {d} ({list(FLOORS)[level[d]]})"
          for m in sorted(graph) for d in sorted(graph[m]) if level[d] > level[m]]
    assert not up, "arrows up the floors of dbert_core/__init__.py:\n" + "\n".join(up)


def test_config_is_a_leaf():
    assert _graph()["config"] <= {"errors", "strategies"}
    assert _graph()["strategies"] <= {"errors"}


def test_importing_config_leaves_torch_out():
    code = "import sys, dbert_core.config; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=120).returncode == 0


def test_only_the_cli_imports_typer_or_rich_and_nothing_imports_the_front_end():
    for name, tree in _modules(CORE).items():
        roots = {i.split(".")[0] for i in _imports(tree)}
        assert not roots & {"textual", "dbert_tui"}, f"dbert_core/{name}.py imports the front end"
        if name not in CLI_MODULES:
            assert not roots & {"typer", "rich", "click"}, f"dbert_core/{name}.py imports {roots & {'typer', 'rich'}}"


@pytest.mark.parametrize("name", TEXTUAL_FREE)
def test_the_tuis_state_modules_import_no_textual(name):
    roots = {i.split(".")[0] for i in _imports(ast.parse((TUI / name).read_text(encoding="utf-8")))}
    assert "textual" not in roots


def test_every_file_name_is_a_layout_constant():
    found = []
    for name, tree in _modules(CORE).items():
        if name == "layout":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
                found.append(f"dbert_core/{name}.py:{node.lineno}: {node.value!r}")
    assert not found, "file names outside layout.py:\n" + "\n".join(found)


def test_a_sampling_run_checks_its_settings_once(tiny_db, monkeypatch):
    from dbert_core import sample

    calls = []
    real = sample.validate
    monkeypatch.setattr(sample, "validate", lambda *a, **k: calls.append(a) or real(*a, **k))
    texts, _ = sample.generate(tiny_db, n=3, batch_size=1, steps=4, seed=0)
    assert len(texts) == 3 and len(calls) == 1
    cfg = sample.resolve(sample.SampleConfig(n=2, steps=4, seed=0), tiny_db)
    calls.clear()
    assert len(list(sample.frames(tiny_db, cfg))) >= 1 and calls == []  # handed a resolved config: taken as it is
    cfg.steps = 10 ** 6  # changed since: resolved again, and refused
    with pytest.raises(sample.DbertError, match="--steps"):
        next(sample.frames(tiny_db, cfg))
    assert list(sample.frames(tiny_db, n=2, steps=4, seed=0))  # the README's form


def test_no_test_module_imports_another():
    """Shared helpers live in tests/helpers.py; a test module never imports a test module or conftest."""
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        roots = {i.split(".")[0] for i in _imports(ast.parse(path.read_text(encoding="utf-8")))}
        bad = {r for r in roots if r.startswith("test_") or r == "conftest"}
        assert not bad, f"tests/{path.name} imports {sorted(bad)}"
