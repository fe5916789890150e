"""The dbert-tui app: three modes (Generate, Checkpoints, Train) over one loaded checkpoint.

`create_app` is the factory: tests inject a loader (e.g. one returning a tiny model already in
memory), default sampling settings and training data, and `deterministic=True` to hide timings
and stop cursor blinking for snapshots.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Iterable, Optional

import typer

from textual import work
from textual.app import App, SystemCommand
from textual.reactive import reactive
from textual.screen import ModalScreen, Screen
from textual.worker import Worker, WorkerState

from dbert_core import config
from dbert_core.errors import DbertError

from .messages import CheckpointLoaded, PromptChosen, SettingsChosen, StoreChanged
from .controller import Session, Settings
from .files import read_state, remember
from .keymap import APP_KEYS, bindings, commands
from .screens.checkpoints import CheckpointsScreen
from .screens.generate import GenerateScreen
from .screens.generate.keys import CATALOGUE as GENERATE_KEYS
from .screens.train import TrainScreen
from .workers import one_line

if TYPE_CHECKING:
    from dbert_core.storage.checkpoint import DBert


def initial_checkpoint(requested: str | None) -> tuple[Path | None, str]:
    """--checkpoint, else the last one used, else the shipped default, else the newest usable
    store entry; and a notice when the remembered one had to be ignored."""
    from dbert_core.errors import DbertError
    from dbert_core.disk.layout import inspect
    from dbert_core.storage.store import entries, resolve

    if requested:
        return resolve(requested), ""  # a clear DbertError for a bad name
    notice = ""
    last = read_state().get("checkpoint")
    if last is not None:
        try:
            if not isinstance(last, str) or not last:
                raise DbertError(f"tui.json names {last!r}, not a folder")
            inspect(Path(last))
            return Path(last), ""
        except DbertError as e:
            notice = f"ignoring the last checkpoint used: {e}"
        except OSError as e:  # a path too long for the file system, a folder it may not read
            notice = f"ignoring the last checkpoint used: {e.strerror or e} ({str(last)[:60]}…)"
    try:
        return resolve(None), notice
    except DbertError:
        pass
    rows = [e for e in entries() if not e.broken]
    if not rows:
        return None, notice
    return max(rows, key=lambda e: e.created or "").path, notice


class DbertApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "dbert"

    db: reactive[DBert | None] = reactive(None, always_update=True)
    """The checkpoint in use (a DBert), or None. Set in one place (on_checkpoint_loaded); the
    Generate screen runs whatever it becomes and the Checkpoints screen marks it, both by
    watching it. The App owns the TUI's state: this checkpoint, the generation `session`, the
    `replay` being played and `load_error`; screens read them from here and keep no copy."""
    BINDINGS = bindings(APP_KEYS, priority=("quit",))  # keymap.APP_KEYS: every screen's keys, written once

    def __init__(self, checkpoint: str | Path | None = None, loader: Callable | None = None,
                 settings: Settings | None = None, train_data: list[str] | None = None,
                 deterministic: bool = False, replay=None) -> None:
        """replay: a dbert_core.sampling.replay.Replay (or a trajectory file's path) to play instead of
        sampling: no checkpoint is loaded."""
        super().__init__()
        if replay is not None and not hasattr(replay, "frames"):
            from dbert_core.sampling.replay import load as load_replay

            replay = load_replay(replay)
        self.replay = replay  # the Generate screen plays it instead of sampling (GenerateScreen.replay)
        self.session = Session(settings)  # the generation session: settings, runs, selection (controller.Session)
        self.load_error = ""  # why the last checkpoint could not be used; the Checkpoints screen shows it until one loads
        self.requested = str(checkpoint) if checkpoint is not None else None
        self.loader = loader
        self.deterministic = deterministic
        if deterministic:
            self.animation_level = "none"
        self._show_after_load = True
        self.generate_screen = GenerateScreen()
        self.checkpoints_screen = CheckpointsScreen()
        self.train_screen = TrainScreen(train_data)
        self.add_mode("generate", lambda: self.generate_screen)
        self.add_mode("checkpoints", lambda: self.checkpoints_screen)
        self.add_mode("train", lambda: self.train_screen)

    # ------------------------------------------------------------------ start-up
    def on_mount(self) -> None:
        from dbert_core.errors import DbertError

        if self.replay is not None:  # a trajectory file: no model, the Generate screen plays it
            self.switch_mode("generate")
            self.db = self.replay.db
            return
        try:
            path, notice = initial_checkpoint(self.requested)
        except DbertError as e:
            self.switch_mode("checkpoints")
            self.notify(str(e), severity="error", timeout=10)
            return
        if notice:
            self.notify(notice, severity="warning", timeout=10)
        if path is None:
            self.switch_mode("checkpoints")
            return
        self.switch_mode("generate")
        self.use_checkpoint(path, show=False)

    def use_checkpoint(self, path, show: bool = True) -> None:
        """Load a checkpoint in a worker; the Generate screen then runs it (and is shown if `show`)."""
        self.notify(f"loading {Path(path).name} …", timeout=2)
        self._show_after_load = show
        self.load(Path(path))

    @work(exclusive=True, exit_on_error=False, group="load", name="load")
    async def load(self, path: Path) -> None:
        """The load runs in a daemon thread of its own, not in the event loop's executor: Ctrl-Q
        while a model loads (torch importing, weights read) quits at once, where an executor
        thread would be waited for at exit until the load finished. A newer choice cancels this
        worker; its thread's result is then dropped."""
        db = await in_daemon_thread(self._read_checkpoint, path)
        self.post_message(CheckpointLoaded(db, path))

    def _read_checkpoint(self, path: Path):
        if self.loader is not None:
            return self.loader(path)
        from dbert_core.storage.checkpoint import load
        from dbert_core.hardware import pick_device

        return load(path, device=pick_device(self.session.settings.device))

    def on_checkpoint_loaded(self, message: CheckpointLoaded) -> None:
        try:  # the Generate screen's settings fitted to it first: a checkpoint it cannot run stays out
            notes = self.session.fit(message.db)
        except Exception as e:  # noqa: BLE001 - say so, keep the previous checkpoint
            self.load_error = f"could not use that checkpoint: {one_line(e)}"
            self.notify(self.load_error, severity="error", timeout=10)
            self.switch_mode("checkpoints")
            return
        for note in notes:
            self.notify(note, title="sampler", severity="warning")
        self.load_error = ""
        self.db = message.db  # the screens watch it
        remember(checkpoint=str(Path(message.path).resolve()))  # only a checkpoint in use is remembered
        if self._show_after_load:
            self.switch_mode("generate")

    # ------------------------------------------------------------------ the session, by messages
    def on_settings_chosen(self, message: SettingsChosen) -> None:
        """The settings dialog's values on the side the keys change; the Generate screen then starts new runs."""
        from .forms import FieldError, said, settings_fields

        try:
            self.session.change(self.db, **settings_fields(message.values, self.session.active, self.db))
        except (FieldError, DbertError) as e:  # the dialog checked them; the checkpoint may have changed since
            self.notify(said(e) if isinstance(e, DbertError) else e.message, title="settings", severity="error")
            return
        self.generate_screen.restart()

    def on_prompt_chosen(self, message: PromptChosen) -> None:
        """The prompt dialog's template for every side, once the checkpoint takes it; then new runs."""
        from .forms import check_prompt, said

        if message.prompt and self.db is not None:
            try:
                check_prompt(message.prompt, self.db, self.session.settings.length)
            except DbertError as e:
                self.notify(said(e), title="prompt", severity="error")
                return
        self.session.set_all(prompt=message.prompt)
        self.generate_screen.restart()

    def on_store_changed(self, message: StoreChanged) -> None:
        if self.checkpoints_screen.is_mounted:
            self.checkpoints_screen.refresh_store(select=message.path)

    # ------------------------------------------------------------------ errors
    def notify(self, message: str, *, title: str = "", severity="information", timeout: float | None = None,
               markup: bool = False) -> None:
        """Every notification, made safe to show: its text often quotes a checkpoint's fields, a
        file name or a URL, so it is plain text (no markup) with control characters escaped."""
        from dbert_core.display import safe_text

        super().notify(safe_text(message, 500), title=safe_text(title, 80), severity=severity, timeout=timeout,
                       markup=markup)

    def action_help_quit(self) -> None:
        """Ctrl-C: Textual's hint that ctrl+q quits, in words (its own is markup, and notify() here shows text as it is)."""
        for key, active in self.active_bindings.items():
            if active.binding.action in ("quit", "app.quit"):
                self.notify(f"Press {key} to quit the app", title="Do you want to quit?")
                return

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.report_worker(event.worker, event.state)

    def report_worker(self, worker: Worker, state: WorkerState) -> None:
        """Every worker failure ends here: one line in a notification, never a crash."""
        if state != WorkerState.ERROR or worker.error is None:
            return
        from .files import log_error

        expected = isinstance(worker.error, (DbertError, OSError, MemoryError))
        message = one_line(worker.error, None if expected else log_error(f"worker {worker.name!r}", worker.error))
        self.log.error(f"worker {worker.name!r} failed: {worker.error!r}")
        self.notify(message, title=f"{worker.name} failed", severity="error", timeout=10)
        if worker.group == "load":
            self.load_error = f"could not load that checkpoint: {message}"
            self.switch_mode("checkpoints")
            if self.checkpoints_screen.is_mounted:
                self.checkpoints_screen.refresh_store()

    # ------------------------------------------------------------------ navigation and palette
    def action_toggle_keys(self) -> None:
        """Show (or hide) the key help of the current screen: every key, described in full."""
        from .screens.help import HelpScreen

        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        elif not isinstance(self.screen, ModalScreen):
            self.push_screen(HelpScreen(self.screen))

    def action_mode(self, mode: str) -> None:
        if self.current_mode != mode:
            if mode == "checkpoints":
                self.checkpoints_screen.arrive()
            self.switch_mode(mode)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title != "Keys":  # Textual's help panel: ours is the key help screen below
                yield command
        yield from commands(APP_KEYS, self)  # the palette's commands: the key catalogues' (keymap), then the fetch
        yield from commands(GENERATE_KEYS, self.generate_screen)
        if screen is self.train_screen:  # its keys act on its form: offered where the form is on screen
            yield from commands(TrainScreen.CATALOGUE, self.train_screen)
        yield SystemCommand("Fetch a checkpoint", "From the Hugging Face Hub or an https URL",
                            lambda: (self.action_mode("checkpoints"), self.call_later(self.checkpoints_screen.action_fetch)))  # type: ignore[func-returns-value]  # two calls in one lambda


async def in_daemon_thread(function, *args):
    """function(*args) in a daemon thread, awaited: the interpreter never waits for it at exit."""
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value, error) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)

    def job() -> None:
        try:
            value, error = function(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting worker, which reports it
            value, error = None, e
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the app has quit meanwhile: nobody waits for it
            pass

    threading.Thread(target=job, daemon=True, name="dbert-load").start()
    return await future


def create_app(**kwargs) -> DbertApp:
    """The app with injected dependencies (see DbertApp.__init__)."""
    return DbertApp(**kwargs)


def run(checkpoint: str | None = None, settings: Settings | None = None, replay=None) -> int:
    """Run the app in this terminal; returns the exit status. No terminal (stdin or stdout
    redirected, a cron job, a pipe) is one DbertError line, not a screen drawn into a file."""
    if not (_isatty(sys.stdin) and _isatty(sys.stdout)):
        raise DbertError("the TUI needs a terminal: stdin and stdout must both be one (use `dbert sample` in scripts)")
    app = create_app(checkpoint=checkpoint, settings=settings, replay=replay)
    app.run()
    return app.return_code or 0


def _isatty(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):
        return False


# the command line's order: the first run's settings, `dbert sample`'s (settings.SAMPLE), among the app's own options
LAYOUT: dict[str | None, tuple[str, ...]] = {None: (
    "checkpoint", "steps", "temperature", "top_k", "top_p", "length", "seed", "device", "pace_ms", "prompt", "replay")}
OFF = {"show_default": False}  # a default of None: the checkpoint's, which the help says
CHANGED: dict[str, dict] = {  # those settings' help in the app's words: they set the first run
    "steps": {"help": "Reverse steps of the first run (default: the checkpoint's recommendation, else 96).", **OFF},
    "temperature": {"help": "Softmax temperature (0: greedy). Default: what the checkpoint recommends, else 1.", **OFF},
    "top_k": {"help": "Keep the k most likely tokens (0: off). Default: the checkpoint's recommendation, else 30.",
              **OFF},
    "top_p": {"help": "Nucleus mass in (0, 1] (1: off). Default: the checkpoint's recommendation, else 1.", **OFF},
    "length": {"help": "Tokens per sample (default: the checkpoint's training length; a story model's: a window and a "
                       "continuation window, 383 tokens for the shipped model)."},
    "seed": {"help": "Seed of the first run."}, "device": {"help": "Where to sample."}}


def _first_run() -> dict:
    """The first run's settings of the command line: `dbert sample`'s declarations (type, range,
    a choice's values) with the app's defaults (controller.Settings)."""
    d = Settings()
    return {s.name: replace(s, default=getattr(d, s.name)) for s in config.SAMPLE_SETTINGS.values()}


def main(argv: list[str] | None = None, prog_name: str = "dbert-tui") -> None:
    """`dbert-tui [OPTIONS]` (and `dbert tui [OPTIONS]`, which forwards here): the command line
    in the style of `dbert`'s own help (Typer), then the app."""
    from dbert_core.cli import flags_without_type
    from dbert_core.cli.options import plain, with_settings
    from dbert_core.cli.ending import is_the_process
    from dbert_core.heap import keep_freed_memory

    if is_the_process(("dbert-tui", "dbert"), ("dbert_tui", "dbert_tui.app", "dbert_core.cli")):
        keep_freed_memory()  # the sampler's arrays reuse pages from call to call (dbert_core/heap.py)
    flags_without_type()
    d = Settings()  # the defaults: dbert sample's, with the TUI's few overrides (controller.Settings)
    command = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @command.command(help="Watch DiffusionBERT generate; fetch or train checkpoints.\n\n"
                          "Example: dbert-tui --checkpoint dbert-minilm-wiki --steps 64 --seed 7")
    @with_settings(_first_run(), LAYOUT, CHANGED, rest=False)
    def tui(
        checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", "-c", help="Store name or checkpoint directory to start with (default: the last one used, else the shipped model).")] = None,
        pace_ms: Annotated[int, typer.Option(help="Milliseconds per shown step while playing (0: full speed).")] = d.pace_ms,
        prompt: Annotated[str, typer.Option(help="The first run's prompt: its opening, or a template with [MASK] slots ([MASK*N], [MASK*A-B]); p changes it.")] = d.prompt,
        replay: Annotated[Optional[Path], typer.Option("--replay", help="Play, scrub and inspect a trajectory file (dbert sample --trajectory, or the TUI's export) without a model.")] = None,
        **first,  # the first run's settings: --steps, --temperature, ... (settings.SAMPLE: with_settings)
    ):
        def fail(message: str):
            from dbert_core.display import safe_text

            print(f"{prog_name}: error: {safe_text(message, 2000)}", file=sys.stderr)
            sys.exit(2)

        from dbert_core.settings import flag  # dbert-tui's own flags name its settings, as dbert does

        if checkpoint:
            from dbert_core.storage.store import resolve

            try:
                resolve(checkpoint)
            except DbertError as e:
                fail(e.said(flag))
            except OSError as e:  # a name too long for the file system, a folder it may not read
                fail(f"--checkpoint {checkpoint[:60]}: {e.strerror or e}")
        loaded = None
        if replay is not None:
            from dbert_core.sampling.replay import load as load_replay

            try:
                loaded = load_replay(replay)
            except DbertError as e:
                fail(e.said(flag))
        settings = Settings(**plain(first), pace_ms=max(0, pace_ms), prompt=prompt)
        try:
            settings.validate()
        except DbertError as e:
            fail(e.said(flag))
        try:
            code = run(checkpoint, settings) if loaded is None else run(checkpoint, settings, replay=loaded)
        except DbertError as e:  # no terminal
            fail(e.said(flag))
        sys.exit(code)

    typer.main.get_command(command)(args=sys.argv[1:] if argv is None else list(argv), prog_name=prog_name)


if __name__ == "__main__":
    main()
