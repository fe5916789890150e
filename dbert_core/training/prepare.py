"""Preparing a training run: everything before the first optimizer step, done once.

`prepare(cfg)` checks the config, takes the output folder's lock, applies the resume rule (a
resumed run continues the checkpoint's own config; only TrainConfig.RESUMABLE fields may
change), reads and splits the data, builds the tokenizer (trimming --init's vocabulary when
asked), builds or loads the model and checks it against the config, and hands everything to
the loop as a `Prepared`. `train.Trainer` runs it; `Trainer(cfg).run()` prepares on its own,
and `in_memory` prepares a run of a model already loaded (what `dbert bench` times).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ..storage import checkpoint as ckpt
from ..storage.store import did_you_mean, named
from ..text import learnt_tables
from ..disk import layout
from ..config import TrainConfig
from . import story_data
from .story_data import first_texts
from ..text.data import DocumentStats, Special, fingerprints, token_counts, train_tokenizer
from ..errors import DbertError
from ..hardware import pick_device
from ..disk.lock import OutLock
from ..stopping import put_off_stops
from ..disk.output import check_writable, make_folders, remove_empty

if TYPE_CHECKING:
    from ..text.cached_windows import StoryWindows


@dataclass
class Prepared:
    """A run ready to train: what `Trainer` needs and nothing it has to work out again."""

    cfg: TrainConfig               # validated; when resuming, the checkpoint's own config continued
    db: ckpt.DBert                 # checkpoint.DBert: model (on the CPU), tokenizer, schedule, meta
    train: Sequence[list[int]] | StoryWindows  # tokenized training examples (made when indexed from the token cache:
                                   # StoryWindows, CachedExamples, PackedExamples, SentenceWindows; a list in memory)
    val: list[list[int]]           # tokenized held-out examples
    device: torch.device
    state: dict | None = None      # the trainer state to continue from (--resume)
    lock: OutLock | None = None    # the output folder's lock: held until the run ends
    keep: object = None            # what must live as long as the run (the trimmed vocabulary's folder)
    documents: list[str] | None = None  # lines for the user: the documents read (count, lengths), warnings

    @property
    def special(self) -> Special:
        return Special.of(self.db.tokenizer)

    def release(self) -> None:
        """Give up the lock on the output folder."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


# ---------------------------------------------------------------------------------- the resume rule
def moved_data(saved: dict, meta: dict, given: dict, out) -> dict:
    """The saved train_config with --data / --val-data replaced by the given paths when those name
    the run's own files moved elsewhere (the same sizes and SHA-256, meta's *_files); DbertError
    when they name other files."""
    for key in ("data", "val_data"):
        paths, recorded = given.get(key), meta.get(f"{key}_files")
        if not paths or paths == saved.get(key):
            continue
        if recorded is None:
            raise DbertError(f"differs from the run's and {out} predates the record of its files' contents; give "
                             "the original paths to continue it ($resume)", key, paths, ("resume",))
        if [(f["size"], f["sha256"]) for f in fingerprints(paths)] != [(f["size"], f["sha256"]) for f in recorded]:
            raise DbertError(f"names files that are not the run's ({len(recorded)} files; sizes or SHA-256 differ): "
                             "a resumed run ($resume) trains on the same data", key, paths, ("resume",))
        saved = {**saved, key: list(paths)}
    return saved


def _saved_config(out, given: dict) -> dict | None:
    """The train_config saved in the run at `out` (None: written before dbert kept it), with the
    given --data / --val-data when they name the same files moved (moved_data)."""
    src = ckpt.readable(Path(out))
    if not (src / layout.STATE / layout.STATE_JSON).is_file():
        raise DbertError(f"$resume: no trainer state in {out} (nothing to resume)", refs=("resume",))
    meta = ckpt.read_meta(src)
    saved = meta.get("train_config")
    return None if saved is None else moved_data(saved, meta, given, out)


