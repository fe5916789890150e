"""Blind reading: story samples shuffled with held-out human stories, graded by readers who see only
the sheet and the rubric, scored against a key kept apart (docs/stories.md#reading-blind).

    dbert sample --n 20 --seed 11 > runs/blind/defaults.txt
    python scripts/studies/blind_read.py sheet --out runs/blind/r1 defaults=runs/blind/defaults.txt [t07=...]
    python scripts/studies/blind_read.py prompt runs/blind/r1        # the words a reader is given
    # a reader (a person, or a fresh language-model session given only the prompt) writes runs/blind/r1/grades.txt
    python scripts/studies/blind_read.py score runs/blind/r1 [runs/blind/r2 ...]      # several sheets: pooled

`sheet` takes the first --n stories of each NAME=FILE (one story a line, as `dbert sample` prints them) and
--n human stories drawn (seeded) from --human (held-out stories never trained on: the last 200 of
TinyStories-train-head.txt, `scripts/stories_model.sh story-data`), shuffles them under ids S01, S02, ...,
and writes OUT/sheet.md (the stories, ids only), OUT/rubric.md (the rubric, from docs/stories.md) and the key,
OUT.key.json, beside the folder so that the folder can be handed to a reader whole. `score` reads grades
files (one line a story: `S07 grammar=7 consistency=6 plot=5 fluency=6 author=human`), averages the readers
of each story, and prints the table: per source, each criterion's mean over its stories with a 95% interval
(mean ± 1.96 standard errors over stories), and how many of its (story, reader) grades said human.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from pathlib import Path

CRITERIA = ("grammar", "consistency", "plot", "fluency")
ROOT = Path(__file__).resolve().parents[2]
RUBRIC_DOC = ROOT / "docs" / "stories.md"
RUBRIC_START, RUBRIC_END = "<!-- rubric -->", "<!-- /rubric -->"


class BlindError(Exception):
    """A bad input: one line for the user."""


def rubric(doc: Path = RUBRIC_DOC) -> str:
    """The rubric's text: what docs/stories.md holds between its rubric markers."""
    text = doc.read_text(encoding="utf-8")
    if RUBRIC_START not in text or RUBRIC_END not in text:
        raise BlindError(f"{doc}: no rubric between {RUBRIC_START} and {RUBRIC_END}")
    return text.split(RUBRIC_START, 1)[1].split(RUBRIC_END, 1)[0].strip() + "\n"


def human_stories(path: Path) -> list[str]:
    """Each held-out document as one line, its paragraphs joined by a space, as a sample prints."""
    from dbert_core.text.data import read_documents, story_texts

    return [" ".join(t.split()) for t in story_texts(read_documents([str(path)]))]


