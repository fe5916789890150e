"""What the commands' options are made of: the choice types built from config's tuples, the
defaults the options show (TrainConfig's and SampleConfig's), flags shown without a type in
--help, and what an option turns into (a device, a loaded checkpoint).

Light on imports: torch and transformers load only inside load(), when a command runs.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

import typer

from .. import config, strategies
from ..errors import DbertError


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


def _choice(name: str, values: tuple[str, ...]) -> type[Enum]:
    """A Typer option type built from one of config's tuples of choices."""
    return Enum(name, [(v.replace("-", "_"), v) for v in values], type=str)  # type: ignore[return-value]  # a class


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
TRAIN = config.TrainConfig(data=[], out="")  # the defaults the options below show
SAMPLE = config.SampleConfig()


def is_given(ctx: typer.Context, name: str) -> bool:
    """Whether the command line gave the option `name` (not its default)."""
    return getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")


def device_of(gpu: bool, device: Device) -> str:
    return "cuda" if gpu else device.value


def load(checkpoint: str | None, device: str):
    from ..storage import checkpoint as ckpt
    from ..storage.store import resolve
    from ..hardware import pick_device

    return ckpt.load(resolve(checkpoint), device=pick_device(device))


def no_params(param: list[str] | None) -> dict | None:  # the default sampler's params: none
    if param:
        raise DbertError("--param needs --sampler (parameters belong to the sampler they are named with)")
    return None
