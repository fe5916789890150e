"""Vocabulary trimming: same pieces for the training texts, same logits on kept ids, a plain
BertForMaskedLM checkpoint out, and --trim-vocab end to end."""

import json

import pytest
import torch

from dbert_core.storage import checkpoint
from dbert_core.text.data import read_examples
from dbert_core.errors import DbertError
from dbert_core.training.train import Trainer
from dbert_core.training.vocab import trim
from helpers import TINYSTORIES, cli_words, tiny_config


def test_trim_keeps_the_pieces_of_the_texts(bert_dir, tmp_path):
    from tokenizers import Tokenizer

    texts = read_examples([str(TINYSTORIES)], "sentence")[:300]
    info = trim(bert_dir, texts, tmp_path / "t")
    assert info["vocab_before"] == 1024 and info["vocab_after"] < 1024
    old, new = Tokenizer.from_file(str(bert_dir / "tokenizer.json")), Tokenizer.from_file(str(tmp_path / "t/tokenizer.json"))
    assert new.get_vocab_size() == info["vocab_after"]
    assert json.loads((tmp_path / "t/config.json").read_text())["vocab_size"] == info["vocab_after"]
    for a, b in zip(old.encode_batch(texts), new.encode_batch(texts)):
        assert a.tokens == b.tokens  # the same pieces, [CLS]/[SEP] included (post-processor renumbered)
        assert [new.token_to_id(p) for p in a.tokens] == b.ids
    # [PAD] keeps id 0; specials survive; a word the texts never use still tokenizes, without [UNK]
    assert new.token_to_id("[PAD]") == 0 and all(new.token_to_id(s) is not None for s in ("[UNK]", "[MASK]"))
    odd = new.encode("zyxwvut quokka", add_special_tokens=False)
    assert "[UNK]" not in odd.tokens and "".join(odd.tokens).replace("##", "") == "zyxwvutquokka"


def test_trimmed_model_gives_the_same_logits_on_kept_ids(bert_dir, tmp_path):
    from transformers import AutoTokenizer, BertForMaskedLM

    texts = read_examples([str(TINYSTORIES)], "sentence")[:300]
    trim(bert_dir, texts, tmp_path / "t")
    old_tok, new_tok = AutoTokenizer.from_pretrained(bert_dir), AutoTokenizer.from_pretrained(tmp_path / "t")
    old_m, new_m = BertForMaskedLM.from_pretrained(bert_dir).eval(), BertForMaskedLM.from_pretrained(tmp_path / "t").eval()
    keep = torch.tensor([old_tok.convert_tokens_to_ids(p) for p in
                         new_tok.convert_ids_to_tokens(list(range(len(new_tok))))])
    assert torch.equal(keep, keep.sort().values)  # old order kept
    enc_old, enc_new = old_tok(texts[:4], padding=True, return_tensors="pt"), new_tok(texts[:4], padding=True, return_tensors="pt")
    assert torch.equal(keep[enc_new["input_ids"]], enc_old["input_ids"])
    with torch.no_grad():
        a, b = old_m(**enc_old).logits, new_m(**enc_new).logits
    torch.testing.assert_close(b, a[..., keep], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_train_with_trim_vocab(bert_dir, tmp_path):
    t = Trainer(tiny_config(tmp_path / "run", init=str(bert_dir), preset=None, trim_vocab=True, max_steps=5,
                            seq_len=20))
    t.run()
    db = checkpoint.load(tmp_path / "run")
    trimmed = db.meta["trim_vocab"]
    assert trimmed["vocab_before"] == 1024 and db.model.config.vocab_size == trimmed["vocab_after"] < 1024
    assert len(db.tokenizer) == trimmed["vocab_after"] and db.counts.shape[0] == trimmed["vocab_after"]
    from transformers import AutoTokenizer, BertForMaskedLM

    assert BertForMaskedLM.from_pretrained(tmp_path / "run").config.vocab_size == trimmed["vocab_after"]
    assert len(AutoTokenizer.from_pretrained(tmp_path / "run")) == trimmed["vocab_after"]


def test_trim_vocab_needs_init(tmp_path):
    with pytest.raises(DbertError) as e:
        Trainer(tiny_config(tmp_path / "run", trim_vocab=True)).prepare()
    assert "--trim-vocab needs --init" in cli_words(e.value)