def resume_config(out, **changes) -> TrainConfig:
    """The config that continues the run saved in `out`: the checkpoint's own train_config with
    `changes` on top (only TrainConfig.RESUMABLE fields may differ from it)."""
    saved = _saved_config(out, changes)
    if saved is None:  # written before dbert kept its settings: the caller's, checked against the model
        if not changes.get("data"):
            raise DbertError(f"$resume: {out} predates saved training settings; give them again ($data, ...)",
                             refs=("resume", "data"))
        return TrainConfig(out=str(out), resume=True, **changes)
    return TrainConfig.resume_from(saved, str(out), **changes)


def resumed(cfg: TrainConfig) -> TrainConfig:
    """cfg (with resume=True) as the run it continues: the checkpoint's own config where it has
    one, continued under cfg; a change outside RESUMABLE is one error naming it."""
    saved = _saved_config(cfg.out, {"data": cfg.data, "val_data": cfg.val_data})
    return cfg if saved is None else TrainConfig.from_dict(saved).continued(cfg)


def check_model(db, c: TrainConfig) -> None:
    """A resumed checkpoint must agree with the config the loss and data will use."""
    found = {"schedule": db.schedule.name, "T": db.schedule.T, "time": db.model.time,
             "seq_len": db.meta.get("seq_len", c.seq_len), "pack": db.meta.get("pack", c.pack),
             "unit": db.meta.get("unit", c.unit), "hide_end_padding": db.model.hide_end_padding}
    for name, value in found.items():
        if value != getattr(c, name):
            raise DbertError(f"{getattr(c, name)} does not continue the checkpoint ($resume), trained with {value}",
                             name, getattr(c, name), ("resume",))


# ---------------------------------------------------------------------------------- processes
DIST_TIMEOUT = 1800.0  # seconds; torch's own default for a rendezvous and for each collective


def dist_timeout() -> float:
    """How long the processes of a torchrun launch wait for each other (DBERT_DIST_TIMEOUT)."""
    from ..storage.net import seconds

    return seconds("DBERT_DIST_TIMEOUT", DIST_TIMEOUT)


DIST_START_TIMEOUT = 300.0  # seconds for every process of a run to start and meet (torchrun starts them together)


NOTICE_AFTER = 10.0  # seconds of waiting for the other ranks before saying so


def meet(rank: int, world: int, poll: float = 0.1, notice=None):
    """The run's rendezvous store, once every rank has joined it. Rank 0 serves it at
    MASTER_ADDR:MASTER_PORT; each rank writes that it is there and waits for the others. A rank
    missing after DBERT_DIST_START_TIMEOUT seconds (300 by default) is one DbertError that names
    it, instead of a wait of DBERT_DIST_TIMEOUT (30 minutes) and a backend's message. After
    NOTICE_AFTER seconds of waiting (half the limit, if shorter), notice(line) says who is
    awaited and for how long."""
    import datetime
    import os
    import time

    from ..storage.net import seconds

    limit = seconds("DBERT_DIST_START_TIMEOUT", DIST_START_TIMEOUT)
    host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    # under torchrun's elastic agent the agent serves the store at MASTER_PORT already: every rank is its client
    serve = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
    attempt = f"dbert/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    deadline = time.monotonic() + limit
    told = [False]

    def waiting(who: str) -> None:
        if notice is not None and not told[0] and time.monotonic() > deadline - limit + min(NOTICE_AFTER, limit / 2):
            told[0] = True
            notice(f"rank {rank} of {world}: waiting for {who} (at most {limit:g} s in all; "
                   "DBERT_DIST_START_TIMEOUT sets it)")

    try:
        if not serve:  # wait for the store quietly here: torch's client logs every failed try as a C++ stack
            _reachable(host, int(port), deadline, lambda: waiting(f"rank 0 at {host}:{port}"))
        store: torch.distributed.Store  # the TCPStore, then the attempt's PrefixStore on it
        store = torch.distributed.TCPStore(host, int(port), world, serve, timeout=datetime.timedelta(seconds=limit),
                                           wait_for_workers=False)
        store = torch.distributed.PrefixStore(attempt, store)  # a restarted attempt never sees an old one's keys
        store.set(f"joined/{rank}", "1")
        missing = list(range(world))
        while True:
            missing = [r for r in missing if not store.check([f"joined/{r}"])]
            if not missing or time.monotonic() > deadline:
                break
            waiting(f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing[:8]))} to start")
            time.sleep(poll)
    except (RuntimeError, ValueError, OSError) as e:
        if rank == 0:
            raise DbertError(f"rank 0 of {world}: cannot serve the run's rendezvous at {host}:{port}: "
                             f"{' '.join(str(e).split())[:120]}") from None
        raise DbertError(f"rank {rank} of {world}: rank 0 did not answer at {host}:{port} within {limit:g} s "
                         "(DBERT_DIST_START_TIMEOUT): it never started, or MASTER_ADDR/MASTER_PORT are wrong") from None
    if missing:
        names = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise DbertError(f"rank {rank} of {world}: rank{'s' if len(missing) > 1 else ''} {names} did not start within "
                         f"{limit:g} s (DBERT_DIST_START_TIMEOUT); start all {world} processes (torchrun does)")
    return store


