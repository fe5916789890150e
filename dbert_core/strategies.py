"""Decoding strategies: the one registry of what `dbert sample --sampler`, `dbert eval`, `dbert bench`,
the server's `dbert.sampler`, the TUI's `m` key, `--stats` and the trajectory file offer. It is the
only place that maps a strategy's name to what it is: every front end asks `get(name)`, `names()`
or the Strategy object, never compares a name.

A Strategy declares its family (the sampler that runs it: a generator function over one
sampling.base.State, named "module:function" so this module stays torch-free, or the function
itself), the fixed options it hands that family, its typed parameters (Param: name, type, range,
default, help), what it supports (`supports(checkpoint)`: None, or the reason it cannot run on
that checkpoint) and the checks between its parameters (`check`). `register` adds one (a plug-in,
a test's toy); docs/architecture.md has the touch list of a new sampler.

Each strategy has a name, a label and its parameters with their defaults:

    exact      draws from the law the model defines with the S-step reverse process
               (docs/method.md section 2); the three exact samplers draw from the same law;
    heuristic  changes that law: which positions are revealed, and when, follows a rule of its
               own (and ReMDM may mask revealed tokens again). docs/decoding.md measures by how
               much (total-variation distance on a model small enough to measure it) and what
               each one buys in quality and network calls.

Every strategy runs on the one frame generator (sample.frames) and yields the same Frames.
Temperature, top-k, top-p and the repeat block shape only the token drawn at a revealed
position; which positions a heuristic reveals is decided from the model's raw p (softmax of
the logits, tokens that can never be drawn left out), so a colder temperature never changes
the order of reveals, as for the exact samplers.

This module is torch-free (config.py reads it, and `dbert --help` stays instant); the
samplers themselves are in sampling/ (one module per family).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .errors import DbertError


class ParamError(DbertError):
    """A strategy parameter that is unknown, of the wrong type or out of its range; `param` names it."""

    def __init__(self, message: str, param: str, setting: str | None = None):
        super().__init__(message, setting)
        self.param = param


@dataclass(frozen=True)
class Param:
    """One parameter of a strategy: a number of `type` (float or int) in [lo, hi] (lo excluded when
    lo_open), or one of choices (type str)."""

    name: str
    default: float | int | str | None
    help: str
    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    choices: tuple[str, ...] = ()
    when: tuple[str, str] | None = None  # (parameter, value): applies only then (remdm's loop settings)
    type: type = float                   # float, int, or str (with choices)

    def parse(self, text: str):
        """The value of `text` (from --param NAME=VALUE) for this parameter."""
        if self.choices or self.type is str:
            return text
        try:
            return int(text) if self.type is int else float(text)
        except ValueError:
            what = "a whole number" if self.type is int else "a number"
            raise ParamError(f"{self.name} takes {what}, got {text!r}", self.name, "params") from None

    def check(self, value, where: str) -> None:
        """A ParamError (`where`: how the message names this parameter) unless value is one of its values."""
        if self.choices:
            if value not in self.choices:
                raise ParamError(f"{where} must be one of: {', '.join(self.choices)} (got {value!r})", self.name)
            return
        kinds = (int,) if self.type is int else (int, float)
        ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (value > self.lo if self.lo_open else value >= self.lo) and value <= self.hi
        if not ok:
            bounds = f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"
            what = "a whole number" if self.type is int else "a finite number"
            raise ParamError(f"{where} must be {what} in {bounds} (got {value!r})", self.name)


@dataclass(frozen=True)
class Strategy:
    name: str
    exact: bool
    summary: str                    # one line: what it does (--help, the TUI's settings dialog)
    law: str                        # what law it samples, against the model's (docs/decoding.md)
    params: tuple[Param, ...] = ()
    reference: str = ""
    uses_steps: bool = True         # False: --steps only sets the time grid frames report against
    derived: dict = field(default_factory=dict, hash=False, compare=False)  # defaults that depend on another parameter
    # the sampler family that runs it: "module:function" (imported by sampling, not here) or the function
    family: str | Callable = field(default="", compare=False)
    options: dict = field(default_factory=dict, hash=False, compare=False)  # fixed keywords its family gets
    needs: Callable | None = field(default=None, compare=False)   # checkpoint -> None, or why it cannot run there
    rules: Callable | None = field(default=None, compare=False)   # (params, steps or None) -> None; raises DbertError
    cache_masked: bool = False      # reads [MASK] positions' kept reveal chances with --cache-masked
    baseline: bool = False          # the one `dbert bench` measures the others' speed-up against

    @property
    def label(self) -> str:
        return "exact" if self.exact else "heuristic"

    def supports(self, db) -> str | None:
        """None if this strategy can run on checkpoint db, else the reason (one line) it cannot."""
        return self.needs(db) if self.needs is not None else None

    def check(self, params: dict, steps: int | None = None) -> None:
        """The checks between resolved parameters, and with the step budget when it is known."""
        if self.rules is not None:
            self.rules(params, steps)

    def resolve(self, given: dict | None, prefix: str | None = None) -> dict:
        """Every parameter's value: `given` over the defaults, checked. Unknown names are an error.
        A ParamError names the parameter; `prefix` (the server's "dbert.params") goes before its name
        in the message (prefix.tau), else it reads "threshold's tau"."""
        given = dict(given or {})
        known = {p.name: p for p in self.params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            has = ", ".join(known) if known else "none"
            where = f"{prefix}: the" if prefix else "the"
            raise ParamError(f"{where} {self.name} sampler has no parameter {', '.join(map(repr, unknown))} "
                             f"(its parameters: {has})", unknown[0])
        out: dict = {}
        for p in self.params:
            where = f"{prefix}.{p.name}" if prefix else f"{self.name}'s {p.name}"
            if p.when is not None and out.get(p.when[0]) != p.when[1]:
                if p.name in given:
                    raise ParamError(f"{where} applies only with {p.when[0]}={p.when[1]}", p.name)
                continue
            value = given.get(p.name, p.default)
            if value is None and p.name in self.derived:
                key, table = self.derived[p.name]
                value = table[out[key]]
            if isinstance(value, int) and not isinstance(value, bool) and p.type is float and not p.choices:
                value = float(value)
            p.check(value, where)
            out[p.name] = value
        return out

    def describe(self, params: dict | None = None) -> str:
        """'threshold (heuristic; tau=0.9)': the name, the label and the parameters' values."""
        values = self.resolve(params)
        shown = "; " + ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()) if values else ""
        return f"{self.name} ({self.label}{shown})"

    def short(self, params: dict | None = None) -> str:
        """What the TUI's control bar shows: the name alone for an exact sampler, else the name,
        '~' (heuristic) and the parameters' values."""
        if self.exact:
            return self.name
        values = self.resolve(params)
        return f"{self.name}~" + "".join(f" {k} {_fmt(v)}" for k, v in values.items())


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


