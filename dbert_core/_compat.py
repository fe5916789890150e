"""The old flat module names (`dbert_core.sample`, `dbert_core.checkpoint`, ...) for one release.

dbert_core's modules moved into packages by role (docs/architecture.md). An old name still imports,
as the very module object under its new name, with a DeprecationWarning saying the new one:

    import dbert_core.sample                 # a finder on sys.meta_path (install(), from __init__)
    from dbert_core.checkpoint import load   # the same finder
    from dbert_core import store             # dbert_core.__getattr__ -> old_module()

MOVED is the one table of old names; it goes, with this module, in the release after 0.1.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import FrameType

MOVED = {  # old module name -> its package now
    **dict.fromkeys(("jsonfile", "layout", "schema", "trust"), "disk"),
    **dict.fromkeys(("tokenizer", "data", "detok", "truecase", "stable", "quotes", "contractions"), "text"),
    **dict.fromkeys(("schedule", "model", "diffusion"), "maths"),
    **dict.fromkeys(("sample", "touchup", "inspector", "trajectory", "replay", "share", "distance", "infill"),
                    "sampling"),
    **dict.fromkeys(("checkpoint", "pretrained", "store", "fetch", "archive", "net"), "storage"),
    **dict.fromkeys(("prepare", "train", "vocab"), "training"),
    **dict.fromkeys(("metrics", "judge", "bench"), "evaluation"),
    **dict.fromkeys(("serve", "serve_queue"), "serving"),
    "progress": "cli",  # the `dbert` command is one package now (dbert_core/cli/)
}
OLD = {f"dbert_core.{name}": f"dbert_core.{package}.{name}" for name, package in MOVED.items()}


def _new_module(old: str):
    new = OLD[old]
    # the warning names the line that imported the old name: count the frames up to it that warn()
    # counts (it skips the import system's own)
    level = 2
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        frozen = frame.f_code.co_filename.startswith("<frozen importlib")
        if not frozen and frame.f_globals.get("__name__") not in {__name__, "importlib", "dbert_core"}:
            break
        level += not frozen
        frame = frame.f_back
    warnings.warn(f"{old} is now {new}; the old name goes in the next release", DeprecationWarning, stacklevel=level)
    return importlib.import_module(new)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module of its new name (no second copy of the module)."""

    def __init__(self):
        self._specs = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in OLD:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        module = _new_module(spec.name)
        self._specs[spec.name] = module.__spec__  # the import system sets __spec__ to the old name's: put it back
        return module

    def exec_module(self, module):
        module.__spec__ = self._specs.pop(module.__spec__.name)


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())


def old_module(name: str):
    """`from dbert_core import sample` and `dbert_core.sample`: the moved module, with the warning."""
    if f"dbert_core.{name}" not in OLD:
        raise AttributeError(f"module 'dbert_core' has no attribute {name!r}")
    return importlib.import_module(f"dbert_core.{name}")
