"""Hostile or broken checkpoints: every one is a clear DbertError on load and import, a
`broken` row in the store listing, and never runs code, crashes or loads wrong weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dbert_core.storage import checkpoint, store
from dbert_core.disk import schema
from dbert_core.errors import DbertError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _without_shipped(monkeypatch):
    monkeypatch.setattr(store, "shipped", lambda name: None)


# ------------------------------------------------------------------------------ mutations
def edit_json(name, **changes):
    def mutate(d: Path):
        data = json.loads((d / name).read_text())
        data.update(changes)
        (d / name).write_text(json.dumps(data))
    return mutate


def write(name, text):
    def mutate(d: Path):
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    return mutate


def edit_tensors(name, change):
    def mutate(d: Path):
        tensors = load_file(str(d / name))
        change(tensors)
        save_file(tensors, str(d / name), metadata={"format": "pt"})
    return mutate


def set_value(key, value):
    def change(t):
        t[key] = t[key].clone()
        t[key].view(-1)[3] = value
    return change


def vocab_lines(delta):
    def mutate(d: Path):
        (d / "tokenizer.json").unlink()
        lines = (d / "vocab.txt").read_text().splitlines()
        lines = lines[:delta] if delta < 0 else lines + [f"extra{i}" for i in range(delta)]
        (d / "vocab.txt").write_text("\n".join(lines) + "\n")
    return mutate


WORD = "bert.embeddings.word_embeddings.weight"
QUERY = "bert.encoder.layer.0.attention.self.query.weight"

CORRUPT = [
    # dbert.json: one schema, the field named
    ("seq_len-text", edit_json("dbert.json", seq_len="abc"), "seq_len"),
    ("lambda-text", edit_json("dbert.json", **{"lambda": "abc"}), "lambda"),
    ("lambda-range", edit_json("dbert.json", **{"lambda": 5}), "lambda"),
    ("lambda-nan", lambda d: (d / "dbert.json").write_text(
        (d / "dbert.json").read_text().replace('"lambda": 0.3', '"lambda": NaN')), "lambda"),
    ("T-negative", edit_json("dbert.json", T=-4), "'T'"),
    ("T-text", edit_json("dbert.json", T="2048"), "'T'"),
    ("T-bool", edit_json("dbert.json", T=True), "'T'"),
    ("T-float", edit_json("dbert.json", T=12.5), "'T'"),
    ("schedule-unknown", edit_json("dbert.json", schedule="cosine"), "schedule"),
    ("time-unknown", edit_json("dbert.json", time="sometimes"), "time"),
    ("format-newer", edit_json("dbert.json", format=99), "format"),
    ("parameters-text", edit_json("dbert.json", parameters="many"), "parameters"),
    ("created-number", edit_json("dbert.json", created=5), "created"),
    ("meta-list", write("dbert.json", "[1, 2]"), "JSON object"),
    ("meta-garbage", write("dbert.json", "{nope"), "not valid JSON"),
    ("meta-missing-T", lambda d: (d / "dbert.json").write_text(json.dumps(
        {k: v for k, v in json.loads((d / "dbert.json").read_text()).items() if k != "T"})), "'T'"),
    # custom code: refused, never run
    ("auto_map-config", edit_json("config.json", auto_map={"AutoModel": "evil.EvilModel"}), "custom code"),
    ("auto_map-tokenizer", edit_json("tokenizer_config.json", auto_map={"AutoTokenizer": ["evil.Tok", None]}),
     "custom code"),
    ("python-file", write("evil.py", "import os\nos.system('touch /tmp/pwned')\n"), "evil.py"),
    ("native-file", write("sub/evil.so", "\x7fELF"), "evil.so"),
    # weights: finite, floating, complete, the right shapes, the tokenizer's size
    ("weight-nan", edit_tensors("model.safetensors", set_value(WORD, float("nan"))), "NaN value"),
    ("weight-inf", edit_tensors("model.safetensors", set_value(QUERY, float("inf"))), "infinite values"),
    ("weight-int", edit_tensors("model.safetensors", lambda t: t.update({WORD: t[WORD].to(torch.int32)})),
     "not floating"),
    ("weight-missing", edit_tensors("model.safetensors", lambda t: t.pop(QUERY)), "missing tensors"),
    ("weight-extra", edit_tensors("model.safetensors", lambda t: t.update(
        {"bert.encoder.layer.9.attention.self.query.weight": t[QUERY].clone()})), "unexpected tensors"),
    ("weight-shape", edit_tensors("model.safetensors", lambda t: t.update({QUERY: t[QUERY][:, :-1].clone()})),
     "shape"),
    ("head-missing", edit_tensors("model.safetensors", lambda t: [t.pop(k) for k in list(t)
                                                                  if k.startswith("cls.")]), "MLM head"),
    ("tokenizer-smaller", vocab_lines(-10), "vocabulary"),
    ("tokenizer-larger", vocab_lines(10), "vocabulary"),
    ("config-layers-huge", edit_json("config.json", num_hidden_layers=10**9), "num_hidden_layers"),
    ("config-hidden-text", edit_json("config.json", hidden_size="abc"), "hidden_size"),
    ("config-dropout", edit_json("config.json", hidden_dropout_prob=2.0), "hidden_dropout_prob"),
    # the schedule's table: finite, non-negative, one count per token
    ("counts-nan", edit_tensors("dbert_tokens.safetensors", lambda t: t.update(
        counts=t["counts"].to(torch.float32).index_fill(0, torch.tensor([5]), float("nan")))), "counts"),
    ("counts-negative", edit_tensors("dbert_tokens.safetensors", lambda t: t.update(
        counts=t["counts"].index_fill(0, torch.tensor([5]), -7))), "counts"),
    ("counts-short", edit_tensors("dbert_tokens.safetensors", lambda t: t.update(counts=t["counts"][:-3].clone())),
     "counts"),
    ("counts-2d", edit_tensors("dbert_tokens.safetensors", lambda t: t.update(counts=t["counts"][None].clone())),
     "counts"),
    ("counts-other-name", edit_tensors("dbert_tokens.safetensors", lambda t: t.update(other=t.pop("counts"))),
     "counts"),
    # time-embedding weights only where dbert.json says the model is time-conditioned
    ("time-file-unexpected", lambda d: save_file({"time_embed.weight": torch.zeros(4, 4)},
                                                 str(d / "dbert_time.safetensors")), "dbert_time.safetensors"),
]
IDS = [c[0] for c in CORRUPT]


@pytest.fixture(params=CORRUPT, ids=IDS)
def corrupt(request, tiny_checkpoint, tmp_path):
    name, mutate, needle = request.param
    d = tmp_path / name
    shutil.copytree(tiny_checkpoint, d)
    shutil.rmtree(d / "trainer_state")
    mutate(d)
    return d, needle


def test_corrupt_checkpoints_are_refused_on_load(corrupt):
    path, needle = corrupt
    with pytest.raises(DbertError, match=needle) as e:
        checkpoint.load(path)
    assert "\n" not in str(e.value)


def test_corrupt_checkpoints_are_refused_on_import(corrupt):
    path, needle = corrupt
    with pytest.raises(DbertError, match=needle):
        store.import_dir(path, name="x")
    assert not (store.store_dir() / "x").exists()
    root = store.store_dir()
    assert not root.is_dir() or [p.name for p in root.iterdir()] == []


@pytest.mark.parametrize("make,why", [
    (lambda d: (d / "vocab2.txt").symlink_to("/etc/passwd"), "links"),
    (lambda d: (d / "sub").symlink_to("/etc", target_is_directory=True), "links"),
    (lambda d: os.mkfifo(d / "pipe"), "not a regular file"),  # copying a FIFO would block forever
], ids=["file-link", "dir-link", "fifo"])
def test_import_refuses_links_and_special_files(tiny_checkpoint, tmp_path, make, why):
    d = tmp_path / "odd"
    shutil.copytree(tiny_checkpoint, d)
    make(d)
    with pytest.raises(DbertError, match=why):
        store.import_dir(d, name="odd")
    assert not store.store_dir().is_dir() or list(store.store_dir().iterdir()) == []


def test_the_intact_copy_loads(tiny_checkpoint, tmp_path):
    """The fixture's mutations are the only reason the cases above fail."""
    d = tmp_path / "fine"
    shutil.copytree(tiny_checkpoint, d)
    shutil.rmtree(d / "trainer_state")
    edit_json("dbert.json")(d)
    edit_tensors("model.safetensors", lambda t: None)(d)
    assert checkpoint.load(d).schedule.name == "spindle"


