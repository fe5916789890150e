"""scripts/studies/decoding.py end to end at toy scale: the TV table, three frontier settings under a
stand-in judge, the doc written; run again it reuses what is done; --doc-only keeps the notes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from helpers import TINYSTORIES, TINYSTORIES_VALID

ROOT = Path(__file__).resolve().parent.parent


def script():
    spec = importlib.util.spec_from_file_location("decoding_script", ROOT / "scripts" / "studies" / "decoding.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["decoding_script"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_runs_resumes_and_writes_the_doc(tiny_checkpoint, tmp_path):
    mod = script()
    out, doc = tmp_path / "runs", tmp_path / "docs" / "decoding.md"
    args = ["--checkpoint", str(tiny_checkpoint), "--data", str(TINYSTORIES_VALID), "--tv-data", str(TINYSTORIES),
            "--judge-data", str(TINYSTORIES_VALID), "--tv-draws", "300", "--samples", "4", "--length", "12",
            "--settings", "first-hitting-T1.0,confidence-S16,threshold-0.7", "--train-judge", "3",
            "--out", str(out), "--doc", str(doc)]
    assert mod.main(args) == 0
    text = doc.read_text()
    for needle in ("## How far from the model's law", "Noise floor", "| `first-hitting` | exact |",
                   "| `confidence` | heuristic |", "| threshold-0.7 | `threshold` | heuristic | tau=0.7 |",
                   "| human text |", "**stand-in**", "Target (at least 2x fewer calls"):
        assert needle in text, needle
    assert len(list((out / "frontier").glob("*.json"))) == 3
    stamps = {p: p.stat().st_mtime_ns for p in (out / "frontier").glob("*.json")} | {out / "tv.json": (out / "tv.json").stat().st_mtime_ns}
    doc.write_text(text + "my own notes\n")
    assert mod.main(args) == 0  # everything done: nothing is measured again
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert mod.main(["--doc-only", "--out", str(out), "--doc", str(doc)]) == 0
    assert doc.read_text().endswith("my own notes\n") and "| human text |" in doc.read_text()
    assert mod.main(["--out", str(out), "--doc", str(doc), "--skip", "tv", "--checkpoint", str(tiny_checkpoint)]) == 2


@pytest.mark.slow
def test_samples_drawn_once_are_scored_later_under_a_judge(tiny_checkpoint, tmp_path):
    import json

    mod = script()
    out, doc = tmp_path / "runs", tmp_path / "docs" / "decoding.md"
    common = ["--checkpoint", str(tiny_checkpoint), "--data", str(TINYSTORIES_VALID), "--samples", "4",
              "--length", "12", "--settings", "first-hitting-T1.0,threshold-0.7", "--skip", "tv",
              "--out", str(out), "--doc", str(doc)]
    assert mod.main(common + ["--sample-only"]) == 0
    assert not doc.exists()  # nothing to write a doc from yet
    drawn = {p.name: json.loads(p.read_text()) for p in (out / "frontier").glob("*.json")}
    assert len(drawn) == 2 and all("gen_ppl" not in r and len(r["texts"]["first"]) == 4 for r in drawn.values())
    assert mod.main(["--doc-only", "--out", str(out), "--doc", str(doc)]) == 0  # a doc of what is there so far
    assert "Drawn but not yet scored under a judge" in doc.read_text() and "| human text |" not in doc.read_text()
    assert mod.main(common + ["--judge-data", str(TINYSTORIES_VALID), "--train-judge", "3"]) == 0
    for name, before in drawn.items():
        after = json.loads((out / "frontier" / name).read_text())
        assert after["texts"] == before["texts"] and after["seconds_total"] == before["seconds_total"]  # not redrawn
        assert after["gen_ppl"] > 1 and after["human_texts"] == 4 and after["judge"].endswith("judge-3")
    assert "| human text |" in doc.read_text()
