"""`dbert bench`: sampling speed, training throughput and forward-pass efficiency, in one run.

Every figure comes from this machine in this run, so the ratios between rows are what to
compare (a shared or busy machine moves absolute times, much less their ratios):
    matmul peak      best GFLOP/s of a large square torch.mm, per dtype
    rates            F.linear's GFLOP/s at the model's own shapes (QKV, attention output, FFN up
                     and down, head, vocabulary) and their combination (the forward's limit), per
                     dtype and for 1 thread and the run's threads, at the sampling, `sample --n 10`
                     and training shapes; sampling rows, the CLI defaults and training report their
                     achieved GFLOP/s as a fraction of the rate at their shapes (training: MFU)
    forward          one denoiser call at batch B x length L with every position projected to
                     the vocabulary: achieved GFLOP/s (counted from the architecture) vs peak
    threads, bf16    the same forward with 1..cores threads, and in bfloat16
    sampling         per sampler x steps x batch: seconds, samples/s, network calls per batch,
                     rows evaluated per sample, and the speed-up over ancestral (any strategy of
                     strategies.py at its default parameters; a heuristic one is marked so)
    train            optimizer steps on a copy of the model: tokens/s (masked-only logits)

Results go to OUT/bench.json and OUT/bench.md (each rewritten atomically after every
measurement, so an interrupted run keeps what it measured); `dbert bench` prints the Markdown on
stdout. Progress goes to the `report` callback given to `run` (the CLI writes it to stderr); the
bench itself prints nothing.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from ..disk import layout
from ..hardware import auto_dtype, compute_dtype, cpu_name, native_bf16
from ..disk.atomic import atomic_write_text
from .. import strategies
from ..errors import DbertError
from ..maths.model import attention_path, forward_flops
from .rates import (_sig, _sync, best_time, fraction, linear_rate, matmul_peak, model_shapes,  # noqa: F401 - bench.X as before
                    shape_rates, side_by_side_rate)


def machine(device: torch.device) -> dict:
    info = {"cpu": cpu_name(), "native_bf16": native_bf16(device), "cores": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info


BUSY = 0.5  # a load average at the start of at least this many per core: the rates are another job's share


def load_warning(m: dict) -> str | None:
    """A warning when other work held the CPU as the bench began (machine()'s load average of the
    last minute against its cores), else None: its rates then read low, and vary from run to run."""
    load, cores = (m.get("load_average") or [None])[0], m.get("cores") or 1
    if load is None or load < BUSY * cores:
        return None
    return (f"warning: the load average was {load:.1f} on {cores} cores as the bench began: other work shares "
            "the CPU, so these rates read low and vary from run to run; measure on an idle machine")


def _inputs(db, B: int, L: int, device):
    tok = db.tokenizer
    ids = torch.full((B, L + 2), db.model.mask_id, dtype=torch.long)
    ids[:, 0], ids[:, -1] = tok.cls_token_id, tok.sep_token_id
    select = torch.zeros_like(ids, dtype=torch.bool)
    select[:, 1:-1] = True
    attention = torch.ones_like(ids, dtype=torch.bool)
    t = torch.full((B,), db.schedule.T)
    return ids.to(device), attention.to(device), select.to(device), t.to(device)


def time_forward(model, db, B: int, L: int, device, reps: int) -> float:
    ids, attention, select, t = _inputs(db, B, L, device)
    with torch.inference_mode():
        return best_time(lambda: model(ids, attention, select, t=t), device, reps)


def attention_report(db, length: int) -> str:
    """The attention form of sampling and of training on this device (model.attention_path)."""
    dev, p = db.device.type, db.model.config.attention_probs_dropout_prob
    dtype = auto_dtype(db.device)
    return f"{attention_path(dev, False, dtype, length, 0.0)} (sampling), {attention_path(dev, True, dtype, length, p)} (training)"


class Bench:
    """Runs the measurements and keeps the report up to date on disk."""

    def __init__(self, db, out: Path, length: int, quick: bool, reps: int, report=None, progress=None):
        self.db, self.out, self.length, self.quick, self.reps = db, Path(out), length, quick, reps
        self.say = report or (lambda message: None)  # report(message): one line per measurement (the CLI: stderr)
        # progress(label, samples): a sampling run's on_frame, with close() (the CLI: a progress line on stderr)
        self.progress = progress
        self.device = db.device
        self.result: dict = {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "checkpoint": str(db.path) if db.path else None,
            "model": {"schedule": db.schedule.name, "T": db.schedule.T, "time": db.model.time,
                      "hidden": db.model.config.hidden_size, "layers": db.model.config.num_hidden_layers,
                      "vocab": db.model.config.vocab_size,
                      "attention": attention_report(db, length),
                      "dtype": str(next(db.model.parameters()).dtype).removeprefix("torch.")},
            "machine": machine(self.device), "length": length,
            "peak": {}, "rates": {}, "forward": [], "sampling": [], "train": None, "cli_defaults": None,
        }

    # ------------------------------------------------------------------ output
    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / layout.BENCH_JSON, json.dumps(self.result, indent=2) + "\n")
        atomic_write_text(self.out / layout.BENCH_MD, markdown(self.result))

    # ------------------------------------------------------------------ parts
    def peak(self, dtypes) -> None:
        for dtype in dtypes:
            name = str(dtype).removeprefix("torch.")
            self.result["peak"][name] = round(matmul_peak(dtype, self.device, reps=self.reps), 2)
            self.say(f"matmul peak {name}: {self.result['peak'][name]:.1f} GFLOP/s")
        self.save()

    def rates(self, name: str, B: int, N: int, M: int, dtypes, threads, workers: int = 1) -> None:
        """F.linear's rate at the model's shapes for a forward on (B, N) projecting M positions, per
        dtype and thread count (shape_rates): the limit the runs measured at those shapes are put
        against. workers > 1: also the rate of those products as that many batches side by side
        (side_by_side_rate, "side_by_side"), and the limit is the higher of the two. Kept in
        result["rates"][name]."""
        cfg, base_threads = self.db.model.config, torch.get_num_threads()
        entry: dict[str, Any] = {"batch": B, "tokens": N, "projected": M, "rows": []}
        self.result["rates"][name] = entry
        for dtype in dtypes:
            for n in threads:
                torch.set_num_threads(n)
                try:
                    row = {"dtype": str(dtype).removeprefix("torch."), "threads": n,
                           **shape_rates(cfg, B, N, M, dtype, self.device, self.reps)}
                    if workers > 1 and n > 1:
                        row["side_by_side"] = side_by_side_rate(cfg, B, N, M, dtype, self.device, workers, self.reps)
                        row["workers"] = min(workers, B)
                except Exception as e:  # noqa: BLE001 - a dtype this machine cannot run is reported
                    row = {"dtype": str(dtype).removeprefix("torch."), "threads": n,
                           "error": str(e).splitlines()[0][:200]}
                finally:
                    torch.set_num_threads(base_threads)
                entry["rows"].append(row)
                self.say(f"matmul rate {name} ({B} x {N}, {M} projected) {row['dtype']} {n} threads: " +
                         (f"{row['model']:.1f} GFLOP/s at the model's shapes" if "model" in row else row["error"]) +
                         (f", {row['side_by_side']:.1f} as {row['workers']} batches side by side" if "side_by_side" in row else ""))
                self.save()

    def rate(self, name: str, dtype: str, threads: int) -> float | None:
        """The measured rate at the model's shapes (`rates`) for dtype and threads (the higher of one
        batch's and the batches' side by side where both were measured), or None."""
        for row in self.result["rates"].get(name, {}).get("rows", []):
            if row["dtype"] == dtype and row["threads"] == threads and "model" in row:
                return max(row["model"], row.get("side_by_side", 0.0))
        return None

    def _dtype(self) -> str:
        """The dtype the sampler computes in: float32 weights run under bf16 autocast where "auto" picks
        it (sampling.base.Net), so a run's rate is put against the bf16 matmul rate there, not fp32's."""
        own = next(self.db.model.parameters()).dtype
        return str(auto_dtype(self.device) if own == torch.float32 else own).removeprefix("torch.")

    def forward(self, B: int, threads=(), bf16: bool = False) -> None:
        """Forward at batch B, all positions projected; vs the same dtype's matmul peak."""
        db, L = self.db, self.length
        cfg = db.model.config
        base_threads = torch.get_num_threads()
        variants = [("fp32", db.model, base_threads)]
        variants += [("fp32", db.model, n) for n in threads if n != base_threads]
        if bf16:
            variants.append(("bf16", copy.deepcopy(db.model).to(torch.bfloat16), base_threads))
        for name, model, n in variants:
            torch.set_num_threads(n)
            # CPUs without native bf16 (no AVX512-BF16/AMX) run it an order of magnitude slower:
            # time it on a smaller batch and matrix, once, so the suite stays short
            slow = name == "bf16" and self.device.type == "cpu"
            b = min(B, 4) if slow else B
            flops = forward_flops(cfg, b, L + 2, b * L)
            try:
                sec = time_forward(model, db, b, L, self.device, reps=1 if slow else self.reps)
                dt = "bfloat16" if name == "bf16" else "float32"
                key = dt if n == base_threads else f"{dt}@{n}threads"  # the peak with the same threads
                if key not in self.result["peak"]:
                    self.result["peak"][key] = round(matmul_peak(getattr(torch, dt), self.device, n=1024 if slow else 2048,
                                                                 reps=2 if slow else self.reps), 2)
                peak = self.result["peak"][key]
                row = {"variant": name, "batch": b, "length": L, "threads": n, "seconds": round(sec, 4),
                       "gflops": round(flops / 1e9, 2), "gflop_per_s": round(flops / sec / 1e9, 2),
                       "peak_gflop_per_s": peak, "percent_of_peak": round(100 * flops / sec / 1e9 / peak, 1)}
            except Exception as e:  # noqa: BLE001 - a variant that fails is reported, not fatal
                row = {"variant": name, "batch": b, "length": L, "threads": n, "error": str(e).splitlines()[0][:200]}
            finally:
                torch.set_num_threads(base_threads)
            self.result["forward"].append(row)
            self.say(f"forward {name} batch {row['batch']} threads {n}: " +
                (f"{row['seconds']:.3f} s, {row['percent_of_peak']}% of peak" if "seconds" in row else row["error"]))
            self.save()

    def sampling(self, samplers, steps_list, batches, seed: int = 0) -> None:
        """Each sampler at each step budget and batch, at the checkpoint's own token choice (top-k, top-p), on
        the exact forward (no decided-position cache: cli_defaults measures the checkpoint's whole decoding)."""
        from ..sampling.sample import generate

        for batch in batches:
            for steps in steps_list:
                if steps > self.db.schedule.T:
                    self.say(f"skipping steps {steps} > T={self.db.schedule.T}")
                    continue
                base = None
                for sampler in samplers:
                    with self._watch(f"bench: {sampler} steps {steps} batch {batch}", batch) as on_frame:
                        _, st = generate(self.db, n=batch, batch_size=batch, workers=1, seed=seed, length=self.length,
                                         steps=steps, sampler=sampler, pair_quotes=False, fix_contractions=False,
                                         known_words=False, cache_refresh=0,  # the sampler alone, on the exact forward
                                         on_frame=on_frame)
                    sec = st["seconds"]
                    row = {"sampler": sampler, "exact": st["exact"], "params": st["params"], "steps": steps,
                           "batch": batch, "seconds": sec,
                           "samples_per_s": round(batch / sec, 4), "calls_per_batch": st["nfe"],
                           "rows_per_sample": round(st["rows"] / batch, 2), **self._compute(st)}
                    if strategies.get(sampler).baseline:
                        base = sec
                    if base is not None:
                        row["speedup_vs_ancestral"] = round(base / sec, 2)
                    self.result["sampling"].append(row)
                    self.say(f"{sampler:>13} steps {steps:>4} batch {batch:>2}: {sec:8.2f} s, "
                        f"{row['calls_per_batch']} calls, {row['rows_per_sample']} rows/sample")
                    self.save()

    @contextlib.contextmanager
    def _watch(self, label: str, samples: int):
        """A sampling run's on_frame for the run's progress (None without one), closed after it."""
        watch = self.progress(label, samples) if self.progress is not None else None
        try:
            yield watch
        finally:
            if watch is not None:
                watch.close()

    def _compute(self, st: dict, rates: str = "sampling") -> dict:
        """The network's work in a sampling run, the time it needs at the measured matmul peak, and
        its achieved GFLOP/s as a fraction of the matmul rate at the model's shapes (same dtype and
        threads as the run)."""
        peak = self.result["peak"].get("float32")
        out = {"gflop": st["gflop"]}
        if peak:
            out["seconds_at_peak"] = float(f"{st['gflop'] / peak:.3g}")
        achieved = st["gflop"] / st["seconds"] if st["seconds"] > 0 else 0.0
        dtype, threads = self._dtype(), torch.get_num_threads()
        rate = self.rate(rates, dtype, threads)
        out.update({"gflop_per_s": _sig(achieved), "dtype": dtype, "threads": threads,
                    "matmul_rate_gflop_per_s": rate, "fraction_of_matmul_rate": fraction(achieved, rate)})
        return out

    def cli_defaults(self, load_seconds: float) -> None:
        """What `dbert sample --n 10` does after loading, with the CLI's defaults."""
        from ..config import SampleConfig
        from ..sampling.sample import generate, resolve

        cfg = resolve(SampleConfig(seed=0), self.db)
        assert cfg.length is not None and cfg.workers is not None  # resolve fills them in
        B = min(cfg.n, cfg.batch_size)
        self.rates("cli", B, cfg.length + 2, B * cfg.length, [getattr(torch, self._dtype())], [torch.get_num_threads()],
                   workers=cfg.workers)
        with self._watch("bench: sample --n 10 defaults", cfg.n) as on_frame:
            _, st = generate(self.db, cfg, on_frame)
        self.result["cli_defaults"] = {"sampler": cfg.sampler, "length": cfg.length, "steps": cfg.steps,
                                       "cache_refresh": cfg.cache_refresh, "cache_masked": bool(cfg.cache_masked),
                                       "load_seconds": round(load_seconds, 2),
                                       "sample_seconds": st["seconds"], "calls": st["nfe"], "batches": st["batches"],
                                       "workers": st["workers"], "at_once": st["at_once"], **self._compute(st, "cli")}
        self.say(f"sample --n 10 defaults: load {load_seconds:.2f} s + sampling {st['seconds']:.2f} s")
        self.save()

    def train(self, batch: int = 32, seq_len: int = 64, steps: int = 3, dtype: str = "auto") -> None:
        """Optimizer steps on a copy of the model: tokens/s as `dbert train` counts them, and model
        FLOP utilisation against F.linear's rate at the training shapes (batch x seq_len)."""
        from ..config import TrainConfig
        from ..training.prepare import in_memory
        from ..training.train import Trainer

        db = copy.copy(self.db)
        db.model = copy.deepcopy(self.db.model).float()
        gen = torch.Generator().manual_seed(0)
        examples = torch.randint(1000, db.model.config.vocab_size, (4 * batch, seq_len), generator=gen).tolist()
        cfg = TrainConfig(data=["(bench)"], out="(bench)", batch_size=batch, seq_len=seq_len, T=db.schedule.T,
                          lr=1e-5, warmup=0, max_steps=steps + 1, device=self.device.type, dtype=dtype)
        trainer = Trainer(cfg, prepared=in_memory(db, cfg, examples))  # the trainer's own step: optimizer, loss, autocast
        trainer.train_step()  # warm-up (allocates the optimizer state)
        flops = []  # model FLOPs of every forward the timed steps run, from its own inputs

        def count(module, args, kwargs):
            ids = args[0]
            select = args[2] if len(args) > 2 else kwargs["select"]
            flops.append(forward_flops(module.config, ids.shape[0], ids.shape[1], int(select.sum())))

        hook = trainer.model.register_forward_pre_hook(count, with_kwargs=True)
        try:
            _sync(self.device)
            t0 = time.perf_counter()
            for _ in range(steps):
                trainer.train_step()
            _sync(self.device)
            sec = (time.perf_counter() - t0) / steps
        finally:
            hook.remove()
        gflop = 3 * sum(flops) / steps / 1e9  # forward + backward (2x the forward: input and weight gradients)
        dtype = {"bf16": "bfloat16", "fp32": "float32"}[compute_dtype(cfg.dtype, self.device)]
        threads = torch.get_num_threads()
        if "train" not in self.result["rates"]:
            self.rates("train", batch, seq_len, round(batch * seq_len / 2), [getattr(torch, dtype)], [threads])
        rate = self.rate("train", dtype, threads)
        self.result["train"] = {"batch": batch, "seq_len": seq_len, "steps": steps, "seconds_per_step": _sig(sec),
                                "tokens_per_s": round(batch * seq_len / sec, 1), "dtype": cfg.dtype,
                                "compute_dtype": dtype, "threads": threads, "gflop_per_step": _sig(gflop),
                                "gflop_per_s": _sig(gflop / sec), "matmul_rate_gflop_per_s": rate,
                                "mfu": fraction(gflop / sec, rate)}
        self.say(f"train: {sec:.2f} s/step, {batch * seq_len / sec:.0f} tokens/s, {gflop / sec:.1f} GFLOP/s"
                 + (f", MFU {100 * gflop / sec / rate:.0f}% of {rate:.0f}" if rate else ""))
        self.save()


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def markdown(r: dict) -> str:
    """The report as Markdown tables."""
    m, mod = r["machine"], r["model"]
    lines = [f"### dbert bench, {r['date']}", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['threads']} torch threads, {m['cpu_capability']}, "
             f"torch {m['torch']}" + (f", GPU {m['gpu']}" if m.get("gpu") else "") +
             (f"; load average at start {m['load_average'][0]}" if m.get("load_average") else "") + ".",
             f"Model: {r['checkpoint']} ({mod['layers']} layers, hidden {mod['hidden']}, vocab {mod['vocab']}, "
             f"{mod['schedule']} T={mod['T']}, time {mod['time']}, attention {mod['attention']}, {mod['dtype']}); "
             f"length {r['length']}.", ""]
    if load_warning(m):
        lines += [f"**{load_warning(m)}**", ""]
    for name, e in r.get("rates", {}).items():
        shapes = [k for k in e["rows"][0] if k not in ("dtype", "threads", "model", "error", "side_by_side", "workers")] \
            if e["rows"] else []
        apart = any("side_by_side" in row for row in e["rows"])  # the CLI's batches side by side (rates.side_by_side_rate)
        lines += [f"Matmul rate (F.linear GFLOP/s, best of runs) at the model's {name} shapes: batch {e['batch']} x "
                  f"{e['tokens']} tokens, {e['projected']} positions projected to the vocabulary; `model` is the "
                  f"forward's products together (its limit), on {m['cpu']}" +
                  ("; `side by side`: the same products as the run's batches side by side, each on its share of "
                   "the threads (the limit is the higher of the two)." if apart else "."), "",
                  "| dtype | threads | " + " | ".join(shapes) + " | model |" + (" side by side |" if apart else ""),
                  "|---|---:|" + "---:|" * (len(shapes) + 1 + apart)]
        for row in e["rows"]:
            if "error" in row:
                lines.append(f"| {row['dtype']} | {row['threads']} | failed: {row['error']} |")
            else:
                lines.append(f"| {row['dtype']} | {row['threads']} | " +
                             " | ".join(f"{row[k]:.1f}" for k in shapes) + f" | {row['model']:.1f} |" +
                             (f" {row['side_by_side']:.1f} |" if "side_by_side" in row else " |" if apart else ""))
        lines.append("")
    if r["sampling"]:
        lines += ["| sampler | steps | batch | seconds | samples/s | calls/batch | rows/sample | vs ancestral "
                  "| GFLOP | s at peak | GFLOP/s | of matmul rate |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in r["sampling"]:
            sp = s.get("speedup_vs_ancestral")
            name = s["sampler"] + ("" if s.get("exact", True) else " (heuristic)")
            lines.append(f"| {name} | {s['steps']} | {s['batch']} | {s['seconds']:.2f} | "
                         f"{s['samples_per_s']:.3f} | {s['calls_per_batch']} | {s['rows_per_sample']} | "
                         f"{'' if sp is None else f'{sp:.1f}x'} | {s.get('gflop', '')} | "
                         f"{s.get('seconds_at_peak', '')} | {s.get('gflop_per_s', '')} | {_pct(s.get('fraction_of_matmul_rate'))} |")
        lines.append("")
    if r["forward"]:
        lines += ["| forward | batch | threads | seconds | GFLOP | GFLOP/s | matmul peak | % of peak |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for f in r["forward"]:
            if "error" in f:
                lines.append(f"| {f['variant']} | {f['batch']} | {f['threads']} | failed: {f['error']} | | | | |")
                continue
            lines.append(f"| {f['variant']} | {f['batch']} | {f['threads']} | {f['seconds']:.3f} | "
                         f"{f['gflops']:.1f} | {f['gflop_per_s']:.1f} | {f['peak_gflop_per_s']:.1f} | "
                         f"{f['percent_of_peak']:.0f}% |")
        lines.append("")
    if r["train"]:
        t = r["train"]
        lines.append(f"Training: {t['tokens_per_s']:.0f} tokens/s ({t['seconds_per_step']:.2f} s per step of "
                     f"{t['batch']} x {t['seq_len']} tokens, {t.get('compute_dtype', t['dtype'])}, "
                     f"{t.get('threads', '?')} threads, AdamW): {t.get('gflop_per_s', '?')} GFLOP/s of model FLOPs, "
                     f"MFU {_pct(t.get('mfu'))} of the matmul rate at its shapes ({t.get('matmul_rate_gflop_per_s')}).")
    if r["cli_defaults"]:
        c = r["cli_defaults"]
        cache = f", cache refresh {c['cache_refresh']}" if c.get("cache_refresh") else ""
        cache += ", masked states kept" if c.get("cache_refresh") and c.get("cache_masked") else ""
        steps = f", {c['steps']} steps" if c.get("steps") else ""
        lines.append(f"`dbert sample --n 10` defaults ({c['sampler']}{steps}, length {c['length']}{cache}): "
                     f"load {c['load_seconds']:.2f} s + sampling {c['sample_seconds']:.2f} s, {c['calls']} calls, "
                     f"{c['gflop']} GFLOP ({c.get('seconds_at_peak', '?')} s at the matmul peak), "
                     f"{c.get('gflop_per_s', '?')} GFLOP/s, {_pct(c.get('fraction_of_matmul_rate'))} of the matmul "
                     f"rate at the model's shapes ({c.get('dtype')}, {c.get('threads')} threads).")
    return "\n".join(lines).rstrip() + "\n"


MAX_THREADS = 1024  # --threads at most: torch.set_num_threads(100000) kills the process (a segfault)


def check_threads(threads: int | None) -> None:
    """--threads within [1, MAX_THREADS], before torch is asked for them."""
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise DbertError(f"must be in [1, {MAX_THREADS}] (this machine has {os.cpu_count() or 1} cores), "
                         f"got {threads}", "threads", threads)


def check_batches(db, batches, length: int) -> None:
    """Every --batch size must fit the device's free memory at --length tokens (one line saying
    to lower --batch, before the measuring starts; the training measurement uses 32 rows)."""
    from ..hardware import check_memory
    from ..sampling.preflight import row_bytes

    largest = max(batches)
    check_memory(largest * row_bytes(db, length), db.device, f"bench $batch {largest:,} at $length {length}",
                 "$batch (or $length)", refs=("batch", "length"))


def run(db, out, load_seconds: float, samplers, steps_list, batches, length: int = 64, quick: bool = False,
        train: bool = True, bf16: bool = True, threads=(), report=None, progress=None) -> dict:
    """The whole suite; returns the result dict (also in out/bench.json). report(line): a line per
    measurement; progress(label, samples): an on_frame with close() for each sampling run."""
    check_batches(db, batches, length)
    reps = 2 if quick else 4
    bench = Bench(db, out, length, quick, reps, report, progress)
    bench.peak([torch.float32])
    from ..config import SampleConfig

    B = min(max(batches), SampleConfig().batch_size)  # the sampler's rows per call
    dtypes = [torch.float32] + ([torch.bfloat16] if bf16 else [])
    bench.rates("sampling", B, length + 2, B * length, dtypes, sorted({1, torch.get_num_threads()}))  # 1 and the run's
    bench.forward(32, threads=threads, bf16=bf16)
    bench.cli_defaults(load_seconds)
    if train:
        bench.train(steps=2 if quick else 3)
    bench.sampling(samplers, steps_list, batches)
    return bench.result
