"""Every choice and default of dbert, defined once and torch-free.

The CLI's option types, the TUI's selects and the engine all read the tuples below, and
`dbert train`, `dbert sample`, the TUI and library code all build a TrainConfig or a
SampleConfig: the defaults, the range checks and the resume rule live here and nowhere else.
Importing this module costs nothing (no torch), so `dbert --help` stays instant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from . import settings, strategies
from .errors import DbertError
from .settings import MAX_LAMBDA, MAX_NGRAM, MAX_SEED, MAX_T  # noqa: F401  (the ranges, declared with the settings)

# ---------------------------------------------------------------------------------- choices
SCHEDULES = ("linear", "spindle")
TIME_MODES = ("none", "prefix", "layerwise")      # time-agnostic (TAD), prefix token (PTE), layer-wise (LTE)
SAMPLERS = strategies.EXACT                        # the built-in exact samplers: the model's own law
STRATEGIES = strategies.NAMES                      # the built-in strategies; strategies.names(): every registered one
DEVICES = ("auto", "cpu", "cuda", "mps")
UNITS = ("line", "sentence", "story")             # story: a whole document, in windows that end with its end
EVAL_UNITS = UNITS + ("window",)  # eval also scores the sentence-start windows a checkpoint trained on
DOC_SEPS = ("auto", "blank", "eot", "line", "jsonl")  # what separates documents (data.read_documents)
LOSSES = ("hybrid", "elbo", "ce")
DECAYS = ("cosine", "constant")
DTYPES = ("auto", "fp32", "bf16")
DECODING = ("steps", "temperature", "top_k", "top_p", "cache_refresh", "cache_masked", "no_repeat_ngram")  # SampleConfig's fields a checkpoint may recommend (settings.default_decoding)
PRESETS = ("tiny", "mini", "small", "base")       # their sizes: model.PRESETS
CHOICES = {"preset": PRESETS, "unit": UNITS, "doc_sep": DOC_SEPS, "decay": DECAYS, "schedule": SCHEDULES,
           "time": TIME_MODES, "loss": LOSSES, "device": DEVICES, "dtype": DTYPES}  # each choice setting's values


def _need(ok: bool, message: str, setting: str | None = None, value=None, refs: tuple = ()) -> None:
    if not ok:
        raise DbertError(message, setting, value, refs)


def _one_of(setting: str, value, choices: tuple) -> None:
    _need(value in choices, f"must be one of: {', '.join(choices)} (got {value!r})", setting, value)


# ---------------------------------------------------------------------------------- training
@dataclass
class TrainConfig:
    data: list[str]
    out: str
    preset: str | None = "tiny"        # model sizes for a random init (tiny, mini, small, base)
    init: str | None = None            # or a pretrained BERT: local dir or hub id
    from_scratch: bool = False         # with init: its architecture and tokenizer, random weights
    trim_vocab: bool = False           # with init: keep only the word pieces the training data uses
    vocab_size: int | None = None      # WordPiece size learnt from the data (presets without init)
    unit: str = "line"                 # an example is a line, a sentence, or a whole story (document)
    doc_sep: str = "auto"              # what separates documents: auto (per file), blank, eot, line, jsonl
    story_context: int | None = None   # --unit story: earlier tokens a continuation window carries (None: seq_len // 2)
    hide_end_padding: bool = False     # --unit story: a visible [SEP] after a [SEP] is no key (maths/end_padding.py)
    pack: bool = False                 # join examples with [SEP] into full seq_len streams
    short_windows: float = 0.0         # with --unit sentence --pack: this fraction of windows get a shorter room
    seq_len: int = 64                  # content tokens per example (plus [CLS], [SEP])
    batch_size: int = 32               # examples per optimizer step, over all processes
    grad_accum: int = 1                # micro-batches per optimizer step
    max_steps: int = 1000
    lr: float = 5e-4
    warmup: int = 100
    decay: str = "cosine"              # cosine to min_lr_ratio * lr, or constant after warm-up
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    clip: float = 1.0
    schedule: str = "spindle"
    lam: float = 0.3                   # spindle strength (0 = linear)
    T: int = 2048
    time: str = "none"                 # none (time-agnostic), prefix, layerwise
    loss: str = "hybrid"               # ELBO + hybrid_weight * CE (paper), pure elbo, or ce
    hybrid_weight: float = 0.01
    val_data: list[str] | None = None  # held-out files; default: a slice of the training data
    val_examples: int = 256
    eval_every: int = 200              # 0: never
    eval_steps: int | None = None      # step budget of the validation ELBO (None: min(128, T))
    save_every: int = 500              # 0: only at the end
    log_every: int = 10
    device: str = "auto"               # auto, cpu, cuda, mps
    dtype: str = "auto"                # auto (bf16 autocast where native: CUDA, AVX512-BF16/AMX CPUs), fp32, bf16
    dropout: float | None = None       # override the model's dropout rates (None: keep them)
    seed: int = 0
    resume: bool = False

    # What a resumed run may change; everything else is the checkpoint's.
    RESUMABLE = ("max_steps", "eval_every", "save_every", "log_every", "device", "dtype")

    @property
    def by_story(self) -> bool:
        """Whole-story windows (data.story_windows)."""
        return self.unit == "story"

    @property
    def by_document(self) -> bool:
        """Documents read as such: whole stories, or sentence-start windows (data.pack_sentences)."""
        return self.by_story or (self.pack and self.unit == "sentence")

    @property
    def eval_budget(self) -> int:
        """Step budget of the validation ELBO."""
        return self.eval_steps if self.eval_steps is not None else min(128, self.T)

    def validate(self, world: int = 1) -> "TrainConfig":
        """Raise DbertError naming the first bad field; returns self unchanged."""
        _need(bool(self.data) and all(isinstance(p, str) and p for p in self.data), "needs at least one file", "data")
        _need(isinstance(self.out, str) and bool(self.out), "must name a directory", "out", self.out)
        if self.init is None:
            _one_of("preset", self.preset, PRESETS)
            _need(not self.from_scratch, "needs $init (a preset is always a random init)", "from_scratch",
                  refs=("init",))
            _need(not self.trim_vocab, "needs $init (a preset learns a vocabulary from the data anyway)",
                  "trim_vocab", refs=("init",))
        _check(self, TRAIN_SETTINGS)
        _one_of("unit", self.unit, UNITS)
        _need(self.unit != "story" or self.seq_len >= 2, f"story needs $seq_len 2 or more (a window holds "
              f"the [SEP] that opens a story, then at least one token), got {self.seq_len!r}", "unit", self.unit,
              refs=("seq_len",))
        _one_of("doc_sep", self.doc_sep, DOC_SEPS)
        if self.story_context is not None:
            settings.Setting("story_context", int, "", 1, max(1, self.seq_len - 1)).check(self.story_context)
            _need(self.unit == "story", "is for $unit story", "story_context", self.story_context, ("unit",))
        _need(not (self.unit == "story" and self.pack), "story makes whole-story windows itself: drop $pack",
              "unit", self.unit, ("pack",))
        _need(not self.hide_end_padding or self.unit == "story", "is for $unit story (its windows end in padding)",
              "hide_end_padding", True, ("unit",))
        _need(not self.short_windows or (self.pack and self.unit == "sentence"), "shortens sentence-start "
              "windows: it needs $unit sentence $pack", "short_windows", self.short_windows, ("unit", "pack"))
        _need(self.batch_size % (world * self.grad_accum) == 0, f"{self.batch_size} must divide by processes x "
              f"$grad_accum ({world} x {self.grad_accum})", "batch_size", self.batch_size, ("grad_accum",))
        _one_of("decay", self.decay, DECAYS)
        _one_of("schedule", self.schedule, SCHEDULES)
        _one_of("time", self.time, TIME_MODES)
        _one_of("loss", self.loss, LOSSES)
        if self.eval_steps is not None:
            settings.Setting("eval_steps", int, "", 1, self.T).check(self.eval_steps)
        _one_of("device", self.device, DEVICES)
        _one_of("dtype", self.dtype, DTYPES)
        _need(self.dropout is None or self.dropout < 1.0, f"must be below 1 (got {self.dropout})", "dropout",
              self.dropout)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict) -> "TrainConfig":
        """A config from a checkpoint's train_config: keys of older versions dropped, new ones default."""
        if not isinstance(saved, dict):
            raise DbertError("the checkpoint's train_config is not a JSON object")
        known = {f.name: f.type for f in fields(cls)}
        for name, value in saved.items():  # each saved field of the type its annotation says, or one line naming it
            if name in known and not _of_type(value, str(known[name])):
                raise DbertError(f"the checkpoint's training settings (dbert.json train_config) are damaged: field "
                                 f"{name!r} is {str(value)[:40]!r}, not {known[name]}")
        return cls(**{k: v for k, v in saved.items() if k in known})

    @classmethod
    def resume_from(cls, saved: dict, out: str, **changes) -> "TrainConfig":
        """The config of a run to continue: the checkpoint's own, with `changes` on top.
        Changes outside RESUMABLE are allowed only when they equal the saved value."""
        base = cls.from_dict(saved)
        return base.continued(replace(base, out=out, resume=True, **changes))

    def continued(self, given: "TrainConfig") -> "TrainConfig":
        """self (the checkpoint's config) continued under `given`: only RESUMABLE fields may differ."""
        for f in fields(self):
            if f.name in self.RESUMABLE or f.name in ("out", "resume"):
                continue
            mine, theirs = getattr(self, f.name), getattr(given, f.name)
            if f.name == "eval_steps":
                mine, theirs = self.eval_budget, given.eval_budget
            if mine != theirs:
                others = ", ".join("$" + n for n in self.RESUMABLE)
                raise DbertError(f"is {mine!r} in the checkpoint, not {theirs!r}; a resumed run ($resume) may "
                                 f"change only {others}", f.name, theirs, ("resume",) + self.RESUMABLE)
        return replace(self, out=given.out, resume=True, **{n: getattr(given, n) for n in self.RESUMABLE})


