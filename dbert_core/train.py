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
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import checkpoint as ckpt
from .data import Special, collate, epoch_batches, pack, read_examples, token_counts, tokenize, train_tokenizer
from .diffusion import draw_steps, elbo, masked_kl
from .hardware import native_bf16
from .errors import DbertError

LOSSES = ("hybrid", "elbo", "ce")


@dataclass
class TrainConfig:
    data: list[str]
    out: str
    preset: str | None = "tiny"        # model sizes for a random init (tiny, mini, small, base)
    init: str | None = None            # or a pretrained BERT: local dir or hub id
    from_scratch: bool = False         # with init: its architecture and tokenizer, random weights
    trim_vocab: bool = False           # with init: keep only the word pieces the training data uses
    vocab_size: int | None = None      # WordPiece size learnt from the data (presets without init)
    unit: str = "line"                 # an example is a line or a sentence of the files
    pack: bool = False                 # join examples with [SEP] into full seq_len streams
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
    eval_every: int = 200
    eval_steps: int | None = None      # step budget of the validation ELBO (default: min(128, T))
    save_every: int = 500
    log_every: int = 10
    device: str = "auto"               # auto, cpu, cuda, mps
    dtype: str = "auto"                # auto (bf16 autocast where native: CUDA, AVX512-BF16/AMX CPUs), fp32, bf16
    dropout: float | None = None       # override the model's dropout rates (None: keep them)
    seed: int = 0
    resume: bool = False
    extra: dict = field(default_factory=dict)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DbertError("CUDA was requested (--gpu / --device cuda) but no CUDA GPU is available")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DbertError("--device mps was requested but Apple's MPS backend is not available")
    if name not in ("cpu", "cuda", "mps"):
        raise DbertError(f"unknown device {name!r}; choose auto, cpu, cuda or mps")
    return torch.device(name)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to min_lr_ratio * lr (or constant)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    if cfg.decay == "constant":
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


class Callback:
    """Hooks a trainer calls; override what you need. Metrics are plain dicts."""

    def on_start(self, trainer): ...
    def on_step(self, trainer, metrics: dict): ...
    def on_eval(self, trainer, metrics: dict): ...
    def on_checkpoint(self, trainer, path: Path): ...
    def on_end(self, trainer, metrics: dict): ...


