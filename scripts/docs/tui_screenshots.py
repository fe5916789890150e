"""Refresh the pictures of dbert-tui in the README and docs/tui.md.

    python scripts/docs/tui_screenshots.py [--out docs/img] [--doc docs/tui.md] [--size 100x30] [--data TRAIN.txt]
                                           [--only all|inspect|text]

Runs the app headless (Textual's `App.run_test`) and writes SVG screenshots (`App.export_screenshot`):

- generate.svg: the Generate screen on the shipped default checkpoint (`dbert_core.storage.store.resolve(None)`),
  a grid of four samples of one run filling in together, paused when about half of the tokens
  are revealed;
- inspect.svg: the token inspector at 120x40 on one finished sample of the same checkpoint:
  the cursor on a token (its reveal step, p', top-5 candidates, masking time), one token
  locked and three remasked, ready to refill;
- train.svg: the Train screen while the `tiny` preset trains on TinyStories (--data; default:
  $DBERT_DATA, ../shared/data or /work/shared/data, then tinystories/train.txt), its loss and
  validation charts live.

and redraws the text pictures of docs/tui.md (--doc) at 80x24, the screen's lines as text: each
fenced block after a `<!-- tui_screenshots: NAME -->` line is replaced by the picture NAME:

- generate-paused, generate-done: one sample of the shipped model at its defaults (seed 0),
  paused at the first frame with half of its tokens or fewer masked (the app's paced first
  run: give or take a frame), then finished;
- confidence-legend: the legend line after `v` (p' in the run's quintiles);
- compare: `c`, both sides finished;
- inspect-80: `i` on the finished sample, the cursor on its first token with three candidates or more;
- checkpoints: the Checkpoints screen (the store's path written as `~/.local/share/dbert`);
- train-80: the Train screen near step 200 of the README's tiny recipe (--data).

The app runs in a temporary DBERT_HOME, so the store and the remembered checkpoint are left
alone; the trained model is thrown away with it. Takes a minute or two on a laptop CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository


def default_data() -> Path:
    for base in (os.environ.get("DBERT_DATA"), ROOT.parent / "shared" / "data", "/work/shared/data"):
        if base and (Path(base) / "tinystories" / "train.txt").is_file():
            return Path(base) / "tinystories" / "train.txt"
    raise SystemExit("tui_screenshots: TinyStories not found; pass --data FILE")


def save(app, path: Path) -> None:
    """The screen as an SVG, with Rich's long per-picture class prefix shortened (a little smaller)."""
    svg = app.export_screenshot()
    prefix = re.search(r"terminal-\d+", svg).group(0)
    path.write_text(svg.replace(prefix, "t"), encoding="utf-8")


