"""A BERT WordPiece tokenizer without transformers: `tokenizers.Tokenizer` plus the special tokens.

It offers what dbert uses of transformers' BertTokenizerFast (the special tokens and their ids,
len, encode, decode, convert_ids_to_tokens, backend_tokenizer) and reads and writes the same
files: tokenizer.json (or only vocab.txt, as an uncased BERT WordPiece) and
tokenizer_config.json, so `AutoTokenizer.from_pretrained(dir)` loads a saved one unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..disk import layout
from ..display import is_safe, safe_text
from ..errors import DbertError

SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
            "mask_token": "[MASK]"}
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))  # transformers' clean_up_tokenization, in order


def _read_json(path: Path) -> dict:
    """A small JSON object beside the vocabulary, or {} when there is none (jsonfile's limits)."""
    from ..disk.jsonfile import read_json

    if not path.exists():
        return {}
    data = read_json(path)
    if not isinstance(data, dict):
        raise DbertError(f"{path} must hold a JSON object")
    return data


def _shown(piece: str | None) -> str | None:
    return piece if piece is None or is_safe(piece) else safe_text(piece, None)


def _content(token) -> str:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    return token["content"] if isinstance(token, dict) else str(token)


class WordPieceTokenizer:
    def __init__(self, backend, specials: dict[str, str] | None = None, config: dict | None = None):
        """backend: a tokenizers.Tokenizer; specials: {"cls_token": "[CLS]", ...}; config: the other
        keys of tokenizer_config.json, written back by save_pretrained."""
        from tokenizers import AddedToken

        backend.no_padding()  # as transformers does: padding and truncation only when asked
        backend.no_truncation()
        self.backend_tokenizer = backend
        self.config = dict(config or {})
        specials = {**SPECIALS, **(specials or {})}
        added = {str(t) for t in backend.get_added_tokens_decoder().values()}
        backend.add_special_tokens([AddedToken(t, special=True) for t in specials.values() if t not in added])
        for key, token in specials.items():
            setattr(self, key, token)
            setattr(self, key + "_id", backend.token_to_id(token))
        ids: dict = {}
        for key in SPECIALS:  # one id each: a [MASK] that is [PAD] would be dropped from every batch
            other = ids.setdefault(getattr(self, key + "_id"), key)
            if other != key:
                raise DbertError(f"the tokenizer's {other} and {key} are the same token "
                                 f"({safe_text(getattr(self, key), 40)!r}); each special token must be its own")

    @classmethod
    def from_vocab(cls, vocab: dict[str, int], do_lower_case: bool = True, strip_accents: bool | None = None,
                   tokenize_chinese_chars: bool = True, specials: dict[str, str] | None = None,
                   config: dict | None = None) -> "WordPieceTokenizer":
        """BERT's WordPiece pipeline over a vocabulary {token: id}, as transformers builds it."""
        from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
        from tokenizers.models import WordPiece

        s = {**SPECIALS, **(specials or {})}
        missing = [t for t in s.values() if t not in vocab]
        if missing:
            raise DbertError(f"the vocabulary lacks the special tokens {', '.join(missing)}")
        tok = Tokenizer(WordPiece(vocab, unk_token=s["unk_token"], max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
                                                    strip_accents=strip_accents, lowercase=do_lower_case)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        cls_, sep = s["cls_token"], s["sep_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls_}:0 $A:0 {sep}:0", pair=f"{cls_}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls_, vocab[cls_]), (sep, vocab[sep])])
        return cls(tok, s, config)

    @classmethod
    def load(cls, path) -> "WordPieceTokenizer":
        """From a directory: tokenizer.json, or vocab.txt; tokenizer_config.json for the special tokens."""
        from tokenizers import Tokenizer

        path = Path(path)
        config = _read_json(path / layout.TOKENIZER_CONFIG)
        named = {**_read_json(path / layout.SPECIAL_TOKENS), **config}
        specials = {k: _content(named[k]) for k in SPECIALS if named.get(k)}
        if (path / layout.TOKENIZER).is_file():
            try:
                backend = Tokenizer.from_file(str(path / layout.TOKENIZER))
            except Exception as e:  # noqa: BLE001 - the Rust parser's errors
                raise DbertError(f"{path}/tokenizer.json cannot be read: {str(e).splitlines()[0][:120]}") from None
            return cls(backend, specials, config)
        if (path / layout.VOCAB).is_file():
            lines = (path / layout.VOCAB).read_text(encoding="utf-8").split("\n")
            vocab = {token: i for i, token in enumerate(lines[:-1] if lines[-1] == "" else lines)}
            return cls.from_vocab(vocab, config.get("do_lower_case", True), config.get("strip_accents"),
                                  config.get("tokenize_chinese_chars", True), specials, config)
        raise DbertError(f"{path} holds no tokenizer.json or vocab.txt")

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = True) -> str:
        """The text of token ids, as transformers' BertTokenizerFast.decode gives it."""
        text = self.backend_tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces:
            for old, new in _CLEANUP:
                text = text.replace(old, new)
        return text

    def ids_of(self, pieces) -> list[int]:
        """The ids of those of these pieces the vocabulary has, in their order."""
        ids = (self.backend_tokenizer.token_to_id(p) for p in pieces)
        return [int(i) for i in ids if i is not None]

    def convert_ids_to_tokens(self, ids):
        """Token pieces as they are shown (display.safe_text: a piece holding escape codes or other
        control characters reads as their escapes, never reaches a terminal raw)."""
        if isinstance(ids, int):
            return _shown(self.backend_tokenizer.id_to_token(ids))
        return [_shown(self.backend_tokenizer.id_to_token(int(i))) for i in ids]

    def _normalizer(self) -> dict:
        normalizer = json.loads(self.backend_tokenizer.to_str()).get("normalizer") or {}
        return normalizer if normalizer.get("type") == "BertNormalizer" else {}

    def save_pretrained(self, path) -> None:
        """tokenizer.json, tokenizer_config.json, special_tokens_map.json and vocab.txt into path."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        # Python's own I/O, not the tokenizer's save: a full disk is then an OSError (ENOSPC), which a
        # checkpoint save reports in one line, not a bare Exception from Rust ("os error 28")
        (path / layout.TOKENIZER).write_text(self.backend_tokenizer.to_str(pretty=True), encoding="utf-8")
        specials = {key: getattr(self, key) for key in SPECIALS}
        norm = self._normalizer()  # transformers rebuilds the normaliser from these keys: keep them in step
        config = {**self.config, **specials, "tokenizer_class": "BertTokenizer", "backend": "tokenizers",
                  "do_lower_case": norm.get("lowercase", self.config.get("do_lower_case", True)),
                  "strip_accents": norm.get("strip_accents", self.config.get("strip_accents")),
                  "tokenize_chinese_chars": norm.get("handle_chinese_chars",
                                                     self.config.get("tokenize_chinese_chars", True))}
        (path / layout.TOKENIZER_CONFIG).write_text(json.dumps(dict(sorted(config.items())), indent=2) + "\n")
        (path / layout.SPECIAL_TOKENS).write_text(json.dumps(specials, indent=2) + "\n")
        vocab = self.backend_tokenizer.get_vocab(with_added_tokens=False)
        (path / layout.VOCAB).write_text("".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])),
                                        encoding="utf-8")


def continuation_seeds(wp, texts) -> list[str]:
    """Every continuation piece ("##c") the WordPiece trainer will make for the texts, in sorted
    order: given to it first (as special tokens, whose ids it assigns in order), they take ids that
    do not depend on its word table's hash order, which otherwise decides between pairs of equal
    count (so two runs on the same texts learnt vocabularies that differed by a piece or more)."""
    from .pieces import pieces

    norm, pre = wp._tokenizer.normalizer, wp._tokenizer.pre_tokenizer
    chars: set[str] = set()
    for t in texts:
        for p in pieces(t):  # a long text in bounded pieces (pieces.py)
            chars.update(norm.normalize_str(p))

    def inside(c: str) -> bool:  # c can follow a letter inside a word (not white space, not punctuation)
        words = pre.pre_tokenize_str(norm.normalize_str("a" + c))
        return len(words) == 1 and len(words[0][0]) == 2

    return sorted("##" + c for c in chars if inside(c))
