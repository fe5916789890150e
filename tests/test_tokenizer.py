"""dbert's WordPiece tokenizer against transformers' BertTokenizerFast: the same ids, the same
decoded text, and files that AutoTokenizer loads unchanged."""

from __future__ import annotations

import shutil

import pytest
import torch

from dbert_core.text.tokenizer import WordPieceTokenizer
from helpers import TEXTS, TINYSTORIES, minilm_dir

def _same_tokenizer(ours: WordPieceTokenizer, theirs, texts=TEXTS):
    assert len(ours) == len(theirs)
    for key in ("cls", "sep", "pad", "mask", "unk"):
        assert getattr(ours, f"{key}_token") == getattr(theirs, f"{key}_token")
        assert getattr(ours, f"{key}_token_id") == getattr(theirs, f"{key}_token_id")
    for text in texts:
        assert ours.encode(text) == theirs(text)["input_ids"], text
        assert ours.encode(text, add_special_tokens=False) == theirs(text, add_special_tokens=False)["input_ids"]


def test_decode_matches_transformers_on_minilm():
    from transformers import AutoTokenizer

    path = minilm_dir()
    ours, theirs = WordPieceTokenizer.load(path), AutoTokenizer.from_pretrained(path)
    _same_tokenizer(ours, theirs)
    g = torch.Generator().manual_seed(0)
    samples = [ours.encode(t) for t in TEXTS] + [torch.randint(0, len(ours), (40,), generator=g).tolist()
                                                 for _ in range(20)]
    samples.append(ours.encode("i don't think it's ' quoted ' , you've we're i'm done . really ? yes !"))
    for ids in samples:
        want = theirs.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=True)
        assert ours.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=True) == want
        assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    assert "don't" in ours.decode(ours.encode("I don't know, it's fine."))


def test_saved_tokenizer_loads_in_transformers(tmp_path):
    from transformers import AutoTokenizer

    path = minilm_dir()
    ours = WordPieceTokenizer.load(path)
    ours.save_pretrained(tmp_path / "minilm")
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"} <= \
        {p.name for p in (tmp_path / "minilm").iterdir()}
    _same_tokenizer(ours, AutoTokenizer.from_pretrained(tmp_path / "minilm"))
    _same_tokenizer(WordPieceTokenizer.load(tmp_path / "minilm"), AutoTokenizer.from_pretrained(path))
    # vocab.txt alone: an uncased BERT WordPiece, as transformers builds it
    (tmp_path / "vocab_only").mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(path / name, tmp_path / "vocab_only")
    _same_tokenizer(WordPieceTokenizer.load(tmp_path / "vocab_only"), AutoTokenizer.from_pretrained(path))


def test_trained_tokenizer_round_trips_through_transformers(tmp_path):
    from transformers import AutoTokenizer

    from dbert_core.text.data import read_examples, train_tokenizer

    texts = read_examples([str(TINYSTORIES)])[:3000]
    tok = train_tokenizer(texts, 600)
    assert isinstance(tok, WordPieceTokenizer) and len(tok) <= 600
    tok.save_pretrained(tmp_path)
    _same_tokenizer(tok, AutoTokenizer.from_pretrained(tmp_path), TEXTS + texts[:50])
    again = WordPieceTokenizer.load(tmp_path)
    assert all(again.encode(t) == tok.encode(t) for t in texts[:200])


def test_missing_or_broken_files_are_clear_errors(tmp_path):
    from dbert_core.errors import DbertError

    with pytest.raises(DbertError, match="no tokenizer.json or vocab.txt"):
        WordPieceTokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DbertError, match="tokenizer.json cannot be read"):
        WordPieceTokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(DbertError, match=r"lacks the special tokens \[SEP\], \[CLS\], \[MASK\]"):
        WordPieceTokenizer.load(tmp_path)


def test_a_learnt_tokenizer_is_the_same_in_every_process():
    """tokenizers' WordPiece trainer numbers its pieces in a hash order of its own, new in every process,
    and broke ties between pairs of equal count by those numbers: two runs of a preset on the same
    data learnt vocabularies that differed (4 processes, 4 vocabularies before the fix)."""
    import subprocess
    import sys

    from helpers import DATA, ROOT

    code = ("import sys, json; from dbert_core.text.data import read_documents, story_texts, train_tokenizer; "
            f"t = train_tokenizer(story_texts(read_documents([{str(DATA / 'tinystories' / 'TinyStories-train-head.txt')!r}])), 2000); "
            "print(json.dumps(sorted(t.backend_tokenizer.get_vocab().items())))")
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    got = {subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
           for _ in range(3)}
    assert len(got) == 1 and len(__import__("json").loads(got.pop())) == 2000
