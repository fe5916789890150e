"""Moved: the control bar lives in widgets/generate/controls.py; this name is kept for imports
from before the Generate screen was split into widgets (tests/test_strategies.py)."""

from .generate.controls import CONTROLS, ControlBar, _value  # noqa: F401
