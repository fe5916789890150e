"""scripts/studies/ablations.py end to end on a tiny BERT: two rows, a few steps, the table written;
run again it reuses what is done; with more steps it continues every run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers import TINYSTORIES, TINYSTORIES_VALID

ROOT = Path(__file__).resolve().parent.parent


def ablations():
    spec = importlib.util.spec_from_file_location("ablations", ROOT / "scripts" / "studies" / "ablations.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ablations"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_grid_runs_resumes_and_writes_the_table(bert_dir, tmp_path):
    mod = ablations()
    doc, out = tmp_path / "docs" / "reproduction.md", tmp_path / "runs"
    args = ["--init", str(bert_dir), "--data", str(TINYSTORIES), "--val-data", str(TINYSTORIES_VALID), "--rows", "1,5",
            "--steps", "4", "--samples", "4", "--eval-sentences", "24", "--seq-len", "16", "--batch-size", "8",
            "--device", "cpu", "--out", str(out), "--doc", str(doc)]
    assert mod.main(args) == 0
    text = doc.read_text()
    assert "| 1 | pretrained | spindle | TAD |" in text and "| 5 | random | spindle | TAD |" in text
    assert "DiffusionBERT, spindle, TAD | 63.78" in text  # the paper's row beside ours
    assert "a pretrained start beats random init" in text and "paired 95% interval" in text
    ev = json.loads((out / "1-bert-spindle-tad" / "eval.json").read_text())
    assert ev["samples"] == 4 and ev["block_repeats"] is False and ev["ppl_token"] > 1
    meta = json.loads((out / "5-scratch-spindle-tad" / "dbert.json").read_text())
    assert meta["from_scratch"] is True and meta["step"] == 4
    stamp = (out / "1-bert-spindle-tad" / "eval.json").stat().st_mtime_ns
    doc.write_text(doc.read_text() + "\nA hand-written reading of the table.\n")  # after the notes marker
    assert mod.main(args) == 0  # nothing to do: the same runs and evaluations are reused
    assert (out / "1-bert-spindle-tad" / "eval.json").stat().st_mtime_ns == stamp
    again = doc.read_text()
    assert again.count(mod.NOTES) == 1 and again.rstrip().endswith("A hand-written reading of the table.")
    longer = [*args[:args.index("--steps") + 1], "6", *args[args.index("--steps") + 2:]]
    assert mod.main(longer) == 0  # more steps: every run continues and is evaluated again
    assert json.loads((out / "1-bert-spindle-tad" / "dbert.json").read_text())["step"] == 6
    assert (out / "1-bert-spindle-tad" / "eval.json").stat().st_mtime_ns != stamp


def test_bad_rows_are_one_line(bert_dir, tmp_path):
    with pytest.raises(SystemExit, match="--rows"):
        ablations().main(["--init", str(bert_dir), "--rows", "1,9", "--out", str(tmp_path)])


def test_speed_is_the_median_of_logged_intervals(tmp_path):
    """A paused interval (a shared machine, a stopped run) does not drag the row's tokens/s down."""
    mod = ablations()
    row = mod.ROWS[0]
    state = tmp_path / row.name / "trainer_state" / "state.json"
    state.parent.mkdir(parents=True)
    history = [{"step": 10 * i, "tokens_per_s": v} for i, v in enumerate([2000.0, 12.0, 2100.0, 1900.0, 2050.0], 1)]
    state.write_text(json.dumps({"step": 50, "history": history + [{"step": 50, "val_ppl_token": 9.0}]}))
    assert mod.speed(row, type("A", (), {"out": tmp_path})()) == 2000.0


def test_claims_need_a_gap_beyond_the_noise_floor_and_the_paired_interval():
    """Row 1 against rows 2-5 on the same sentences: a clear gap agrees, a reversed one disagrees,
    one inside the seed noise floor (row 1 vs row 7) or the paired interval is not resolved."""
    import random

    mod = ablations()
    rng = random.Random(0)
    base = [rng.uniform(20, 80) for _ in range(400)]  # sentences differ a lot; pairing removes that
    tokens = [10] * 400

    def row(shift, jitter=0.5):
        nats = [b + shift + rng.gauss(0, jitter) for b in base]
        return {"example_nats": nats, "example_tokens": tokens, "ppl_token": 2.718281828 ** (sum(nats) / 4000)}

    evals = {1: row(0.0), 7: row(0.3), 5: row(15.0), 2: row(-8.0), 3: row(0.1), 4: row(0.2, jitter=40.0)}
    rows = [r for r in mod.ROWS if r.n in evals]
    lines = mod.findings(rows, evals)
    verdicts = {n: next(x for x in lines if f"(row {n})" in x) for n in (5, 2, 3, 4)}
    assert verdicts[5].endswith("agrees.") and verdicts[2].endswith("disagrees.")
    assert "seed noise floor" in verdicts[3]  # +1% per token, the seeds differ by +3%
    assert "evaluation interval" in verdicts[4]  # the same mean gap, but each sentence is noisy
    assert lines[0].startswith("- Noise floor: row 7")
    g, half = mod.paired_gap(evals, 1, 5)
    assert abs(g - 1.5) < 0.01 and half < 0.01  # 15 nats over 10 tokens a sentence
