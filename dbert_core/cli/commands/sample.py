"""`dbert sample`: samples one per line on stdout, for a prompt, a prompt file or stdin; an
infill prompt ([MASK*A-B]) ranked by the model's bound; --output and --trajectory files."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from ... import config, strategies
from ...errors import DbertError
from .. import options
from ..options import SAMPLE, SAMPLER, no_params, plain, with_settings
from ..short_help import show_all
from ..streams import say

TOPK = 5  # candidates recorded per reveal in a --trajectory file (the token inspector shows them)
COMMON = ("prompt_arg", "checkpoint", "n", "steps", "temperature", "top_k", "top_p", "length", "seed", "prompt",
          "prompt_file", "output", "stats", "candidates", "help_all")  # `dbert sample --help`; --help-all: every option
# --help-all's order, the command's own options and its settings together; a setting named nowhere comes last
LAYOUT: dict[str | None, tuple[str, ...]] = {None: ("prompt_arg", "checkpoint", "n", "steps", "temperature", "top_k", "top_p", "length", "min_length",
                 "end_at_sentence", "natural_length", "start_as_trained", "batch_size", "workers", "seed", "prompt",
                 "prompt_file", "output", "sampler", "params", "block_repeats", "no_repeat_ngram", "pair_quotes", "fix_contractions",
                 "known_words", "lowercase", "stats", "trajectory", "device", "dtype", "prefix_cache",
                 "cache_refresh", "cache_masked", "candidates", "help_all")}
# what `dbert sample` says of a setting beyond its declaration: --sampler's names are the registry's, as it is then
CHANGED = {"sampler": {**SAMPLER, "help": "Decoding strategy. " + strategies.help_text() + ". Default: what the "
                                         "checkpoint recommends (dbert.json's sampling.decoding; the shipped model: "
                                         "blockwise), else first-hitting where the model allows it, else ancestral."}}


@with_settings(config.SAMPLE_SETTINGS, LAYOUT, CHANGED)
def sample(
    prompt_arg: Annotated[Optional[str], typer.Argument(metavar="[PROMPT]", show_default=False, help="A prompt template with [MASK] slots (\"Once upon a time [MASK*20]\"), or - to read prompts from stdin, one per line.")] = None,
    checkpoint: Annotated[Optional[str], typer.Option("--checkpoint", "-c", help="A store name (see `dbert checkpoints list`) or, with a path separator (./x, runs/x), a directory (default: the shipped model).")] = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Template with [MASK] slots ([MASK*N]: N of them; [MASK*A-B]: A to B tokens, see --candidates); masks are appended up to --length.")] = SAMPLE.prompt,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", help="Prompts from a file, one per line (- : stdin); --n samples each.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Also write the samples to this JSON Lines file: text, prompt, seed and settings per sample.")] = None,
    lowercase: Annotated[bool, typer.Option("--lowercase", help="Print the model's raw lower-case words (no truecasing; a prompt's words stay as typed).")] = False,
    stats: Annotated[bool, typer.Option("--stats", help="Print {nfe, rows, gflop, seconds, samples, batches, workers, at_once, steps, sampler, exact, params} as JSON on stderr (nfe: every batch's network calls; at_once: the batches that ran side by side).")] = False,
    trajectory: Annotated[Optional[Path], typer.Option(help="Also write every frame of the run to this JSON file (one batch: --n <= --batch-size; format in dbert_core/sampling/trajectory.py).")] = None,
    candidates: Annotated[int, typer.Option(help="Infill ([MASK*A-B] in the prompt): texts drawn for each length; all are ranked by the model's ELBO per token and the best --n printed, their scores on stderr.")] = 4,
    help_all: Annotated[bool, typer.Option("--help-all", is_eager=True, callback=show_all, help="Every option (precision, caches, touch-ups, story rules, workers), each name whole, and exit.")] = False,
    **declared,  # the settings (settings.SAMPLE), each an option of its own (options.with_settings)
):
    """Generate N samples, one per line on stdout; a story start inside a sample reads " ¶ ".

    Example: dbert sample "Once upon a time [MASK*20]" -n 3 --seed 1 -o stories.jsonl
    """
    prompts = _prompts(prompt_arg, prompt, prompt_file)
    given = plain(declared)
    sampler, param = given["sampler"], given.pop("params")
    if trajectory is not None and given["workers"] is None:
        given["workers"] = 1  # a recorded run's one batch, in turn
    cfg = config.SampleConfig(**given, params=strategies.parse_params(sampler, param) if sampler else no_params(param),
                              prompt=None).validate()
    _check_files(cfg, prompts, trajectory, output)
    if cfg.seed is None:  # drawn once here, so --output can say which seed made each sample
        import random

        cfg = replace(cfg, seed=random.SystemRandom().randrange(config.MAX_SEED))
    db = options.load(checkpoint, cfg.device)
    from ...sampling.preflight import check_sample

    check_sample(db, cfg, prompts, candidates)  # every prompt, infill length and batch, before the first step
    paragraph = _paragraph()
    _say_notes(db, prompts)
    run = _Run(cfg.n * len(prompts), cfg.batch_size, trajectory is not None)
    for p in prompts:
        run.one(db, replace(cfg, prompt=p), candidates, not lowercase, paragraph)
    run.progress.close()
    if trajectory is not None:
        from ...disk.atomic import atomic_write_text
        from ...sampling.sample import resolve
        from ...sampling.trajectory import trajectory as as_json

        atomic_write_text(trajectory, json.dumps(as_json(db, resolve(replace(cfg, prompt=prompts[0]), db), run.kept)) + "\n")
    if output is not None:
        from ...disk.atomic import atomic_write_text

        atomic_write_text(output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in run.records))
    for t in run.texts:  # a line at a time: one giant write to a pipe whose reader left can end "successfully"
        sys.stdout.write(t.replace("\n", " ") + "\n")
    sys.stdout.flush()
    if stats:
        say(run.stats_line())


def _check_files(cfg, prompts: list[str | None], trajectory: Path | None, output: Path | None) -> None:
    """--trajectory's one batch and both files' folders checked before the checkpoint loads."""
    from ...disk.output import check_output
    from ...sampling.infill import has_range

    if trajectory is not None and any(has_range(p) for p in prompts):
        raise DbertError("--trajectory records one batch; an infill prompt ([MASK*A-B]) runs one per length")
    if trajectory is not None:
        from ...sampling.parallel import plan

        if len(plan(cfg.n, cfg.batch_size, cfg.workers or 1)) > 1 or len(prompts) > 1:
            raise DbertError("--trajectory records one batch: give --n <= --batch-size, --workers 1 and one prompt")
        check_output(trajectory, "--trajectory")  # before the run, not after it
    if output is not None:
        check_output(output, "--output")


def _paragraph() -> str:
    """What a story start inside a sample reads: the pilcrow, or " | " where stdout cannot show it."""
    from ...text.detok import STORY_BREAK

    try:
        STORY_BREAK.encode(sys.stdout.encoding or "utf-8")
        return STORY_BREAK
    except (UnicodeEncodeError, LookupError):
        return " | "  # a terminal or pipe that cannot show the pilcrow


def _say_notes(db, prompts: list[str | None]) -> None:
    """The notes on each different prompt (sample.prompt_notes) on stderr, named when there are several."""
    from ...sampling.infill import has_range, variants
    from ...sampling.sample import prompt_notes

    for p in dict.fromkeys(x for x in prompts if x is not None):
        for note in prompt_notes(db, variants(p)[0][1] if has_range(p) else p):
            say(f"dbert: note: {note}" + (f" ({p[:40]!r})" if len(prompts) > 1 else ""))


SETTINGS = ("steps", "temperature", "top_k", "top_p", "length", "min_length", "end_at_sentence", "natural_length",
            "start_as_trained", "sampler", "params", "block_repeats", "no_repeat_ngram", "dtype", "prefix_cache", "cache_refresh",
            "cache_masked", "batch_size", "workers")  # an --output line's settings, as resolved
SUMMED = ("nfe", "rows", "gflop", "seconds", "samples", "batches")  # --stats figures added up over the prompts


class _Run:
    """What a `dbert sample` run gathers over its prompts: the texts, the --output lines, the
    summed --stats, each infill prompt's cost, and the frames --trajectory keeps."""

    def __init__(self, samples: int, batch_size: int, keep_frames: bool):
        from ..progress import SampleProgress

        self.keep_frames = keep_frames
        self.progress = SampleProgress(samples, batch_size)
        self.texts: list[str] = []
        self.records: list[dict] = []  # the --output file's lines, one a sample
        self.stats: dict | None = None
        self.infill_stats: list[dict] = []  # one a [MASK*A-B] prompt: its drawing's and its ranking's cost
        self.kept: list = []

    def one(self, db, run, candidates: int, cased: bool, paragraph: str) -> None:
        """One prompt's samples (run.prompt): an infill prompt ranked (_infill), any other generated."""
        from ...sampling.infill import has_range
        from ...sampling.sample import generate, resolve

        if has_range(run.prompt):
            got, st = _infill(db, run, candidates, cased, paragraph, self.records)
            self.texts.extend(got)
            self.infill_stats.append(st)
            return
        resolved = resolve(run, db)
        assert resolved.steps is not None  # resolve fills it in
        self.progress.per_window = resolved.steps  # a long story's frames count steps on across its windows
        got, st = generate(db, resolved, on_frame=self.on_frame, cased=cased, paragraph=paragraph,
                           topk=TOPK if self.keep_frames else 0,
                           every_frame=self.keep_frames)  # the progress line needs the done frames only
        self.texts.extend(got)
        self.records.extend({"text": t, "prompt": run.prompt, "index": i, "seed": run.seed, "checkpoint": str(db.path),
                             "settings": {k: getattr(resolved, k) for k in SETTINGS}, "stats": st}
                            for i, t in enumerate(got))
        self.stats = st if self.stats is None else {k: (self.stats[k] + st[k] if k in SUMMED else st[k]) for k in st}

    def on_frame(self, frame) -> None:
        self.progress(frame)
        if self.keep_frames:
            self.kept.append(frame)

    def stats_line(self) -> str:
        """--stats as JSON: the generated prompts' sums, with the infill prompts' costs beside them."""
        st, infill_stats = self.stats, self.infill_stats
        if infill_stats and st is None and len(infill_stats) == 1:
            return json.dumps(infill_stats[0])
        return json.dumps({**st, "infill": infill_stats} if infill_stats and st else
                          {"infill": infill_stats} if infill_stats else st)


