"""Nothing from a checkpoint runs as code.

dbert reads weights from safetensors only, configs as JSON, and never imports transformers to
load a checkpoint, so it has no way to run a checkpoint's code. It still refuses a folder that
asks for custom code (`auto_map` and its kin in a JSON config, as transformers'
trust_remote_code would honour) or carries code files, so such a folder never enters the store
to be loaded later by a tool that would run it.

This module holds the rules (which names are code, which bytes are a pickle, which keys ask
for code); `layout.refuse_code` applies them to a folder.
"""

from __future__ import annotations

from ..errors import DbertError

CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".pyx", ".so", ".dylib", ".dll", ".exe", ".sh", ".bat", ".ipynb")
CODE_KEYS = ("auto_map", "custom_pipelines", "trust_remote_code")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_CONFIG_BYTES = 4 << 20  # configs are small; a larger one is refused, never passed unchecked


KNOWN_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".md")  # what a checkpoint's files are named


def is_code(name: str) -> bool:
    return name.lower().endswith(CODE_SUFFIXES)


def pickled(name: str, head: bytes) -> bool:
    """A file that is a pickle whatever its name: pickle protocol 2-5 (b"\\x80\\x02".."\\x05"), or a
    zip as torch.save writes one. Files with a checkpoint's own suffixes are read by their own
    parsers and never unpickled, so only other names are judged by their first bytes."""
    if name.lower().endswith(KNOWN_SUFFIXES):
        return False
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head.startswith(b"PK\x03\x04")


def code_key(data) -> str | None:
    """The first key of CODE_KEYS at any depth of a parsed JSON config, else None."""
    stack = [data]
    while stack:  # no recursion: read_json bounds the depth, and this walks all of it
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in CODE_KEYS and value not in (None, False, {}, []):
                    return key
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def refuse_config(data, where: str) -> None:
    """Raise if a parsed config asks for custom code."""
    key = code_key(data)
    if key:
        raise DbertError(f"{where} asks for custom code ({key!r}); dbert never runs code from a checkpoint")
