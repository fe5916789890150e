"""scripts/studies/ar_baseline.py at toy scale: the diffusion run's own windows and tokenizer, a
token budget met, a resume that continues where it stopped, an exact held-out perplexity."""

from __future__ import annotations

import importlib.util
import json

from helpers import ROOT, TINYSTORIES_VALID


def script():
    spec = importlib.util.spec_from_file_location("ar_baseline", ROOT / "scripts" / "studies" / "ar_baseline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trains_resumes_and_scores(tiny_checkpoint, tmp_path, capsys):
    from dbert_core import checkpoint

    mod = script()
    db = checkpoint.load(tiny_checkpoint)
    rows = mod.windows(db, db.meta["train_config"]["data"], db.meta["seq_len"])
    assert rows and all(len(r) <= db.meta["seq_len"] for r in rows)
    out = tmp_path / "ar"
    assert mod.main(["train", str(tiny_checkpoint), "--out", str(out), "--tokens", "2000", "--save-every", "2"]) == 0
    state = json.loads((out / "state.json").read_text())
    assert state["step"] == state["steps"] >= 2 and state["tokens_seen"] >= 2000 * 0.8
    assert abs(state["params"] - sum(p.numel() for p in mod.build(db, db.meta["seq_len"]).parameters())) == 0
    # run again: nothing left to do, the same state
    assert mod.main(["train", str(tiny_checkpoint), "--out", str(out), "--tokens", "2000"]) == 0
    assert json.loads((out / "state.json").read_text())["step"] == state["step"]
    capsys.readouterr()
    assert (out / "vocab.txt").is_file()  # a causal LM folder with its tokenizer: a judge
    from dbert_core.judge import Judge

    assert Judge(str(out)).model.config.n_embd == 384
    assert mod.main(["eval", str(out), "--heldout", str(TINYSTORIES_VALID), "--limit", "20"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sentences"] == 20 and result["tokens"] > 20 and 1 < result["ppl_token"] < 2 * len(db.tokenizer)