REMDM_ETA = {"cap": 0.008, "rescale": 0.015, "loop": 0.02}  # the paper's scripts (OWT, 1,024 steps)
_SAMPLING = "dbert_core.sampling."  # where the built-in families live (one module per family)


def _time_agnostic(db) -> str | None:
    """cached: a row's logits are reused while the row is unchanged, so the model must ignore t."""
    if db.model.time != "none":
        return f"the cached sampler needs a time-agnostic model; this one uses time={db.model.time!r}"
    return None


def _hits_exactly(db) -> str | None:
    """first-hitting: the event step is drawn from p at the row's last change (time-agnostic), or
    needs no p at all (a token-free schedule)."""
    if db.model.time != "none" and not db.schedule.token_free:
        return ("the first-hitting sampler needs a time-agnostic model with the "
                f"{db.schedule.name} schedule; this one uses time={db.model.time!r}")
    return None


def _remdm_rules(params: dict, steps: int | None) -> None:
    if params["schedule"] != "loop":
        return
    if not params["t_off"] < params["t_on"]:
        raise DbertError(f"remdm's loop needs t_off < t_on (got t_on={params['t_on']:g}, t_off={params['t_off']:g})")
    if steps is not None and steps < 2:
        raise DbertError("must be >= 2 for remdm's loop schedule (one step to reveal, one to finish)", "steps", steps)


