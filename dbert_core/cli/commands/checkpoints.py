"""`dbert checkpoints list|fetch|import|remove`: the store of checkpoints, a group of its own
(checkpoints_app); the table `list` prints and the download progress of `fetch`."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Optional

import typer

from ...errors import DbertError
from ..streams import say

checkpoints_app = typer.Typer(no_args_is_help=True, help="List and manage stored checkpoints.")


@checkpoints_app.command("list")
def checkpoints_list(as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False):
    """Stored checkpoints (the shipped default first) and the store's location.

    Example: dbert checkpoints list --json
    """
    from ...storage.store import entries, store_dir, tui_checkpoint

    rows = entries()
    in_tui = tui_checkpoint()
    in_tui = in_tui.resolve() if in_tui is not None else (rows[0].path.resolve() if rows else None)

    def used(e) -> bool:
        try:
            return in_tui is not None and e.path.resolve() == in_tui
        except OSError:
            return False

    if as_json:
        for e in rows:
            row = {"name": e.name, "path": str(e.path), "size": e.size, "tui": used(e)}
            row.update({"broken": e.broken} if e.broken else {"parameters": e.parameters, "schedule": e.schedule,
                                                               "time": e.time, "created": e.created, "step": e.step,
                                                               "val_ppl_token": e.val_ppl, "quality": e.quality})
            print(json.dumps(row))
        return
    for line in list_lines(rows, used):
        print(line)
    say(f"store: {store_dir()}  (* the TUI's checkpoint; paths and settings: --json)")
    say("VAL PPL: the checkpoint's quality figure where its dbert.json records one (the shipped model's: held-out "
        "whole stories, exact 128-step bound), else its last validation bound")


def list_lines(rows, used, width: int = 80) -> list[str]:
    """`dbert checkpoints list` as a table that fits `width` columns: name, size, parameters (as the
    TUI counts them), steps, the last validation bound, the day it was created; * marks the TUI's."""
    from ...storage.store import human_size

    fixed = 2 + 9 + 8 + 7 + 9 + 11  # mark, SIZE, PARAMS, STEPS, VAL PPL, CREATED with their gaps
    labels = [e.label for e in rows]
    name_w = max(4, min(max((len(x) for x in labels), default=4), width - fixed - 1))

    def cut(text: str) -> str:
        return text if len(text) <= name_w else text[:name_w - 1] + "…"

    out = [f"  {'NAME':<{name_w}} {'SIZE':>8} {'PARAMS':>7} {'STEPS':>6} {'VAL PPL':>8} {'CREATED':<10}"]
    for e, label in zip(rows, labels):
        mark = "* " if used(e) else "  "
        if e.broken:  # a bad entry is a row saying why, never a crash
            out.append(f"{mark}{cut(label):<{name_w}} {human_size(e.size):>8} broken: {e.broken}"[:width])
            continue
        params = f"{e.parameters / 1e6:.2f}M" if e.parameters else "?"
        steps = f"{e.step:,}" if isinstance(e.step, int) else "-"
        val = "-" if e.val_ppl is None else f"{e.val_ppl:.2f}" if e.quality else f"{e.val_ppl:.1f}"
        out.append(f"{mark}{cut(label):<{name_w}} {human_size(e.size):>8} {params:>7} {steps:>6} {val:>8} "
                   f"{(e.created or '?')[:10]:<10}")
    return out


class _FetchProgress:
    """Download progress on stderr: a live bar on a terminal; otherwise a plain line at each
    quarter of a download of known size, and after 2 s, then every 10 s, of silence (a large or
    slow download, or one whose size the server does not say, is never silent for long)."""

    def __init__(self):
        try:
            self.live = sys.stderr.isatty()
        except (OSError, ValueError):
            self.live = False
        self.last = -1
        self.start = self.shown = time.monotonic()

    def __call__(self, done: int, total: int | None, what: str) -> None:
        from ...storage.store import human_size

        pct = int(100 * done / total) if total else None
        if self.live:
            shown = f"{pct:3d}%" if pct is not None else ""
            self._write(f"\r{what} {human_size(done):>9} {shown}")
            return
        now = time.monotonic()
        quiet = now - self.shown >= (2.0 if self.shown == self.start else 10.0)
        if (pct is not None and pct // 25 != self.last) or quiet:
            self.last = pct // 25 if pct is not None else self.last
            self.shown = now
            say(f"{what} {human_size(done)}" + (f" ({pct}%)" if pct is not None else ""))

    def close(self) -> None:
        if self.live:
            self._write("\n")

    def _write(self, text: str) -> None:
        try:  # progress only: a failing stderr never fails the download
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            self.live = False


@checkpoints_app.command("fetch")
def checkpoints_fetch(
    source: Annotated[str, typer.Argument(metavar="REPO_ID_OR_URL", help="Hub repo id (user/model) or an https URL to a .tar.gz/.zip.")],
    revision: Annotated[Optional[str], typer.Option(help="Hub branch, tag or commit to pin.")] = None,
    name: Annotated[Optional[str], typer.Option(help="Store name (default: the repo's or archive's name).")] = None,
):
    """Download a checkpoint into the store; prints its path on stdout.

    Example: dbert checkpoints fetch user/my-dbert --name my-dbert
    """
    from ...storage.fetch import fetch

    if source.strip().lower().startswith("http://"):
        say(f"dbert: warning: {source.strip()} is plain http: anyone on the way can read or change it; "
            "prefer https://")
    bar = _FetchProgress()
    try:
        path = fetch(source, revision=revision, name=name, progress=bar)
    finally:
        bar.close()
    print(path)


@checkpoints_app.command("import")
def checkpoints_import(
    directory: Annotated[str, typer.Argument(metavar="DIR", help="A checkpoint directory to copy into the store.")],
    name: Annotated[Optional[str], typer.Option(help="Store name (default: the directory's name).")] = None,
):
    """Copy a local checkpoint into the store; prints its path on stdout.

    Example: dbert checkpoints import runs/stories --name stories
    """
    from ...storage.store import import_dir

    print(import_dir(directory, name=name))


@checkpoints_app.command("remove")
def checkpoints_remove(
    name: Annotated[str, typer.Argument(help="Store name of the checkpoint to delete.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
):
    """Delete a checkpoint from the store (asks first unless --yes).

    Example: dbert checkpoints remove stories --yes
    """
    from ...storage.store import refuse_held, remove, resolve

    refuse_held(resolve(name), "remove")  # a clear error for an unknown name, or one a run holds, before asking
    if not yes:
        if not sys.stdin.isatty():
            raise DbertError(f"refusing to remove {name!r} without confirmation; pass --yes")
        if not typer.confirm(f"Remove checkpoint {name!r} from the store?", err=True):
            raise typer.Exit(1)
    path = remove(name)
    say(f"removed {path}")
