"""The Train screen's runs beside the Generate screen's sampling, driven with Pilot."""

from __future__ import annotations

import pytest

from dbert_core.storage import store
from dbert_tui.app import create_app
from dbert_tui.controller import Settings
from helpers import SIZE, TINYSTORIES, finished, wait_for

pytestmark = pytest.mark.anyio


def stats(tr) -> str:
    return str(tr.query_one("#tr-stats").render())


async def test_training_validates_in_a_thread_that_sampled_before(tiny_db):
    """Textual runs thread workers in one reused pool: the training worker gets the thread the
    Generate screen's bf16 sampler ran in, whose attention workspace (maths/model.py) was made
    under torch.inference_mode and is larger than validation needs. Validation (no_grad, bf16)
    writes into it: it must train on, validate and save."""
    from dbert_core.storage.checkpoint import read_meta

    app = create_app(checkpoint=tiny_db.path, loader=lambda p: tiny_db, train_data=[str(TINYSTORIES)],
                     settings=Settings(pace_ms=0, steps=8, length=120, sampler="ancestral", top_k=0, dtype="bf16"),
                     deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app), what="the bf16 run")
        await pilot.press("3")
        await wait_for(pilot, lambda: app.current_mode == "train")
        tr = app.train_screen
        for wid, value in {"tr-out": "validated", "tr-steps": "6", "tr-batch": "8", "tr-seq": "16", "tr-T": "64",
                           "tr-eval": "3", "tr-sample": "2", "tr-warmup": "2", "tr-save": "0"}.items():
            tr.query_one(f"#{wid}").value = value
        tr.query_one("#tr-unit").value = "sentence"
        tr.query_one("#tr-dtype").value = "bf16"
        await pilot.press("f5")
        await wait_for(pilot, lambda: "finished" in stats(tr) or "failed" in stats(tr), timeout=120, what="the run")
        assert "finished at step 6" in stats(tr), stats(tr)
        assert [s for s, _ in tr.vals] == [3, 6]
        assert read_meta(store.store_dir() / "validated")["step"] == 6


async def test_a_new_run_does_not_show_the_last_runs_sample(tiny_db):
    """The sample preview of the run before (a failed one's too) stayed under a new run until its
    own first sample."""
    app = create_app(checkpoint=tiny_db.path, loader=lambda p: tiny_db, train_data=[str(TINYSTORIES)],
                     settings=Settings(pace_ms=0, steps=8, length=20, sampler="ancestral", top_k=0), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("3")
        await wait_for(pilot, lambda: app.current_mode == "train")
        tr = app.train_screen
        preview = lambda: str(tr.query_one("#tr-preview").render())  # noqa: E731
        for name, sample in (("first", "2"), ("second", "1000")):
            for wid, value in {"tr-out": name, "tr-steps": "4", "tr-batch": "8", "tr-seq": "16", "tr-T": "64",
                               "tr-eval": "0", "tr-sample": sample, "tr-warmup": "1", "tr-save": "0"}.items():
                tr.query_one(f"#{wid}").value = value
            tr.query_one("#tr-unit").value = "sentence"
            await pilot.press("f5")
            await wait_for(pilot, lambda: "finished" in stats(tr) or "failed" in stats(tr), timeout=120, what=name)
            assert "finished at step 4" in stats(tr), stats(tr)
            if name == "first":
                assert "[step " in preview()
        assert "[step " not in preview(), preview()  # the second run drew no sample: none is shown


async def test_a_run_from_a_csv_file_reads_its_text_column(tmp_path):
    """A Kaggle or pandas export (a header, the text in its "text" column) typed as the data path:
    the run tokenizes each row's text, not the file's lines of CSV."""
    import csv
    from pathlib import Path

    from dbert_core.storage import checkpoint
    from dbert_core.text.data import encode
    from dbert_core.text.token_cache import cache_key, open_entry
    from dbert_core.training.story_data import cache_root, file_prints

    fixture = checkpoint.load(Path(__file__).parent / "fixtures" / "tiny")
    lines = [f"the {who} saw a {what}, and ran." for who in ("dog", "cat", "bird") for what in ("ball", "box", "tree")]
    data = tmp_path / "rows.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows([["id", "text"], *([i, t] for i, t in enumerate(lines * 4))])
    app = create_app(checkpoint=fixture.path, loader=lambda p: fixture,
                     settings=Settings(pace_ms=0, steps=4, length=12, sampler="ancestral", top_k=0), deterministic=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, finished(app))
        await pilot.press("3")
        await wait_for(pilot, lambda: app.current_mode == "train")
        tr = app.train_screen
        for wid, value in {"tr-data": str(data), "tr-out": "from-csv", "tr-steps": "2", "tr-batch": "4", "tr-seq": "16",
                           "tr-T": "32", "tr-eval": "0", "tr-sample": "0", "tr-warmup": "1", "tr-save": "0"}.items():
            tr.query_one(f"#{wid}").value = value
        tr.query_one("#tr-unit").value = "line"
        await pilot.press("f5")
        await wait_for(pilot, lambda: "finished" in stats(tr) or "failed" in stats(tr), timeout=120, what="the run")
        assert "finished at step 2" in stats(tr), stats(tr)
    tok = checkpoint.load(store.store_dir() / "from-csv").tokenizer
    entry = open_entry(cache_root() / cache_key(file_prints([str(data)]), tok, "line", "auto")[0])
    assert [entry.doc(i).tolist() for i in range(len(entry))] == encode(lines * 4, tok)