_ORDERED, _ADAPTIVE = _SAMPLING + "ordered:ordered", _SAMPLING + "ordered:adaptive"
_BUILT_IN = (
    Strategy("ancestral", True, "one network call per step, every position of the batch",
             "the model's S-step reverse process (docs/method.md section 2)",
             family=_SAMPLING + "ancestral:ancestral", options={"cached": False}, baseline=True),
    Strategy("cached", True, "ancestral, skipping a row's call when nothing it depends on changed "
             "(time-agnostic models); the same samples as ancestral",
             "the model's S-step law: the same draws and samples as ancestral",
             family=_SAMPLING + "ancestral:ancestral", options={"cached": True}, needs=_time_agnostic),
    Strategy("first-hitting", True, "jumps straight to each row's next reveal (Zheng et al. 2024): "
             "at most one call per token whatever --steps is",
             "the model's S-step law, exactly (a different random stream than ancestral)",
             family=_SAMPLING + "first_hitting:first_hitting", needs=_hits_exactly, cache_masked=True),
    Strategy("confidence", False, "MaskGIT / LLaDA low-confidence remasking: each step reveals the k most "
             "confident masked positions (top-1 probability), k from the schedule's expected reveals",
             "the order of reveals is the model's most confident first, not the reverse process's random one",
             reference="Chang et al. 2022 (MaskGIT); Nie et al. 2025 (LLaDA, remasking='low_confidence')",
             family=_ORDERED, options={"by": "confidence"}),
    Strategy("margin", False, "as confidence, ranking masked positions by top-1 minus top-2 probability",
             "most decided positions first (by the margin of the top two tokens)",
             reference="Kim et al. 2025 (top-k margin); Dream's topk_margin", family=_ORDERED, options={"by": "margin"}),
    Strategy("entropy", False, "as confidence, ranking masked positions by lowest entropy first",
             "lowest-entropy positions first", reference="Dream (Ye et al. 2025), alg='entropy'",
             family=_ORDERED, options={"by": "entropy"}),
    Strategy("blockwise", False, "LLaDA semi-autoregressive decoding: the canvas in blocks of `block` tokens, "
             "left to right; each step reveals the surest masked positions (by `by`) of the first unfinished block",
             "left to right by blocks, the model's surest first within a block: the reverse process's order is lost",
             params=(Param("block", 32, "tokens per block: a step reveals in the first block with a masked "
                           "position before any later one", lo=1, type=int),
                     Param("by", "confidence", "how positions are ranked within a block",
                           choices=("confidence", "margin", "entropy"), type=str),
                     Param("opening", -1.0, "the temperature of the canvas's first block (a story's opening: its "
                           "names and places), -1: the --temperature; a cool temperature otherwise opens nearly "
                           "every story alike", lo=-1.0, hi=1e6)),
             reference="Nie et al. 2025 (LLaDA, semi-autoregressive remasking, block_length)",
             family=_SAMPLING + "ordered:blockwise", cache_masked=True),
    Strategy("threshold", False, "Fast-dLLM parallel decoding: every call reveals each masked position whose "
             "confidence exceeds tau, and at least the most confident one",
             "several positions revealed together from their separate marginals (their dependence is lost)",
             params=(Param("tau", 0.9, "confidence threshold: reveal every masked position with top-1 "
                           "probability above it (at least one per call)", lo=0.0, hi=1.0),),
             reference="Wu et al. 2025 (Fast-dLLM), threshold 0.9", uses_steps=False,
             family=_ADAPTIVE, options={"rule": "above", "value": "tau"}),
    Strategy("entropy-bounded", False, "EB-sampler: every call reveals the lowest-entropy masked positions while "
             "their summed entropy minus the largest stays at most gamma (at least one)",
             "several positions revealed together while the error proxy (their joint entropy bound) is small",
             params=(Param("gamma", 0.1, "entropy budget in nats: reveal the lowest-entropy positions while "
                           "sum(H) - max(H) <= gamma", lo=0.0),),
             reference="Ben-Hamu et al. 2025 (EB-sampler); gamma sweeps 1e-3..1 there, 0.1 here",
             uses_steps=False, family=_ADAPTIVE, options={"rule": "budget", "value": "gamma"}),
    Strategy("remdm", False, "ReMDM: revealed tokens may be masked again with probability sigma_t, so later "
             "steps can correct them; more steps buy quality",
             "a predictor-corrector law: the forward marginals under a perfect denoiser, another law under "
             "a learnt one",
             params=(Param("schedule", "cap", "sigma_t: cap (min(eta, (1-a_s)/a_t)), rescale "
                           "(eta * min(1, (1-a_s)/a_t)) or loop (unmask to alpha_on, remask at constant "
                           "alpha between t_on and t_off, then finish)", choices=("cap", "rescale", "loop"), type=str),
                     Param("eta", None, "remasking strength (default: the paper's for the schedule: cap 0.008, "
                           "rescale 0.015, loop 0.02)", lo=0.0, hi=1.0),
                     Param("t_on", 0.55, "loop: the remasking phase starts at this fraction of the reverse "
                           "process's time (1 = start)", lo=0.0, hi=1.0, when=("schedule", "loop")),
                     Param("t_off", 0.05, "loop: and ends at this one", lo=0.0, hi=1.0, when=("schedule", "loop")),
                     Param("alpha_on", 0.9, "loop: the fraction of tokens visible during the remasking phase",
                           lo=0.0, hi=1.0, lo_open=True, when=("schedule", "loop"))),
             derived={"eta": ("schedule", REMDM_ETA)},
             reference="Wang et al. 2025 (ReMDM); defaults from its scripts: cap eta 0.008, rescale 0.015, "
                       "loop eta 0.02, t_on 0.55, t_off 0.05, alpha_on 0.9",
             family=_SAMPLING + "remdm:remdm", rules=_remdm_rules),
)

