"""Data formats as users bring them (docs/stories.md, "Documents are stories"): JSONL files and
<|endoftext|> files are read for their documents' text everywhere (the examples, the truecase
table, the word list), whatever the --unit; a JSONL file may start with a UTF-8 byte-order mark;
`dbert eval` warns about documents that look wrong as `dbert train` does; a story window too
short to hold a story is refused naming --seq-len."""

from __future__ import annotations

import json

import pytest

from helpers import DATA, ROOT, run, tiny_config
from dbert_core.text.data import EOT, read_documents

TINY = ROOT / "tests" / "fixtures" / "tiny"  # committed: seq_len 24
HEAD = DATA / "tinystories" / "TinyStories-train-head.txt"


@pytest.fixture(scope="module")
def stories():
    """The head file's first 40 stories, each a list of its paragraphs; none writes "text"."""
    docs = read_documents([str(HEAD)])[:40]
    assert not any("text" in p.lower() for d in docs for p in d)
    return docs


def write_jsonl(path, docs, bom: bool = False):
    body = "".join(json.dumps({"text": "\n".join(d)}) + "\n" for d in docs)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body.encode("utf-8"))
    return path


def write_eot(path, docs):
    path.write_text("".join("\n".join(d) + f"\n{EOT}\n" for d in docs), encoding="utf-8")
    return path


def prepared(tmp_path, data, **overrides):
    """What a training run would learn from `data` (prepare: examples, tokenizer, the tables), no step."""
    from dbert_core.training.train import Trainer

    trainer = Trainer(tiny_config(tmp_path / "run", data=[str(data)], batch_size=8, val_examples=4, **overrides))
    trainer.prepare()
    trainer.prepared.lock.release()
    return trainer


@pytest.mark.parametrize("unit", ["story", "line"])
def test_the_tables_of_a_jsonl_file_hold_its_text_not_its_json(tmp_path, stories, unit):
    """The word list held "text" (the field's name) and "nthe" (a "\\n" escape before "the"), the
    truecase table "nthe" too: both were learnt from the file's raw lines."""
    db = prepared(tmp_path, write_jsonl(tmp_path / "s.jsonl", stories), unit=unit, seq_len=24).db
    assert "text" not in db.words and not any(w.startswith("n") and w[1:] in ("the", "she", "lily") for w in db.words)
    assert {"lily", "needle"} <= db.words
    assert "text" not in db.truecase and "nthe" not in db.truecase and db.truecase.get("lily") == "Lily"


def test_the_word_list_of_an_eot_file_has_no_endoftext(tmp_path, stories):
    """The shipped model's list held "endoftext": the separator lines were read as text."""
    db = prepared(tmp_path, write_eot(tmp_path / "s.txt", stories), unit="story", seq_len=24).db
    assert "endoftext" not in db.words and {"lily", "needle"} <= db.words


def test_unit_line_reads_a_jsonl_files_text_field(tmp_path, stories):
    """`--unit line --doc-sep jsonl` trained on the raw JSON ('{"text": "One day, ...'); each
    line of each text is an example now, as `--unit story` reads the same file."""
    trainer = prepared(tmp_path, write_jsonl(tmp_path / "s.jsonl", stories), unit="line", doc_sep="jsonl")
    tok = trainer.db.tokenizer
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in [*trainer.train_examples, *trainer.val_examples]]
    assert texts and not any("{" in t or "text" in t for t in texts), texts[:3]
    paragraphs = sum(len(d) for d in stories)
    assert len(texts) == paragraphs  # one example a paragraph, none lost


def test_a_jsonl_file_with_a_byte_order_mark_is_read(tmp_path, stories, capsys, monkeypatch):
    """It was refused: '...:1: not a JSON object'."""
    path = write_jsonl(tmp_path / "bom.jsonl", stories[:3], bom=True)
    assert read_documents([str(path)]) == stories[:3]
    code, out, err = run(["eval", "-c", str(TINY), "--data", str(path), "--unit", "story", "--steps", "2",
                          "--limit", "1", "--json"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(out)["documents"] == 3


def test_eval_warns_about_a_document_of_110000_words(tmp_path, capsys, monkeypatch):
    """`dbert train` warns that a 110,000-word document is probably a file read as one; `dbert eval
    --unit story` said nothing."""
    data = tmp_path / "one.txt"
    data.write_text(f"Tom had a red kite.\n{EOT}\n" + "word " * 110_000 + f"\n{EOT}\n", encoding="utf-8")
    code, out, err = run(["eval", "-c", str(TINY), "--data", str(data), "--unit", "story", "--steps", "2",
                          "--limit", "1"], capsys, monkeypatch)
    assert code == 0, err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "110,000 words" in warnings[0] and "--doc-sep auto" in warnings[0], err
    assert "Traceback" not in err


def test_eval_reads_documents_as_doc_sep_says(tmp_path, capsys, monkeypatch):
    data = tmp_path / "lines.txt"
    data.write_text("Tom had a red kite.\nLily had a blue ball.\nThe dog ran.\n", encoding="utf-8")
    code, out, err = run(["eval", "-c", str(TINY), "--data", str(data), "--unit", "story", "--steps", "2",
                          "--doc-sep", "line", "--json"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(out)["documents"] == 3  # read as blank-line documents (auto) it is one


@pytest.mark.parametrize("seq_len", ["1"])
def test_a_story_window_of_one_token_names_seq_len(tmp_path, capsys, monkeypatch, seq_len):
    """It failed with 'story context must be in [1, 0] tokens', naming an option never given."""
    code, out, err = run(["train", "--data", str(HEAD), "--out", str(tmp_path / "run"), "--unit", "story",
                          "--seq-len", seq_len, "--preset", "tiny", "--max-steps", "1"], capsys, monkeypatch)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and out == "" and len(lines) == 1, (code, err)
    assert lines[0].startswith("dbert: error: --unit story needs --seq-len 2 or more") and "context" not in lines[0]
    assert not (tmp_path / "run").exists()


def test_relearn_tables_cleans_a_checkpoints_tables_from_its_own_files(tmp_path, stories):
    """scripts/recipes/relearn_tables.py: the shipped model's list held "endoftext"; the script
    learns both tables again from the recorded training files (sha256-checked), weights untouched."""
    import subprocess
    import sys

    from dbert_core.disk.layout import WORDS
    from dbert_core.storage import checkpoint

    data = write_eot(tmp_path / "s.txt", stories)
    trainer = prepared(tmp_path, data, unit="story", seq_len=24)
    checkpoint.save(trainer.db, tmp_path / "ck")
    words = json.loads((tmp_path / "ck" / WORDS).read_text())
    words["words"] = sorted(words["words"] + ["endoftext"])  # what the old reader learnt
    (tmp_path / "ck" / WORDS).write_text(json.dumps(words))
    weights = (tmp_path / "ck" / "model.safetensors").read_bytes()
    script = [sys.executable, str(ROOT / "scripts" / "recipes" / "relearn_tables.py"), str(tmp_path / "ck")]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*script, str(data), "--write"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "left the list: ['endoftext']" in done.stderr
    assert "endoftext" not in checkpoint.load(tmp_path / "ck").words
    assert (tmp_path / "ck" / "model.safetensors").read_bytes() == weights
    other = tmp_path / "other.txt"
    other.write_text("Not the training text.\n")
    bad = subprocess.run([*script, str(other)], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "not one of the files" in bad.stderr
