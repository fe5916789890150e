"""What each setting a person gives is called and may be, declared once: its name (the field of
config's TrainConfig or SampleConfig), type, range, help, and the words of each front end that
shows it: the CLI's flag, the server's JSON field, the TUI form's label and what its empty field
means. Defaults are the dataclasses' own and a choice's values config's tuples (config.py binds
them: config.SAMPLE_SETTINGS, config.TRAIN_SETTINGS). Torch-free, importing only errors.

From this table: config's range checks (Setting.check), the options of `dbert sample` and
`dbert train` (each setting with a flag, built by cli/options.with_settings; `dbert eval`, `serve`,
`bench` and `dbert-tui` take the few they share), the server's request fields (serving/request.py), the
Generate screen's settings form (dbert_tui/forms.py) and the Train screen's form's labels
(dbert_tui/screens/train.py); each front end names a DbertError's setting through it
(errors.DbertError.said).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import DbertError


@dataclass(frozen=True)
class Setting:
    name: str                        # the config field (SampleConfig.top_p)
    kind: type                       # int, float, bool or str (a choice's values: choices)
    help: str                        # the CLI's --help line for it
    lo: float | None = None          # the range of a number; None: no bound below
    hi: float | None = None          # None: no bound above
    lo_open: bool = False            # lo itself is out of range: (lo, hi]
    flag: str = ""                   # the CLI's option; "": --name with dashes (top_p: --top-p)
    off: str = ""                    # a bool's CLI option that turns it off (--allow-repeats); "": none
    short: str = ""                  # the CLI option's one-letter name (-n); "": none
    metavar: str = ""                # what the CLI's help shows for its value (K); "": its type
    many: bool = False               # the CLI option is repeatable: a list of its kind
    field: str | None = None         # the server's JSON field; None: not a request field
    label: str | None = None         # the TUI form's name for it; None: not on a form
    note: str = ""                   # what the form shows after the label, in brackets: its range
    blank: str = ""                  # what the form's empty field means
    default: object = None           # the dataclass's default (config binds it)
    choices: tuple = ()              # a choice's values: config's tuple (config binds it)

    @property
    def shown(self) -> str:
        """The form's label with its note: "top-k (0: off)"."""
        return f"{self.label} ({self.note})" if self.note else str(self.label)

    @property
    def cli(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def check(self, value) -> None:
        """Raise DbertError(setting=self.name) unless a number `value` is of the setting's type and range."""
        if self.kind not in (int, float):
            return
        number = isinstance(value, (int, float) if self.kind is float else int) and not isinstance(value, bool)
        lo = -math.inf if self.lo is None else self.lo
        hi = math.inf if self.hi is None else self.hi
        inside = number and math.isfinite(value) and (value > lo if self.lo_open else value >= lo) and value <= hi
        if not inside:
            raise DbertError(f"must be {self.what()} (got {value!r})", self.name, value)

    def what(self) -> str:
        """The range in words: "a whole number >= 1", "a finite number in (0, 1]"."""
        kind = "a whole number" if self.kind is int else "a finite number"
        lo = -math.inf if self.lo is None else self.lo
        if self.kind is int:  # whole numbers written out: [1, 1000000]
            return f"{kind} >= {lo}" if self.hi is None else f"{kind} in [{lo}, {self.hi}]"
        if self.hi is None:
            return f"{kind} {'>' if self.lo_open else '>='} {lo:g}" if self.lo is not None else kind
        return f"{kind} in {'(' if self.lo_open else '['}{lo:g}, {self.hi:g}]"


MAX_SEED = 2**32 - 1
MAX_T = 1_000_000
MAX_LAMBDA = 1 / math.pi                           # spindle strength that keeps a_t monotone
MAX_NGRAM = 64                                     # the longest n-gram the n-gram block (no_repeat_ngram) holds
CHECKPOINTS = "the checkpoint's"

# the settings of `dbert sample`, the server's requests and the Generate screen's settings form
SAMPLE = (
    Setting("steps", int, "Reverse steps S (1..T). Default: what the checkpoint recommends (dbert.json's "
            "sampling.decoding; the shipped model: 255), else 96.", 1, MAX_T, field="dbert.steps",
            label="steps", note="1..T", blank=CHECKPOINTS),
    Setting("temperature", float, "Softmax temperature of the token choice (0: greedy, the most likely token). "
            "Default: what the checkpoint recommends (dbert.json's sampling.decoding), else 1.", 0.0, 1e6,
            field="temperature", label="temperature", note="0: greedy", blank=CHECKPOINTS),
    Setting("top_k", int, "Keep the k most likely tokens (0: off). Default: what the checkpoint recommends "
            "(dbert.json's sampling.decoding), else 30.", 0, field="dbert.top_k", label="top-k", note="0: off",
            blank=CHECKPOINTS),
    Setting("top_p", float, "Nucleus sampling: keep the most likely tokens that make up this much of the "
            "probability, in (0, 1] (1: off). Default: what the checkpoint recommends, else 1.", 0.0, 1.0,
            lo_open=True, field="top_p", label="top-p", note="0..1]", blank=CHECKPOINTS),
    Setting("length", int, "Tokens per sample (default: the checkpoint's training length). A story model (the "
            "shipped one) writes one story of at most this many tokens and chooses where it ends (default 383: a "
            "255-token window and one continuation window, room for nearly every story); a story that has not "
            "ended when a window is full continues block by block, up to 8,192.", 1, field="max_tokens",
            label="length", note="tokens", blank=CHECKPOINTS),
    Setting("min_length", int, "A story model's shortest story, in tokens: before it the story may not end (the "
            "model's p given \"not the end\"). Default: what the checkpoint recommends (dbert.json's "
            "sampling.min_length: the 1st percentile of its training stories' lengths; 0 where it says nothing).",
            0, field="min_tokens", label="shortest story", note="tokens", blank="the checkpoint's (story models)"),
    Setting("n", int, "Number of samples (lines on stdout), for each prompt.", 1, short="-n", field="n",
            label="samples"),
    Setting("seed", int, "Random seed: the same seed gives the same output (default: a fresh one, written to "
            "--output).", 0, MAX_SEED, field="seed", label="seed"),
    Setting("sampler", str, "Decoding strategy.", field="dbert.sampler", label="sampler"),
    Setting("params", str, "A parameter of the --sampler strategy (repeatable), e.g. --param tau=0.8.",
            flag="--param", metavar="NAME=VALUE", many=True, field="dbert.params", label="sampler parameters", blank="NAME=VALUE ...: defaults"),
    Setting("cache_refresh", int, "Approximate, faster calls: decided positions keep their keys and values "
            "between network calls and are computed afresh every K calls; the calls between compute only what is "
            "still masked or just changed (a decided-position cache, after Fast-dLLM's dual cache). 0: the "
            "model's exact p. Default: the checkpoint's recommendation, else 0.", 0, MAX_T,
            metavar="K", label="cache refresh", note="0: exact", blank="the checkpoint's: a whole forward every K calls"),
    Setting("cache_masked", bool, "With --cache-refresh K: keep the still-masked positions' keys and values too, "
            "and their reveal chances from the last whole call (first-hitting), so the calls between compute only "
            "the positions just revealed and the ones being revealed (Fast-dLLM's dual cache, without blocks): "
            "approximate, several times cheaper calls. --fresh-masked computes every masked position at every "
            "call. Default: the checkpoint's recommendation, else --fresh-masked.", off="--fresh-masked",
            label="cache keeps masks", note="yes/no", blank="the checkpoint's: masked positions' states kept too"),
    Setting("batch_size", int, "Samples per network call, at most.", 1),
    Setting("workers", int, "The --n samples split into a multiple of this many batches, run side by side, each "
            "on its share of the CPU's threads (one thread: in turn). The split sets the texts. Default: 2 on a "
            "CPU (1 with --trajectory), 1 on a GPU.", 1, 256),
    Setting("block_repeats", bool, "Never draw a token equal to an already revealed neighbour (no \"there "
            "there\"); --allow-repeats samples the model's own distribution.", off="--allow-repeats",
            field="dbert.block_repeats"),
    Setting("no_repeat_ngram", int, "Never draw a token that, with its N-1 revealed neighbours on one side, "
            "writes an N-gram (N tokens in a row) the sample already shows: no sentence written twice (\"She "
            "couldn't find it. But she couldn't find it.\"). 0: off. Default: what the checkpoint recommends, "
            "else 0.", 0, MAX_NGRAM, metavar="N", field="dbert.no_repeat_ngram", label="no-repeat n-gram",
            note="0: off", blank=CHECKPOINTS),
    Setting("end_at_sentence", bool, "A story model ends a story only after a sentence end (. ! ? or a closing "
            "quote; never after \"And\"): p given that rule; --end-anywhere lets the model end where it likes.",
            off="--end-anywhere", field="dbert.end_at_sentence"),
    Setting("start_as_trained", bool, "A story model opens a story with a token that opens its training stories "
            "(dbert.json's sampling.openings; no \"But\" or \"And once\"): p given that rule; --start-anyhow lets "
            "the model open with any token.", off="--start-anyhow", field="dbert.start_as_trained"),
    # in no request and on no form: the command line's only
    Setting("natural_length", bool, "--natural-length: a story model's end keeps the model's own chance "
            "(temperature 1, no top-k or top-p), so a cooler temperature changes the words, not the story's length "
            "(longer stories, read as worse: docs/stories.md); --shaped-length (default): the end is shaped like any "
            "token, and cool stories end sooner.", off="--shaped-length"),
    Setting("pair_quotes", bool, "Refill the quote marks that pair with none (quotes excluded) after sampling; "
            "--unpaired-quotes prints the model's own quotes.", off="--unpaired-quotes"),
    Setting("fix_contractions", bool, "Refill the contractions English does not write (\"you't\", \"friends's\"; "
            "apostrophes excluded) after sampling; --raw-contractions prints the model's own.",
            off="--raw-contractions"),
    Setting("known_words", bool, "Refill the words the checkpoint's training text never writes (\"littlewirled\": "
            "word pieces no text joins) after sampling; --made-up-words prints the model's own.",
            off="--made-up-words"),
    Setting("device", str, "auto, cpu, cuda or mps."),
    Setting("dtype", str, "The network's precision: auto (bf16 where native: CUDA, CPUs with AVX512-BF16/AMX; "
            "draws stay float64), fp32 or bf16."),
    Setting("prefix_cache", bool, "Approximate, faster long stories: a story's continuation windows keep their "
            "given context's keys and values from each window's first call and compute only the new block "
            "(Fast-dLLM's prefix cache; the context no longer sees the block being written). Off: the model's exact "
            "p. With the decided-position cache on (--cache-refresh) it takes that cache's place in continuation "
            "windows and is slower: use it with --cache-refresh 0."),
)

# the settings of `dbert train` that the Train screen's form shows, as it labels them
TRAIN = (
    Setting("data", str, "Training text files, globs or folders, or hf:owner/name (a hub dataset, downloaded once) "
            "(repeatable; recorded as absolute paths; with --resume: "
            "the checkpoint's, or the same files moved).", many=True, label="data"),
    Setting("out", str, "Output checkpoint: a bare NAME goes to the store; anything with a path separator (./x, "
            "runs/x) is a directory.", label="output"),
    Setting("preset", str, "Model size for a random init.", label="preset"),
    Setting("init", str, "Start from a pretrained BERT: a folder, a store name (default: the shipped model) or a hub "
            "id.", label="init"),
    Setting("trim_vocab", bool, "With --init: keep only the word pieces the training data uses (faster).",
            label="trim vocab"),
    Setting("from_scratch", bool, "With --init: its architecture and tokenizer, random weights.", label="scratch"),
    Setting("vocab_size", int, "WordPiece size learnt from the data (presets).", 16, 1_000_000, label="vocab"),
    Setting("seed", int, "Random seed.", 0, MAX_SEED, label="seed"),
    Setting("val_data", str, "Held-out files (default: a slice of --data).", many=True, label="val data"),
    Setting("unit", str, "An example is a line, a sentence, or a story: a whole document in windows that end with "
            "its end (--seq-len tokens; longer ones continue with earlier text as context).", label="unit"),
    Setting("pack", bool, "Join examples with [SEP] into full-length sequences.", off="--no-pack", label="pack"),
    Setting("max_steps", int, "Optimizer steps.", 1, label="steps"),
    Setting("batch_size", int, "Examples per optimizer step (all processes).", 1, label="batch"),
    Setting("seq_len", int, "Content tokens per example.", 1, 100_000, label="seq len"),
    Setting("dtype", str, "auto (bf16 autocast where native: CUDA, CPUs with AVX512-BF16/AMX), fp32 or bf16.",
            label="dtype"),
    Setting("lr", float, "Peak learning rate.", 0.0, 10.0, lo_open=True, label="lr"),
    Setting("warmup", int, "Warm-up steps.", 0, label="warm-up"),
    Setting("device", str, "Where to train.", label="device"),
    Setting("schedule", str, "Noise schedule.", label="schedule"),
    Setting("lam", float, "Spindle strength (0..1/pi).", 0.0, MAX_LAMBDA, flag="--lambda", label="lambda"),
    Setting("T", int, "Diffusion steps of the forward process.", 1, MAX_T, flag="--T", label="T"),
    Setting("time", str, "Time conditioning.", label="time"),
    Setting("loss", str, "hybrid (ELBO + 0.01 CE, the paper's), elbo, or ce.", label="loss"),
    Setting("eval_every", int, "Validation ELBO every N steps (0: never).", 0, label="eval"),
    Setting("save_every", int, "Checkpoint every N steps (0: only at the end).", 0, label="save"),
    Setting("resume", bool, "Continue the run saved in --out exactly (its own settings; only --max-steps, --eval-every, "
            "--save-every, --log-every, --device and --dtype may change; --data / --val-data again only for the same "
            "files moved elsewhere, checked by size and hash).", label="F7"),
    # on no form: the command line's and the library's only (flag=name: no option, the library's name)
    Setting("short_windows", float, "With --unit sentence --pack: this fraction of windows get a room drawn from "
            "1..--seq-len, so some hold one sentence alone (BERT keeps 10% of sequences short).",
            0.0, 1.0),
    Setting("grad_accum", int, "Micro-batches per optimizer step.", 1),
    Setting("min_lr_ratio", float, "The cosine decay's floor, a fraction of --lr.", 0.0, 1.0, flag="min_lr_ratio"),
    Setting("weight_decay", float, "AdamW's weight decay.", 0.0, 10.0, flag="weight_decay"),
    Setting("clip", float, "The gradient norm's clip.", 0.0, lo_open=True, flag="clip"),
    Setting("hybrid_weight", float, "The CE term's weight in the hybrid loss.", 0.0, 1e6, flag="hybrid_weight"),
    Setting("val_examples", int, "Held-out examples the validation ELBO reads.", 1, flag="val_examples"),
    Setting("log_every", int, "Progress line every N steps (non-terminal stderr).", 1),
    Setting("dropout", float, "Override the model's dropout rates.", 0.0, 1.0),
    Setting("doc_sep", str, "What separates documents: auto (each file's own: <|endoftext|> lines, JSONL, else blank "
            "lines), blank, eot, line (one per line) or jsonl ({\"text\": ...} per line)."),
    # story_context and eval_steps: their ranges are other settings' (seq_len, T): TrainConfig.validate checks them
    Setting("story_context", int, "With --unit story: tokens of earlier text a continuation window carries (default: "
            "half of --seq-len)."),
    Setting("hide_end_padding", bool, "With --unit story: attention never reads a visible padding [SEP] after a "
            "story's end, so samplers leave a decided end out of the forward, exactly (faster stories; recorded in "
            "the checkpoint)."),
    Setting("decay", str, "LR after warm-up."),
    Setting("eval_steps", int, "Step budget of the validation ELBO (default: min(128, T))."),
)


def by_name(table: tuple) -> dict[str, Setting]:
    return {s.name: s for s in table}


_ALL = {**by_name(TRAIN), **by_name(SAMPLE)}  # the CLI's flags agree where a name is in both (seed, batch_size)


def flag(name: str) -> str:
    """The CLI's flag for setting `name` (`dbert train` and `dbert sample` spell a shared one alike)."""
    return _ALL[name].cli if name in _ALL else "--" + name.replace("_", "-")


def field(name: str) -> str:
    """The server's JSON field for setting `name` (length: max_tokens, steps: dbert.steps), read
    from SAMPLE as it is now (a setting added at run time is named by its field too)."""
    found = next((s for s in SAMPLE if s.name == name), None)
    return found.field or name if found is not None else name


def dbert_settings() -> dict[str, Setting]:
    """The settings a request's "dbert" object sets, by their name there (steps: the field
    dbert.steps): SAMPLE's entries, as it is now, whose field starts with "dbert."."""
    return {s.field.removeprefix("dbert."): s for s in SAMPLE if s.field and s.field.startswith("dbert.")}


def openai_settings() -> dict[str, Setting]:
    """The settings a request's OpenAI-level fields set, by field (length: max_tokens, seed: seed):
    SAMPLE's entries, as it is now, whose field is no "dbert." one."""
    return {s.field: s for s in SAMPLE if s.field and not s.field.startswith("dbert.")}


def label(name: str, table: tuple = SAMPLE) -> str:
    """The TUI form's label for setting `name` in the form of `table` (SAMPLE: the settings
    dialog, TRAIN: the Train screen); a setting on no form by its name."""
    found = next((s for s in table if s.name == name), None)
    return found.label if found is not None and found.label else name.replace("_", " ")
