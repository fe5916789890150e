"""The exceptions users see as a single line on stderr."""


class DbertError(Exception):
    """An expected failure caused by the user's input: bad file, bad option, bad checkpoint."""


class Interrupted(BaseException):
    """A stop signal (SIGINT, SIGTERM or SIGHUP; its name is the message) that ends a command:
    `dbert: interrupted`, exit 130, after every `finally` has cleaned up. Not a KeyboardInterrupt,
    so no library's own Ctrl-C handling (typer's is a silent exit) swallows it."""
