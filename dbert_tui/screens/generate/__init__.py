"""The Generate screen: `screen.py` composes the widgets of widgets/generate/ and routes their
messages; `keys.py` holds its keys."""

from .screen import GenerateScreen

__all__ = ["GenerateScreen"]
