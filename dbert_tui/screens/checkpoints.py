"""The Checkpoints screen: the store (default first), choose one, fetch, import, delete."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Header, ProgressBar, Static
from textual.worker import get_current_worker

from dbert_core.storage.store import DEFAULT_NAME, SHIPPED, human_size

from ..keymap import KeySpec, bindings
from ..messages import FetchProgress, StoreChanged
from ..widgets.keybar import KeyBar, bar_keys
from ..workers import ReportWorkerErrors
from .dialogs import ConfirmDialog, FormDialog


def _name(entry) -> str:
    """A row's name: the shipped default by its own name (`dbert-minilm-stories`, as `dbert sample -c`
    and the README say it; the details pane adds `(default)`), any other by its store name."""
    return SHIPPED[entry.name] if entry.name == DEFAULT_NAME else entry.name


def entry_details(entry) -> Text:
    """The details pane of a store entry: what its model card says first, its size, schedule,
    steps trained, the last validation bound, and the data it was trained on."""
    import json

    from dbert_core.disk.layout import STATE, STATE_JSON, read_meta

    out = Text()
    out.append(entry.label, style="bold")  # the shipped default by its name too, as `dbert checkpoints list`
    if entry.broken:
        return out.append(f" · broken: {entry.broken}", style="red")
    try:
        meta = read_meta(entry.path)
    except Exception:  # noqa: BLE001 - a pane never fails the screen
        meta = {}
    params = f"{entry.parameters / 1e6:.2f}M parameters" if entry.parameters else "? parameters"
    out.append(f" · {params} · {human_size(entry.size)} · {entry.schedule}")
    if meta.get("T"):
        out.append(f" T={meta['T']}")
    out.append(f" · time {entry.time}")
    line = []
    if meta.get("step") is not None:
        line.append(f"{meta['step']:,} steps")
    if meta.get("tokens_seen"):
        line.append(f"{meta['tokens_seen'] / 1e6:.2f}M tokens seen")
    if meta.get("train_seconds"):
        line.append(f"{meta['train_seconds'] / 60:.0f} min")
    if meta.get("saved") or meta.get("created"):
        line.append("saved " + str(meta.get("saved") or meta.get("created"))[:16].replace("T", " "))
    if line:
        out.append("\ntrained: " + " · ".join(line), style="")
    from dbert_core.storage.store import quality

    measured = quality(meta)
    evals = []
    try:
        history = json.loads((Path(entry.path) / STATE / STATE_JSON).read_text()).get("history", [])
        evals = [h for h in history if "val_nats_per_token" in h]
    except (OSError, ValueError, AttributeError):
        pass
    if measured is not None:
        out.append(f"\nquality: ppl {measured[0]:.2f} per token ({measured[1]})")
    elif evals:
        last = evals[-1]
        out.append(f"\nvalidation: ELBO ≤ {last['val_nats_per_token']:.3f} nats/token, ppl ≤ "
                   f"{last['val_ppl_token']:.0f} (step {last['step']:,})")
    else:
        import re

        card = Path(entry.path) / "MODEL_CARD.md"
        try:  # a shipped checkpoint has no trainer state; its card states the best held-out bound
            best = re.search(r"ELBO bound per token[^.]*\.\s*Best:\s*([\d.]+) at step ([\d,]+)", card.read_text())
        except OSError:
            best = None
        if best:
            out.append(f"\nvalidation: held-out ppl ≤ {best.group(1)} per token at step {best.group(2)} "
                       "(its best, model card)")
        else:
            out.append("\nvalidation: not recorded (dbert eval measures it)", style="dim")
    data = meta.get("data") or []
    if data:
        how = ", ".join(x for x in (meta.get("unit"), "packed" if meta.get("pack") else "") if x)
        more = f" and {len(data) - 1} more" if len(data) > 1 else ""
        out.append(f"\ndata: {Path(str(data[0])).name}{more}" + (f" ({how})" if how else ""))  # no path of the training machine
    card = Path(entry.path) / "MODEL_CARD.md"
    if card.is_file():
        try:
            paragraph = next((p for p in card.read_text().split("\n\n") if p.strip() and not p.startswith("#")), "")
        except OSError:
            paragraph = ""
        if paragraph:
            summary = " ".join(paragraph.split()).replace("**", "")
            out.append("\ncard: " + (summary if len(summary) <= 150 else summary[:149] + "…"), style="italic")
    return out


class CheckpointsScreen(ReportWorkerErrors, Screen):
    CATALOGUE = (  # keymap.KeySpec: the key help's order; the bar shows those with a label
        KeySpec("enter", "use", "Use the selected checkpoint", "⏎", "Use", 1, 1, "", ""),
        KeySpec("f", "fetch", "Fetch one from the Hugging Face Hub or a URL", "", "Fetch", 2, 2, "", ""),
        KeySpec("i", "import_dir", "Import a local checkpoint folder", "", "Import", 2, 3, "", ""),
        KeySpec("d,delete", "delete", "Delete the selected checkpoint from the store", "", "Delete", 3, 4, "", ""),
        KeySpec("r", "refresh", "Refresh the list", "", "", 5, 0, "", ""),
        KeySpec("escape", "cancel_fetch", "Cancel a download", "", "", 5, 0, "", ""),
    )
    BINDINGS = bindings(CATALOGUE)
    KEYS = bar_keys(CATALOGUE, "screen")
    HELP = "The checkpoint store: ● marks the one in use. Enter uses the selected one."

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: list = []
        self.message = ""
        self.arriving = True    # set when the app switches to this screen (arrive(), from DbertApp.action_mode)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="ck-message")
        yield DataTable(id="ck-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="ck-details")
        yield ProgressBar(id="ck-progress", show_eta=False)
        yield Static("", id="ck-status")
        yield KeyBar(self.KEYS)

    def on_mount(self) -> None:
        self.sub_title = "Checkpoints"
        table = self.query_one(DataTable)
        table.add_columns("NAME", "SIZE", "PARAMS", "SCHEDULE", "TIME", "CREATED")
        self.query_one(ProgressBar).display = False
        self.refresh_store()
        self.watch(self.app, "db", lambda: self.refresh_store(), init=False)  # the mark follows it
        table.focus()

    def on_screen_resume(self) -> None:
        """Coming back from another screen: the list anew, the cursor on the checkpoint in use and
        no stale message; after a dialog closes, the list anew with the selection kept."""
        if self.arriving:
            self.arriving = False
            if not self.error_notice:
                self.message = ""
            self.refresh_store()
        else:
            entry = self.selected()
            self.refresh_store(select=entry.path if entry is not None else None)

    def arrive(self) -> None:
        """The user is switching to this screen (not back from a dialog): the next resume starts afresh."""
        self.arriving = True

    @property
    def error_notice(self) -> str:
        """Why the last checkpoint could not be used (the App's load_error), shown until one loads."""
        return self.app.load_error

    def in_use(self) -> Path | None:
        db = self.app.db
        return Path(db.path).resolve() if db is not None and db.path else None

    def fresh_message(self) -> None:
        """A new operation starts: the last one's message goes (the summary line comes back)."""
        if not self.error_notice:
            self.message = ""
            self.refresh_store(select=self.selected().path if self.selected() else None)

    def say(self, text: str, style: str = "") -> None:
        self.message = text
        self.query_one("#ck-message", Static).update(Text(text, style=style))

    def refresh_store(self, select: Path | None = None) -> None:
        from dbert_core.storage.store import entries, store_dir

        table = self.query_one(DataTable)
        table.clear()
        self.rows = entries()
        current = self.in_use()
        for e in self.rows:
            mark = "● " if current is not None and Path(e.path).resolve() == current else "  "
            # every cell a Text: a str cell would be read as markup, and its fields come from the
            # checkpoint (store.Entry has made them safe to show)
            if e.broken:  # listed with its reason; choosing it says why it cannot be used
                table.add_row(Text(mark + _name(e), style="red"), human_size(e.size), "?",
                              Text(f"broken: {e.broken}", style="red"), "", "", key=str(e.path))
                continue
            params = f"{e.parameters / 1e6:.2f}M" if e.parameters else "?"
            created = (e.created or "?")[:16].replace("T", " ")
            table.add_row(*(Text(c) for c in (mark + _name(e), human_size(e.size), params, e.schedule, e.time, created)),
                          key=str(e.path))
        target = Path(select).resolve() if select is not None else current  # by default: the one in use
        if target is not None:
            for i, e in enumerate(self.rows):
                if Path(e.path).resolve() == target:
                    table.move_cursor(row=i)
        self.show_details()
        if self.error_notice:
            hint = "" if self.rows else " · fetch (f), import (i) or train (3) one"
            self.say(self.error_notice + hint, "bold red")
        elif not self.rows:
            self.say("No checkpoint yet: fetch one (f), import a folder (i), or train one (3: Train). "
                     f"Store: {store_dir()}", "bold yellow")
        elif not self.message or self.message.startswith("No checkpoint"):
            self.say(f"{len(self.rows)} checkpoint(s) · Enter uses the selected one · store: {store_dir()}", "dim")

    @on(DataTable.RowHighlighted)
    def show_details(self) -> None:
        entry = self.selected()
        self.query_one("#ck-details", Static).update(entry_details(entry) if entry is not None else "")

    def selected(self):
        table = self.query_one(DataTable)
        if not self.rows or table.cursor_row is None or not 0 <= table.cursor_row < len(self.rows):
            return None
        return self.rows[table.cursor_row]

    # ------------------------------------------------------------------ actions
    def action_use(self) -> None:
        entry = self.selected()
        if entry is None:
            self.app.notify("no checkpoint selected", severity="warning")
            return
        if entry.broken:
            self.app.notify(f"{entry.name} is broken: {entry.broken}", severity="error", timeout=10)
            return
        self.app.use_checkpoint(entry.path)

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_use()

    def action_refresh(self) -> None:
        self.refresh_store()

    def action_fetch(self) -> None:
        self.app.push_screen(FormDialog("Fetch a checkpoint into the store", [
            ("source", "hub repo id or URL", "", "user/model  or  https://…/ckpt.tar.gz (.zip)"),
            ("revision", "revision (hub, optional)", "", "branch, tag or commit (default: main)"),
            ("name", "store name (optional)", "", "default: the repo's or archive's name"),
        ], "Fetch"), self._fetch_answer)

    def _fetch_answer(self, values: dict | None) -> None:
        if not values or not values["source"]:
            return
        self.start_fetch(values["source"], values["revision"] or None, values["name"] or None)

    def start_fetch(self, source: str, revision: str | None = None, name: str | None = None) -> None:
        self.fresh_message()
        bar = self.query_one(ProgressBar)
        bar.display = True
        bar.update(total=None, progress=0)
        self.query_one("#ck-status", Static).update(Text(f"fetching {source} … (Esc cancels)", style="cyan"))
        self.fetch(source, revision, name)

    @work(thread=True, exclusive=True, exit_on_error=False, group="fetch", name="fetch")
    def fetch(self, source: str, revision: str | None, name: str | None) -> None:
        from dbert_core.storage import fetch as hub

        from dbert_core.errors import DbertError

        worker = get_current_worker()
        try:
            path = hub.fetch(source, revision=revision, name=name,
                             progress=lambda d, t, w: self.post_message(FetchProgress(d, t, w)),
                             cancel=lambda: worker.is_cancelled)
        except DbertError:
            if worker.is_cancelled:  # Esc: a cancelled worker reports no error, so say it here
                self.app.call_from_thread(self.app.notify, f"download of {source} cancelled; nothing was written",
                                          severity="warning")
                return
            raise
        finally:
            self.app.call_from_thread(self._fetch_over)
        self.post_message(StoreChanged(path, "fetched"))

    def _fetch_over(self) -> None:
        self.query_one(ProgressBar).display = False
        self.query_one("#ck-status", Static).update("")

    @on(FetchProgress)
    def _progress(self, message: FetchProgress) -> None:
        bar = self.query_one(ProgressBar)
        bar.update(total=message.total, progress=message.done)
        total = f" of {human_size(message.total)}" if message.total else ""
        self.query_one("#ck-status", Static).update(
            Text(f"{message.what}: {human_size(message.done)}{total} (Esc cancels)", style="cyan"))

    @on(StoreChanged)
    def _store_changed(self, message: StoreChanged) -> None:
        self.say(f"{message.verb} {message.path.name} into the store · Enter uses it", "bold green")
        self.app.notify(f"{message.verb} {message.path.name}")
        self.refresh_store(select=message.path)

    def action_cancel_fetch(self) -> None:
        for worker in self.workers:
            if worker.group == "fetch" and worker.is_running:
                worker.cancel()
                self.app.notify("cancelling the download…")

    def action_import_dir(self) -> None:
        self.app.push_screen(FormDialog("Import a local checkpoint folder (it is copied into the store; "
                                        "ctrl+o picks the folder)", [
            ("path", "directory", "", "/path/to/checkpoint  (ctrl+o: pick)"),
            ("name", "store name (optional)", "", "default: the folder's name"),
        ], "Import", browse="path"), self._import_answer)

    def _import_answer(self, values: dict | None) -> None:
        if values and values["path"]:
            self.fresh_message()
            self.query_one("#ck-status", Static).update(Text(f"importing {values['path']} …", style="cyan"))
            self.import_dir(values["path"], values["name"] or None)

    @work(thread=True, exclusive=True, exit_on_error=False, group="import", name="import")
    def import_dir(self, path: str, name: str | None) -> None:
        from dbert_core.storage import store

        try:
            new = store.import_dir(path, name=name)
        finally:
            self.app.call_from_thread(self._fetch_over)
        self.post_message(StoreChanged(new, "imported"))

    def action_delete(self) -> None:
        entry = self.selected()
        if entry is None:
            return
        self.fresh_message()
        if entry.name == "default":
            self.app.notify("the shipped default checkpoint cannot be deleted", severity="warning")
            return
        if self.in_use() == Path(entry.path).resolve():  # said before asking, not after a yes
            self.app.notify(f"{entry.name} is in use; choose another checkpoint first (Enter on it)",
                            severity="warning")
            return
        self.app.push_screen(ConfirmDialog(f"Delete checkpoint {entry.name!r} ({human_size(entry.size)}) from the store?"),
                             lambda yes: self._delete(entry, yes))

    def _delete(self, entry, yes: bool | None) -> None:
        if not yes:
            return
        from dbert_core.storage import store
        from dbert_core.errors import DbertError

        if self.app.db is not None and self.app.db.path and Path(self.app.db.path).resolve() == Path(entry.path).resolve():
            self.app.notify(f"{entry.name} is in use; choose another checkpoint first", severity="warning")
            return
        try:
            store.remove(entry.name)
        except (DbertError, OSError) as e:
            self.app.notify(str(e), severity="error")
            return
        self.say(f"deleted {entry.name}", "yellow")
        self.app.notify(f"deleted {entry.name}")
        self.refresh_store()
