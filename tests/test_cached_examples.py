"""`--unit line` and `--unit sentence` from the token cache: the examples, packed windows, split and
counts the lists of before gave, a run trained to the same weights, and a re-run that tokenizes
nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import DATA

from dbert_core.text import cached_examples, learnt_tables, token_cache
from dbert_core.text.cached_examples import CachedExamples
from dbert_core.text.data import (EOT, epoch_batches, pack, read_documents, read_examples, story_texts, token_counts,
                                  tokenize, train_tokenizer)
from dbert_core.text.sources import iter_examples

HEAD = DATA / "tinystories" / "TinyStories-train-head.txt"


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(story_texts(read_documents([str(HEAD)]))[:400], 600)


def _lines(path: Path, n: int = 40) -> Path:
    """Stories as blank-line documents, with lines that give no tokens (a zero-width space) between."""
    docs = read_documents([str(HEAD)])[:n]
    path.write_text("".join("\n".join(d) + ("\n\u200b\n" if i % 7 == 3 else "") + f"\n{EOT}\n"
                            for i, d in enumerate(docs)))
    return path


@pytest.mark.parametrize("unit", ["line", "sentence"])
def test_cached_examples_are_the_tokenized_examples(tmp_path, tok, unit, monkeypatch):
    data = [str(_lines(tmp_path / "s.txt"))]
    texts = read_examples(data, unit)
    assert list(iter_examples(data, unit)) == texts
    entry = token_cache.cached(data, "auto", tok, tmp_path / "cache", unit=unit)
    assert len(entry) == len(texts)  # one document an example, the empty ones too (the split counts them)
    some = np.array([0, 3, 5, *range(9, len(texts), 3)])
    for seq_len in (12, 40):
        ref = tokenize([texts[i] for i in some], tok, seq_len)
        got = CachedExamples(entry, some, seq_len)
        assert len(ref) < len(some) and list(got) == ref and got.lengths.tolist() == [len(e) for e in ref]
        assert torch.equal(got.token_counts(len(tok)), token_counts(ref, len(tok)))
        assert got.total_tokens() == sum(map(len, ref))
        assert got.starts.dtype == got.lengths.dtype == np.int32  # two int32 an example where the corpus fits
        packed = got.packed(tok.sep_token_id)
        assert list(packed) == pack(ref, seq_len, tok.sep_token_id) and packed.uniform_length == seq_len
        assert packed[-1] == pack(ref, seq_len, tok.sep_token_id)[-1]
        monkeypatch.setattr(cached_examples, "CHUNK_TOKENS", 29)  # many stretches, examples across their edges
        assert torch.equal(packed.token_counts(len(tok)), token_counts(list(packed), len(tok)))
        monkeypatch.undo()
    with pytest.raises(IndexError):
        packed[len(packed)]


def test_sorted_batches_from_a_numpy_array_of_lengths_are_the_lists(tok):
    lengths = [int(x) for x in torch.randint(1, 30, (997,), generator=torch.Generator().manual_seed(1))]
    for epoch in range(3):
        assert epoch_batches(997, 8, epoch, 5, np.array(lengths), bucket=4) == \
            epoch_batches(997, 8, epoch, 5, lengths, bucket=4)


def _cfg(tmp_path, out, data, **more):
    from dbert_core.config import TrainConfig

    cfg = dict(data=[str(data)], out=str(tmp_path / out), preset="tiny", unit="line", seq_len=24, batch_size=8,
               max_steps=3, eval_every=3, log_every=1, val_examples=6, lr=3e-3, device="cpu", seed=3)
    return TrainConfig(**{**cfg, **more})


@pytest.mark.parametrize("more", [{}, {"pack": True}, {"unit": "sentence", "val": True}])
def test_a_line_run_is_what_it_was_with_lists_and_a_rerun_tokenizes_nothing(tmp_path, monkeypatch, tok, more):
    from dbert_core.storage import checkpoint
    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.prepare import _hold_out, prepare
    from dbert_core.training.train import Trainer

    learnt = []  # the texts a preset's tokenizer is learnt from; one tokenizer for every run (its ties)
    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: learnt.append(list(texts)) or tok)
    data = _lines(tmp_path / "s.txt", 60)
    more = dict(more)
    if more.pop("val", False):
        more["val_data"] = [str(_lines(tmp_path / "v.txt", 10))]
    cfg = _cfg(tmp_path, "a", data, **more)
    real_encoded = learnt_tables._encoded

    def never(*a, **k):
        raise AssertionError("the word list's text tokenized again")

    monkeypatch.setattr(learnt_tables, "_encoded", never)  # the word list comes from the entry's ids
    p = prepare(cfg)
    monkeypatch.setattr(learnt_tables, "_encoded", real_encoded)
    try:  # the lists of before: the examples read whole, split by _hold_out, tokenized, packed
        texts = read_examples([str(data)], cfg.unit)
        val_texts = read_examples(cfg.val_data, cfg.unit) if cfg.val_data else None
        ref_train, ref_val = [tokenize(t, tok, 24) for t in _hold_out(cfg, texts, val_texts)]
        if cfg.pack:
            ref_train, ref_val = pack(ref_train, 24, tok.sep_token_id), pack(ref_val, 24, tok.sep_token_id)
        assert isinstance(p.train, (cached_examples.CachedExamples, cached_examples.PackedExamples))
        assert list(p.train) == ref_train and p.val == ref_val
        assert torch.equal(p.db.counts, token_counts(ref_train, len(tok)))
        assert p.db.meta["train_tokens"] == sum(map(len, ref_train)) and learnt == [texts]
    finally:
        p.release()
    first = Trainer(cfg)
    first.run()
    calls = []
    real = token_cache._encoder
    monkeypatch.setattr(token_cache, "_encoder", lambda t: calls.append(1) or real(t))
    second = Trainer(_cfg(tmp_path, "b", data, **more))
    second.run()
    assert calls == []  # the entry was read, nothing tokenized
    a, b = checkpoint.load(tmp_path / "a"), checkpoint.load(tmp_path / "b")
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    assert [h.get("loss_elbo") for h in first.history] == [h.get("loss_elbo") for h in second.history]
    assert (a.truecase, a.words) == (b.truecase, b.words) == learnt_tables.learn([str(data)], tok)  # from the text


@pytest.mark.parametrize("seed", range(6))
def test_sentence_windows_are_pack_sentences_of_random_stories(tmp_path, seed):
    """Stories of random units (some of no tokens, some longer than a window; some stories of no
    tokens at all), laid out as a sentence-pack entry: the same windows, rooms and token counts."""
    from dbert_core.text.data import pack_sentences
    from dbert_core.text.token_cache import TokenCache

    g = np.random.default_rng(seed)
    stories = [[list(g.integers(5, 50, size=int(g.choice([0, 1, 3, 7, 13, 30])))) for _ in range(int(g.integers(0, 6)))]
               for _ in range(40)]
    lengths, paragraphs = [], []
    for story in stories:
        lengths += [0] + [len(u) for u in story]  # the head (no ids) and its units
        paragraphs += [1 + int(g.integers(0, 3))] + [0] * len(story)
    flat = np.array([x for story in stories for u in story for x in u], dtype=np.uint16)
    (tmp_path / "tokens.bin").write_bytes(flat.tobytes())
    cache = TokenCache(tmp_path, flat, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                       np.zeros(len(lengths), np.int64), np.array(paragraphs, dtype=np.int32))
    short = [0.0, 0.5][seed % 2]
    ref = pack_sentences(stories, 12, 2, short=short, seed=seed)
    got = cached_examples.SentenceWindows(cache, 12, 2, short=short, seed=seed)
    assert list(got) == ref and got.lengths.tolist() == [len(w) for w in ref]
    assert torch.equal(got.token_counts(50), token_counts(ref, 50))
    keep = np.array([i for i in range(len(ref)) if i % 3])
    assert list(got.select(keep)) == [ref[i] for i in keep]
    assert torch.equal(got.select(keep).token_counts(50), token_counts([ref[i] for i in keep], 50))


@pytest.mark.parametrize("more", [{}, {"short_windows": 0.4}, {"val": True}])
def test_a_sentence_pack_run_is_what_it_was_with_lists_and_reads_no_file_whole(tmp_path, monkeypatch, tok, more):
    from dbert_core.text import data as data_module
    from dbert_core.text.data import DocumentStats, document_sentences, document_windows
    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.prepare import _hold_out, prepare, stats_lines

    learnt = []
    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: learnt.append(list(texts)) or tok)
    data = _lines(tmp_path / "s.txt", 60)
    more = dict(more)
    if more.pop("val", False):
        more["val_data"] = [str(_lines(tmp_path / "v.txt", 10))]
    cfg = _cfg(tmp_path, "a", data, unit="sentence", pack=True, **more)
    docs = read_documents([str(data)])
    val_docs = read_documents(cfg.val_data) if cfg.val_data else None

    def whole(*a, **k):
        raise AssertionError("a data file read whole")

    monkeypatch.setattr(data_module, "read_documents", whole)
    monkeypatch.setattr(data_module, "_file_lines", whole)
    reports = []
    p = prepare(cfg, report=reports.append)
    try:  # the lists of before: the documents read whole, their sentences windowed, split by _hold_out
        units = document_sentences(docs)
        ref = document_windows(units, tok, 24, short=cfg.short_windows, seed=cfg.seed)
        ref_train, ref_val = _hold_out(cfg, ref, None if val_docs is None else
                                       document_windows(document_sentences(val_docs), tok, 24))
        assert isinstance(p.train, cached_examples.SentenceWindows)
        assert list(p.train) == ref_train and p.val == ref_val
        assert [len(w) for w in ref_train] == p.train.lengths.tolist()
        assert torch.equal(p.db.counts, token_counts(ref_train, len(tok)))
        assert p.db.meta["train_tokens"] == sum(map(len, ref_train)) and len(p.train) == len(ref_train)
        assert learnt == [[s for d in units for s in d]]  # the tokenizer's texts: every unit, in order
        assert [r["documents"] for r in reports if r["stage"] == "built"][0] == len(docs)  # stories, not units
        assert p.documents == stats_lines(DocumentStats.of(docs), None if val_docs is None else
                                          DocumentStats.of(val_docs), cfg.doc_sep)
    finally:
        p.release()
    calls = []
    real = token_cache._encoder
    monkeypatch.setattr(token_cache, "_encoder", lambda t: calls.append(1) or real(t))
    again = prepare(_cfg(tmp_path, "b", data, unit="sentence", pack=True, **more))
    again.release()
    assert calls == [] and list(again.train) == ref_train and again.val == ref_val  # the entry read, nothing tokenized


def _unit(unit: str) -> dict:
    return {"unit": "sentence", "pack": True} if unit == "sentence-pack" else {"unit": unit}


def _rank(rank, world, port, root, data, unit, vocab, result_dir):
    """One process of a two-process gloo run: which entries it built, which training examples it took."""
    import json
    import os
    import time

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from dbert_core.text.tokenizer import WordPieceTokenizer
    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.train import Trainer

    tok = WordPieceTokenizer.from_vocab(vocab, do_lower_case=True, strip_accents=True)
    prepare_module.train_tokenizer = lambda texts, size: tok  # one vocabulary for both (the trainer's ties)
    built, real = [], token_cache.build
    token_cache.build = lambda *a, **k: built.append(rank) or time.sleep(2 - 2 * rank) or real(*a, **k)  # rank 0 slow
    tr = Trainer(_cfg(Path(root), "ddp", data, **_unit(unit), max_steps=3, eval_every=0, save_every=0))
    tr.prepare()
    examples, taken = tr.train_examples, []

    class Taken:
        def __len__(self):
            return len(examples)

        def __getitem__(self, i):
            taken.append(int(i))
            return examples[i]

    tr.train_examples = Taken()
    tr.run()
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"built": built, "taken": taken, "n": len(examples), "kind": type(examples).__name__}, f)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("unit, kind", [("story", "StoryWindows"), ("line", "CachedExamples"),
                                        ("sentence-pack", "SentenceWindows")])
def test_two_ranks_share_one_cache_built_by_rank_0_and_read_their_own_examples(tmp_path, tok, unit, kind, monkeypatch):
    import json
    import socket

    import torch.multiprocessing as mp

    data = _lines(tmp_path / "s.txt", 60)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(2, port, str(tmp_path), str(data), unit, tok.backend_tokenizer.get_vocab(), str(tmp_path)), nprocs=2,
             join=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [g["built"] for g in got] == [[0], []]  # rank 0 tokenized; rank 1 waited and read its entry
    assert got[0]["n"] == got[1]["n"] and {g["kind"] for g in got} == {kind}
    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.train import Trainer

    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: tok)
    ref = Trainer(_cfg(tmp_path, "ref", data, **_unit(unit)))  # one process: the global batches of the same run
    ref.prepare()
    ref.release()
    batches = epoch_batches(len(ref.train_examples), 8, 0, 3, ref.lengths)[:3]
    assert got[0]["taken"] == [i for b in batches for i in b[0::2]]
    assert got[1]["taken"] == [i for b in batches for i in b[1::2]]


def _hub_rank(rank, world, port, root, vocab, result_dir):
    """One process of a two-process gloo run on `--data hf:owner/stories`: rank 0's download and its
    counting made slow, so a rank that does not wait for them does them itself."""
    import json
    import os
    import time

    import huggingface_hub

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from dbert_core.text.tokenizer import WordPieceTokenizer
    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.train import Trainer

    tok = WordPieceTokenizer.from_vocab(vocab, do_lower_case=True, strip_accents=True)
    prepare_module.train_tokenizer = lambda texts, size: tok
    fetch, count = huggingface_hub.snapshot_download, cached_examples.range_counts
    counted = []
    huggingface_hub.snapshot_download = lambda *a, **k: time.sleep(3 - 3 * rank) or fetch(*a, **k)
    cached_examples.range_counts = lambda *a, **k: counted.append(rank) or time.sleep(3 - 3 * rank) or count(*a, **k)
    tr = Trainer(_cfg(Path(root), "ddp", "hf:owner/stories", max_steps=1, eval_every=0, save_every=0))
    tr.run()
    with open(os.path.join(result_dir, f"hub{rank}.json"), "w") as f:
        json.dump({"counted": counted, "data": tr.cfg.data, "n": len(tr.train_examples)}, f)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_download_a_hub_dataset_and_count_its_tokens_once_on_rank_0(tmp_path, tok, monkeypatch):
    import json
    import socket

    import torch.multiprocessing as mp

    from helpers import HubServer, online

    repo = tmp_path / "repo"
    repo.mkdir()
    _lines(repo / "train.txt", 60)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with HubServer() as hub:
        hub.datasets["owner/stories"] = repo
        online(monkeypatch, hub)  # the spawned ranks inherit HF_ENDPOINT and HF_HUB_OFFLINE=0
        mp.spawn(_hub_rank, args=(2, port, str(tmp_path), tok.backend_tokenizer.get_vocab(), str(tmp_path)),
                 nprocs=2, join=True)
        fetched = [r for r in hub.requests if r.startswith("GET /datasets/owner/stories/resolve/")]
    got = [json.loads((tmp_path / f"hub{r}.json").read_text()) for r in range(2)]
    assert len(fetched) == 1, fetched  # the one data file, downloaded once: rank 1 waited and read rank 0's folder
    assert [g["counted"] for g in got] == [[0], []]  # rank 0 counted the tokens; rank 1 read its counts
    assert got[0]["n"] == got[1]["n"] > 0


def test_eval_of_a_line_model_reads_the_runs_cache_and_scores_the_same(tmp_path, monkeypatch, tok):
    import os
    import shutil

    from dbert_core.evaluation import metrics
    from dbert_core.storage import checkpoint
    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.train import Trainer

    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: tok)
    data = _lines(tmp_path / "s.txt", 40)
    Trainer(_cfg(tmp_path, "a", data, max_steps=1, eval_every=0)).run()
    db = checkpoint.load(tmp_path / "a")
    real = metrics.iter_encode

    def never(*a, **k):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(metrics, "iter_encode", never)
    cached = metrics.perplexity(db, [str(data)], steps=8, limit=7, unit="line")
    monkeypatch.setattr(metrics, "iter_encode", real)
    shutil.rmtree(Path(os.environ["DBERT_HOME"]) / "cache" / "tokens")
    assert cached == metrics.perplexity(db, [str(data)], steps=8, limit=7, unit="line")  # read and encoded as before


@pytest.mark.parametrize("unit", ["window", "line", "sentence"])
def test_eval_draws_its_examples_from_the_token_cache_and_reads_no_file_whole(tmp_path, monkeypatch, tok, unit,
                                                                               capsys):
    """`dbert eval` builds the files' entry as `dbert train` would (its tokenizing heard), scores the
    examples the lists of before gave, and a second eval reads the first's entry."""
    import json

    from helpers import run

    from dbert_core.evaluation import metrics
    from dbert_core.sampling.settings import window_length
    from dbert_core.storage import checkpoint
    from dbert_core.text import data as data_module
    from dbert_core.text.data import count_words, document_sentences, document_windows, iter_encode
    from dbert_core.training import prepare as prepare_module
    from dbert_core.training.train import Trainer

    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda texts, size: tok)
    Trainer(_cfg(tmp_path, "a", _lines(tmp_path / "s.txt", 20), max_steps=1, eval_every=0)).run()
    db = checkpoint.load(tmp_path / "a")
    data = [str(_lines(tmp_path / "e.txt", 30))]  # files no run has tokenized
    if unit == "window":  # the lists of before: the documents read whole, their sentences windowed
        ref, ref_words = document_windows(document_sentences(read_documents(data)), tok, window_length(db), words=True)
    else:  # every example encoded, those of no ids or longer than the model skipped
        texts = read_examples(data, unit)
        ids = list(iter_encode(texts, tok))
        ref = [e for e in ids if 0 < len(e) <= db.model.max_length]
        ref_words = [count_words(t) for t, e in zip(texts, ids) if 0 < len(e) <= db.model.max_length]

    def whole(*a, **k):
        raise AssertionError("a data file read whole")

    for module, name in ((data_module, "read_documents"), (data_module, "_file_lines")):  # metrics imports neither
        monkeypatch.setattr(module, name, whole)
    reports: list = []
    first = metrics.perplexity(db, data, steps=8, unit=unit, report=reports.append, examples=True)
    assert first["examples"] == len(ref) and first["tokens"] == sum(map(len, ref)) and first["words"] == sum(ref_words)
    assert first["example_tokens"] == [len(e) for e in ref]
    assert first["skipped_too_long"] == (0 if unit == "window" else len(ids) - len(ref))
    assert reports[-1]["stage"] == "built" and any(r["stage"] == "tokenize" for r in reports)
    limited = metrics.perplexity(db, data, steps=8, unit=unit, limit=5)
    assert limited["examples"] == 5 and limited["tokens"] == sum(map(len, ref[:5]))
    calls = []
    real = token_cache._encoder
    monkeypatch.setattr(token_cache, "_encoder", lambda t: calls.append(1) or real(t))
    again: list = []
    assert metrics.perplexity(db, data, steps=8, unit=unit, report=again.append, examples=True) == first
    assert calls == [] and [r["stage"] for r in again] == ["cached"]  # the first eval's entry, nothing tokenized
    monkeypatch.setattr(token_cache, "_encoder", real)
    monkeypatch.setenv("DBERT_HOME", str(tmp_path / "another_home"))  # the CLI, on a home with no entry
    capsys.readouterr()
    code, out, err = run(["eval", "--checkpoint", str(tmp_path / "a"), "--data", data[0], "--unit", unit,
                          "--steps", "8", "--json"], capsys, monkeypatch)
    assert code == 0, err
    assert "tokenizing " in err and " MB/s, " in err and "(tokenized now)" in err
    assert json.loads(out)["nats_per_token"] == first["nats_per_token"]