def _reachable(host: str, port: int, deadline: float, waiting=lambda: None) -> None:
    """Return once host:port accepts a connection; OSError at the deadline (waiting() between tries)."""
    import socket
    import time

    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(1.0, deadline - time.monotonic()))).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            waiting()
            time.sleep(0.1)


def processes() -> tuple[int, int, int]:
    """(rank, world, local_rank) from torchrun's environment; (0, 1, 0) when not distributed.
    A missing or malformed variable, or a rank outside the world, is one DbertError line."""
    import os

    def whole(name: str, default: str | None, lo: int, hi: int) -> int:
        text = os.environ.get(name, default)
        if text is None:
            raise DbertError(f"{name} is not set (WORLD_SIZE={os.environ.get('WORLD_SIZE')} asks for a "
                             "distributed run: launch it with torchrun)")
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise DbertError(f"{name} must be a whole number in [{lo}, {hi}], got {text[:40]!r}")
        return value

    world = whole("WORLD_SIZE", "1", 1, 1 << 20)
    if world == 1:
        return 0, 1, 0
    if not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
        raise DbertError("MASTER_ADDR and MASTER_PORT must be set for a distributed run (torchrun sets them)")
    return whole("RANK", None, 0, world - 1), world, whole("LOCAL_RANK", "0", 0, 1 << 16)


def _device(name: str, rank: int, world: int, local_rank: int, notice=None) -> torch.device:
    """The run's device; with several processes, the process group joined first."""
    device = pick_device(name)
    if world > 1 and not torch.distributed.is_initialized():
        import datetime

        backend = "nccl" if device.type == "cuda" else "gloo"
        seconds = dist_timeout()
        store = meet(rank, world, notice=notice)  # every rank present within DBERT_DIST_START_TIMEOUT, or one line naming who is not
        try:
            torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world,
                                                 timeout=datetime.timedelta(seconds=seconds))
        except (RuntimeError, ValueError, OSError) as e:
            raise DbertError(f"rank {rank} of {world}: the processes did not meet within {seconds:g} s "
                             f"(DBERT_DIST_TIMEOUT): {' '.join(str(e).split())[:160]}") from None
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
    return device


