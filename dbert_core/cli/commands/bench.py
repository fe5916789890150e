"""`dbert bench`: sampling speed, training tokens/s and forward efficiency on this machine;
bench.json and bench.md in --out, the Markdown on stdout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ... import config, strategies
from ...errors import DbertError
from .. import options
from ..options import plain, with_settings
from ..streams import say


def _int_list(text: str, option: str, most: int | None = None) -> list[int]:
    """Comma-separated positive integers, at most `most` each (a 400-digit --batch is one line, not
    an OverflowError when its memory is reckoned)."""
    shown = repr(text) if len(text) <= 40 else repr(text[:40]) + f"... ({len(text):,} characters)"  # one short line
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise DbertError(f"{option} takes comma-separated integers, got {shown}") from None
    if not values or min(values) < 1:
        raise DbertError(f"{option} takes positive integers, got {shown}")
    if most is not None and max(values) > most:
        raise DbertError(f"{option} takes integers of at most {most:,}, got {shown}")
    return values


MAX_BENCH_BATCH = 1_000_000  # rows per call at most; the device's free memory is checked once the model is loaded


MAX_BENCH_LENGTH = 4096  # tokens; the checkpoint's own position limit is checked when it is loaded


# --help's order: the bench's own options (its --steps, --batch and --length are lists and sizes of its own),
# then `dbert sample`'s --device (settings.SAMPLE)
LAYOUT: dict[str | None, tuple[str, ...]] = {None: (
    "checkpoint", "out", "quick", "steps", "batch", "samplers", "length", "measure_train", "bf16", "threads", "device")}


@with_settings(config.SAMPLE_SETTINGS, LAYOUT, rest=False)
def bench(
    checkpoint: Annotated[Optional[str], typer.Option(help="A store name (see `dbert checkpoints list`) or, with a path separator (./x, runs/x), a directory (default: the shipped model).")] = None,
    out: Annotated[str, typer.Option(help="Directory for bench.json and bench.md.")] = "bench",
    quick: Annotated[bool, typer.Option("--quick", help="Steps 16,128 only, fewer repetitions (minutes, not an hour).")] = False,
    steps: Annotated[Optional[str], typer.Option(help="Step budgets, comma-separated (default 16,128,512,2048).")] = None,
    batch: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "1,32",
    samplers: Annotated[str, typer.Option(help="Samplers, comma-separated (any of: " + ", ".join(strategies.names()) + "; each at its default parameters).")] = ",".join(config.SAMPLERS),
    length: Annotated[int, typer.Option(help="Tokens per sample.")] = 64,
    measure_train: Annotated[bool, typer.Option("--train/--no-train", help="Measure training tokens/s.")] = True,
    bf16: Annotated[bool, typer.Option(help="Also time the forward pass in bfloat16.")] = True,
    threads: Annotated[Optional[int], typer.Option(help="torch threads (default: torch's choice); the forward is also timed with 1..cores.")] = None,
    **declared,  # --device: `dbert sample`'s setting (settings.SAMPLE: options.with_settings)
):
    """Measure sampling speed, training tokens/s and forward efficiency on this machine (Markdown on stdout).

    Example: dbert bench --quick --out bench-results
    """
    import os
    import time

    import torch

    from ...evaluation.bench import markdown, run

    step_list = _int_list(steps, "--steps") if steps else ([16, 128] if quick else [16, 128, 512, 2048])
    batches = _int_list(batch, "--batch", MAX_BENCH_BATCH)
    if not 1 <= length <= MAX_BENCH_LENGTH:
        raise DbertError(f"--length must be in [1, {MAX_BENCH_LENGTH}], got {length}")
    from ...disk.output import check_output

    check_output(out, "--out", folder=True)  # before the hour of measuring, not after it
    from ...disk import layout

    for report in (layout.BENCH_JSON, layout.BENCH_MD):  # a link or folder at a report's name, too
        if os.path.lexists(Path(out) / report):
            check_output(Path(out) / report, "--out")
    chosen = [s.strip() for s in samplers.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in strategies.names()]
    if unknown or not chosen:
        raise DbertError(f"--samplers: choose from {', '.join(strategies.names())}, got {samplers!r}")
    if threads is not None:
        from ...evaluation.bench import check_threads

        check_threads(threads)
        torch.set_num_threads(threads)
    start = time.perf_counter()
    db = options.load(checkpoint, plain(declared)["device"])
    load_seconds = time.perf_counter() - start
    unsupported = [s for s in chosen if strategies.get(s).supports(db) is not None]
    for name in unsupported:
        say(f"bench: skipping {name}: {strategies.get(name).supports(db)}")
    chosen = [s for s in chosen if s not in unsupported]
    from ...evaluation.bench import check_batches

    check_batches(db, batches, length)  # before the first measurement
    from ...evaluation.bench import load_warning, machine
    from ..progress import SampleProgress

    say(f"bench: {db.path}, steps {step_list}, batch {batches}, samplers {chosen}; results in {out}/")
    if load_warning(machine(db.device)):  # said before the minutes of measuring, and kept in the report
        say(f"dbert: {load_warning(machine(db.device))}")
    result = run(db, Path(out), load_seconds, chosen, step_list, batches, length=length, quick=quick, train=measure_train,
                 bf16=bf16, threads=range(1, (os.cpu_count() or 1) + 1), report=say,
                 progress=lambda label, samples: SampleProgress(samples, samples, label=label))
    import errno

    try:
        sys.stdout.write(markdown(result))
        sys.stdout.flush()
    except OSError as e:  # a full disk or device behind stdout: the report is kept in --out all the same
        if e.errno == errno.EPIPE:
            raise
        raise DbertError(f"cannot write the report to stdout: {e.strerror or e}; it is in "
                         f"{Path(out) / layout.BENCH_MD} (and {layout.BENCH_JSON})") from None
