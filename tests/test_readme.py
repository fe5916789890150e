"""The README as written: its safe commands run, its flags exist, its links and the docs' resolve.

The marker: a fenced block whose info string is ``bash safe`` holds commands this file runs, one
command a line (a trailing ``\\`` continues it, ``#`` lines and blank lines are skipped), in order,
in one scratch folder and one isolated store, so a later line may use what an earlier one made
(``dbert train ... --out tiny-stories`` then ``dbert sample -c tiny-stories``). ``bash safe slow``
runs the same way under ``@pytest.mark.slow``. Each command must exit 0 and print something on
stdout, except ``dbert train``, whose stdout must stay empty as the README promises. Mark only
commands that are cheap, need no network and write nothing outside the store and the folder they
run in. Untagged ``bash`` blocks are not run, but every ``--flag`` their ``dbert`` commands use
must appear in that command's ``--help``.

The scratch folder sits beside a ``shared/data`` link to the corpora, so the README's
``../shared/data/...`` paths work as written.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from helpers import DATA, ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(```+|~~~+)\s*(.*)$")


def fenced_blocks(text: str):
    """(info words, body lines, line number of the opening fence) for each fenced block."""
    blocks, open_, info, body, start = [], None, [], [], 0
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line.strip())
        if open_ is None and m:
            open_, info, body, start = m.group(1), m.group(2).split(), [], n
        elif open_ is not None and line.strip().startswith(open_) and not line.strip().strip(open_[0]):
            blocks.append((info, body, start))
            open_ = None
        elif open_ is not None:
            body.append(line)
    assert open_ is None, f"a fenced block opened at line {start} never closes"
    return blocks


def command_lines(body: list[str]) -> list[str]:
    """The commands of a block: continuations joined, comments and blank lines dropped."""
    out, cur = [], ""
    for line in body:
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1].rstrip() + " "
            continue
        out.append((cur + line.strip()).strip())
        cur = ""
    if cur:
        out.append(cur.strip())
    return out


def safe_blocks():
    """pytest params, one per `bash safe` block of the README, slow ones marked."""
    params = []
    for info, body, start in fenced_blocks(README.read_text()):
        if info[:2] == ["bash", "safe"]:
            slow = "slow" in info[2:]
            params.append(pytest.param(command_lines(body), id=f"line{start}",
                                       marks=[pytest.mark.slow] if slow else []))
    return params


def _env() -> dict[str, str]:
    """This interpreter's scripts first, this checkout's code first, one thread; DBERT_HOME and
    HF_HOME are the isolated ones conftest set for this test."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", os.environ.get("DBERT_TEST_THREADS", "1"))
    env["COLUMNS"] = "200"  # rich's help: every option name on one line
    return env


def _need_scripts():
    env = _env()
    if not shutil.which("dbert", path=env["PATH"]):
        pytest.skip("the dbert command is not installed beside this Python (pip install -e .)")
    return env


def test_the_readme_marks_cheap_commands_safe():
    blocks = safe_blocks()
    commands = [c for p in blocks for c in p.values[0]]
    assert "dbert --help" in commands
    assert any(c.startswith("dbert sample ") for c in commands)
    assert any(c.startswith("dbert train ") for p in blocks if p.marks for c in p.values[0]), \
        "the tiny training recipe runs under the slow marker"
    for c in commands:
        assert ">" not in shlex.split(c, comments=True), f"a safe command redirects its output: {c}"


@pytest.mark.parametrize("commands", safe_blocks())
def test_safe_commands_run_as_written(commands, tmp_path):
    env = _need_scripts()
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(DATA, target_is_directory=True)
    work = tmp_path / "work"
    work.mkdir()
    for cmd in commands:
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=work, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, f"{cmd}\nexit {r.returncode}\n{r.stderr[-3000:]}"
        if cmd.startswith("dbert train "):
            assert r.stdout == "", f"{cmd}: dbert train keeps stdout empty, got {r.stdout[:300]!r}"
        else:
            assert r.stdout.strip(), f"{cmd}: nothing on stdout\n{r.stderr[-3000:]}"


