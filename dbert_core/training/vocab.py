"""Vocabulary trimming: keep only the word pieces a corpus can produce.

A pretrained uncased BERT carries 30,522 word pieces; a small corpus uses a few thousand. The
MLM output layer and its softmax cost time in proportion to the vocabulary, so a model that
will only ever see one corpus trains and samples faster on a smaller one.

    kept = special tokens + every piece the training texts tokenize to
           + every single-character piece ("a", "##a", ...), so any word still tokenizes.

WordPiece is greedy longest-match-first: every piece it chose for the training texts is kept
and no longer match existed before, so the training texts get exactly the same pieces under
the kept vocabulary; ids are only renumbered (old order kept, so [PAD] stays 0). Words outside
the corpus fall back to shorter pieces instead of their old ones.

`trim` works on a BERT directory in the Hugging Face layout (config.json, model.safetensors,
tokenizer.json) and writes another one: rows of the embedding and of the MLM decoder are cut
to the kept ids, and the tokenizer files get the new vocabulary. The result is still a plain
BertForMaskedLM checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ..disk import layout
from ..errors import DbertError
from ..text.pieces import encoded

# tensors with one row per vocabulary entry, in BertForMaskedLM / BertModel checkpoints
VOCAB_ROWS = ("word_embeddings.weight", "predictions.bias", "predictions.decoder.weight", "predictions.decoder.bias")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def single_char(piece: str, prefix: str = "##") -> bool:
    """A piece of one character, alone or as a word continuation ("a", "##a")."""
    return len(piece) == 1 or (piece.startswith(prefix) and len(piece) == len(prefix) + 1)


def kept_ids(tokenizer, texts: list[str]) -> list[int]:
    """Sorted old ids to keep for texts, under a `tokenizers.Tokenizer` with a WordPiece model."""
    vocab = tokenizer.get_vocab()
    prefix = getattr(tokenizer.model, "continuing_subword_prefix", "##")
    keep = {i for piece, i in vocab.items() if single_char(piece, prefix)}
    keep.update(vocab[s] for s in SPECIALS if s in vocab)
    keep.update(tokenizer.get_added_tokens_decoder())  # {id: AddedToken}
    for ids in encoded(tokenizer, texts, "ids"):  # a long text in bounded pieces (text/pieces.py)
        keep.update(ids)
    return sorted(keep)


def _remap_processor(proc: dict | None, new_id: dict[int, int]) -> None:
    """Renumber the special-token ids a tokenizer.json post-processor names (in place)."""
    if not proc:
        return
    kind = proc.get("type")
    if kind in ("BertProcessing", "RobertaProcessing"):
        for key in ("sep", "cls"):
            proc[key][1] = new_id[proc[key][1]]
    elif kind == "TemplateProcessing":
        for spec in proc.get("special_tokens", {}).values():
            spec["ids"] = [new_id[i] for i in spec["ids"]]
    elif kind == "Sequence":
        for inner in proc.get("processors", []):
            _remap_processor(inner, new_id)


def trim(src, texts: list[str], dst) -> dict:
    """Write a copy of the BERT directory src with the vocabulary cut to what texts use.

    Returns {"vocab_before", "vocab_after"}. dst must not exist yet (the caller owns it).
    """
    from ..storage.pretrained import read_tensors
    from ..text.tokenizer import WordPieceTokenizer, _read_json

    src, dst = Path(src), Path(dst)
    wordpiece = WordPieceTokenizer.load(src)
    tok = wordpiece.backend_tokenizer
    config = _read_json(src / layout.CONFIG)
    V = config.get("vocab_size")
    if tok.model.__class__.__name__ != "WordPiece":
        raise DbertError(f"needs a WordPiece tokenizer; {src} has {tok.model.__class__.__name__}", "trim_vocab", True)
    if V != tok.get_vocab_size(with_added_tokens=True):
        raise DbertError(f"cannot trim {src}: config.json says vocab_size {V}, the tokenizer has "
                         f"{tok.get_vocab_size(with_added_tokens=True)} pieces")
    keep = kept_ids(tok, texts)
    new_id = {old: new for new, old in enumerate(keep)}
    index = torch.tensor(keep, dtype=torch.long)

    weights = read_tensors(src)
    rows = [k for k, v in weights.items() if k.endswith(VOCAB_ROWS) and v.shape[0] == V]
    if not any(k.endswith("word_embeddings.weight") for k in rows):
        raise DbertError(f"cannot trim {src}: no word_embeddings.weight with {V} rows")
    trimmed = {k: (v.index_select(0, index) if k in rows else v).contiguous() for k, v in weights.items()}

    tj = json.loads(tok.to_str())
    old_vocab = tj["model"]["vocab"]
    tj["model"]["vocab"] = {piece: new_id[i] for piece, i in sorted(old_vocab.items(), key=lambda kv: kv[1])
                            if i in new_id}
    tj["added_tokens"] = [dict(a, id=new_id[a["id"]]) for a in tj.get("added_tokens", []) if a["id"] in new_id]
    _remap_processor(tj.get("post_processor"), new_id)
    for key in ("truncation", "padding"):  # dbert pads and cuts itself
        tj[key] = None

    from safetensors.torch import save_file

    dst.mkdir(parents=True)
    save_file(trimmed, str(dst / layout.WEIGHTS), metadata={"format": "pt"})
    config["vocab_size"] = len(keep)
    (dst / layout.CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    (dst / layout.TOKENIZER).write_text(json.dumps(tj, ensure_ascii=False) + "\n")
    pieces = sorted(tj["model"]["vocab"], key=tj["model"]["vocab"].get)
    (dst / layout.VOCAB).write_text("".join(p + "\n" for p in pieces))
    if (src / layout.TOKENIZER_CONFIG).is_file():
        tc = dict(wordpiece.config)
        if "added_tokens_decoder" in tc:
            tc["added_tokens_decoder"] = {str(new_id[int(k)]): v for k, v in tc["added_tokens_decoder"].items()
                                          if int(k) in new_id}
        (dst / layout.TOKENIZER_CONFIG).write_text(json.dumps(tc, indent=2) + "\n")
    if (src / layout.SPECIAL_TOKENS).is_file():
        shutil.copyfile(src / layout.SPECIAL_TOKENS, dst / layout.SPECIAL_TOKENS)
    return {"vocab_before": V, "vocab_after": len(keep)}
