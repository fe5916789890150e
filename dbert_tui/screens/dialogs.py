"""Small modal dialogs: a confirmation and a form of labelled text fields."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, DirectoryTree, Input, Label

from dbert_core.disk import layout


class ConfirmDialog(ModalScreen[bool]):
    """Yes / no; dismisses with True only on an explicit yes."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(Text(self.question), classes="dialog-title")  # text, not markup: it may name a checkpoint
            with Horizontal(classes="dialog-buttons"):
                yield Button("Yes (y)", id="yes", variant="error", compact=True)
                yield Button("No (n)", id="no", variant="primary", compact=True)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class FormDialog(ModalScreen[dict | None]):
    """Labelled inputs; Enter (or OK) dismisses with {key: text}, Escape with None.

    With `check` (values -> None, or (key, message) for the first bad field), a bad value keeps
    the dialog open with every edit in place: the field is marked, focused, and the message is
    shown under the fields. With `post` (values -> a Message), the values go to the App in that
    message as well: the dialogs that change the App's state (messages.SettingsChosen) say so
    there, and the App, which owns that state, applies it."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+o", "browse", "Pick a folder")]

    def __init__(self, title: str, fields: list[tuple[str, str, str, str]], ok: str = "OK",
                 check: Callable[[dict], tuple[str | None, str] | None] | None = None,
                 browse: str | None = None, post: Callable[[dict], Message] | None = None) -> None:
        """fields: (key, label, initial value, placeholder); `browse`: the key of a field that
        ctrl+o fills from a folder picker (FileDialog(folders=True))."""
        super().__init__()
        self.title_text = title
        self.fields = fields
        self.ok = ok
        self.check = check
        self.browse = browse
        self.post = post
        self.error: tuple[str | None, str] | None = None  # the last refusal (tests read it)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            with VerticalScroll(classes="dialog-fields"):
                for key, label, value, placeholder in self.fields:  # one line per field: fits 80x24
                    with Horizontal(classes="field-row", id=f"row-{key}"):
                        yield Label(label, classes="field-label")
                        yield Input(value=value, placeholder=placeholder, id=f"field-{key}", compact=True)
            yield Label("", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button(self.ok, id="ok", variant="primary", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def on_mount(self) -> None:
        for inp in self.query(Input):
            inp.cursor_blink = not getattr(self.app, "deterministic", False)
        self.query_one(".dialog-error", Label).display = False
        self.query(Input).first().focus()

    def values(self) -> dict:
        return {key: self.query_one(f"#field-{key}", Input).value.strip() for key, *_ in self.fields}

    def submit(self) -> None:
        values = self.values()
        self.error = self.check(values) if self.check is not None else None
        for row in self.query(".field-row"):
            row.remove_class("-bad")
        if self.error is None:
            if self.post is not None:
                self.app.post_message(self.post(values))  # to the App: this dialog is gone once dismissed
            self.dismiss(values)
            return
        key, message = self.error
        shown = self.query_one(".dialog-error", Label)
        shown.update(message)
        shown.display = True
        if key is not None and self.query(f"#row-{key}"):
            self.query_one(f"#row-{key}").add_class("-bad")
            field = self.query_one(f"#field-{key}", Input)
            field.focus()
            field.scroll_visible(animate=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self.submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_browse(self) -> None:
        if self.browse is None:
            return
        field = self.query_one(f"#field-{self.browse}", Input)
        start = Path(field.value).expanduser() if field.value else Path(".")
        root = start if start.is_dir() else start.parent if start.parent.is_dir() else Path(".")

        def picked(path: str | None) -> None:
            if path:
                field.value = path
                field.focus()

        self.app.push_screen(FileDialog("Pick a checkpoint folder (Enter on it; Backspace: up; Esc cancels)",
                                        str(root), folders=True), picked)


class FileDialog(ModalScreen[str | None]):
    """Pick a file from a directory tree; dismisses with its path (Enter / click) or None (Esc).
    Backspace (or the ".. up" button) re-roots the tree at the parent folder, so files beside or
    above the launch directory (../shared/data) can be reached. With `folders=True` it picks a
    checkpoint folder instead: Enter on a folder holding dbert.json (or config.json) takes it,
    on any other folder opens it."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("backspace", "up", "Parent folder")]

    def __init__(self, title: str, root: str = ".", folders: bool = False) -> None:
        super().__init__()
        self.title_text = title
        self.root = str(Path(root).expanduser().resolve())
        self.folders = folders

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog file-dialog"):
            yield Label(self.title_text, classes="dialog-title")
            with Horizontal(classes="dialog-buttons file-where"):
                yield Button(".. up (Backspace)", id="file-up", compact=True)
                yield Label(self.root, id="file-root")
            yield DirectoryTree(self.root, id="file-tree")

    def on_mount(self) -> None:
        self.query_one(DirectoryTree).focus()

    def action_up(self) -> None:
        parent = str(Path(self.root).parent)
        if parent != self.root:
            self.root = parent
            self.query_one(DirectoryTree).path = parent
            self.query_one("#file-root", Label).update(parent)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "file-up":
            event.stop()
            self.action_up()
            self.query_one(DirectoryTree).focus()

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        event.stop()
        self.dismiss(str(event.path.parent if self.folders else event.path))

    def on_directory_tree_directory_selected(self, event: DirectoryTree.DirectorySelected) -> None:
        event.stop()
        if self.folders and any((event.path / name).is_file() for name in (layout.META, layout.CONFIG)):
            self.dismiss(str(event.path))

    def action_cancel(self) -> None:
        self.dismiss(None)