_REGISTRY: dict[str, Strategy] = {s.name: s for s in _BUILT_IN}  # every strategy, in the order `m` cycles them
NAMES = tuple(s.name for s in _BUILT_IN)                        # the built-in strategies (names() adds registered ones)
EXACT = tuple(s.name for s in _BUILT_IN if s.exact)             # the built-in exact samplers
HEURISTIC = tuple(s.name for s in _BUILT_IN if not s.exact)
DEFAULTS = ("first-hitting", "ancestral")  # the sampler a run uses unless told: the first its checkpoint supports


def register(strategy: Strategy) -> Strategy:
    """Add a strategy (a plug-in's, a test's): every front end offers it from now on. Its name must be new."""
    if strategy.name in _REGISTRY:
        raise DbertError(f"a strategy named {strategy.name!r} is registered already")
    if not strategy.family:
        raise DbertError(f"the {strategy.name} strategy names no sampler family")
    _REGISTRY[strategy.name] = strategy
    return strategy


def unregister(name: str) -> None:
    """Remove a registered strategy (not a built-in one)."""
    if name in NAMES:
        raise DbertError(f"the built-in {name} strategy cannot be removed")
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered strategy: the exact built-ins, the heuristic ones, then those registered since."""
    return tuple(_REGISTRY)


def exact_names() -> tuple[str, ...]:
    return tuple(n for n, s in _REGISTRY.items() if s.exact)


def get(name: str) -> Strategy:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise DbertError(f"must be one of: {', '.join(names())} (got {name!r})", "sampler", name) from None


def default_for(db) -> Strategy:
    """The fastest exact sampler checkpoint db allows (what `dbert sample` uses unless told)."""
    return next(s for s in map(get, DEFAULTS) if s.supports(db) is None)  # ancestral runs on every checkpoint


def parse_params(name: str, items: list[str] | None) -> dict:
    """--param NAME=VALUE options for strategy `name` as a dict (checked by Strategy.resolve later)."""
    strategy = get(name)
    known = {p.name: p for p in strategy.params}
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise DbertError(f"takes NAME=VALUE, got {item!r}", "params", item)
        if key not in known:
            has = ", ".join(known) if known else "none"
            raise ParamError(f"the {name} sampler has no parameter {key!r} (its parameters: {has})", key)
        out[key] = known[key].parse(value.strip())
    return out


def help_text() -> str:
    """The --sampler help: every strategy, its label and its parameters' defaults."""
    parts = []
    exact = exact_names()
    heuristic = tuple(n for n in names() if n not in exact)
    for label, group in (("exact (the model's own law)", exact), ("heuristic (change the law; docs/decoding.md)", heuristic)):
        items = []
        for n in group:
            s = _REGISTRY[n]
            ps = s.resolve(None)
            items.append(n + (" (" + ", ".join(f"{k}={_fmt(v)}" for k, v in ps.items()) + ")" if ps else ""))
        parts.append(f"{label}: " + "; ".join(items))
    return ". ".join(parts) + ". Set parameters with --param NAME=VALUE"
