"""The one exception users see as a single line on stderr."""


class DbertError(Exception):
    """An expected failure caused by the user's input: bad file, bad option, bad checkpoint."""