async def wait(pilot, condition, what: str, timeout: float = 600.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise SystemExit(f"tui_screenshots: timed out waiting for {what}")
        await pilot.pause(0.05)


async def shoot_inspect(out: Path) -> None:
    from dbert_core.storage.store import resolve
    from dbert_tui.app import create_app
    from dbert_tui.controller import Settings

    checkpoint = resolve(None)
    app = create_app(checkpoint=str(checkpoint), settings=Settings(n=1, pace_ms=0, length=48, seed=2))
    async with app.run_test(size=(120, 40)) as pilot:
        g = app.generate_screen
        await wait(pilot, lambda: g.run is not None and g.run.finished and g.drawn is g.run.frames[-1], "the run")
        await pilot.press("i", *["right"] * 8, "l", "right", "shift+right", "shift+right", "backspace",
                          *["right"] * 4)
        await pilot.pause(0.3)
        app.clear_notifications()
        await pilot.pause(0.2)
        save(app, out / "inspect.svg")
        print(f"wrote {out / 'inspect.svg'} ({checkpoint.name}, the inspector on token #{g.draft.cursor + 1})")


async def shoot(out: Path, size: tuple[int, int], data: Path, samples: int, train_steps: int,
                only: str = "all") -> None:
    from dbert_core.storage.store import resolve
    from dbert_tui.app import create_app
    from dbert_tui.controller import Settings

    if only in ("all", "inspect"):
        await shoot_inspect(out)
    if only == "inspect":
        return
    checkpoint = resolve(None)
    app = create_app(checkpoint=str(checkpoint), settings=Settings(n=samples, pace_ms=0), train_data=[str(data)])
    async with app.run_test(size=size) as pilot:
        g = app.generate_screen

        def half_revealed() -> bool:
            rec = g.shown()
            return rec is not None and float(rec.frame.masked.double().mean()) <= 0.5

        await wait(pilot, half_revealed, "the samples to be half revealed")
        await pilot.press("space")  # pause, so what is shown stays a mid-run frame
        await pilot.pause(0.5)
        app.clear_notifications()
        await pilot.pause(0.2)
        save(app, out / "generate.svg")
        print(f"wrote {out / 'generate.svg'} ({checkpoint.name}, {samples} samples, "
              f"{int(g.shown().frame.masked.sum())} of {g.shown().frame.masked.numel()} tokens still masked)")

        await pilot.press("f3")
        await wait(pilot, lambda: app.current_mode == "train", "the Train screen")
        tr = app.train_screen
        every = max(1, train_steps // 6)
        for wid, value in {"tr-out": "tiny-stories", "tr-steps": str(train_steps), "tr-batch": "16",
                           "tr-seq": "32", "tr-T": "256", "tr-eval": str(every), "tr-sample": str(every)}.items():
            tr.query_one(f"#{wid}").value = value
        await pilot.press("f5")
        await wait(pilot, lambda: len(tr.vals) >= 4 and len(tr.losses) >= int(train_steps * 0.8),
                   "a few evaluations of the training run")
        await pilot.pause(0.3)
        app.clear_notifications()
        await pilot.pause(0.2)
        save(app, out / "train.svg")
        print(f"wrote {out / 'train.svg'} (tiny preset, {len(tr.losses)} steps of {train_steps} on {data.name})")
        await pilot.press("f6")
        await wait(pilot, lambda: tr.trainer is None, "the training run to stop")


TEXT_SIZE = (80, 24)
MARKER = re.compile(r"^( *)<!-- tui_screenshots: ([\w-]+) -->\n\1```\n.*?^\1```$", re.M | re.S)  # indented in a list too
SHOWN_HOME = "~/.local/share/dbert"  # the store's path in the pictures (platformdirs' on Linux)


def lines(app) -> str:
    """The screen as text: the compositor's lines, trailing blanks cut."""
    return "\n".join(strip.text.rstrip() for strip in app.screen._compositor.render_strips())



async def quiet_lines(pilot, app) -> str:
    """The screen's text once it has settled and its toasts are cleared."""
    await pilot.pause(0.3)
    app.clear_notifications()
    await pilot.pause(0.2)
    return lines(app)

def put(doc: Path, pictures: dict[str, str]) -> list[str]:
    """Each marked block of doc replaced by its picture; the names of the markers with none."""
    missing: list[str] = []

    def one(m: re.Match) -> str:
        indent, name = m.group(1), m.group(2)
        if name not in pictures:
            missing.append(name)
            return m.group(0)
        body = "\n".join(indent + line if line else line for line in pictures[name].splitlines())
        return f"{indent}<!-- tui_screenshots: {name} -->\n{indent}```\n{body}\n{indent}```"

    doc.write_text(MARKER.sub(one, doc.read_text(encoding="utf-8")), encoding="utf-8")
    return missing


async def generate_pictures(pilot, pictures: dict[str, str]) -> None:
    """The Generate screen's pictures, one sample of the shipped model at its defaults."""
    app = pilot.app
    g = app.generate_screen
    done = lambda: g.run is not None and g.run.finished and g.drawn is g.run.frames[-1]  # noqa: E731

    def half_revealed() -> bool:
        rec = g.shown()
        return rec is not None and float(rec.frame.masked.double().mean()) <= 0.5

    await wait(pilot, half_revealed, "the sample to be half revealed")
    await pilot.press("space")
    await pilot.pause(0.3)
    pictures["generate-paused"] = await quiet_lines(pilot, app)
    await pilot.press("space")
    await wait(pilot, done, "the run to finish")
    await pilot.pause(0.3)
    pictures["generate-done"] = lines(app)
    await pilot.press("v")
    await pilot.pause(0.3)
    pictures["confidence-legend"] = next(x for x in lines(app).splitlines() if x.startswith(" p' "))
    await pilot.press("v", "c")
    await wait(pilot, lambda: len(g.playbacks) == 2 and all(pb.run.finished for pb in g.playbacks)
               and not g._draw_pending, "both sides of the comparison")
    pictures["compare"] = await quiet_lines(pilot, app)
    await pilot.press("c")
    await wait(pilot, done, "side A alone")
    await pilot.press("i")
    for _ in range(60):  # on to a token the sampler had a choice for: its candidates are the point
        if sum(p > 0 for _, p in (g.inspected() or {}).get("top", ())) >= 3:  # p' 0: ruled out, not listed
            break
        await pilot.press("right")
    await pilot.pause(0.3)
    pictures["inspect-80"] = lines(app)
    await pilot.press("escape")


async def store_pictures(pilot, pictures: dict[str, str], data: Path, home: str) -> None:
    """The Checkpoints screen, and the Train screen near step 200 of the README's tiny recipe."""
    app = pilot.app
    await pilot.press("2")
    await wait(pilot, lambda: app.current_mode == "checkpoints", "the Checkpoints screen")
    await pilot.pause(0.5)
    app.clear_notifications()
    await pilot.pause(0.2)
    pictures["checkpoints"] = lines(app).replace(home, SHOWN_HOME)
    await pilot.press("3")
    await wait(pilot, lambda: app.current_mode == "train", "the Train screen")
    tr = app.train_screen
    import shutil

    from dbert_core.storage.store import store_dir

    shutil.rmtree(store_dir() / "tiny-stories", ignore_errors=True)  # train.svg's run, in this throwaway store
    for wid, value in {"tr-out": "tiny-stories", "tr-steps": "300", "tr-lr": "3e-3", "tr-seq": "32",
                       "tr-eval": "100", "tr-sample": "100"}.items():
        tr.query_one(f"#{wid}").value = value
    tr.query_one("#tr-unit").value = "sentence"
    await pilot.press("f5")
    await wait(pilot, lambda: len(tr.vals) >= 1 and len(tr.losses) >= 198, "step 200 of the tiny recipe")
    await pilot.pause(0.3)
    app.clear_notifications()
    await pilot.pause(0.2)
    pictures["train-80"] = lines(app).replace(home, SHOWN_HOME)
    await pilot.press("f6")
    await wait(pilot, lambda: tr.trainer is None, "the training run to stop")


async def shoot_text(doc: Path, data: Path, home: str) -> None:
    """docs/tui.md's text pictures, at 80x24."""
    from dbert_core.storage.store import resolve
    from dbert_tui.app import create_app
    from dbert_tui.controller import Settings

    pictures: dict[str, str] = {}
    app = create_app(checkpoint=str(resolve(None)), settings=Settings(n=1), train_data=[str(data)], deterministic=True)
    async with app.run_test(size=TEXT_SIZE) as pilot:
        await generate_pictures(pilot, pictures)
        await store_pictures(pilot, pictures, data, home)
    missing = put(doc, pictures)
    if missing:
        raise SystemExit(f"tui_screenshots: {doc} marks pictures this script does not draw: {', '.join(missing)}")
    print(f"wrote {len(pictures)} text pictures into {doc}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder of the SVGs (default docs/img)")
    parser.add_argument("--size", default="100x30", help="terminal columns x rows (default 100x30)")
    parser.add_argument("--data", type=Path, default=None, help="training text for the Train screen")
    parser.add_argument("--samples", type=int, default=4, help="samples on the Generate screen (default 4)")
    parser.add_argument("--train-steps", type=int, default=300, help="training steps of the tiny preset (default 300)")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "tui.md", help="the page of the text pictures")
    parser.add_argument("--only", choices=("all", "inspect", "text"), default="all",
                        help="all pictures, the inspector's SVG alone, or the text pictures alone")
    args = parser.parse_args(argv)
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    data = args.data or (default_data() if args.only != "inspect" else None)
    args.out.mkdir(parents=True, exist_ok=True)
    # a name as long as SHOWN_HOME (/tmp/dbshot-XXXXXXXX), so the pictures wrap the store's path where it would
    with tempfile.TemporaryDirectory(prefix="dbshot-", dir="/tmp" if Path("/tmp").is_dir() else None) as home:
        os.environ["DBERT_HOME"] = home  # a throwaway store: nothing of the user's is touched
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if args.only != "text":
            asyncio.run(shoot(args.out.resolve(), (cols, rows), data, args.samples, args.train_steps, args.only))
        if args.only in ("all", "text"):
            asyncio.run(shoot_text(args.doc.resolve(), data, home))


if __name__ == "__main__":
    main()