# ---------------------------------------------------------------------------------- preparing
def prepare(cfg: TrainConfig, rank: int = 0, world: int = 1, local_rank: int = 0, notice=None,
            report=None) -> Prepared:
    """Everything before the first step (the module's docstring says what); the output folder's
    lock is released again if anything fails. notice: called with a line for a person (a rank
    waiting for an absent peer). report: called with a dict as the data is tokenized
    (story_data: {"stage": "tokenize", "bytes", "total", "tokens", ...}, then "built" or "cached")."""
    cfg.validate(world)
    if cfg.preset is not None and not cfg.init and not cfg.resume:  # the preset's positions, before reading data
        from ..maths.model import PRESETS

        check_positions(cfg, PRESETS[cfg.preset]["max_position_embeddings"])
    out = Path(cfg.out)
    lock = None
    made: list[Path] = []  # the folders above --out this start made: removed again if it fails
    undo: list = []  # what to stop if it fails
    try:
        if rank == 0:
            made = make_folders(out.parent)
            check_writable(out.parent)  # fail now, not at the first save after an hour of training
            with put_off_stops():  # a Ctrl-C waits until `lock` holds it, so the clean-up below sees it
                lock = OutLock(out)  # before anything touches out; released when the run ends
            ckpt.recover(out)
        return _prepare(cfg, out, lock, rank, world, local_rank, notice, report, undo)
    except DbertError as e:  # a bare --init name that the hub could not give, close to a checkpoint's here
        about_init = e.setting == "init" and e.value == cfg.init
        hint = did_you_mean(cfg.init) if cfg.init and "/" not in cfg.init and about_init else ""
        _undo(undo, lock, made)
        if hint:
            raise DbertError(e.message + hint, e.setting, e.value, e.refs) from None
        raise
    except BaseException:
        _undo(undo, lock, made)
        raise


def _undo(undo: list, lock, made: list[Path]) -> None:
    """A failed start: its threads stopped, its lock released, the folders it made removed."""
    for cancel in undo:  # the tables' thread
        cancel()
    if lock is not None:
        lock.release()
    remove_empty(made)  # `--out a/b/c/ck` with bad --data leaves no a/


def _prepare(c: TrainConfig, out: Path, lock, rank: int, world: int, local_rank: int, notice=None, report=None,
             undo: list | None = None) -> Prepared:
    from dataclasses import replace

    from ..storage import datasets

    device = _device(c.device, rank, world, local_rank, notice)  # --device is resumable: the given one is the run's
    if any(datasets.is_hub(p) for p in [*c.data, *(c.val_data or [])]):  # hf:owner/name: its folder, downloaded by rank 0
        c = story_data.rank_0_first(lambda: replace(c, data=datasets.local(c.data),
                                                    val_data=None if c.val_data is None else datasets.local(c.val_data)))
    if c.resume:
        c = resumed(c)
    torch.manual_seed(c.seed + rank)
    state = None
    if c.resume:
        state = ckpt.load_trainer_state(out)
        if state is None:
            raise DbertError(f"$resume: no trainer state in {out} (nothing to resume)", refs=("resume",))
    elif out.exists() and any(out.iterdir()):
        raise DbertError(f"{out} already holds files; continue it with $resume, or choose another $out",
                         refs=("resume", "out"))

    documents, sampling, entry, tables = None, None, None, None
    db, init, trimmed, keep = None, named(c.init), None, None  # a store name: its folder
    # streamed from the files only where a tokenizer is learnt from them or a vocabulary trimmed to them
    texts = first_texts(c, 200_000) if init is None and state is None else []
    train_texts = story_data.train_texts(c) if c.trim_vocab and state is None else []
    if state is not None:
        db = ckpt.load(out, device="cpu")
        check_model(db, c)
        tokenizer = db.tokenizer
    else:
        if c.trim_vocab:
            keep, init, trimmed = _trim(c, train_texts)
        tokenizer = _tokenizer(c, texts, init)
    special = Special.of(tokenizer)
    train: Sequence[list[int]] | StoryWindows
    if rank == 0 and not (c.by_document and not c.by_story):  # the tables' pass over the lines, in a thread while
        # the corpus is tokenized into the cache, whose ids then give the word list (no word spans two entries' documents)
        tables = learnt_tables.Tables(c.data, tokenizer, story_data.tables_root(), story_data.file_prints(c.data),
                                      story=True, sep=c.doc_sep)
        (undo if undo is not None else []).append(tables.cancel)
    if c.by_story:
        got = story_data.stories(c, tokenizer, report)
        train, val, sampling, entry = got.train, got.val, got.sampling, got.cache
        documents = stats_lines(got.stats, got.val_stats, c.doc_sep)
    elif c.by_document:  # --unit sentence --pack: the token cache's sentence-start windows (story_data)
        train, val, stats, val_stats = story_data.sentence_windows(c, tokenizer, report)
        documents = stats_lines(stats, val_stats, c.doc_sep)
    else:  # --unit line or sentence: the token cache's examples (story_data.examples)
        train, val, entry = story_data.examples(c, tokenizer, report)
    if len(train) < c.batch_size:
        raise DbertError(f"{c.batch_size} is more than the {len(train)} training examples", "batch_size",
                         c.batch_size)
    if not val:
        raise DbertError("the validation slice is empty; give more data or $val_data", refs=("val_data",))
    if db is None:
        db = _build(c, init, trimmed, tokenizer, special, train)
        if c.by_story:  # what its sampler should hold to: the shortest story, the openings (story_defaults)
            db.meta["sampling"] = sampling
    check_memory_for(c, db.model.config, world)
    if rank == 0:  # on every start (a resumed run of an older dbert gets them too), from the cache when it has them
        if tables is None:  # the documents' text as training reads it (learnt_tables.text_of: data.text_lines)
            tables = learnt_tables.Tables(c.data, db.tokenizer, story_data.tables_root(), story_data.file_prints(c.data),
                                          sep=c.doc_sep)
        db.truecase, db.words, _ = tables.end(entry)
    return Prepared(c, db, train, val, device, state=state, lock=lock, keep=keep, documents=documents)


