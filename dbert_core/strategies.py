"""Decoding strategies: the one registry of what `dbert sample --sampler`, `dbert eval`, `dbert bench`,
the TUI's `m` key, `--stats` and the trajectory file offer.

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

from .errors import DbertError


@dataclass(frozen=True)
class Param:
    """One parameter of a strategy: a number in [lo, hi] (lo excluded when lo_open) or one of choices."""

    name: str
    default: float | str | None
    help: str
    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    choices: tuple[str, ...] = ()
    when: tuple[str, str] | None = None  # (parameter, value): applies only then (remdm's loop settings)

    def parse(self, text: str):
        """The value of `text` (from --param NAME=VALUE) for this parameter."""
        if self.choices:
            return text
        try:
            return float(text)
        except ValueError:
            raise DbertError(f"--param {self.name} takes a number, got {text!r}") from None

    def check(self, value, strategy: str) -> None:
        where = f"{strategy}'s {self.name}"
        if self.choices:
            if value not in self.choices:
                raise DbertError(f"{where} must be one of: {', '.join(self.choices)} (got {value!r})")
            return
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (value > self.lo if self.lo_open else value >= self.lo) and value <= self.hi
        if not ok:
            bounds = f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"
            raise DbertError(f"{where} must be a finite number in {bounds} (got {value!r})")


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

    @property
    def label(self) -> str:
        return "exact" if self.exact else "heuristic"

    def resolve(self, given: dict | None) -> dict:
        """Every parameter's value: `given` over the defaults, checked. Unknown names are an error."""
        given = dict(given or {})
        known = {p.name: p for p in self.params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            has = ", ".join(known) if known else "none"
            raise DbertError(f"the {self.name} sampler has no parameter {', '.join(map(repr, unknown))} "
                             f"(its parameters: {has})")
        out: dict = {}
        for p in self.params:
            if p.when is not None and out.get(p.when[0]) != p.when[1]:
                if p.name in given:
                    raise DbertError(f"{self.name}'s {p.name} applies only with {p.when[0]}={p.when[1]}")
                continue
            value = given.get(p.name, p.default)
            if value is None and p.name in self.derived:
                key, table = self.derived[p.name]
                value = table[out[key]]
            if isinstance(value, int) and not isinstance(value, bool) and not p.choices:
                value = float(value)
            p.check(value, self.name)
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

_STRATEGIES = (
    Strategy("ancestral", True, "one network call per step, every position of the batch",
             "the model's S-step reverse process (docs/method.md section 2)"),
    Strategy("cached", True, "ancestral, skipping a row's call when nothing it depends on changed "
             "(time-agnostic models); the same samples as ancestral",
             "the model's S-step law: the same draws and samples as ancestral"),
    Strategy("first-hitting", True, "jumps straight to each row's next reveal (Zheng et al. 2024): "
             "at most one call per token whatever --steps is",
             "the model's S-step law, exactly (a different random stream than ancestral)"),
    Strategy("confidence", False, "MaskGIT / LLaDA low-confidence remasking: each step reveals the k most "
             "confident masked positions (top-1 probability), k from the schedule's expected reveals",
             "the order of reveals is the model's most confident first, not the reverse process's random one",
             reference="Chang et al. 2022 (MaskGIT); Nie et al. 2025 (LLaDA, remasking='low_confidence')"),
    Strategy("margin", False, "as confidence, ranking masked positions by top-1 minus top-2 probability",
             "most decided positions first (by the margin of the top two tokens)",
             reference="Kim et al. 2025 (top-k margin); Dream's topk_margin"),
    Strategy("entropy", False, "as confidence, ranking masked positions by lowest entropy first",
             "lowest-entropy positions first", reference="Dream (Ye et al. 2025), alg='entropy'"),
    Strategy("threshold", False, "Fast-dLLM parallel decoding: every call reveals each masked position whose "
             "confidence exceeds tau, and at least the most confident one",
             "several positions revealed together from their separate marginals (their dependence is lost)",
             params=(Param("tau", 0.9, "confidence threshold: reveal every masked position with top-1 "
                           "probability above it (at least one per call)", lo=0.0, hi=1.0),),
             reference="Wu et al. 2025 (Fast-dLLM), threshold 0.9", uses_steps=False),
    Strategy("entropy-bounded", False, "EB-sampler: every call reveals the lowest-entropy masked positions while "
             "their summed entropy minus the largest stays at most gamma (at least one)",
             "several positions revealed together while the error proxy (their joint entropy bound) is small",
             params=(Param("gamma", 0.1, "entropy budget in nats: reveal the lowest-entropy positions while "
                           "sum(H) - max(H) <= gamma", lo=0.0),),
             reference="Ben-Hamu et al. 2025 (EB-sampler); gamma sweeps 1e-3..1 there, 0.1 here",
             uses_steps=False),
    Strategy("remdm", False, "ReMDM: revealed tokens may be masked again with probability sigma_t, so later "
             "steps can correct them; more steps buy quality",
             "a predictor-corrector law: the forward marginals under a perfect denoiser, another law under "
             "a learnt one",
             params=(Param("schedule", "cap", "sigma_t: cap (min(eta, (1-a_s)/a_t)), rescale "
                           "(eta * min(1, (1-a_s)/a_t)) or loop (unmask to alpha_on, remask at constant "
                           "alpha between t_on and t_off, then finish)", choices=("cap", "rescale", "loop")),
                     Param("eta", None, "remasking strength (default: the paper's for the schedule: cap 0.008, "
                           "rescale 0.015, loop 0.02)", lo=0.0, hi=1.0),
                     Param("t_on", 0.55, "loop: the remasking phase starts at this fraction of the reverse "
                           "process's time (1 = start)", lo=0.0, hi=1.0, when=("schedule", "loop")),
                     Param("t_off", 0.05, "loop: and ends at this one", lo=0.0, hi=1.0, when=("schedule", "loop")),
                     Param("alpha_on", 0.9, "loop: the fraction of tokens visible during the remasking phase",
                           lo=0.0, hi=1.0, lo_open=True, when=("schedule", "loop"))),
             derived={"eta": ("schedule", REMDM_ETA)},
             reference="Wang et al. 2025 (ReMDM); defaults from its scripts: cap eta 0.008, rescale 0.015, "
                       "loop eta 0.02, t_on 0.55, t_off 0.05, alpha_on 0.9"),
)

STRATEGIES: dict[str, Strategy] = {s.name: s for s in _STRATEGIES}
NAMES = tuple(STRATEGIES)                                   # every strategy, in the order `m` cycles them
EXACT = tuple(s.name for s in _STRATEGIES if s.exact)       # the exact samplers
HEURISTIC = tuple(s.name for s in _STRATEGIES if not s.exact)


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise DbertError(f"--sampler must be one of: {', '.join(NAMES)} (got {name!r})") from None


def parse_params(name: str, items: list[str] | None) -> dict:
    """--param NAME=VALUE options for strategy `name` as a dict (checked by Strategy.resolve later)."""
    strategy = get(name)
    known = {p.name: p for p in strategy.params}
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise DbertError(f"--param takes NAME=VALUE, got {item!r}")
        if key not in known:
            has = ", ".join(known) if known else "none"
            raise DbertError(f"the {name} sampler has no parameter {key!r} (its parameters: {has})")
        out[key] = known[key].parse(value.strip())
    return out


def check_pair(name: str, params: dict) -> None:
    """Checks between parameters (after resolve)."""
    if name == "remdm" and params["schedule"] == "loop" and not params["t_off"] < params["t_on"]:
        raise DbertError(f"remdm's loop needs t_off < t_on (got t_on={params['t_on']:g}, t_off={params['t_off']:g})")


def help_text() -> str:
    """The --sampler help: every strategy, its label and its parameters' defaults."""
    parts = []
    for label, names in (("exact (the model's own law)", EXACT), ("heuristic (change the law; docs/decoding.md)", HEURISTIC)):
        items = []
        for n in names:
            s = STRATEGIES[n]
            ps = s.resolve(None)
            items.append(n + (" (" + ", ".join(f"{k}={_fmt(v)}" for k, v in ps.items()) + ")" if ps else ""))
        parts.append(f"{label}: " + "; ".join(items))
    return ". ".join(parts) + ". Set parameters with --param NAME=VALUE"
