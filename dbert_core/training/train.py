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
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ..storage import checkpoint as ckpt
from ..disk import layout
from ..config import TrainConfig
from ..text.data import collate, epoch_batches, scored_tokens
from ..maths.diffusion import RowDraws, Workspace, draw_steps, elbo, masked_kl
from ..errors import DbertError
from ..stopping import stop, stop_reset, stop_under_way
from ..hardware import compute_dtype
from ..heap import HeapCeiling
from .prepare import Prepared, prepare, processes

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

    def on_prepare(self, trainer, info: dict): ...  # the data being tokenized (prepare's report)
    def on_notice(self, trainer, line: str): ...  # a line about the start for a person (before on_start)
    def on_start(self, trainer): ...
    def on_step(self, trainer, metrics: dict): ...
    def on_eval(self, trainer, metrics: dict): ...
    def on_checkpoint(self, trainer, path: Path): ...
    def on_end(self, trainer, metrics: dict): ...


class Trainer:
    """The loop: `Trainer(cfg, callbacks).run()` prepares the run (prepare.prepare) unless handed
    a Prepared, then trains it."""

    def __init__(self, cfg: TrainConfig, callbacks=(), prepared: Prepared | None = None):
        self.cfg = cfg
        self.callbacks = list(callbacks)
        self.rank, self.world, self.local_rank = processes()
        self._stop = False  # a plain flag, not a threading.Event: a signal handler must take no lock (a
        # second Ctrl-C landing inside the first one's Event.set() waited forever on its own lock)
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.tokens_seen = 0
        self.elapsed = 0.0
        self.history: list[dict] = []
        self.heap = HeapCeiling()  # a batch's arrays change size from step to step: freed heap pages go back
        self._db: ckpt.DBert | None = None  # the prepared run's (db)
        self.prepared: Prepared | None = None
        if prepared is not None:
            self._adopt(prepared)

    # ----------------------------------------------------------------- setup
    def stop(self) -> None:
        """Ask the loop to save a checkpoint and return after the current step (thread-safe: the
        loop reads the flag between steps)."""
        self._stop = True

    @property
    def db(self) -> ckpt.DBert:
        """The run's checkpoint in memory, once the run is prepared (prepare(), or a Prepared given)."""
        if self._db is None:
            raise RuntimeError("the run is not prepared yet (Trainer.prepare)")
        return self._db

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def prepare(self) -> None:
        """Prepare the run (prepare.prepare: data, tokenizer, model, the resume rule) and take it on."""
        def report(info: dict) -> None:
            for cb in self.callbacks:
                getattr(cb, "on_prepare", lambda *a: None)(self, info)

        self._adopt(prepare(self.cfg, self.rank, self.world, self.local_rank,
                            notice=self._notice, report=report))

    def _notice(self, line: str) -> None:
        """A line about the start for a person (a rank waiting for the others): the callbacks' on_notice."""
        for cb in self.callbacks:
            if hasattr(cb, "on_notice"):  # a callback need not derive from Callback
                cb.on_notice(self, line)

    def _adopt(self, prepared: Prepared) -> None:
        """Take on a prepared run: its config, model, examples and device; the model goes to the
        device with its optimizer, and a resumed run's state is restored."""
        self.prepared = prepared
        self.cfg, self._db, self.device = prepared.cfg, prepared.db, prepared.device
        self.special = prepared.special
        self.train_examples, self.val_examples = prepared.train, prepared.val
        # examples of one length (cached story windows) are never sorted by it: epoch_batches' stable
        # sort of equal keys keeps the order, so None gives the same batches without a list of lengths
        uniform = getattr(prepared.train, "uniform_length", None)
        known = getattr(prepared.train, "lengths", None)  # cached examples: their lengths, a numpy array
        self.lengths = None if uniform is not None else known if known is not None else [len(e) for e in prepared.train]
        try:
            self._attach()
            if prepared.state is not None:
                self._restore(prepared.state)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give up the lock on the output folder (run() does this when it ends)."""
        if self.prepared is not None:
            self.prepared.release()

    def _attach(self) -> None:
        """Model on the device in training mode, DDP wrapper, optimizer and noise generator."""
        c = self.cfg
        model = self.db.model.to(self.device)
        if c.dropout is not None:  # kept in config.json, so a resumed run uses it too
            model.bert.set_dropout(c.dropout)
        model.train()
        self.model = model
        self.ddp: torch.nn.Module = model  # the model, or its DistributedDataParallel wrapper
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(model, device_ids=ids)
        self.optimizer = self._optimizer()
        self.gen = torch.Generator().manual_seed(c.seed * 1000 + 17 + self.rank)
        self.workspace = Workspace()  # the loss's (M, V) arrays, reused across steps

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
        from ..storage.pretrained import upgrade_optimizer_state

        where = f"the trainer state's {Path(self.cfg.out) / layout.STATE / layout.OPTIMIZER}"
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
            raise DbertError(f"the trainer state has no random-number state for rank {self.rank}")
        self.gen.set_state(rng["noise"])
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            try:
                torch.cuda.set_rng_state(rng["cuda"])
            except RuntimeError:
                raise DbertError("the trainer state's CUDA random-number state does not fit this GPU") from None
        s = state["state"]
        self.step, self.epoch, self.batch_in_epoch = s["step"], s["epoch"], s["batch_in_epoch"]
        self.tokens_seen, self.elapsed = s.get("tokens_seen", 0), float(s.get("elapsed", 0.0))
        self.history = s.get("history", [])

    def save(self) -> Path | None:
        """Checkpoint weights + trainer state (rank 0 writes; every rank's RNG is kept)."""
        rngs = [self._rng_state()]
        if self.world > 1:
            gathered: list = [None] * self.world  # each rank's RNG state
            with self._collective():
                torch.distributed.all_gather_object(gathered, rngs[0])
            rngs = gathered
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise DbertError(f"training diverged by step {self.step}: the weights are not finite (try a lower $lr); "
                             f"the last good checkpoint in {self.cfg.out}, if any, is kept", refs=("lr",))
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
            with self._collective():  # a rank killed while rank 0 saved: the checkpoint just written stays
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
        """Validation ELBO (nats per token, perplexity) with the eval step budget; each example's draws fixed."""
        c = self.cfg
        self.model.eval()
        nats, toks = 0.0, 0
        for i in range(0, len(self.val_examples), c.batch_size):
            batch = self.val_examples[i:i + c.batch_size]
            ids, att, noisable = collate(batch, self.special, self.device)
            draws = RowDraws(1234, range(i, i + len(batch)))  # the same draws whatever --batch-size: runs compare
            with self._autocast():
                nats += elbo(self.model, ids, att, noisable, self.db.schedule, c.eval_budget, draws).sum().item()
            toks += scored_tokens(batch)  # a story's padding is not text
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
        sums: dict[str, Any] = {"elbo": 0.0, "ce": 0.0, "tokens": 0}
        for j in range(c.grad_accum):
            chunk = examples[j * micro:(j + 1) * micro]
            sync = self.world == 1 or j == c.grad_accum - 1
            ctx = contextlib.nullcontext() if sync else self.ddp.no_sync()  # type: ignore[operator]  # world > 1: DDP's
            with ctx:
                loss, m = self.loss(chunk)
                (loss / c.grad_accum).backward()
            sums["tokens"] += m["tokens"]
            for key in ("elbo", "ce"):
                sums[key] += m[key] / c.grad_accum
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.clip)
        if not (math.isfinite(float(norm)) and math.isfinite(sums["elbo"]) and math.isfinite(sums["ce"])):
            kept = f"the last good checkpoint in {c.out} is kept" if (Path(c.out) / layout.META).exists() \
                else "nothing was saved"
            raise DbertError(f"training diverged at step {self.step + 1}: the loss or gradient is not finite "
                             f"(try a lower $lr); {kept}", refs=("lr",))
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

    def _distributed_step(self) -> dict:
        """train_step in a torchrun launch. Nothing is saved when a peer has gone (this step's
        gradients never arrived whole); the last checkpoint stays."""
        with self._collective():
            return self.train_step()

    @contextlib.contextmanager
    def _collective(self):
        """Around the collectives of a torchrun launch (a step's gradients, a save's gather and
        barrier), where one that fails means another rank has gone (killed, out of memory, its
        machine lost): one line saying so, not a backend error reported as a bug."""
        try:
            yield
        except RuntimeError as e:
            if self.world == 1 or not _peer_failure(e):
                raise
            raise DbertError(f"rank {self.rank}: another process of this {self.world}-process run stopped "
                             f"({' '.join(str(e).split())[:120]}); the last checkpoint in {self.cfg.out} stays "
                             "(rerun with $resume)", refs=("resume",)) from None

    def run(self) -> dict:
        """Train until max_steps or stop(); returns the last metrics.

        In the main thread, SIGINT (Ctrl-C), SIGTERM and SIGHUP (a closed terminal or ssh
        session) stop the run after the current step and save a checkpoint; one that arrives
        while the run is still starting up (reading data, building the model) ends it at once
        with Interrupted, the lock released and nothing written. Once a stop is saving, further
        signals change nothing (stopping.stop_under_way): a fast second Ctrl-C neither breaks into
        the save nor shows a traceback. A SIGHUP the caller ignores (nohup) stays ignored."""
        old_handlers = {}
        training = False
        stop_reset()  # a run started after a stopped one can be stopped again

        def on_signal(signum, frame):
            if not training:  # Interrupted now, or (an import under way) this handler again in 50 ms
                stop(signum, frame)
                return  # a signal put off is no stop after a step: it ends the start-up when it comes again
            self._stop = True  # stop after this step and save; a second signal cannot break into the save
            stop_under_way()

        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if sig == getattr(signal, "SIGHUP", None) and signal.getsignal(sig) == signal.SIG_IGN:
                    continue
                old_handlers[sig] = signal.signal(sig, on_signal)
        metrics: dict = {}
        try:
            if self.prepared is None:
                self.prepare()
            c = self.cfg
            training = True
            for cb in self.callbacks:
                cb.on_start(self)
            while self.step < c.max_steps and not self._stop:
                metrics = self._distributed_step() if self.world > 1 else self.train_step()
                self.heap.after_step()
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
        metrics["stopped"] = self._stop and self.step < c.max_steps
        for cb in self.callbacks:
            cb.on_end(self, metrics)
        return metrics


def _peer_failure(error: RuntimeError) -> bool:
    """A collective failed because a peer went away (gloo and NCCL word it differently)."""
    import torch.distributed as dist

    if isinstance(error, tuple(t for t in (getattr(dist, "DistError", None),) if t is not None)):
        return True
    text = str(error).lower()
    return any(w in text for w in ("gloo", "nccl", "connection reset", "connection closed", "broken pipe",
                                   "timed out", "timeout", "peer"))