def stats_lines(stats: DocumentStats, val_stats: DocumentStats | None, sep: str) -> list[str]:
    """What a user reads first about the documents: how many and how long, and a warning line
    when their boundaries look wrong (DocumentStats.warning)."""
    lines = ["training data: " + stats.line()]
    if val_stats is not None:
        lines.append("held-out data: " + val_stats.line())
    warning = stats.warning(sep)
    return lines + ([warning] if warning else [])


def in_memory(db, cfg: TrainConfig, examples: list[list[int]]) -> Prepared:
    """A run of a model already in memory on tokenized examples: no files read or written, no
    lock, nothing held out (the benchmark times `Trainer.train_step` on it)."""
    cfg.validate()
    return Prepared(cfg, db, list(examples), [], pick_device(cfg.device))


def check_positions(c: TrainConfig, positions: int) -> None:
    """--seq-len content tokens must fit the model's positions beside the ones it reserves:
    [CLS] at the start and [SEP] at the end of every example, and with --time prefix one more
    for the time token. One line that names them and the largest --seq-len that fits."""
    reserved = ["[CLS]", "[SEP]"] + (["the time prefix token"] if c.time == "prefix" else [])
    if c.seq_len + len(reserved) > positions:
        raise DbertError(f"{c.seq_len} does not fit the model's {positions} positions: {len(reserved)} are reserved "
                         f"({', '.join(reserved)}), so it may be at most {positions - len(reserved)}", "seq_len",
                         c.seq_len)