def _of_type(value, annotation: str) -> bool:
    """Whether a JSON value fits a field's annotation as dataclasses keep it (a string under
    `from __future__ import annotations`): int, float, str, bool, list[str], unions with None."""
    for kind in (a.strip() for a in annotation.split("|")):
        if kind == "None" and value is None:
            return True
        if kind == "bool" and isinstance(value, bool):
            return True
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind == "str" and isinstance(value, str):
            return True
        if kind == "list[str]" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return True
        if kind == "dict" and isinstance(value, dict):
            return True
        if kind not in ("None", "bool", "int", "float", "str", "list[str]", "dict"):
            return True  # a type this check does not know: validate() has the last word
    return False


# ---------------------------------------------------------------------------------- sampling
@dataclass
class SampleConfig:
    """How to sample. None fields are filled in per checkpoint by `sample.resolve(cfg, db)`."""

    n: int = 10                        # samples
    steps: int | None = None           # reverse steps S (1..T); None: the checkpoint's recommendation, else 96
    temperature: float | None = None   # 0: greedy, the most likely token (ties broken by the seeded draw); None: the
    #                                    checkpoint's recommendation, else 1
    top_k: int | None = None           # 0: off; None: the checkpoint's recommendation, else 30 (the paper's)
    top_p: float | None = None         # 1: off; None: the checkpoint's recommendation, else 1
    length: int | None = None          # None: the length the checkpoint was trained on
    min_length: int | None = None      # a story model's shortest story in tokens; None: the checkpoint's own
    end_at_sentence: bool = True       # a story model ends only after a sentence end (never after "And")
    natural_length: bool = False       # a story model's end keeps the model's own chance (temperature 1, no top-k/p):
    #                                    the shaping changes the words, not the story's length (draw.shape_probs keep);
    #                                    off: the end is shaped like any token (blind readers grade those shorter stories higher)
    start_as_trained: bool = True      # a story model's first token opens some of its training stories
    sampler: str | None = None         # None: the fastest exact sampler the checkpoint allows
    params: dict | None = None         # the strategy's parameters (strategies.py); None: its defaults
    batch_size: int = 32               # samples per network call, at most
    workers: int | None = None         # the samples split into a multiple of this many batches, run side by side,
    #                                    each on its share of the threads (sampling/parallel.py); None: 2 on a CPU, 1 on a GPU
    seed: int | None = None            # None: a fresh random seed
    device: str = "auto"
    prompt: str | None = None          # a template with [MASK] slots
    block_repeats: bool = True         # never draw a token equal to a revealed neighbour ("there there")
    no_repeat_ngram: int | None = None  # > 0: never draw a token that writes an N-gram the sample already shows
    #                                    (draw.no_repeat_ngram_ids); 0: off; None: the checkpoint's recommendation, else 0
    pair_quotes: bool = True           # refill quotes that pair with none, quotes excluded (quotes.py)
    fix_contractions: bool = True      # refill contractions English lacks ("you't"), apostrophes excluded
    known_words: bool = True           # refill words the training text never writes (lexicon.py)
    dtype: str = "auto"                # the network's precision: auto (bf16 where native), fp32, bf16
    prefix_cache: bool = False         # a long story's continuation windows keep their context's keys and
    #                                    values from the window's first call (approximate: maths.prefix_cache.PrefixCache)
    cache_refresh: int | None = None   # > 0: decided positions' keys and values are kept between calls and computed
    #                                    afresh every this many (approximate: maths.decided_cache); 0: the exact
    #                                    forward; None: the checkpoint's recommendation, else 0
    cache_masked: bool | None = None   # with cache_refresh: [MASK] positions' states are kept too, and first-hitting
    #                                    reuses their reveal chances of the last whole call; None: the checkpoint's
    #                                    recommendation, else off

    def validate(self) -> "SampleConfig":
        """Checks that need no checkpoint; `sample.resolve` adds the ones that do."""
        _check(self, SAMPLE_SETTINGS)
        if self.sampler is not None:
            strategy = strategies.get(self.sampler)  # "--sampler must be one of: ..." for a name it has not
            strategy.check(strategy.resolve(self.params))
        else:
            _need(not self.params, "needs $sampler (parameters belong to the sampler they are named with)", "params", self.params,
                  ("sampler",))
        _one_of("device", self.device, DEVICES)
        _one_of("dtype", self.dtype, DTYPES)
        return self


def _bound(cls, table: tuple) -> dict[str, settings.Setting]:
    """The settings of `table` with their defaults, the dataclass `cls`'s own (the one place they
    live; dataclasses.MISSING: a required field), and a choice's values (CHOICES)."""
    defaults = {f.name: f.default for f in fields(cls)}
    return {s.name: replace(s, default=defaults[s.name], choices=CHOICES.get(s.name, ())) for s in table}


def _check(cfg, table: dict) -> None:
    """Each numeric setting of `cfg` that is given (not None) within its declared range (one with
    none declared, whose range is another setting's, is validate's to check)."""
    for s in table.values():
        value = getattr(cfg, s.name)
        if value is not None and s.kind in (int, float) and (s.lo, s.hi) != (None, None):
            s.check(value)


SAMPLE_SETTINGS = _bound(SampleConfig, settings.SAMPLE)  # the schema: settings.py, with the defaults above
TRAIN_SETTINGS = _bound(TrainConfig, settings.TRAIN)
