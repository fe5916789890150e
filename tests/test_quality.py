"""One quality figure per checkpoint (dbert.json's `quality`): the README, `dbert checkpoints list` and the
TUI's details pane say the same number and what it is; a damaged field is one line at load."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from helpers import ROOT, run

SHIPPED = ROOT / "assets" / "dbert-minilm-stories"


def test_the_shipped_models_figure_is_the_same_in_the_readme_the_list_and_the_tui(capsys, monkeypatch):
    from dbert_core.storage import store
    from dbert_tui.screens.checkpoints import entry_details

    q = json.loads((SHIPPED / "dbert.json").read_text())["quality"]
    figure = f"{q['ppl_token']:.2f}"
    assert f"**{figure}** per token" in (ROOT / "README.md").read_text()
    code, out, err = run(["checkpoints", "list"], capsys, monkeypatch)
    row = next(line for line in out.splitlines() if "dbert-minilm-stories" in line)
    assert code == 0 and f" {figure} " in row
    assert "held-out whole stories" in err  # the list says what the column is
    code, out, _ = run(["checkpoints", "list", "--json"], capsys, monkeypatch)
    shipped = next(json.loads(line) for line in out.splitlines() if "dbert-minilm-stories" in line)
    assert shipped["val_ppl_token"] == q["ppl_token"] and "exact 128-step bound" in shipped["quality"]
    entry = next(e for e in store.entries() if e.path.resolve() == SHIPPED.resolve())
    pane = entry_details(entry).plain
    assert f"quality: ppl {figure} per token (held-out whole stories" in pane
    assert "/work/" not in pane and ".devdata" not in pane  # no path of the machine that trained it
    assert re.search(r"data: head-train\.txt and \d+ more", pane)


@pytest.mark.parametrize("bad, field", [({"ppl_token": "low"}, "quality.ppl_token"), ({"ppl_token": 0.5}, "quality.ppl_token"),
                                        ({"ppl_token": 9.0, "what": 3}, "quality.what"), ("good", "'quality'")])
def test_a_damaged_quality_field_is_one_line_naming_it(tiny_checkpoint, tmp_path, capsys, monkeypatch, bad, field):
    ck = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, ck)
    meta = json.loads((ck / "dbert.json").read_text())
    meta["quality"] = bad
    (ck / "dbert.json").write_text(json.dumps(meta))
    code, out, err = run(["sample", "-c", str(ck), "--n", "1", "--length", "8", "--steps", "4"], capsys, monkeypatch)
    assert code == 2 and out == "" and field in err and err.count("\n") == 1 and "Traceback" not in err


def test_without_a_quality_figure_the_list_shows_the_last_validation_bound(tiny_checkpoint):
    from dbert_core.storage.store import _val_ppl, quality

    meta = json.loads((tiny_checkpoint / "dbert.json").read_text())
    assert quality(meta) is None
    meta["val_ppl_token"] = 33.3
    assert _val_ppl(tiny_checkpoint, meta) == 33.3
    meta["quality"] = {"ppl_token": 20.5, "what": "held-out \x1b[31mlines"}
    assert _val_ppl(tiny_checkpoint, meta) == 20.5 and "\x1b" not in quality(meta)[1]