def check_memory_for(c: TrainConfig, config, world: int) -> None:
    """One micro-batch's activations must fit the device's free memory (hardware.check_memory):
    a --batch-size far too large is one line saying to lower it, before the first step, not a
    kill by the kernel's OOM killer or an internal error at step 1."""
    from ..hardware import check_memory, pick_device

    rows = max(1, c.batch_size // max(1, c.grad_accum * world))
    L = c.seq_len + 3
    per_row = 4.0 * L * config.num_hidden_layers * (10 * config.hidden_size + 2 * config.intermediate_size +
                                                   config.num_attention_heads * L) + 12.0 * L * config.vocab_size
    check_memory(rows * per_row, pick_device(c.device), f"{c.batch_size} ({rows:,} examples of {c.seq_len} tokens "
                 "per micro-batch)", "$batch_size (or raise $grad_accum)", "batch_size", ("grad_accum",))


def _build(c: TrainConfig, init, trimmed, tokenizer, special: Special, train) -> ckpt.DBert:
    """A new model for a fresh run: a preset's random init or --init's BERT, with its record."""
    from ..storage.pretrained import build_bert

    counts = story_data.rank_0_first(  # cached windows' counts: rank 0 counts and keeps them, the others read them
        lambda: train.token_counts(len(tokenizer)) if hasattr(train, "token_counts") else token_counts(train, len(tokenizer)))
    bert = build_bert(c.preset, init, vocab_size=len(tokenizer), special_ids=dict(
        pad_token_id=special.pad), from_scratch=c.from_scratch)
    if bert.config.vocab_size != len(tokenizer):  # checkpoint.load refuses a mismatch too
        raise DbertError(f"the model's vocabulary ({bert.config.vocab_size}) does not match the tokenizer's "
                         f"({len(tokenizer)})")
    counts = counts[: bert.config.vocab_size] if len(counts) >= bert.config.vocab_size else \
        torch.nn.functional.pad(counts, (0, bert.config.vocab_size - len(counts)))
    check_positions(c, bert.config.max_position_embeddings)
    meta: dict[str, Any] = {"preset": None if c.init else c.preset, "init": c.init, "from_scratch": c.from_scratch,
            "seq_len": c.seq_len, "pack": c.pack,
            "unit": c.unit, "data": [str(p) for p in c.data], "end_padding": "hidden" if c.hide_end_padding else "seen"}
    if trimmed is not None:
        meta["trim_vocab"] = trimmed
    tokens = train.total_tokens() if hasattr(train, "total_tokens") else sum(len(e) for e in train)
    meta.update({"train_examples": len(train), "train_tokens": tokens}, data_files=story_data.file_prints(c.data))
    if c.val_data:
        meta["val_data_files"] = story_data.file_prints(c.val_data)
    return ckpt.assemble(bert, tokenizer, c.schedule, c.T, counts, c.lam, c.time, meta)


def _trim(c: TrainConfig, train_texts):
    """--trim-vocab: a copy of --init cut to the training texts' word pieces (vocab.py), in a
    temporary directory that lives as long as the run: (the directory, its BERT, the record)."""
    import tempfile

    from ..storage.pretrained import local_dir
    from .vocab import trim

    assert c.init is not None  # TrainConfig.validate: --trim-vocab needs --init
    folder = tempfile.TemporaryDirectory(prefix="dbert-trim-")
    dst = Path(folder.name) / "bert"
    return folder, str(dst), trim(local_dir(named(c.init)), train_texts, dst)


def _tokenizer(c: TrainConfig, texts, init):
    if init is not None:
        from ..storage.pretrained import local_dir
        from ..text.tokenizer import WordPieceTokenizer

        folder = local_dir(init)  # its own message when a hub id cannot be downloaded
        layout.refuse_code(Path(folder), files=False)  # before the corpus is read: a refused model costs no tokenizing
        try:
            return WordPieceTokenizer.load(folder)
        except DbertError as e:
            raise e.under(f"{c.init}: cannot load a tokenizer: ", "init", c.init) from None
    from ..maths.model import PRESETS

    assert c.preset is not None  # TrainConfig.validate: without --init a preset is named
    size = c.vocab_size or PRESETS[c.preset]["vocab_size"]
    return train_tokenizer(texts[:200_000], size)


def _hold_out(c: TrainConfig, texts, val=None):
    """(train, validation): val_examples of `val` at random, or, without it, of `texts` (held out)."""
    g = torch.Generator().manual_seed(c.seed + 99)
    if val is not None:
        keep = torch.randperm(len(val), generator=g)[:c.val_examples].sort().values.tolist()
        return texts, [val[i] for i in keep]
    n_val = min(c.val_examples, max(1, len(texts) // 20))
    perm = torch.randperm(len(texts), generator=g)
    held = set(perm[:n_val].tolist())
    return [t for i, t in enumerate(texts) if i not in held], [texts[i] for i in sorted(held)]
