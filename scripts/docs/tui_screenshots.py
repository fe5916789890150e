"""Refresh the pictures of dbert-tui in the README and docs/tui.md.

    python scripts/docs/tui_screenshots.py [--out docs/img] [--size 100x30] [--data TRAIN.txt] [--only NAME]

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder of the SVGs (default docs/img)")
    parser.add_argument("--size", default="100x30", help="terminal columns x rows (default 100x30)")
    parser.add_argument("--data", type=Path, default=None, help="training text for the Train screen")
    parser.add_argument("--samples", type=int, default=4, help="samples on the Generate screen (default 4)")
    parser.add_argument("--train-steps", type=int, default=300, help="training steps of the tiny preset (default 300)")
    parser.add_argument("--only", choices=("all", "inspect"), default="all", help="all pictures, or the inspector's alone")
    args = parser.parse_args(argv)
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    data = args.data or (default_data() if args.only == "all" else None)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dbert-shots-") as home:
        os.environ["DBERT_HOME"] = home  # a throwaway store: nothing of the user's is touched
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        asyncio.run(shoot(args.out.resolve(), (cols, rows), data, args.samples, args.train_steps, args.only))


if __name__ == "__main__":
    main()