def _infill(db, cfg, candidates: int, cased: bool, paragraph: str, records: list) -> tuple[list[str], dict]:
    """An infill prompt ([MASK*A-B]): every length drawn `candidates` times, ranked by ELBO per
    token (infill.py); the best cfg.n texts and the run's cost (--stats) returned, their scores on
    stderr and in records. Progress on stderr: the drawing, then the ranking."""
    from ...sampling.infill import infill, variants
    from ...sampling.sample import resolve
    from ..progress import CountProgress, SampleProgress

    from ...sampling.infill import DRAWS, SCORE_STEPS

    lengths = len(variants(cfg.prompt))
    texts = lengths * candidates
    say(f"dbert: infill: {texts} texts to draw ({lengths} lengths x {candidates} candidates), then to rank by "
        f"the {SCORE_STEPS}-step bound over {DRAWS} corruptions")
    drawing = SampleProgress(texts, candidates, label="infill: drawing")
    ranking: list = []  # its progress, from the ranking's start (its elapsed time and ETA are the ranking's)

    def ranked_so_far(done: int, total: int, fraction: float) -> None:
        if not ranking:
            drawing.close()
            ranking.append(CountProgress(total, total, label="infill: ranking"))
        ranking[0].update(done, fraction)

    st: dict = {}
    try:
        ranked = infill(db, resolve(cfg, db), per_length=candidates, cased=cased, paragraph=paragraph,
                        on_frame=drawing, on_rank=ranked_so_far, stats=st)
    finally:
        drawing.close()
        for progress in ranking:
            progress.close()
    best = ranked[:cfg.n]
    if len(best) < cfg.n:  # the same text drawn twice is kept once
        say(f"dbert: note: only {len(best)} different texts among those drawn for --n {cfg.n}; "
            "raise --candidates for more")
    for i, c in enumerate(best):
        say(f"dbert: infill #{i + 1}: {c.score:.4f} nats/token, lengths {','.join(map(str, c.lengths))}, "
            f"{c.tokens} tokens")
        records.append({"text": c.text, "prompt": cfg.prompt, "index": i, "seed": cfg.seed, "checkpoint": str(db.path),
                        "infill": c.record(), "stats": st})
    return [c.text for c in best], st


def _prompts(arg: str | None, option: str | None, file: Path | None) -> list[str | None]:
    """The prompts of a `dbert sample` run: the positional one, --prompt, or --prompt-file / - (stdin,
    one per line, blank lines skipped); [None] for an unconditional run."""
    given = [x for x in (arg, option, file) if x is not None]
    if len(given) > 1:
        raise DbertError("give one prompt source: PROMPT, --prompt or --prompt-file")
    if file is not None or arg == "-":
        from ...sampling.prompt import prompt_lines

        if file is None or str(file) == "-":  # PROMPT - or --prompt-file -
            raw = getattr(sys.stdin, "buffer", None)  # the bytes; a text stream without one (a test's StringIO) as text
            return [*prompt_lines(raw.read() if raw is not None else
                                  sys.stdin.read().encode("utf-8", "surrogateescape"), "stdin")]
        try:
            return [*prompt_lines(Path(file).read_bytes(), f"--prompt-file {file}")]
        except OSError as e:
            raise DbertError(f"cannot read --prompt-file {file}: {e.strerror}") from None
    return [arg if arg is not None else option]
