"""Every name dbert gives a file on disk, and what a checkpoint folder must hold.

A checkpoint is a folder holding dbert.json (its fields: schema.py; the rest: checkpoint.py).
The names of its files, of the store's and of the TUI's are the constants below. The quick
checks of a folder, before any model is read, are here too: the files it lacks (missing), no
custom code in it (refuse_code), dbert.json valid (read_meta), all three (inspect).

Torch-free: listing the store and the TUI's start-up use it without loading any model.
"""

from __future__ import annotations

from pathlib import Path

from . import trust
from ..errors import DbertError
from .tree import walk

# Every name dbert gives a file on disk, here and nowhere else (tests/test_architecture.py pins it).
META = "dbert.json"                          # dbert's settings and provenance (schema.py)
CONFIG = "config.json"                       # the BERT's Hugging Face config
WEIGHTS = "model.safetensors"                # the BERT's weights
TOKENS = "dbert_tokens.safetensors"          # the token counts of the training data (the spindle schedule's)
TIME = "dbert_time.safetensors"              # the time-embedding weights of a time-conditioned model
DIGEST_FILES = (WEIGHTS, TOKENS, TIME)        # the weight files whose sha256 checkpoint.save records (schema.py)
TRUECASE = "dbert_truecase.json"             # optional: the truecasing table (truecase.py); older checkpoints lack it
WORDS = "dbert_words.json"                   # optional: the training text's multi-piece words (lexicon.py)
TOKENIZER = "tokenizer.json"                 # the tokenizer: tokenizer.json or, in older BERT folders, vocab.txt
VOCAB = "vocab.txt"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS = "special_tokens_map.json"
STATE = "trainer_state"                      # folder: what --resume needs besides the weights
STATE_JSON = "state.json"                    #   the data position and counters
OPTIMIZER = "optimizer.pt"                   #   AdamW's state (torch.load with weights_only)
RNG = "rng.pt"                               #   every rank's random-number state
REQUIRED = (CONFIG, WEIGHTS, META, TOKENS)
UNCHECKED = (TOKENIZER,)                     # big (the vocabulary), and no loader reads code keys from it
TUI_STATE = "tui.json"                       # in $DBERT_HOME: the checkpoint the TUI last used
TUI_ERRORS = "tui-errors.log"                # in $DBERT_HOME: the tracebacks of the TUI's unexpected worker errors
BENCH_JSON, BENCH_MD = "bench.json", "bench.md"  # `dbert bench --out DIR`'s report
CACHE = "cache"                              # in $DBERT_HOME: what dbert can make again from the data
TOKEN_CACHE = "tokens"                       #   cache/tokens/KEY/: a corpus tokenized (text/token_cache.py)
CACHE_TOKENS = "tokens.bin"                  #     every document's ids, flat (uint16 or uint32)
CACHE_OFFSETS = "offsets.npy"                #     where each document starts (int64, documents + 1)
CACHE_WORDS = "words.npy"                    #     each document's word count
CACHE_PARAGRAPHS = "paragraphs.npy"          #     each document's paragraph count
CACHE_INFO = "info.json"                     #     the key's parts and the counts, written last
CACHE_COUNTS = "counts-{key}.npy"            #     token counts of one run's windows or examples (cached_examples.py)
TABLES_CACHE = "tables"                      #   cache/tables/KEY.json: the truecasing table and words learnt
DATASETS_CACHE = "datasets"                  #   cache/datasets/OWNER--NAME[@REV]/: a hub dataset's files (--data hf:)
MARK = ".dbert-temp"                         # in a temp folder: the marker that makes it dbert's own
LOCK = ".{name}.dbert-lock"                  # beside an output folder NAME: a training run's lock (OutLock)

MAX_META = 4 << 20  # bytes of dbert.json (a few kB; its data list names every training file)


def read_meta(path) -> dict:
    """dbert.json of a checkpoint folder, checked against the schema (at most MAX_META bytes)."""
    from .jsonfile import read_json
    from .schema import check

    path = Path(path)
    try:
        meta = read_json(path / META, f"checkpoint {path}: {META}", max_bytes=MAX_META)
    except FileNotFoundError:
        raise DbertError(f"not a dbert checkpoint (no {META}): {path}") from None
    return check(meta, path)


def missing(path) -> list[str]:
    """The files a checkpoint folder needs and lacks (nothing is opened or read)."""
    path = Path(path)
    gaps = [f for f in REQUIRED if not (path / f).is_file()]
    if not ((path / TOKENIZER).is_file() or (path / VOCAB).is_file()):
        gaps.append(f"{TOKENIZER} or {VOCAB}")
    return gaps


def inspect(path) -> dict:
    """The quick checks of a checkpoint folder (files present, no code, dbert.json valid): its
    meta, or DbertError with the reason. The tensors are checked by checkpoint.load."""
    path = Path(path)
    if not path.is_dir():
        raise DbertError(f"checkpoint directory not found: {path}")
    gaps = missing(path)
    if gaps:
        raise DbertError(f"checkpoint {path} is missing {', '.join(gaps)}")
    refuse_code(path)
    return read_meta(path)


def refuse_code(path: Path, files: bool = True) -> None:
    """Refuse a model folder that asks for custom code in its JSON configs or, with files=True,
    holds a code file anywhere inside it."""
    from .jsonfile import read_json

    path = Path(path)

    if files:
        for folder, dirs, others in walk(path):  # links are not followed; a huge or deep tree is refused
            for name in dirs + others:
                if trust.is_code(name):
                    raise DbertError(f"{path} holds custom code ({(folder / name).relative_to(path)}); dbert never "
                                     "runs code from a checkpoint and does not accept folders that carry it")

    for f in sorted(path.glob("*.json")):
        if f.name in UNCHECKED or f.is_dir():
            continue
        # a config too large, too deep or too broken to check is refused, never passed: a loader
        # with other limits might still read the code keys in it
        try:
            data = read_json(f, f"{path}/{f.name}", max_bytes=trust.MAX_CONFIG_BYTES)
        except FileNotFoundError:
            continue  # a dangling link: whoever needs the file says it is missing
        except DbertError as e:
            raise DbertError(f"{e} (a JSON config dbert cannot check for custom code is refused)") from None
        trust.refuse_config(data, f"{path}/{f.name}")


def is_checkpoint(path) -> bool:
    return (Path(path) / META).is_file()
