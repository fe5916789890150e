"""The exceptions users see as a single line on stderr."""

from __future__ import annotations

from string import Template
from typing import Callable


class DbertError(Exception):
    """An expected failure caused by the user's input: bad file, bad option, bad checkpoint.

    One about a setting carries it: `setting` (its name in config's dataclasses: "top_p") and
    `value` (what was given), and the message reads on from the setting's name:
    `DbertError("must be in (0, 1] (got 1.5)", setting="top_p", value=1.5)`. Other settings the
    message mentions are written `$name` and listed in `refs`. Each front end says it in its own
    words with `said(name)`: the CLI names the flag (`--top-p`), the server the JSON field
    (`top_p`), the TUI the form's label; `str()` names the settings as the library does (`top_p`)."""

    def __init__(self, message: str, setting: str | None = None, value=None, refs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message, self.setting, self.value, self.refs = message, setting, value, tuple(refs)

    def said(self, name: Callable[[str], str] = str) -> str:
        """The one line, each setting it is about named by `name`."""
        text = Template(self.message).safe_substitute({r: name(r) for r in self.refs}) if self.refs else self.message
        return text if self.setting is None else f"{name(self.setting)} {text}"

    def under(self, prefix: str, setting: str | None = None, value=None) -> "DbertError":
        """This error at the end of another's message (`prefix`, about `setting`), its own settings
        still named by whichever front end says the whole."""
        if not self.setting and not self.refs:
            return DbertError(prefix + self.message, setting, value)
        body = self.message if self.refs else self.message.replace("$", "$$")  # a template from here on
        lead = "$" + self.setting + " " if self.setting else ""
        return DbertError(prefix + lead + body, setting, value, self.refs + ((self.setting,) if self.setting else ()))

    def __str__(self) -> str:
        return self.said()


class Interrupted(BaseException):
    """A stop signal (SIGINT, SIGTERM or SIGHUP; its name is the message) that ends a command:
    `dbert: interrupted`, exit 130, after every `finally` has cleaned up. Not a KeyboardInterrupt,
    so no library's own Ctrl-C handling (typer's is a silent exit) swallows it."""
