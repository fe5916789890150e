"""Nothing from a checkpoint runs as code.

dbert reads weights from safetensors only, configs as JSON, and never imports transformers to
load a checkpoint, so it has no way to run a checkpoint's code. It still refuses a folder that
asks for custom code (`auto_map` and its kin in a JSON config, as transformers'
trust_remote_code would honour) or carries code files, so such a folder never enters the store
to be loaded later by a tool that would run it.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import DbertError

CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".pyx", ".so", ".dylib", ".dll", ".exe", ".sh", ".bat", ".ipynb")
CODE_KEYS = ("auto_map", "custom_pipelines", "trust_remote_code")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_CONFIG_BYTES = 4 << 20  # configs are small; tokenizer.json (big, no code keys) is not read here


def is_code(name: str) -> bool:
    return name.lower().endswith(CODE_SUFFIXES)


def code_key(data, _depth: int = 0) -> str | None:
    """The first key of CODE_KEYS anywhere in a parsed JSON config, else None."""
    if _depth > 8:
        return None
    if isinstance(data, dict):
        for key, value in data.items():
            if key in CODE_KEYS and value not in (None, False, {}, []):
                return key
            found = code_key(value, _depth + 1)
            if found:
                return found
    elif isinstance(data, list):
        for value in data:
            found = code_key(value, _depth + 1)
            if found:
                return found
    return None


def refuse_config(data, where: str) -> None:
    """Raise if a parsed config asks for custom code."""
    key = code_key(data)
    if key:
        raise DbertError(f"{where} asks for custom code ({key!r}); dbert never runs code from a checkpoint")


def refuse_code(path: Path, files: bool = True) -> None:
    """Refuse a model folder that asks for custom code in its JSON configs or, with files=True,
    holds a code file anywhere inside it."""
    path = Path(path)
    if files:
        for f in sorted(path.rglob("*")):
            if is_code(f.name):
                raise DbertError(f"{path} holds custom code ({f.relative_to(path)}); dbert never runs code "
                                 "from a checkpoint and does not accept folders that carry it")
    for f in sorted(path.glob("*.json")):
        if f.name == "tokenizer.json" or not f.is_file() or f.stat().st_size > MAX_CONFIG_BYTES:
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # unreadable JSON is reported by whoever reads that file for its content
        refuse_config(data, f"{path}/{f.name}")