def test_quick_start_is_what_ci_runs():
    """The two set-up commands: the sampler's, and the test command `.ci/run` runs step by step."""
    bash = [command_lines(body) for info, body, _ in fenced_blocks(README.read_text()) if info == ["bash"]]
    install, tests = bash[0], bash[1]
    assert install == ["python3 -m venv .venv && . .venv/bin/activate && pip install -c constraints.txt . "
                       "&& dbert sample --n 10"]
    steps = [s.strip() for s in tests[0].split("&&")]
    assert steps[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"]
    ci = (ROOT / ".ci" / "run").read_text()
    for step in steps[2:]:
        words = step.split()
        ci_line = next((line for line in ci.splitlines() if line.startswith(words[0])
                        and all(w in line.split() for w in words[1:] if not w.startswith("-q"))), None)
        assert ci_line, f"the README's test command runs `{step}`; .ci/run does not"


@cache
def _help(prefix: tuple[str, ...]) -> str:
    """The command's --help, and its --help-all where --help lists only the common options."""
    r = subprocess.run([*prefix, "--help"], env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(prefix)} --help: {r.stderr[-2000:]}"
    if "--help-all" not in r.stdout:
        return r.stdout
    every = subprocess.run([*prefix, "--help-all"], env=_env(), capture_output=True, text=True, timeout=300)
    assert every.returncode == 0, f"{' '.join(prefix)} --help-all: {every.stderr[-2000:]}"
    return r.stdout + every.stdout


SUBCOMMANDS = {"sample", "train", "eval", "bench", "serve", "tui", "checkpoints", "list", "fetch", "import",
               "remove"}


def _dbert_commands():
    for info, body, _ in fenced_blocks(README.read_text()):
        if info[:1] == ["bash"]:
            for cmd in command_lines(body):
                if cmd.split()[0] in ("dbert", "dbert-tui"):
                    yield cmd


def test_every_flag_in_the_readme_exists():
    _need_scripts()
    seen, missing = 0, []
    for cmd in _dbert_commands():
        words = shlex.split(cmd, comments=True)
        prefix = [words[0]]
        for w in words[1:]:  # the command and its subcommands: the words before the first option or argument
            if w not in SUBCOMMANDS:
                break
            prefix.append(w)
        flags = {w.split("=")[0] for w in words if w.startswith("--")}
        text = _help(tuple(prefix))
        missing += [f"{cmd}: `{' '.join(prefix)}` has no {flag}" for flag in sorted(flags)
                    if not re.search(re.escape(flag) + r"(?![\w-])", text)]
        seen += 1
    assert not missing, "\n".join(missing)
    assert seen >= 10


# ------------------------------------------------------------------ links

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def outside_fences(text: str) -> list[str]:
    """The lines outside fenced blocks."""
    keep, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line.strip())
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
        else:
            keep.append(line)
    return keep


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation gone, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading's anchor in a Markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for line in outside_fences(path.read_text()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            out.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return frozenset(out)


def test_the_slug_rule():
    assert slug("`dbert serve`: throughput and latency") == "dbert-serve-throughput-and-latency"
    assert slug("Decoding strategies: exact or heuristic") == "decoding-strategies-exact-or-heuristic"
    assert slug("1.3 Spindle schedule (dbert's form)") == "13-spindle-schedule-dberts-form"
    assert slug("Trimming the vocabulary: `--trim-vocab`") == "trimming-the-vocabulary---trim-vocab"


@pytest.mark.skipif(not DOCS.is_dir(), reason="docs/ is not in this copy (an sdist)")
def test_every_relative_link_resolves():
    """README.md and docs/**/*.md: every relative link names a file that exists, and a heading in it."""
    broken = []
    for md in [README, *sorted(DOCS.rglob("*.md"))]:  # docs/history/ too
        for line in outside_fences(md.read_text()):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                    continue
                path, _, anchor = target.partition("#")
                dest = (md.parent / path).resolve() if path else md
                if not dest.exists():
                    broken.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{md.relative_to(ROOT)}: {target} (no heading with that anchor in {dest.name})")
    assert not broken, "\n".join(broken)