# ------------------------------------------------------------------------------ time-conditioned
@pytest.fixture
def timed(tiny_db, tmp_path):
    from dbert_core.storage.pretrained import load as load_bert

    bert = load_bert(tiny_db.path)
    db = checkpoint.assemble(bert, tiny_db.tokenizer, "spindle", 64, tiny_db.counts, 0.3, "layerwise",
                             {"seq_len": 24})
    return checkpoint.save(db, tmp_path / "timed")


@pytest.mark.parametrize("change,needle", [
    (lambda t: t.update({k: v.clone().fill_(float("nan")) for k, v in t.items()}), "NaN value"),
    (lambda t: t.update({k: v[..., :-1].clone() for k, v in t.items()}), "dbert_time.safetensors"),
    (lambda t: t.update(extra=torch.zeros(2)), "dbert_time.safetensors"),
], ids=["nan", "shape", "extra"])
def test_time_weights_are_checked(timed, change, needle):
    assert checkpoint.load(timed).model.time == "layerwise"
    edit_tensors("dbert_time.safetensors", change)(timed)
    with pytest.raises(DbertError, match=needle):
        checkpoint.load(timed)


def test_time_weights_missing(timed):
    (timed / "dbert_time.safetensors").unlink()
    with pytest.raises(DbertError, match="dbert_time.safetensors"):
        checkpoint.load(timed)