def model_stories(path: Path, n: int) -> list[str]:
    stories = [" ".join(line.split()) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(stories) < n:
        raise BlindError(f"{path}: {len(stories)} stories, the sheet needs {n} (--n)")
    return stories[:n]


def make_sheet(sources: dict[str, Path], human: Path, n: int, seed: int, human_name: str = "human") -> tuple[str, dict]:
    """(the sheet's Markdown, the key {id: source}); nothing on the sheet says where a story came from."""
    if human_name in sources:
        raise BlindError(f"source name {human_name!r} is the human stories' own: name the sample file otherwise")
    rng = random.Random(seed)
    pool = human_stories(human)
    if len(pool) < n:
        raise BlindError(f"{human}: {len(pool)} stories, the sheet needs {n} (--n)")
    items = [(human_name, s) for s in rng.sample(pool, n)]
    for name, path in sources.items():
        items += [(name, s) for s in model_stories(path, n)]
    rng.shuffle(items)
    width = max(2, len(str(len(items))))
    key, parts = {}, ["# Stories to grade\n"]
    for i, (name, story) in enumerate(items, 1):
        sid = f"S{i:0{width}d}"
        key[sid] = name
        parts.append(f"## {sid}\n\n{story}\n")
    return "\n".join(parts), {"seed": seed, "n": n, "human": str(human), "key": key,
                              "sources": {k: str(v) for k, v in sources.items()}}


READER_PROMPT = """You are a careful reader grading short stories for children. Read the rubric in {rubric} and then
every story in {sheet}, by yourself: read and judge the text; do not run code, search, or open any other file.
Some stories were written by people, some by programs; nothing on the sheet says which.
Grade each story on its own, by the rubric, and write one line per story to {grades}, in the sheet's order:
S01 grammar=G consistency=C plot=P fluency=F author=human|model
(G, C, P, F whole numbers from 1 to 10). Write nothing else in that file. When you are done, say only "done"."""


def reader_prompt(folder: Path, grades: str = "grades.txt") -> str:
    return READER_PROMPT.format(rubric=folder / "rubric.md", sheet=folder / "sheet.md", grades=folder / grades)


LINE = re.compile(r"^\s*(S\d+)\b(.*)$")
FIELD = re.compile(r"(\w+)\s*[=:]\s*(\w+)")


def read_grades(path: Path, ids: set[str]) -> dict[str, dict]:
    """{id: {criterion: int, "human": bool}} from one reader's file; every id graded once, in range."""
    grades: dict[str, dict] = {}
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = LINE.match(line)
        if not m:
            if line.strip():
                raise BlindError(f"{path}:{no}: not a grade line (S07 grammar=7 consistency=6 plot=5 fluency=6 author=human)")
            continue
        sid, fields = m.group(1), {k.lower(): v.lower() for k, v in FIELD.findall(m.group(2))}
        if sid not in ids:
            raise BlindError(f"{path}:{no}: {sid} is not on the sheet")
        if sid in grades:
            raise BlindError(f"{path}:{no}: {sid} graded twice")
        g: dict = {}
        for c in CRITERIA:
            v = fields.get(c, "")
            if not v.isdigit() or not 1 <= int(v) <= 10:
                raise BlindError(f"{path}:{no}: {sid} {c}={v or '(missing)'}: a whole number from 1 to 10")
            g[c] = int(v)
        if fields.get("author") not in ("human", "model"):
            raise BlindError(f"{path}:{no}: {sid} author={fields.get('author', '(missing)')}: human or model")
        g["human"] = fields["author"] == "human"
        grades[sid] = g
    missing = sorted(ids - grades.keys())
    if missing:
        raise BlindError(f"{path}: {len(missing)} stories not graded ({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''})")
    return grades


def mean_ci(values: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% interval (1.96 standard errors; 0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, 1.96 * math.sqrt(var / n)


def score(key: dict[str, str], readers: list[dict[str, dict]]) -> dict[str, dict]:
    """Per source: n stories, each criterion's (mean, ci) over stories (each story its readers' mean),
    and the human guesses over all (story, reader) grades."""
    return pooled([(key, {i: [r[i] for r in readers] for i in key}, {i: i for i in key})])


def pooled(sheets: list[tuple[dict, dict, dict]]) -> dict[str, dict]:
    """score() over several sheets: each (key, {id: [grades of its readers]}, {id: story}); a story that is
    on several sheets (the same text from the same source) counts once, its grades from all of them averaged."""
    stories: dict[tuple[str, str], list[dict]] = {}
    for key, grades, text in sheets:
        for i, source in key.items():
            stories.setdefault((source, text[i]), []).extend(grades[i])
    out: dict[str, dict] = {}
    for source in dict.fromkeys(s for s, _ in stories):
        mine = [g for (s, _), g in stories.items() if s == source]
        row: dict = {"stories": len(mine), "readers": max(len(g) for g in mine)}
        for c in CRITERIA:
            row[c] = mean_ci([sum(x[c] for x in g) / len(g) for g in mine])
        row["taken_for_human"] = sum(x["human"] for g in mine for x in g)
        row["grades"] = sum(len(g) for g in mine)
        out[source] = row
    return out


def sheet_texts(folder: Path) -> dict[str, str]:
    """{id: story} as the sheet shows them."""
    parts = (folder / "sheet.md").read_text(encoding="utf-8").split("\n## ")[1:]
    return {p.split("\n", 1)[0].strip(): p.split("\n", 1)[1].strip() for p in parts}


def table(scores: dict[str, dict]) -> str:
    lines = ["| source (stories) | " + " | ".join(CRITERIA) + " | taken for human |",
             "|---|" + "---:|" * (len(CRITERIA) + 1)]
    for source, row in scores.items():
        cells = [f"{row[c][0]:.1f} ± {row[c][1]:.1f}" for c in CRITERIA]
        lines.append(f"| {source} ({row['stories']}) | " + " | ".join(cells)
                     + f" | {row['taken_for_human']}/{row['grades']} |")
    return "\n".join(lines)


def _source(arg: str) -> tuple[str, Path]:
    name, sep, path = arg.partition("=")
    if not sep or not name or not path:
        raise BlindError(f"{arg!r}: give a sample file as NAME=FILE")
    if not Path(path).is_file():
        raise BlindError(f"{path}: no such file")
    return name, Path(path)


def key_path(folder: Path) -> Path:
    return folder.with_name(folder.name + ".key.json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sheet", help="a shuffled sheet, the rubric, and the key kept apart")
    s.add_argument("sources", nargs="+", metavar="NAME=FILE")
    s.add_argument("--out", required=True, type=Path, help="the reader's folder (the key goes to OUT.key.json)")
    s.add_argument("--human", type=Path, default=ROOT / "runs" / "data" / "head-heldout.txt")
    s.add_argument("--n", type=int, default=20, help="stories of each source (at least 20 for a decision)")
    s.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("prompt", help="what a reader is told (the sheet's and rubric's paths)")
    r.add_argument("folder", type=Path)
    r.add_argument("--grades", default="grades.txt")
    c = sub.add_parser("score", help="the table of one or more readers' grades, over one sheet or several")
    c.add_argument("folder", type=Path, nargs="+", help="sheet folders (several: pooled, a story once however many sheets hold it)")
    c.add_argument("--grades", nargs="*", type=Path, default=None, help="grades files (one folder only; default: FOLDER/grades*.txt)")
    c.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        if a.cmd == "sheet":
            if a.n < 1:
                raise BlindError(f"--n {a.n}: at least 1")
            if not a.human.is_file():
                raise BlindError(f"{a.human}: no such file (scripts/stories_model.sh story-data writes the held-out stories)")
            sources = dict(_source(x) for x in a.sources)
            sheet, key = make_sheet(sources, a.human, a.n, a.seed)
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / "sheet.md").write_text(sheet, encoding="utf-8")
            (a.out / "rubric.md").write_text(rubric(), encoding="utf-8")
            key_path(a.out).write_text(json.dumps(key, indent=1) + "\n", encoding="utf-8")
            print(f"{a.out}/sheet.md: {len(key['key'])} stories; key in {key_path(a.out)}", file=sys.stderr)
        elif a.cmd == "prompt":
            print(reader_prompt(a.folder, a.grades))
        else:
            if a.grades and len(a.folder) > 1:
                raise BlindError("--grades names one sheet's files: give one folder with it")
            sheets = []
            for folder in a.folder:
                kp = key_path(folder)
                if not kp.is_file():
                    raise BlindError(f"{kp}: no key (made by `blind_read.py sheet --out {folder}`)")
                key = json.loads(kp.read_text(encoding="utf-8"))["key"]
                files = a.grades or sorted(folder.glob("grades*.txt"))
                if not files:
                    raise BlindError(f"{folder}: no grades*.txt")
                readers = [read_grades(f, set(key)) for f in files]
                sheets.append((key, {i: [r[i] for r in readers] for i in key}, sheet_texts(folder)))
            scores = pooled(sheets)
            print(json.dumps(scores) if a.json else table(scores))
    except BlindError as e:
        print(f"blind_read: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
