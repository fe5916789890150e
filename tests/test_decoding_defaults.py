"""A checkpoint's recommended decoding (dbert.json's sampling.decoding: steps, top-k, top-p) is
what `dbert sample`, eval, serve and the TUI use unless told; each value the user gives wins, field
by field; a checkpoint that recommends nothing samples with 96 steps at top-k 30, top-p off."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from helpers import run


@pytest.fixture
def recommending(tiny_checkpoint, tmp_path):
    """A copy of the tiny checkpoint whose dbert.json recommends 12 steps of nucleus 0.9 without top-k."""
    out = tmp_path / "nucleus"
    shutil.copytree(tiny_checkpoint, out)
    meta = json.loads((out / "dbert.json").read_text())
    meta.setdefault("sampling", {})["decoding"] = {"steps": 12, "top_k": 0, "top_p": 0.9}
    (out / "dbert.json").write_text(json.dumps(meta))
    return out


def test_resolve_takes_the_checkpoints_decoding_field_by_field(recommending, tiny_db):
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.sample import resolve
    from dbert_core.storage import checkpoint

    db = checkpoint.load(recommending)
    got = resolve(SampleConfig(), db)
    assert (got.steps, got.top_k, got.top_p) == (12, 0, 0.9)
    assert resolve(SampleConfig(steps=40), db).steps == 40
    got = resolve(SampleConfig(top_k=5), db)  # the user's top-k, the checkpoint's top-p
    assert (got.top_k, got.top_p) == (5, 0.9)
    got = resolve(SampleConfig(top_p=1.0), db)
    assert (got.top_k, got.top_p) == (0, 1.0)
    got = resolve(SampleConfig(), tiny_db)  # recommends nothing: 96 steps, the paper's top-k 30, no nucleus
    assert (got.steps, got.top_k, got.top_p) == (96, 30, 1.0)
    T = db.schedule.T
    for bad in ({"top_k": -1, "top_p": 1.5, "steps": 0}, {"top_k": "0", "top_p": True, "steps": 12.0}, "nucleus",
                {"top_p": 0, "steps": T + 1}):
        db.meta["sampling"]["decoding"] = bad  # a hand-edited file's bad values: the general defaults
        got = resolve(SampleConfig(), db)
        assert (got.steps, got.top_k, got.top_p) == (96, 30, 1.0), bad
    db.meta["sampling"]["decoding"] = {"top_p": 0.5}  # one value given: the other is the general default
    got = resolve(SampleConfig(), db)
    assert (got.top_k, got.top_p) == (30, 0.5)


def test_dbert_sample_uses_and_records_the_recommendation(recommending, tiny_checkpoint, tmp_path, capsys,
                                                          monkeypatch):
    common = ["--n", "4", "--seed", "3", "--length", "16"]
    jsonl = tmp_path / "out.jsonl"
    code, own, _ = run(["sample", "-c", str(recommending), *common, "-o", str(jsonl)], capsys, monkeypatch)
    assert code == 0 and len(own.splitlines()) == 4
    settings = [json.loads(line)["settings"] for line in jsonl.read_text().splitlines()]
    assert all((s["steps"], s["top_k"], s["top_p"]) == (12, 0, 0.9) for s in settings)
    # the same draws as asking for that decoding on the plain checkpoint, and not those of its top-k 30
    code, asked, _ = run(["sample", "-c", str(tiny_checkpoint), *common, "--steps", "12", "--top-k", "0", "--top-p", "0.9"],
                         capsys, monkeypatch)
    assert code == 0 and asked == own
    code, plain, _ = run(["sample", "-c", str(tiny_checkpoint), *common], capsys, monkeypatch)
    assert code == 0 and plain != own
    code, told, _ = run(["sample", "-c", str(recommending), *common, "--steps", "96", "--top-k", "30", "--top-p", "1"],
                        capsys, monkeypatch)
    assert code == 0 and told == plain  # the user's word wins
    code, _, err = run(["sample", "-c", str(recommending), "--top-p", "0"], capsys, monkeypatch)
    assert code != 0 and "--top-p" in err and "Traceback" not in err


def test_eval_samples_and_the_server_use_the_recommendation(recommending, capsys, monkeypatch):
    from helpers import TINYSTORIES_VALID

    from dbert_core.serving.options import Limits
    from dbert_core.serving.request import parse
    from dbert_core.storage import checkpoint

    code, out, _ = run(["eval", "-c", str(recommending), "--data", str(TINYSTORIES_VALID), "--limit", "4", "--samples", "2",
                        "--sample-length", "12", "--json"], capsys, monkeypatch)
    result = json.loads(out)
    assert code == 0 and (result["sample_steps"], result["top_k"], result["top_p"]) == (12, 0, 0.9)
    db = checkpoint.load(recommending)
    plan = parse({"prompt": "Once", "max_tokens": 8}, db, "m", Limits())
    assert (plan.prompts[0].cfg.steps, plan.prompts[0].cfg.top_k, plan.prompts[0].cfg.top_p) == (12, 0, 0.9)
    plan = parse({"prompt": "Once", "max_tokens": 8, "top_p": 1, "dbert": {"top_k": 7}}, db, "m", Limits())
    assert (plan.prompts[0].cfg.top_k, plan.prompts[0].cfg.top_p) == (7, 1.0)


def test_the_tui_follows_each_checkpoints_decoding_until_the_user_sets_it(recommending, tiny_db):
    from dbert_core.storage import checkpoint
    from dbert_tui.controller import Session, Settings
    from dbert_tui.widgets.generate.controls import _value

    nucleus = checkpoint.load(recommending)
    s = Session(Settings())
    assert _value(s.settings, "top_p") == "?"  # before a checkpoint loads nothing is in force (the bar: no checkpoint yet)
    s.fit(nucleus)
    assert (s.settings.steps, s.settings.top_k, s.settings.top_p) == (12, 0, 0.9)
    assert (_value(s.settings, "top_k"), _value(s.settings, "top_p")) == ("off", "0.9")
    s.fit(tiny_db)  # another checkpoint: its own recommendation (none: 30, off)
    assert (s.settings.steps, s.settings.top_k, s.settings.top_p) == (96, 30, 1.0)
    s.fit(nucleus)
    s.top_p(nucleus)  # `o`: the next nucleus mass, now the user's
    chosen = s.settings.top_p
    assert chosen != 0.9
    s.fit(tiny_db)
    assert (s.settings.top_k, s.settings.top_p) == (30, chosen)  # top-k still follows, top-p stays
    s.steps(tiny_db, 2.0)  # `]`: the steps are the user's from now on
    s.fit(nucleus)
    assert (s.settings.steps, s.settings.top_k) == (192, 0)
    given = Session(Settings(top_k=5))  # dbert-tui --top-k 5
    given.fit(nucleus)
    assert (given.settings.top_k, given.settings.top_p) == (5, 0.9)
    assert replace(given.settings).validate()


def test_a_checkpoints_temperature_is_the_default_everywhere_unless_told(recommending, tiny_checkpoint, capsys,
                                                                         monkeypatch):
    """sampling.decoding.temperature (the shipped model's, chosen by blind readers): what sample, eval, the
    server and the TUI use unless told; a malformed one, or none, is 1."""
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.sample import resolve
    from dbert_core.serving.options import Limits
    from dbert_core.serving.request import parse
    from dbert_core.storage import checkpoint
    from dbert_tui.controller import Session, Settings

    meta = json.loads((recommending / "dbert.json").read_text())
    meta["sampling"]["decoding"]["temperature"] = 0.5
    (recommending / "dbert.json").write_text(json.dumps(meta))
    db = checkpoint.load(recommending)
    assert resolve(SampleConfig(), db).temperature == 0.5
    assert resolve(SampleConfig(temperature=1.0), db).temperature == 1.0
    assert resolve(SampleConfig(temperature=0), db).temperature == 0  # greedy is a value, not "unset"
    assert resolve(SampleConfig(), checkpoint.load(tiny_checkpoint)).temperature == 1.0
    for bad in (-1, "0.5", True, None):
        db.meta["sampling"]["decoding"]["temperature"] = bad
        assert resolve(SampleConfig(), db).temperature == 1.0, bad
    db.meta["sampling"]["decoding"]["temperature"] = 0.5
    assert parse({"prompt": "Once", "max_tokens": 8}, db, "m", Limits()).prompts[0].cfg.temperature == 0.5
    assert parse({"prompt": "Once", "max_tokens": 8, "temperature": 1}, db, "m", Limits()).prompts[0].cfg.temperature == 1
    s = Session(Settings())
    s.fit(db)
    assert s.settings.temperature == 0.5
    s.temperature(db, +1)  # `+`: the user's from now on
    assert s.settings.temperature > 0.5
    common = ["--n", "3", "--seed", "3", "--length", "16"]
    code, own, _ = run(["sample", "-c", str(recommending), *common], capsys, monkeypatch)
    code2, asked, _ = run(["sample", "-c", str(tiny_checkpoint), *common, "--steps", "12", "--top-k", "0", "--top-p", "0.9",
                           "--temperature", "0.5"], capsys, monkeypatch)
    code3, hot, _ = run(["sample", "-c", str(recommending), *common, "--temperature", "1"], capsys, monkeypatch)
    assert code == code2 == code3 == 0 and own == asked and hot != own


def test_set_decoding_changes_the_recommendation_and_nothing_else(tiny_checkpoint, tmp_path, capsys):
    """scripts/recipes/set_decoding.py: how the shipped model's decoding is set (blind readers chose it)."""
    tool = _set_decoding()
    ck = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, ck)
    before = {p.name: p.read_bytes() for p in ck.iterdir() if p.is_file()}
    meta = json.loads(before["dbert.json"])
    assert tool.main([str(ck), "--steps", "64", "--temperature", "0.5", "--top-p", "0.93", "--cache-masked"]) == 0
    after = json.loads((ck / "dbert.json").read_text())
    assert after["sampling"]["decoding"] == {"steps": 64, "temperature": 0.5, "top_p": 0.93, "cache_masked": True}
    after["sampling"].pop("decoding")
    if "sampling" not in meta and not after["sampling"]:
        del after["sampling"]  # the tiny checkpoint had no sampling field: the tool made it for the decoding alone
    meta.get("sampling", {}).pop("decoding", None)
    assert after == meta  # nothing else in dbert.json changed
    assert all((ck / name).read_bytes() == data for name, data in before.items() if name != "dbert.json")
    capsys.readouterr()
    for bad, said in ((["--top-p", "5"], "--top-p"), (["--temperature", "-1"], "--temperature"), ([], "at least one")):
        assert tool.main([str(ck), *bad]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1
    assert tool.main([str(tmp_path / "nowhere")]) == 2
    assert json.loads((ck / "dbert.json").read_text())["sampling"]["decoding"]["steps"] == 64  # refused: unchanged


def test_a_checkpoint_may_recommend_its_sampler_and_its_parameters(recommending, tiny_checkpoint, tmp_path, capsys,
                                                                    monkeypatch):
    """sampling.decoding's sampler and params (the shipped model's blockwise, chosen by blind readers): the
    sampler sample, eval, the server and the TUI use unless told; its parameters apply to it alone; one
    that is not registered, cannot run on the checkpoint or has bad parameters falls back to the fastest
    exact sampler; a sampler name that is not a string is refused when the checkpoint loads."""
    from dbert_core.config import SampleConfig
    from dbert_core.errors import DbertError
    from dbert_core.sampling.sample import resolve
    from dbert_core.serving.options import Limits
    from dbert_core.serving.request import parse
    from dbert_core.storage import checkpoint
    from dbert_tui.controller import Session, Settings

    meta = json.loads((recommending / "dbert.json").read_text())
    meta["sampling"]["decoding"].update(sampler="blockwise", params={"block": 4})
    (recommending / "dbert.json").write_text(json.dumps(meta))
    db = checkpoint.load(recommending)
    got = resolve(SampleConfig(), db)
    assert (got.sampler, got.params, got.steps) == ("blockwise", {"block": 4, "by": "confidence", "opening": -1.0}, 12)
    assert resolve(SampleConfig(sampler="blockwise", params={"block": 8}), db).params["block"] == 8
    assert resolve(SampleConfig(sampler="blockwise"), db).params["block"] == 4  # the same sampler: its parameters
    assert resolve(SampleConfig(sampler="threshold"), db).params == {"tau": 0.9}  # another: its own defaults
    fallback = resolve(SampleConfig(), checkpoint.load(tiny_checkpoint)).sampler
    for bad in ({"sampler": "no-such"}, {"sampler": "blockwise", "params": {"block": 0}},
                {"sampler": "blockwise", "params": {"width": 2}}, {"sampler": "blockwise", "params": [4]}):
        db.meta["sampling"]["decoding"] = {"steps": 12, **bad}
        assert resolve(SampleConfig(), db).sampler == fallback, bad
    db.meta["sampling"]["decoding"] = meta["sampling"]["decoding"]
    assert parse({"prompt": "Once", "max_tokens": 8}, db, "m", Limits()).prompts[0].cfg.sampler == "blockwise"
    s = Session(Settings())
    s.fit(db)
    assert resolve(s.settings, db).sampler == "blockwise"
    jsonl = tmp_path / "out.jsonl"
    code, own, _ = run(["sample", "-c", str(recommending), "--n", "2", "--seed", "3", "--length", "16", "-o",
                        str(jsonl)], capsys, monkeypatch)
    settings = json.loads(jsonl.read_text().splitlines()[0])["settings"]
    assert code == 0 and settings["sampler"] == "blockwise" and settings["params"]["block"] == 4
    code2, asked, _ = run(["sample", "-c", str(tiny_checkpoint), "--n", "2", "--seed", "3", "--length", "16",
                           "--steps", "12", "--top-k", "0", "--top-p", "0.9", "--sampler", "blockwise", "--param",
                           "block=4"], capsys, monkeypatch)
    assert code2 == 0 and own == asked
    meta["sampling"]["decoding"]["sampler"] = 7
    (recommending / "dbert.json").write_text(json.dumps(meta))
    with pytest.raises(DbertError, match="sampling.decoding"):
        checkpoint.load(recommending)


def test_set_decoding_records_a_sampler_and_its_parameters(tiny_checkpoint, tmp_path, capsys):
    tool = _set_decoding()
    ck = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, ck)
    assert tool.main([str(ck), "--sampler", "blockwise", "--param", "block=16", "--steps", "40"]) == 0
    decoding = json.loads((ck / "dbert.json").read_text())["sampling"]["decoding"]
    assert decoding == {"steps": 40, "sampler": "blockwise", "params": {"block": 16}}
    capsys.readouterr()
    for bad, said in ((["--sampler", "blockwise", "--param", "block=0"], "block"), (["--param", "block=4"], "--sampler"),
                      (["--sampler", "nope"], "must be one of")):
        assert tool.main([str(ck), *bad]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def _set_decoding():
    """scripts/recipes/set_decoding.py as a module."""
    import importlib.util

    from helpers import ROOT

    spec = importlib.util.spec_from_file_location("set_decoding", ROOT / "scripts" / "recipes" / "set_decoding.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool
