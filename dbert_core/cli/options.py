"""What the commands' options are made of: a command's settings made options from their
declarations (settings.py, bound in config: with_settings), the choice types built from config's
tuples, flags shown without a type in --help, and what an option turns into (a device, a loaded
checkpoint).

Light on imports: torch and transformers load only inside load(), when a command runs.
"""

from __future__ import annotations

import functools
import inspect
from copy import copy
from dataclasses import MISSING, replace
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from .. import config, strategies
from ..errors import DbertError
from ..settings import Setting


def flags_without_type() -> None:
    """Help lists a flag (--lowercase, --block-repeats/--allow-repeats, --help) without a `<bool>`
    type column: it takes no value."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "dbert", False):  # an older typer has no such hook: help shows the type
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.dbert = True  # type: ignore[attr-defined]  # the mark that it is ours
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]  # typer's hook, replaced


_CHOICES: dict[tuple[str, ...], type[Enum]] = {}


def _choice(name: str, values: tuple[str, ...]) -> type[Enum]:
    """The Typer option type of one of config's tuples of choices: one class a tuple, whichever
    option asks (a setting's option and the names below are the same class)."""
    if values not in _CHOICES:
        _CHOICES[values] = Enum(name, [(v.replace("-", "_"), v) for v in values], type=str)  # type: ignore[assignment]
    return _CHOICES[values]


if TYPE_CHECKING:  # the type checker cannot read classes built at run time: to it each one is a str Enum
    from enum import StrEnum

    class Decay(StrEnum): ...
    class Device(StrEnum): ...
    class DocSep(StrEnum): ...
    class Dtype(StrEnum): ...
    class EvalUnit(StrEnum): ...
    class Loss(StrEnum): ...
    class Preset(StrEnum): ...
    class Schedule(StrEnum): ...
    class Time(StrEnum): ...
    class Unit(StrEnum): ...
else:
    Schedule = _choice("Schedule", config.SCHEDULES)
    Time = _choice("Time", config.TIME_MODES)
    Device = _choice("Device", config.DEVICES)
    Unit = _choice("Unit", config.UNITS)
    EvalUnit = _choice("EvalUnit", config.EVAL_UNITS)
    DocSep = _choice("DocSep", config.DOC_SEPS)
    Loss = _choice("Loss", config.LOSSES)
    Decay = _choice("Decay", config.DECAYS)
    Dtype = _choice("Dtype", config.DTYPES)
    Preset = _choice("Preset", config.PRESETS)


def strategy_name(value: str | None) -> str | None:
    """--sampler's value: the name of a strategy registered when the command line is read
    (strategies.names(): one registered after this module was imported is a choice too)."""
    if value is not None and value not in strategies.names():
        raise typer.BadParameter(f"{value!r} is not one of: {', '.join(strategies.names())}")
    return value


def _strategy_names(incomplete: str) -> list[str]:
    return [n for n in strategies.names() if n.startswith(incomplete)]


# --sampler: a strategy's name (typer.Option(**SAMPLER)), checked against the registry as it is then
SAMPLER = {"callback": strategy_name, "metavar": "NAME", "autocompletion": _strategy_names}
SAMPLE = config.SampleConfig()  # the defaults of the options a command declares itself


def is_given(ctx: typer.Context, name: str) -> bool:
    """Whether the command line gave the option `name` (not its default)."""
    return getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")


def load(checkpoint: str | None, device: str):
    from ..storage import checkpoint as ckpt
    from ..storage.store import resolve
    from ..hardware import pick_device

    return ckpt.load(resolve(checkpoint), device=pick_device(device))


def no_params(param: list[str] | None) -> dict | None:  # the default sampler's params: none
    if param:
        raise DbertError("--param needs --sampler (parameters belong to the sampler they are named with)")
    return None


def option_of(s: Setting, **changed) -> tuple[Any, Any]:
    """Setting `s` as a Typer option: (its annotation, its default). Its flag (--top-p, -n; a bool's
    --x/--off-flag, or --x alone), type (a choice's Enum; a list where repeatable; Optional where
    the default is None), help and metavar are the declaration's; `changed` gives typer.Option's
    keywords on top of them, and `default` one of this command's own (dataclasses.MISSING: required)."""
    default = changed.pop("default", s.default)
    kind: Any = _choice(s.name.title().replace("_", ""), s.choices) if s.choices else s.kind
    if s.choices and default not in (None, MISSING):
        default = kind(default)
    if s.many:
        kind = list[kind]
    if default is None:
        kind = Optional[kind]
    flags = [s.cli + (f"/{s.off}" if s.off else ""), *([s.short] if s.short else [])]
    about = {"help": s.help, "metavar": s.metavar or None, **changed}
    return Annotated[kind, typer.Option(*flags, **about)], inspect.Parameter.empty if default is MISSING else default


def renamed(table: dict[str, Setting], **names: str) -> dict[str, Setting]:
    """Settings of `table` under a command's own names, each an option --new-name (`dbert eval`'s
    sample_steps="steps": --sample-steps, with the type, range, metavar and default of `dbert
    sample --steps`), to add to the table its with_settings reads."""
    return {new: replace(table[old], name=new, flag="", off="", short="", field=None, label=None)
            for new, old in names.items()}


def with_settings(table: dict[str, Setting], layout: dict[str | None, tuple[str, ...]],
                  changed: dict[str, dict] | None = None, *, rest: bool = True) -> Callable:
    """A command's signature built from the settings it takes (config.SAMPLE_SETTINGS, TRAIN_SETTINGS).

    The decorated function declares its own parameters (Typer's Annotated options) and `**declared`,
    which receives the settings: each one named in `layout` and, with `rest`, every other setting of
    `table` that has a flag (one whose flag is its name has none), last; each is the option option_of
    makes of it, `changed[name]` typer.Option's keywords of this command's own (a help in its words).
    `layout` is the order --help lists the options in, own and settings together, by panel (None:
    rich's "Options"). So a setting declared in settings.py is an option of `dbert sample` and
    `dbert train` with nothing written here; the function as written is the command's __wrapped__."""

    changed = changed or {}

    def build(function: Callable) -> Callable:
        own = {p.name: p for p in inspect.signature(function, eval_str=True).parameters.values()
               if p.kind is not p.VAR_KEYWORD}
        named = [(panel, name) for panel, names in layout.items() for name in names]
        unknown = [name for _, name in named if name not in own and name not in table] + \
            [name for name in changed if name not in table]
        if unknown:  # a slip in the command's module, seen at import
            raise ValueError(f"{function.__name__}: {', '.join(unknown)}: neither its parameter nor a setting")
        placed = {name for _, name in named}
        named += [(None, name) for name in own if name not in placed]
        if rest:
            named += [(None, s.name) for s in table.values() if s.name not in placed and s.cli != s.name]

        @functools.wraps(function)  # its name, help and annotations; __wrapped__: the function as written
        def command(**values):
            return function(**values)

        command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # what Typer reads
            [_placed(own[name] if name in own else _parameter(table[name], **changed.get(name, {})), panel)
             for panel, name in named])
        return command

    return build


def _parameter(s: Setting, **changed) -> inspect.Parameter:
    annotation, default = option_of(s, **changed)
    return inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


def _placed(p: inspect.Parameter, panel: str | None) -> inspect.Parameter:
    """Parameter `p` keyword-only (the signature's order is --help's, a required one anywhere), its
    option in `panel` (None: where its own declaration puts it)."""
    annotation = p.annotation
    if panel is not None and hasattr(annotation, "__metadata__"):  # Annotated[kind, typer.Option(...)]
        info = copy(annotation.__metadata__[0])
        info.rich_help_panel = panel
        annotation = Annotated[annotation.__origin__, info]
    return p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=annotation)


def plain(chosen: dict) -> dict:
    """A command's settings as the configs take them: a choice's Enum as its value."""
    return {k: v.value if isinstance(v, Enum) else v for k, v in chosen.items()}
