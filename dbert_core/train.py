"""Training: one loop in a fixed order, reporting through callbacks.

Per optimizer step: set the learning rate, run micro-batches (x_t ~ q(x_t | x_0) with
stratified t, loss on masked positions only), clip, step, zero the grads, report; every
eval_every steps a validation ELBO, every save_every steps a checkpoint (atomic), and one
at the end or when stopped (Ctrl-C or Trainer.stop()). Resuming restores weights, optimizer,
RNG and data position, so an interrupted run continues exactly as an uninterrupted one.

Multi-GPU / multi-node: launch with torchrun; each rank takes its slice of every global
batch and DistributedDataParallel averages the gradients.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import stat
import threading
import time
from pathlib import Path

import torch

from . import checkpoint as ckpt
from .config import TrainConfig
from .data import (Special, collate, document_sentences, encode, epoch_batches, fingerprints, pack, pack_sentences,
                   read_documents, read_examples, read_lines, token_counts, tokenize, train_tokenizer)
from .diffusion import Workspace, draw_steps, elbo, masked_kl
from .hardware import compute_dtype, pick_device
from .errors import DbertError, Interrupted

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to min_lr_ratio * lr (or constant)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.decay == "constant":
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def moved_data(saved: dict, meta: dict, given: dict, out) -> dict:
    """The saved train_config with --data / --val-data replaced by the given paths when those name
    the run's own files moved elsewhere (the same sizes and SHA-256, meta's *_files); DbertError
    when they name other files."""
    for key in ("data", "val_data"):
        paths, recorded = given.get(key), meta.get(f"{key}_files")
        if not paths or paths == saved.get(key):
            continue
        flag = "--" + key.replace("_", "-")
        if recorded is None:
            raise DbertError(f"--resume: {flag} differs from the run's and {out} predates the record of its files' "
                             "contents; give the original paths")
        if [(f["size"], f["sha256"]) for f in fingerprints(paths)] != [(f["size"], f["sha256"]) for f in recorded]:
            raise DbertError(f"--resume: the files of {flag} are not the run's ({len(recorded)} files; sizes or "
                             "SHA-256 differ): a resumed run trains on the same data")
        saved = {**saved, key: list(paths)}
    return saved


def resume_config(out, **changes) -> TrainConfig:
    """The config that continues the run saved in `out`: the checkpoint's own train_config with
    `changes` on top (only TrainConfig.RESUMABLE fields may differ from it)."""
    src = ckpt.readable(Path(out))
    if not (src / ckpt.STATE / "state.json").is_file():
        raise DbertError(f"--resume: no trainer state in {out} (nothing to resume)")
    meta = ckpt.read_meta(src)
    saved = meta.get("train_config")
    if saved is not None:
        saved = moved_data(saved, meta, changes, out)
    if saved is None:  # written before dbert kept its settings: the caller's, checked against the model
        if not changes.get("data"):
            raise DbertError(f"--resume: {out} predates saved training settings; give them again (--data, ...)")
        return TrainConfig(out=str(out), resume=True, **changes)
    return TrainConfig.resume_from(saved, str(out), **changes)


def _check_writable(folder: Path) -> None:
    """Fail before step 1, not at the first save after an hour of training."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".dbert-write-test-"):
            pass
    except OSError as e:
        raise DbertError(f"cannot write checkpoints to {folder}: {e.strerror or e}") from None


class OutLock:
    """An exclusive lock on an output folder, so two runs never write one checkpoint.

    The lock is a hidden file beside the folder, locked with flock: the kernel drops it when its
    holder exits, even by kill -9, so a stale lock cannot exist. The holder removes the file
    when done; a process that opened it just before is told to retry by the inode check.

    The file is opened with O_NOFOLLOW and never truncated: a link planted at its name (to a
    user's file) is refused, and so is anything but a small file of dbert's own "pid N" text,
    so taking the lock can never change a file that is not dbert's.
    """

    RECORD = 32  # bytes of the "pid N" record, padded: rewriting it in place needs no truncation

    def __init__(self, out: Path):
        self.path = Path(out).with_name(f".{Path(out).name}.dbert-lock")
        self.file = None
        try:
            import fcntl
        except ImportError:  # Windows: no flock; runs are not protected from each other there
            return
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | \
            getattr(os, "O_NONBLOCK", 0)  # non-blocking: a FIFO planted there cannot hang the open
        for _ in range(100):
            try:
                fd = os.open(self.path, flags, 0o666)
            except OSError as e:
                what = "a symbolic link" if os.path.islink(self.path) else (e.strerror or str(e))
                raise DbertError(f"cannot lock {out}: {self.path}: {what}; dbert will not open it "
                                 "(remove it if it is not yours)") from None
            f = os.fdopen(fd, "r+b", buffering=0)
            try:
                holder = self._check(f)
            except DbertError:
                f.close()
                raise
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise DbertError(f"{out} is being written by another dbert run ({holder or 'another process'}); "
                                 "wait for it or choose another --out") from None
            try:
                same = os.fstat(f.fileno()).st_ino == os.stat(self.path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.pwrite(f.fileno(), f"pid {os.getpid()}".ljust(self.RECORD - 1).encode() + b"\n", 0)
                self.file = f
                return
            f.close()  # the previous holder removed the file after we opened it: try again
        raise DbertError(f"cannot lock {out}")

    def _check(self, f) -> str:
        """The holder recorded in an open lock file ("" when empty); DbertError unless it is a
        regular file with one name, of this user, holding only dbert's record."""
        st = os.fstat(f.fileno())
        text = os.pread(f.fileno(), self.RECORD + 1, 0) if stat.S_ISREG(st.st_mode) else b""
        ours = (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid()
                and st.st_size <= self.RECORD and re.fullmatch(rb"(pid \d+ *\n?)?", text) is not None)
        if not ours:
            raise DbertError(f"cannot lock the output folder: {self.path} exists and is not a dbert lock file; "
                             "dbert will not change it (remove it if it is not yours)")
        return text.decode().strip()

    def release(self) -> None:
        if self.file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.file.close()
            self.file = None


def check_optimizer_state(saved: dict, optimizer, where: str) -> None:
    """A saved AdamW state_dict fits `optimizer`: the same groups of the same sizes, and for each
    parameter exactly step, exp_avg and exp_avg_sq, the moments floating-point tensors of the
    parameter's shape with finite values (exp_avg_sq >= 0), step a finite count >= 0."""
    groups = optimizer.param_groups
    sizes = [len(g["params"]) for g in saved["param_groups"]]
    if sizes != [len(g["params"]) for g in groups]:
        raise DbertError(f"{where}: its parameter groups hold {sizes} tensors; this model's hold "
                         f"{[len(g['params']) for g in groups]}")
    ids = [i for g in saved["param_groups"] for i in g["params"]]
    if len(set(ids)) != len(ids):
        raise DbertError(f"{where}: a parameter appears twice in its groups")
    by_id = dict(zip(ids, (p for g in groups for p in g["params"])))
    for key, entry in saved["state"].items():
        param = by_id.get(key)
        if param is None:
            raise DbertError(f"{where}: it holds moments for a parameter {str(key)[:20]!r} the model does not have")
        if not isinstance(entry, dict) or set(entry) != {"step", "exp_avg", "exp_avg_sq"}:
            raise DbertError(f"{where}: parameter {key}'s state must be step, exp_avg and exp_avg_sq")
        for name in ("exp_avg", "exp_avg_sq"):
            t = entry[name]
            if not (isinstance(t, torch.Tensor) and t.is_floating_point() and tuple(t.shape) == tuple(param.shape)):
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise DbertError(f"{where}: parameter {key}'s {name} is {got}; the model needs {tuple(param.shape)}")
            if not torch.isfinite(t).all() or (name == "exp_avg_sq" and (t < 0).any()):
                raise DbertError(f"{where}: parameter {key}'s {name} holds NaN, infinite or negative values")
        step = entry["step"]
        if not (isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_complex()
                and step.dtype != torch.bool and math.isfinite(float(step)) and 0 <= float(step) <= ckpt.MAX_STEP):
            raise DbertError(f"{where}: parameter {key}'s step is not a count >= 0")


class Callback:
    """Hooks a trainer calls; override what you need. Metrics are plain dicts."""

    def on_start(self, trainer): ...
    def on_step(self, trainer, metrics: dict): ...
    def on_eval(self, trainer, metrics: dict): ...
    def on_checkpoint(self, trainer, path: Path): ...
    def on_end(self, trainer, metrics: dict): ...


DIST_TIMEOUT = 1800.0  # seconds; torch's own default for a rendezvous and for each collective


def dist_timeout() -> float:
    """How long the processes of a torchrun launch wait for each other (DBERT_DIST_TIMEOUT)."""
    from .net import seconds

    return seconds("DBERT_DIST_TIMEOUT", DIST_TIMEOUT)


def _dist():
    """(rank, world, local_rank) from torchrun's environment; (0, 1, 0) when not distributed.
    A missing or malformed variable, or a rank outside the world, is one DbertError line."""

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


class Trainer:
    def __init__(self, cfg: TrainConfig, callbacks=()):
        self.cfg = cfg
        self.callbacks = list(callbacks)
        self.rank, self.world, self.local_rank = _dist()
        self._stop = threading.Event()
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.tokens_seen = 0
        self.elapsed = 0.0
        self.history: list[dict] = []
        self.db = None
        self._lock: OutLock | None = None

    # ----------------------------------------------------------------- setup
    def stop(self) -> None:
        """Ask the loop to save a checkpoint and return after the current step (thread-safe)."""
        self._stop.set()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _check_resume(self, out: Path) -> None:
        """--resume continues the checkpoint's own run: its saved config is the starting point and
        only TrainConfig.RESUMABLE fields may differ (one clear error naming any other)."""
        if not (ckpt.readable(out) / ckpt.STATE / "state.json").is_file():
            raise DbertError(f"--resume: no trainer state in {out} (nothing to resume)")
        meta = ckpt.read_meta(ckpt.readable(out))
        saved = meta.get("train_config")
        if saved is not None:
            saved = moved_data(saved, meta, {"data": self.cfg.data, "val_data": self.cfg.val_data}, out)
            self.cfg = TrainConfig.from_dict(saved).continued(self.cfg)

    def _check_model(self) -> None:
        """The loaded checkpoint itself must agree with the config the loss and data will use."""
        c, db = self.cfg, self.db
        found = {"--schedule": db.schedule.name, "--T": db.schedule.T, "--time": db.model.time,
                 "--seq-len": db.meta.get("seq_len", c.seq_len), "--pack": db.meta.get("pack", c.pack),
                 "--unit": db.meta.get("unit", c.unit)}
        wanted = {"--schedule": c.schedule, "--T": c.T, "--time": c.time, "--seq-len": c.seq_len, "--pack": c.pack,
                  "--unit": c.unit}
        for flag, value in found.items():
            if value != wanted[flag]:
                raise DbertError(f"--resume: the checkpoint was trained with {flag} {value}, not {wanted[flag]}")

    def prepare(self) -> None:
        """Read data, build or load the model, restore state when resuming."""
        try:
            self._prepare()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give up the lock on the output folder (run() does this when it ends)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _prepare(self) -> None:
        self.cfg.validate(self.world)
        out = Path(self.cfg.out)
        if self.is_main:
            _check_writable(out.parent)  # fail now, not at the first save after an hour of training
            self._lock = OutLock(out)  # before anything touches out; released when run() ends
            ckpt.recover(out)
        if self.cfg.resume:
            self._check_resume(out)
        c = self.cfg
        self.device = pick_device(c.device)
        if self.world > 1 and not torch.distributed.is_initialized():
            import datetime

            backend = "nccl" if self.device.type == "cuda" else "gloo"
            seconds = dist_timeout()
            try:  # a peer that never starts ends the wait after `seconds`, in one line
                torch.distributed.init_process_group(backend, timeout=datetime.timedelta(seconds=seconds))
            except (RuntimeError, ValueError, OSError) as e:
                raise DbertError(f"rank {self.rank} of {self.world}: the processes did not meet within {seconds:g} s "
                                 f"(DBERT_DIST_TIMEOUT): {' '.join(str(e).split())[:160]}") from None
            if self.device.type == "cuda":
                self.device = torch.device("cuda", self.local_rank)
                torch.cuda.set_device(self.device)
        torch.manual_seed(c.seed + self.rank)
        state = None
        if c.resume:
            state = ckpt.load_trainer_state(out)
            if state is None:
                raise DbertError(f"--resume: no trainer state in {out} (nothing to resume)")
        elif out.exists() and any(out.iterdir()):
            raise DbertError(f"{out} already holds files; pass --resume to continue it or choose another --out")

        by_document = c.pack and c.unit == "sentence"  # sentence-start windows (data.pack_sentences)
        if by_document:
            train_docs = document_sentences(read_documents(c.data))
            val_docs = document_sentences(read_documents(c.val_data)) if c.val_data else None
            texts = train_texts = [s for d in train_docs for s in d]
        else:
            texts = read_examples(c.data, c.unit)
            train_texts, val_texts = self._split(texts)
        init, trimmed = c.init, None
        if state is not None:
            self.db = ckpt.load(out, device="cpu")
            self._check_model()
            tokenizer = self.db.tokenizer
        else:
            if c.trim_vocab:
                init, trimmed = self._trim(train_texts)
            tokenizer = self._tokenizer(texts, init)
        self.special = Special.of(tokenizer)
        if by_document:
            train = self._windows(train_docs, tokenizer)
            train, val = self._hold_out(train, None if val_docs is None else self._windows(val_docs, tokenizer))
        else:
            train = tokenize(train_texts, tokenizer, c.seq_len)
            val = tokenize(val_texts, tokenizer, c.seq_len)
            if c.pack:
                train, val = pack(train, c.seq_len, self.special.sep), pack(val, c.seq_len, self.special.sep)
        if len(train) < c.batch_size:
            raise DbertError(f"only {len(train)} training examples, fewer than --batch-size {c.batch_size}")
        if not val:
            raise DbertError("the validation slice is empty; give more data or --val-data")
        self.train_examples, self.val_examples = train, val
        train_record = {"train_examples": len(train), "train_tokens": sum(len(e) for e in train)}
        self.lengths = [len(e) for e in train]

        if self.db is None:
            from .pretrained import build_bert

            counts = token_counts(train, len(tokenizer))
            bert = build_bert(c.preset, init, vocab_size=len(tokenizer), special_ids=dict(
                pad_token_id=self.special.pad), from_scratch=c.from_scratch)
            if bert.config.vocab_size != len(tokenizer):  # checkpoint.load refuses a mismatch too
                raise DbertError(f"the model's vocabulary ({bert.config.vocab_size}) does not match the tokenizer's "
                                 f"({len(tokenizer)})")
            counts = counts[: bert.config.vocab_size] if len(counts) >= bert.config.vocab_size else \
                torch.nn.functional.pad(counts, (0, bert.config.vocab_size - len(counts)))
            if c.seq_len + 2 + (c.time == "prefix") > bert.config.max_position_embeddings:
                raise DbertError(f"--seq-len {c.seq_len} exceeds the model's {bert.config.max_position_embeddings} positions")
            meta = {"preset": None if c.init else c.preset, "init": c.init, "from_scratch": c.from_scratch,
                    "seq_len": c.seq_len, "pack": c.pack,
                    "unit": c.unit, "data": [str(p) for p in c.data]}
            if trimmed is not None:
                meta["trim_vocab"] = trimmed
            meta.update(train_record, data_files=fingerprints(c.data))
            if c.val_data:
                meta["val_data_files"] = fingerprints(c.val_data)
            self.db = ckpt.assemble(bert, tokenizer, c.schedule, c.T, counts, c.lam, c.time, meta)
        if self.is_main:  # learnt afresh on every start (a resumed run of an older dbert gets one too)
            from .truecase import learn

            self.db.truecase = learn(read_lines(c.data))
        self._attach()
        if state is not None:
            self._restore(state)

    def _attach(self) -> None:
        """Model on the device in training mode, DDP wrapper, optimizer and noise generator."""
        c = self.cfg
        model = self.db.model.to(self.device)
        if c.dropout is not None:  # kept in config.json, so a resumed run uses it too
            model.bert.set_dropout(c.dropout)
        model.train()
        self.model = model
        self.ddp = model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(model, device_ids=ids)
        self.optimizer = self._optimizer()
        self.gen = torch.Generator().manual_seed(c.seed * 1000 + 17 + self.rank)
        self.workspace = Workspace()  # the loss's (M, V) arrays, reused across steps

    @classmethod
    def on(cls, db, cfg: TrainConfig, examples: list[list[int]]) -> "Trainer":
        """A trainer for a model already in memory and tokenized examples: no files read or
        written (the benchmark times `train_step` with it, so it measures what training does)."""
        tr = cls(cfg.validate())
        tr.db, tr.device = db, pick_device(cfg.device)
        tr.special = Special.of(db.tokenizer)
        tr.train_examples, tr.val_examples = examples, []
        tr.lengths = [len(e) for e in examples]
        tr._attach()
        return tr

    def _trim(self, train_texts):
        """--trim-vocab: a copy of --init cut to the training texts' word pieces (vocab.py), in a
        temporary directory that lives as long as the trainer."""
        import tempfile

        from .pretrained import local_dir
        from .vocab import trim

        self._trim_dir = tempfile.TemporaryDirectory(prefix="dbert-trim-")
        dst = Path(self._trim_dir.name) / "bert"
        return str(dst), trim(local_dir(self.cfg.init), train_texts, dst)

    def _tokenizer(self, texts, init):
        c = self.cfg
        if init is not None:
            from .pretrained import local_dir
            from .tokenizer import WordPieceTokenizer

            folder = local_dir(init)  # its own message when a hub id cannot be downloaded
            try:
                return WordPieceTokenizer.load(folder)
            except DbertError as e:
                raise DbertError(f"cannot load a tokenizer from --init {c.init}: {e}") from None
        from .model import PRESETS

        size = c.vocab_size or PRESETS[c.preset]["vocab_size"]
        return train_tokenizer(texts[:200_000], size)

    def _windows(self, docs: list[list[str]], tokenizer) -> list[list[int]]:
        """Documents' sentences -> sentence-start training windows ([SEP] opens a document)."""
        flat = encode([s for d in docs for s in d], tokenizer)
        grouped, i = [], 0
        for d in docs:
            grouped.append(flat[i:i + len(d)])
            i += len(d)
        return pack_sentences(grouped, self.cfg.seq_len, self.special.sep)

    def _split(self, texts):
        c = self.cfg
        return self._hold_out(texts, read_examples(c.val_data, c.unit) if c.val_data else None)

    def _hold_out(self, texts, val=None):
        """(train, validation): val_examples of `val` at random, or, without it, of `texts` (held out)."""
        c = self.cfg
        g = torch.Generator().manual_seed(c.seed + 99)
        if val is not None:
            keep = torch.randperm(len(val), generator=g)[:c.val_examples].sort().values.tolist()
            return texts, [val[i] for i in keep]
        n_val = min(c.val_examples, max(1, len(texts) // 20))
        perm = torch.randperm(len(texts), generator=g)
        held = set(perm[:n_val].tolist())
        return [t for i, t in enumerate(texts) if i not in held], [texts[i] for i in sorted(held)]

    def _optimizer(self):
        c = self.cfg
        params = [p for p in {id(p): p for p in self.model.parameters()}.values() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": c.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=c.lr, betas=(0.9, 0.98), eps=1e-6, **self._fused())

    def _fused(self) -> dict:
        """One fused kernel for the whole update on CPU and CUDA: on the CPU 8x faster than the
        per-tensor loops for MiniLM's 22.7 M parameters (docs/performance.md)."""
        return {"fused": True} if self.device.type in ("cpu", "cuda") else {}

    def _autocast(self):
        c = self.cfg
        if compute_dtype(c.dtype, self.device) == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ----------------------------------------------------------------- state
    def _rng_state(self) -> dict:
        rng = {"noise": self.gen.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        return rng

    def _restore(self, state: dict) -> None:
        """Continue from a trainer state (checkpoint.load_trainer_state has checked its fields;
        the optimizer's tensors are checked against this model here, before torch sees them:
        a moment of the wrong shape would make the fused update write out of bounds)."""
        from .pretrained import upgrade_optimizer_state

        where = f"--resume: {Path(self.cfg.out) / ckpt.STATE / 'optimizer.pt'}"
        try:
            saved = upgrade_optimizer_state(state["optimizer"], self.model)  # runs of older dbert
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
            raise DbertError(f"{where} does not fit this model ({type(e).__name__})") from None
        check_optimizer_state(saved, self.optimizer, where)
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(saved)
        for group, own in zip(self.optimizer.param_groups, hyper):  # this run's settings and implementation,
            group.update(own)                                         # not whatever the file says
        rng = state["rng"].get(f"rank{self.rank}", state["rng"].get("rank0"))
        if rng is None:
            raise DbertError(f"--resume: the trainer state has no random-number state for rank {self.rank}")
        self.gen.set_state(rng["noise"])
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            try:
                torch.cuda.set_rng_state(rng["cuda"])
            except RuntimeError:
                raise DbertError("--resume: the saved CUDA random-number state does not fit this GPU") from None
        s = state["state"]
        self.step, self.epoch, self.batch_in_epoch = s["step"], s["epoch"], s["batch_in_epoch"]
        self.tokens_seen, self.elapsed = s.get("tokens_seen", 0), float(s.get("elapsed", 0.0))
        self.history = s.get("history", [])

    def save(self) -> Path | None:
        """Checkpoint weights + trainer state (rank 0 writes; every rank's RNG is kept)."""
        rngs = [self._rng_state()]
        if self.world > 1:
            gathered = [None] * self.world
            torch.distributed.all_gather_object(gathered, rngs[0])
            rngs = gathered
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise DbertError(f"training diverged by step {self.step}: the weights are not finite (try a lower --lr); "
                             f"the last good checkpoint in {self.cfg.out}, if any, is kept")
        path = None
        if self.is_main:
            import datetime

            meta = self.db.meta  # the run's own record: created once, the rest updated at every save
            meta.setdefault("created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
            meta.update(step=self.step, tokens_seen=self.tokens_seen, train_seconds=round(self.elapsed, 1),
                        device=str(self.device), world_size=self.world)
            vals = [h["val_ppl_token"] for h in self.history if "val_ppl_token" in h]
            if vals:  # the last held-out bound, for listings (the history itself stays in trainer_state/)
                meta["val_ppl_token"] = round(float(vals[-1]), 3)
            meta["train_config"] = self.cfg.to_dict()
            trainer_state = {
                "optimizer": self.optimizer.state_dict(),
                "rng": {f"rank{i}": r for i, r in enumerate(rngs)},
                "state": {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                          "tokens_seen": self.tokens_seen, "elapsed": self.elapsed, "history": self.history[-2000:]},
            }
            path = ckpt.save(self.db, self.cfg.out, trainer_state)
            for cb in self.callbacks:
                cb.on_checkpoint(self, path)
        if self.world > 1:
            torch.distributed.barrier()
        return path

    # ----------------------------------------------------------------- loop
    def _epoch_batches(self) -> list[list[int]]:
        """This epoch's batches, computed once per epoch (a pure function of seed and epoch)."""
        if getattr(self, "_batches_of", None) != self.epoch:
            c = self.cfg
            self._batches = epoch_batches(len(self.train_examples), c.batch_size, self.epoch, c.seed, self.lengths)
            self._batches_of = self.epoch
        return self._batches

    def next_batch(self) -> list[list[int]]:
        """This rank's examples of the next global batch; advances the data position."""
        batches = self._epoch_batches()
        if self.batch_in_epoch >= len(batches):
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            batches = self._epoch_batches()
        idx = batches[self.batch_in_epoch][self.rank::self.world]
        self.batch_in_epoch += 1
        return [self.train_examples[i] for i in idx]

    def loss(self, examples):
        """(loss, metrics) of one micro-batch: diffusion loss on masked positions only."""
        c = self.cfg
        ids, attention, noisable = collate(examples, self.special, self.device)
        k = draw_steps(len(examples), c.T, self.gen)  # budget T: s = t - 1
        with self._autocast():
            kl, ce, n_masked = masked_kl(self.ddp, ids, attention, noisable, k, c.T, self.db.schedule,
                                         self.gen, return_ce=True, workspace=self.workspace)
        n_tok = noisable.sum()
        elbo_tok = c.T * kl.sum() / n_tok  # nats per token, an unbiased estimate of the bound
        ce_mean = ce / n_masked.clamp_min(1)
        loss = {"elbo": elbo_tok, "ce": ce_mean, "hybrid": elbo_tok + c.hybrid_weight * ce_mean}[c.loss]
        return loss, {"elbo": elbo_tok.item(), "ce": ce_mean.item(), "tokens": int(n_tok)}

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation ELBO (nats per token, perplexity) with the eval step budget; fixed seed."""
        c = self.cfg
        self.model.eval()
        g = torch.Generator().manual_seed(1234)
        nats, toks = 0.0, 0
        for i in range(0, len(self.val_examples), c.batch_size):
            ids, att, noisable = collate(self.val_examples[i:i + c.batch_size], self.special, self.device)
            with self._autocast():
                nats += elbo(self.model, ids, att, noisable, self.db.schedule, c.eval_budget, g).sum().item()
            toks += int(noisable.sum())
        self.model.train()
        return {"step": self.step, "val_nats_per_token": nats / toks, "val_ppl_token": math.exp(nats / toks),
                "eval_steps": c.eval_budget}

    def train_step(self) -> dict:
        """One optimizer step (warm-up/cosine lr, grad accumulation, clipping); its metrics."""
        c = self.cfg
        micro = c.batch_size // self.world // c.grad_accum
        t0 = time.perf_counter()
        lr = lr_at(self.step, c)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        examples = self.next_batch()
        sums = {"elbo": 0.0, "ce": 0.0, "tokens": 0}
        for j in range(c.grad_accum):
            chunk = examples[j * micro:(j + 1) * micro]
            sync = self.world == 1 or j == c.grad_accum - 1
            ctx = contextlib.nullcontext() if sync else self.ddp.no_sync()
            with ctx:
                loss, m = self.loss(chunk)
                (loss / c.grad_accum).backward()
            sums["tokens"] += m["tokens"]
            for key in ("elbo", "ce"):
                sums[key] += m[key] / c.grad_accum
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.clip)
        if not (math.isfinite(float(norm)) and math.isfinite(sums["elbo"]) and math.isfinite(sums["ce"])):
            kept = f"the last good checkpoint in {c.out} is kept" if (Path(c.out) / ckpt.META).exists() \
                else "nothing was saved"
            raise DbertError(f"training diverged at step {self.step + 1}: the loss or gradient is not finite "
                             f"(try a lower --lr); {kept}")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        dt = time.perf_counter() - t0
        self.elapsed += dt
        tokens = sums["tokens"] * self.world
        self.tokens_seen += tokens
        return {"step": self.step, "max_steps": c.max_steps, "loss_elbo": sums["elbo"], "loss_ce": sums["ce"],
                "lr": lr, "grad_norm": float(norm), "tokens_per_s": tokens / dt, "tokens_seen": self.tokens_seen,
                "elapsed": self.elapsed, "epoch": self.epoch}

    def run(self) -> dict:
        """Train until max_steps or stop(); returns the last metrics.

        In the main thread, SIGINT (Ctrl-C), SIGTERM and SIGHUP (a closed terminal or ssh
        session) stop the run after the current step and save a checkpoint; one that arrives
        while the run is still starting up (reading data, building the model) ends it at once
        with Interrupted, the lock released and nothing written. A SIGHUP the caller ignores
        (nohup) stays ignored."""
        old_handlers = {}
        training = False

        def on_signal(signum, frame):
            if not training:
                raise Interrupted(signal.Signals(signum).name)
            self._stop.set()

        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if sig == getattr(signal, "SIGHUP", None) and signal.getsignal(sig) == signal.SIG_IGN:
                    continue
                old_handlers[sig] = signal.signal(sig, on_signal)
        metrics: dict = {}
        try:
            if self.db is None:
                self.prepare()
            c = self.cfg
            training = True
            for cb in self.callbacks:
                cb.on_start(self)
            while self.step < c.max_steps and not self._stop.is_set():
                metrics = self.train_step()
                if self.step % c.log_every == 0 or self.step == 1:
                    self.history.append({k: metrics[k] for k in ("step", "loss_elbo", "loss_ce", "tokens_per_s")})
                for cb in self.callbacks:
                    cb.on_step(self, metrics)
                if c.eval_every and self.step % c.eval_every == 0 and self.is_main:
                    ev = self.evaluate()
                    self.history.append(ev)
                    for cb in self.callbacks:
                        cb.on_eval(self, ev)
                if c.save_every and self.step % c.save_every == 0 and self.step < c.max_steps:
                    self.save()
            self.save()
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            self.release()
        metrics["stopped"] = self._stop.is_set() and self.step < c.max_steps
        for cb in self.callbacks:
            cb.on_end(self, metrics)
        return metrics