def _dist():
    """(rank, world, local_rank) from torchrun's environment; (0, 1, 0) when not distributed."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    return int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0"))


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

    # ----------------------------------------------------------------- setup
    def stop(self) -> None:
        """Ask the loop to save a checkpoint and return after the current step (thread-safe)."""
        self._stop.set()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _validate(self):
        c = self.cfg
        from .model import PRESETS, TIME_MODES
        from .schedule import SCHEDULES

        if c.trim_vocab and c.init is None:
            raise DbertError("--trim-vocab needs --init (a preset learns a vocabulary from the data anyway)")
        if c.init is None and c.preset not in PRESETS:
            raise DbertError(f"unknown preset {c.preset!r}; choose one of: {', '.join(PRESETS)}")
        if c.schedule not in SCHEDULES:
            raise DbertError(f"unknown schedule {c.schedule!r}; choose one of: {', '.join(SCHEDULES)}")
        if c.time not in TIME_MODES:
            raise DbertError(f"unknown time conditioning {c.time!r}; choose one of: {', '.join(TIME_MODES)}")
        if c.loss not in LOSSES:
            raise DbertError(f"unknown loss {c.loss!r}; choose one of: {', '.join(LOSSES)}")
        if c.batch_size % (self.world * c.grad_accum):
            raise DbertError(f"--batch-size {c.batch_size} must divide by processes x --grad-accum "
                             f"({self.world} x {c.grad_accum})")
        for name in ("max_steps", "seq_len", "batch_size", "T"):
            if getattr(c, name) < 1:
                raise DbertError(f"--{name.replace('_', '-')} must be >= 1")
        if c.eval_steps is None:
            c.eval_steps = min(128, c.T)
        if not 1 <= c.eval_steps <= c.T:
            raise DbertError(f"--eval-steps must be between 1 and T={c.T}")

    def prepare(self) -> None:
        """Read data, build or load the model, restore state when resuming."""
        c = self.cfg
        self._validate()
        self.device = pick_device(c.device)
        if self.world > 1 and not torch.distributed.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend)
            if self.device.type == "cuda":
                self.device = torch.device("cuda", self.local_rank)
                torch.cuda.set_device(self.device)
        torch.manual_seed(c.seed + self.rank)
        out = Path(c.out)
        ckpt.recover(out)
        state = None
        if c.resume:
            state = ckpt.load_trainer_state(out)
            if state is None:
                raise DbertError(f"--resume: no trainer state in {out} (nothing to resume)")
        elif out.exists() and any(out.iterdir()):
            raise DbertError(f"{out} already holds files; pass --resume to continue it or choose another --out")

        texts = read_examples(c.data, c.unit)
        train_texts, val_texts = self._split(texts)
        init, trimmed = c.init, None
        if state is not None:
            self.db = ckpt.load(out, device="cpu")
            tokenizer = self.db.tokenizer
        else:
            if c.trim_vocab:
                init, trimmed = self._trim(train_texts)
            tokenizer = self._tokenizer(texts, init)
        self.special = Special.of(tokenizer)
        train = tokenize(train_texts, tokenizer, c.seq_len)
        val = tokenize(val_texts, tokenizer, c.seq_len)
        if c.pack:
            train, val = pack(train, c.seq_len, self.special.sep), pack(val, c.seq_len, self.special.sep)
        if len(train) < c.batch_size:
            raise DbertError(f"only {len(train)} training examples, fewer than --batch-size {c.batch_size}")
        if not val:
            raise DbertError("the validation slice is empty; give more data or --val-data")
        self.train_examples, self.val_examples = train, val
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
            self.db = ckpt.assemble(bert, tokenizer, c.schedule, c.T, counts, c.lam, c.time, meta)
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
        if state is not None:
            self._restore(state)

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

            try:
                return WordPieceTokenizer.load(local_dir(init))
            except DbertError as e:
                raise DbertError(f"cannot load a tokenizer from --init {c.init}: {e}") from None
        from .model import PRESETS

        size = c.vocab_size or PRESETS[c.preset]["vocab_size"]
        return train_tokenizer(texts[:200_000], size)

    def _split(self, texts):
        c = self.cfg
        g = torch.Generator().manual_seed(c.seed + 99)
        if c.val_data:
            val = read_examples(c.val_data, c.unit)
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
        extra = {"fused": True} if self.device.type == "cuda" else {}
        return torch.optim.AdamW(groups, lr=c.lr, betas=(0.9, 0.98), eps=1e-6, **extra)

    def _autocast(self):
        c = self.cfg
        if c.dtype == "bf16" or (c.dtype == "auto" and native_bf16(self.device)):
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ----------------------------------------------------------------- state
    def _rng_state(self) -> dict:
        rng = {"noise": self.gen.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        return rng

    def _restore(self, state: dict) -> None:
        s = state["state"]
        self.step, self.epoch, self.batch_in_epoch = s["step"], s["epoch"], s["batch_in_epoch"]
        self.tokens_seen, self.elapsed = s.get("tokens_seen", 0), s.get("elapsed", 0.0)
        self.history = s.get("history", [])
        from .pretrained import upgrade_optimizer_state

        self.optimizer.load_state_dict(upgrade_optimizer_state(state["optimizer"], self.model))  # runs of older dbert
        rng = state["rng"].get(f"rank{self.rank}", state["rng"].get("rank0"))
        self.gen.set_state(rng["noise"])
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])

    def save(self) -> Path | None:
        """Checkpoint weights + trainer state (rank 0 writes; every rank's RNG is kept)."""
        rngs = [self._rng_state()]
        if self.world > 1:
            gathered = [None] * self.world
            torch.distributed.all_gather_object(gathered, rngs[0])
            rngs = gathered
        path = None
        if self.is_main:
            meta = self.db.meta
            meta.update(step=self.step, tokens_seen=self.tokens_seen, train_seconds=round(self.elapsed, 1),
                        device=str(self.device), world_size=self.world)
            cfg = asdict(self.cfg)
            cfg.pop("extra", None)
            meta["train_config"] = cfg
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
    def next_batch(self) -> list[list[int]]:
        """This rank's examples of the next global batch; advances the data position."""
        c = self.cfg
        batches = epoch_batches(len(self.train_examples), c.batch_size, self.epoch, c.seed, self.lengths)
        if self.batch_in_epoch >= len(batches):
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            batches = epoch_batches(len(self.train_examples), c.batch_size, self.epoch, c.seed, self.lengths)
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
                                         self.gen, return_ce=True)
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
                nats += elbo(self.model, ids, att, noisable, self.db.schedule, c.eval_steps, g).sum().item()
            toks += int(noisable.sum())
        self.model.train()
        return {"step": self.step, "val_nats_per_token": nats / toks, "val_ppl_token": math.exp(nats / toks),
                "eval_steps": c.eval_steps}

    def run(self) -> dict:
        """Train until max_steps or stop(); returns the last metrics."""
        if self.db is None:
            self.prepare()
        c = self.cfg
        micro = c.batch_size // self.world // c.grad_accum
        old_handler = None
        if threading.current_thread() is threading.main_thread():
            old_handler = signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        for cb in self.callbacks:
            cb.on_start(self)
        metrics: dict = {}
        try:
            while self.step < c.max_steps and not self._stop.is_set():
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
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                dt = time.perf_counter() - t0
                self.elapsed += dt
                tokens = sums["tokens"] * self.world
                self.tokens_seen += tokens
                metrics = {"step": self.step, "max_steps": c.max_steps, "loss_elbo": sums["elbo"],
                           "loss_ce": sums["ce"], "lr": lr, "grad_norm": float(norm), "tokens_per_s": tokens / dt,
                           "tokens_seen": self.tokens_seen, "elapsed": self.elapsed, "epoch": self.epoch}
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
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
        metrics["stopped"] = self._stop.is_set() and self.step < c.max_steps
        for cb in self.callbacks:
            cb.on_end(self, metrics)
        return metrics