# ------------------------------------------------------------------------------ listing
def test_listing_shows_broken_entries_instead_of_crashing(tiny_checkpoint, capsys, monkeypatch):
    from dbert_core.cli import main

    root = store.store_dir()
    root.mkdir(parents=True)
    for name, mutate in [("good", None), ("bad-lambda", edit_json("dbert.json", **{"lambda": "abc"})),
                         ("bad-json", write("dbert.json", "{")), ("no-meta", lambda d: (d / "dbert.json").unlink()),
                         ("code", write("evil.py", "print('hi')"))]:
        shutil.copytree(tiny_checkpoint, root / name)
        if mutate:
            mutate(root / name)
    (root / "empty").mkdir()  # e.g. a training run that has not saved yet: not listed
    rows = {e.name: e for e in store.entries()}
    assert sorted(rows) == ["bad-json", "bad-lambda", "code", "good", "no-meta"]
    assert rows["good"].broken is None and rows["good"].schedule == "spindle(0.3)"
    assert "lambda" in rows["bad-lambda"].broken and "JSON" in rows["bad-json"].broken
    assert "dbert.json" in rows["no-meta"].broken and "evil.py" in rows["code"].broken

    monkeypatch.setattr(sys, "argv", ["dbert", "checkpoints", "list"])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    assert (exc.value.code or 0) == 0 and "Traceback" not in err
    line = [ln for ln in out.splitlines() if ln[2:].startswith("bad-lambda")][0]
    assert "broken:" in line and "lambda" in line
    monkeypatch.setattr(sys, "argv", ["dbert", "checkpoints", "list", "--json"])
    with pytest.raises(SystemExit):
        main()
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert {r["name"]: bool(r.get("broken")) for r in rows} == {
        "bad-json": True, "bad-lambda": True, "code": True, "good": False, "no-meta": True}


def test_schema_constants_agree_with_the_engine():
    from dbert_core.maths.model import TIME_MODES
    from dbert_core.maths.schedule import SCHEDULES

    assert schema.SCHEDULES == tuple(SCHEDULES) and schema.TIME_MODES == tuple(TIME_MODES)


def test_inspect_is_cheap_and_torch_free(tiny_checkpoint):
    code = ("import sys; from dbert_core import layout, store; layout.inspect(sys.argv[1]); store.entries(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tiny_checkpoint)], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == "False"


# ------------------------------------------------------------------------------ custom code, end to end
def _evil(tiny_checkpoint, d: Path) -> Path:
    shutil.copytree(tiny_checkpoint, d)
    edit_json("config.json", auto_map={"AutoModelForMaskedLM": "evil.EvilModel"})(d)
    (d / "evil.py").write_text(f"open({str(d / 'PWNED')!r}, 'w').write('ran')\n")
    return d


@pytest.mark.parametrize("command", [
    ["checkpoints", "import", "{evil}", "--name", "evil"],
    ["sample", "--checkpoint", "{evil}", "--n", "1", "--steps", "4", "--length", "4"],
    ["train", "--data", "{data}", "--out", "{tmp}/run", "--init", "{evil}", "--max-steps", "1"],
], ids=["import", "sample", "train-init"])
def test_custom_code_is_refused_with_one_line_and_no_prompt(command, tiny_checkpoint, tmp_path):
    from helpers import TINYSTORIES

    evil = _evil(tiny_checkpoint, tmp_path / "evil")
    args = [a.format(evil=evil, tmp=tmp_path, data=TINYSTORIES) for a in command]
    r = subprocess.run([sys.executable, "-m", "dbert_core.cli", *args], input="y\ny\n", capture_output=True,
                       text=True, cwd=ROOT, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "custom code" in r.stderr, r.stderr
    assert not (evil / "PWNED").exists()
    assert not (store.store_dir() / "evil").exists()


def test_init_refuses_custom_code_in_a_bert_folder(tiny_checkpoint, tmp_path):
    from dbert_core.storage.pretrained import build_bert

    d = tmp_path / "hf"
    d.mkdir()
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(tiny_checkpoint / name, d / name)
    assert build_bert(init=str(d)).config.vocab_size > 0
    edit_json("tokenizer_config.json", auto_map={"AutoTokenizer": ["tok.Tok", None]})(d)
    with pytest.raises(DbertError, match="custom code"):
        build_bert(init=str(d))
    with pytest.raises(DbertError, match="custom code"):
        build_bert(init=str(d), from_scratch=True)


def test_loading_never_imports_transformers(tiny_checkpoint):
    code = ("import sys; from dbert_core import checkpoint; checkpoint.load(sys.argv[1]); "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tiny_checkpoint)], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == "False"
