"""Text files -> token examples -> padded batches.

An example is a line of a file (or, with unit="sentence", a sentence of it), tokenized
without special tokens and cut to seq_len. A batch is [CLS] x_1..x_n [SEP] [PAD]... padded
to its longest member; only x_1..x_n are noised and scored ("noisable"). With pack=True
consecutive examples are joined by [SEP] into full seq_len streams: no padding at all.
"""

from __future__ import annotations

import glob
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..config import DOC_SEPS
from ..disk.tree import folder_files
from ..errors import DbertError

# A sentence ends at . ! or ? (closing quotes and brackets stay with it) followed by white space and
# a capital or digit (an opening quote or bracket may come first); in text with no capital at all
# (lower-cased corpora) a lower-case letter may start the next sentence too. Only the white space
# between two sentences is consumed.
_CLOSERS = "\"'\u201d\u2019)\\]"
_OPENERS = "\"'\u201c\u2018(\\["
_SENTENCE_END = re.compile(rf"[.!?][{_CLOSERS}]*(\s+)(?=[{_OPENERS}]?[A-Z0-9])")
_SENTENCE_END_UNCASED = re.compile(rf"[.!?][{_CLOSERS}]*(\s+)(?=[{_OPENERS}]?[a-z0-9])")


def expand_paths(patterns: list[str]) -> list[str]:
    """Files named by paths, globs or folders (their files, every level down, sorted), in order;
    one clear error for anything missing. A name that exists is that file even if it holds glob
    characters (`a[1].txt`); only regular files are read: a FIFO or a device would block or never end."""
    paths: list[str] = []
    for pattern in patterns:
        literal = os.path.expanduser(pattern)
        matches = [literal] if os.path.lexists(literal) else sorted(glob.glob(literal))
        if not matches:
            raise DbertError(f"data file not found: {pattern}")
        matches = [f for m in matches for f in (folder_files(m) if os.path.isdir(m) else [m])]
        for m in matches:
            if os.path.exists(m) and not os.path.isfile(m):
                raise DbertError(f"data path is not a regular file (a FIFO or a device): {m}")
        paths.extend(matches)
    return paths


def absolute_patterns(patterns: list[str] | None) -> list[str] | None:
    """Paths or globs made absolute (~ expanded), as a run records them: it resumes from any folder
    (an hf:owner/name dataset as it is: storage/datasets.py)."""
    if patterns is None:
        return None
    return [p if p.startswith("hf:") else os.path.abspath(os.path.expanduser(p)) for p in patterns]  # hf: a hub dataset


def fingerprints(patterns: list[str]) -> list[dict]:
    """{path, size, sha256} of each file the patterns name, in order: what a run's data is, by content."""
    import hashlib

    out = []
    for path in expand_paths(patterns):
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError as e:
            raise DbertError(f"cannot read data file {path}: {e.strerror}") from None
        out.append({"path": os.path.abspath(path), "size": os.path.getsize(path), "sha256": h.hexdigest()})
    return out


def _file_lines(path: str) -> list[str]:
    """A UTF-8 text file's stripped lines, blank ones included (a byte-order mark at its start is
    not text: Windows editors and some exporters write one); one clear error if it has no text."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            got = [ln.strip() for ln in f]
    except UnicodeDecodeError as e:
        raise DbertError(f"data file is not UTF-8 text: {path} (byte {e.start})") from None
    except OSError as e:
        raise DbertError(f"cannot read data file {path}: {e.strerror}") from None
    if not any(got):
        raise DbertError(f"data file is empty: {path}")
    if any("\x00" in ln for ln in got):  # valid UTF-8, but a binary file, not text
        raise DbertError(f"data file is not text (it holds NUL bytes): {path}")
    return got


def read_lines(patterns: list[str]) -> list[str]:
    """Non-empty stripped lines of UTF-8 text files."""
    return [ln for path in expand_paths(patterns) for ln in _file_lines(path) if ln]


EOT = "<|endoftext|>"                       # TinyStories' own story separator, a line of its own


def document_format(path: str, lines: list[str] | None = None) -> str:
    """How a file separates its documents, read from the file: "jsonl" for a .jsonl file or one
    whose first line is a JSON object, "eot" when a line is <|endoftext|>, else "blank" (blank
    lines between documents)."""
    lines = _file_lines(path) if lines is None else lines
    first = next((ln for ln in lines if ln), "")
    if path.endswith(".jsonl") or (first.startswith("{") and first.endswith("}")):
        return "jsonl"
    if EOT in lines:
        return "eot"
    return "blank"


def jsonl_paragraphs(path: str, i: int, line: str) -> list[str]:
    """The paragraphs of line i of a JSONL file (its "text" field's non-empty lines); a line that is no
    JSON object with a "text" string is one DbertError naming the file and line."""
    import json

    try:
        row = json.loads(line)
    except ValueError:
        raise DbertError(f"{path}:{i}: not a JSON object (JSONL reads one {{\"text\": ...}} per line)") from None
    text = row.get("text") if isinstance(row, dict) else None
    if not isinstance(text, str):
        raise DbertError(f"{path}:{i}: a JSONL line needs a \"text\" string field")
    return [p.strip() for p in text.splitlines() if p.strip()]


def _jsonl_documents(path: str, lines: list[str]) -> list[list[str]]:
    docs = (jsonl_paragraphs(path, i, ln) for i, ln in enumerate(lines, 1) if ln)
    return [paras for paras in docs if paras]


def read_documents(patterns: list[str], sep: str = "auto") -> list[list[str]]:
    """The documents of UTF-8 text files, each a list of its paragraphs. sep says what separates
    documents: "blank" lines (a run of non-empty lines is a document), "eot" (TinyStories'
    <|endoftext|> lines; blank lines inside a document are ignored; such a line ends a document
    in every format), "line" (one document per
    line), "jsonl" (one {"text": ...} per line, its text's lines the paragraphs), or "auto": each
    file's own format (document_format). A file's end ends a document too."""
    if sep not in DOC_SEPS:
        raise DbertError(f"must be one of: {', '.join(DOC_SEPS)} (got {sep!r})", "doc_sep", sep)
    docs: list[list[str]] = []
    for path in expand_paths(patterns):
        lines = _file_lines(path)
        fmt = document_format(path, lines) if sep == "auto" else sep
        if fmt == "jsonl":
            docs.extend(_jsonl_documents(path, lines))
            continue
        if fmt == "line":
            docs.extend([ln] for ln in lines if ln and ln != EOT)
            continue
        doc: list[str] = []
        for ln in lines:
            if ln == EOT or (fmt == "blank" and not ln):
                if doc:
                    docs.append(doc)
                doc = []
            elif ln:
                doc.append(ln)
        if doc:
            docs.append(doc)
    return docs


@dataclass
class DocumentStats:
    """What a user checks first about documents read from files: how many, how long (words)."""
    count: int
    median_words: int
    longest_words: int
    single_paragraph: float  # the share of documents that are one paragraph

    @classmethod
    def of(cls, docs: list[list[str]]) -> "DocumentStats":
        words = sorted(sum(count_words(p) for p in d) for d in docs) or [0]
        single = sum(len(d) == 1 for d in docs) / max(1, len(docs))
        return cls(len(docs), words[len(words) // 2], words[-1], single)

    def line(self, what: str = "documents") -> str:
        return f"{self.count:,} {what}, median {self.median_words:,} words, longest {self.longest_words:,}"

    def warning(self, sep: str) -> str | None:
        """One line when the boundaries look wrong for story-like text, naming the format assumed
        and the flag that changes it; None when they look plausible."""
        if self.longest_words > 100_000:
            return (f"warning: one document holds {self.longest_words:,} words: read as --doc-sep {sep}; if the "
                    "file separates documents by <|endoftext|> lines, blank lines or one per line, say so with --doc-sep")
        if self.count >= 500 and self.median_words < 60:
            return (f"warning: {self.count:,} documents of a median {self.median_words} words ({self.single_paragraph:.0%} "
                    f"one paragraph): read as --doc-sep {sep}, which may be cutting stories at their paragraphs; "
                    "if documents are separated otherwise, pass --doc-sep eot|line|jsonl")
        return None


def split_sentences(text: str) -> list[str]:
    """A light rule-based splitter: after . ! ? (and any closing quotes or brackets, which stay
    with their sentence) when a capital or digit follows; in text without capitals, any letter."""
    end = _SENTENCE_END if any(ch.isupper() for ch in text) else _SENTENCE_END_UNCASED
    out, start = [], 0
    for m in end.finditer(text):
        out.append(text[start:m.start(1)])
        start = m.end(1)
    out.append(text[start:])
    return [s.strip() for s in out if s.strip()]


def _quote_marks(text: str) -> int:
    return text.count('"') + text.count("\u201c") + text.count("\u201d")


def join_open_quotes(sentences: list[str]) -> list[str]:
    """Consecutive sentences joined while a double quote is open ('"I see. Come in," she said.' is
    one unit, not two with one quote each), so a window that starts or ends at a unit never cuts a
    quotation in two. A paragraph's last unit keeps whatever is left open."""
    out: list[str] = []
    open_ = False
    for s in sentences:
        if open_:
            out[-1] = out[-1] + " " + s
        else:
            out.append(s)
        open_ ^= _quote_marks(s) % 2 == 1
    return out


def document_sentences(docs: list[list[str]]) -> list[list[str]]:
    """Each document's units, in order, across its paragraphs: its sentences, those inside one
    quotation joined (join_open_quotes), so the windows built from them keep quotes paired."""
    return [[s for para in doc for s in join_open_quotes(split_sentences(para))] for doc in docs]


def text_lines(patterns: list[str], sep: str = "auto") -> list[str]:
    """The text of the files' documents as training reads it (read_documents with --doc-sep
    `sep`), a paragraph an item: a JSONL line's "text" (never its JSON), no <|endoftext|> mark.
    What `--unit line` trains on, and what the truecase table and the word list are learnt from."""
    return [p for doc in read_documents(patterns, sep) for p in doc]


def read_examples(patterns: list[str], unit: str = "line", sep: str = "auto") -> list[str]:
    """The examples of `--unit line` (each line of text_lines: a JSONL file's "text" field, whatever
    the unit) or `--unit sentence` (each sentence of those lines)."""
    lines = text_lines(patterns, sep)
    if unit == "line":
        return lines
    if unit == "sentence":
        return [s for ln in lines for s in split_sentences(ln)]
    raise DbertError(f"unknown example unit {unit!r}; choose line or sentence")


def iter_encode(texts: list[str], tokenizer, chunk: int = 4096) -> Iterator[list[int]]:
    """Token ids of each text, in order, encoded chunk by chunk as they are consumed (no special
    tokens, no truncation); stop early and the rest is never tokenized.

    Literal special-token strings in the data (a "[MASK]" in the text) become [UNK]: the
    diffusion must never see a real [MASK] in x_0.
    """
    bad = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.mask_token_id}
    unk = tokenizer.unk_token_id
    backend = getattr(tokenizer, "backend_tokenizer", None)  # Rust tokenizer: skip Python-side conversion
    if backend is not None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(backend.to_str())  # a copy without tokenizer.json's padding/truncation
        backend.no_padding()
        backend.no_truncation()
    if backend is not None:  # a long text in bounded pieces (pieces.py): never one allocation of gigabytes
        from .pieces import encoded

        every = encoded(backend, texts, "ids", chunk)
    else:
        every = (ids for i in range(0, len(texts), chunk)
                 for ids in tokenizer(texts[i:i + chunk], add_special_tokens=False, truncation=False)["input_ids"])
    for ids in every:
        yield [unk if x in bad else x for x in ids] if bad.intersection(ids) else ids


def encode(texts: list[str], tokenizer, chunk: int = 4096) -> list[list[int]]:
    """Token ids of each text, aligned with texts (see iter_encode)."""
    return list(iter_encode(texts, tokenizer, chunk))


def tokenize(texts: list[str], tokenizer, seq_len: int) -> list[list[int]]:
    """Training examples: token ids cut to seq_len; texts that give no tokens are dropped."""
    return [ids[:seq_len] for ids in encode(texts, tokenizer) if ids]


def pack(examples: list[list[int]], seq_len: int, sep_id: int) -> list[list[int]]:
    """Join examples with [SEP] and cut the stream into full seq_len pieces (last one dropped)."""
    stream: list[int] = []
    for ids in examples:
        stream.extend(ids)
        stream.append(sep_id)
    return [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


def pack_sentences(docs: list[list[list[int]]], seq_len: int, sep_id: int, short: float = 0.0, seed: int = 0,
                   words: list[list[int]] | None = None):
    """Sentence-start windows: each document's sentences (token ids) in order, [SEP] before a
    document's first sentence, whole sentences filling a window of at most seq_len tokens; a
    sentence that does not fit begins the next window, so every window starts at a sentence
    start and ends at a sentence end (its unused room is padding). A window that starts a
    document starts with [SEP]: the model learns where stories begin. A sentence longer than a
    window is cut, its rest beginning the next windows.

    short: the fraction of windows given a shorter room, drawn uniformly from 1..seq_len (seeded),
    as BERT's pre-training keeps some sequences short: a room smaller than the next sentence gives a
    window of that one sentence, so the model also learns text that stands alone, not only text with
    a window's worth of context around it. With words (each sentence's word count, shaped as docs)
    it returns (windows, each window's words); a cut sentence's words count in its first piece."""
    rng = random.Random(seed)

    def room() -> int:
        return rng.randint(1, seq_len) if short > 0 and rng.random() < short else seq_len

    windows: list[list[int]] = []
    sizes: list[int] = []
    cur: list[int] = []
    cur_words, limit = 0, room()
    for d, doc in enumerate(docs):
        first = True
        for s, sent in enumerate(doc):
            if not sent:
                continue
            unit = [sep_id, *sent] if first else list(sent)
            n_words = words[d][s] if words is not None else 0
            first = False
            if cur and len(cur) + len(unit) > limit:
                windows.append(cur)
                sizes.append(cur_words)
                cur, cur_words, limit = [], 0, room()
            while len(unit) > seq_len:
                windows.append(unit[:seq_len])
                sizes.append(n_words)
                unit, n_words = unit[seq_len:], 0
            cur.extend(unit)
            cur_words += n_words
    if cur:
        windows.append(cur)
        sizes.append(cur_words)
    return (windows, sizes) if words is not None else windows


def document_windows(docs: list[list[str]], tokenizer, seq_len: int, short: float = 0.0, seed: int = 0,
                     words: bool = False):
    """Documents' sentences (document_sentences) -> their sentence-start windows (pack_sentences),
    encoded in one pass; words=True also returns each window's word count."""
    flat = encode([s for d in docs for s in d], tokenizer)
    grouped, counts, i = [], [], 0
    for d in docs:
        grouped.append(flat[i:i + len(d)])
        counts.append([count_words(s) for s in d])
        i += len(d)
    return pack_sentences(grouped, seq_len, tokenizer.sep_token_id, short=short, seed=seed,
                          words=counts if words else None)


class Window(list):
    """A training example (token ids) whose first `context` tokens are given, never noised or
    scored (the story's earlier text a continuation window carries; the [SEP] opening a story),
    and of whose other tokens the first `scored` are text and its end mark (the rest: padding
    after the end, noised and learnt, not counted as text). A plain list has neither."""

    context: int = 0
    scored: int | None = None

    @classmethod
    def of(cls, ids: list[int], context: int = 0, scored: int | None = None) -> "Window":
        w = cls(ids)
        w.context, w.scored = context, scored
        return w


def story_windows(stories: list[list[int]], seq_len: int, sep_id: int, context: int | None = None) -> list[Window]:
    """Whole-story windows of exactly seq_len tokens (no batch padding): a story's stream is its
    tokens then one [SEP], its end mark. The first window is [SEP] (the story's start, given) and
    the stream; when the stream does not fit, each next window carries the `context` tokens
    before it (default seq_len // 2, given, not noised) and the next seq_len - context of the
    stream: what block continuation samples. After a stream's end the window is padded with
    [SEP], noised like text, so the model learns that nothing follows an end and samples choose
    their own length; `scored` counts the stream's tokens (text + end), the per-token unit."""
    ctx = seq_len // 2 if context is None else context
    if not 0 < ctx < seq_len:
        raise DbertError(f"story context must be in [1, {seq_len - 1}] tokens (got {ctx})")
    out: list[Window] = []
    for story in stories:
        if not story:
            continue
        stream = [*story, sep_id]
        first = stream[:seq_len - 1]
        out.append(Window.of([sep_id, *first, *[sep_id] * (seq_len - 1 - len(first))], 1, len(first)))
        at = len(first)
        while at < len(stream):
            new = stream[at:at + seq_len - ctx]
            given = stream[max(0, at - ctx):at]
            if len(given) < ctx:  # the story's start is inside the context: it opens with [SEP]
                given = [sep_id, *given][-ctx:]
            body = [*given, *new]
            out.append(Window.of([*body, *[sep_id] * (seq_len - len(body))], len(given), len(new)))
            at += len(new)
    return out


def story_texts(docs: list[list[str]]) -> list[str]:
    """Each document as one text: its paragraphs joined by a space (a window has no newline)."""
    return [" ".join(d) for d in docs]


def encode_stories(docs: list[list[str]], tokenizer, seq_len: int, context: int | None = None) -> list[Window]:
    """Documents -> their whole-story windows (story_windows), encoded in one pass."""
    return story_windows(encode(story_texts(docs), tokenizer), seq_len, tokenizer.sep_token_id, context)


def scored_tokens(examples) -> int:
    """How many tokens of the examples count as text (a Window's `scored`; a list: all)."""
    return sum(e.scored if getattr(e, "scored", None) is not None else len(e) - getattr(e, "context", 0)
               for e in examples)


@dataclass
class Special:
    cls: int
    sep: int
    pad: int
    mask: int

    @classmethod
    def of(cls, tokenizer):
        return cls(tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.mask_token_id)


def collate(examples: list[list[int]], special: Special, device="cpu"):
    """(ids, attention, noisable), each (B, 2 + longest): [CLS] x [SEP] then padding; a Window's
    first `context` tokens are not noisable."""
    n = max(len(e) for e in examples)
    B = len(examples)
    ids = torch.full((B, n + 2), special.pad, dtype=torch.long)
    noisable = torch.zeros((B, n + 2), dtype=torch.bool)
    for b, e in enumerate(examples):
        ids[b, 0] = special.cls
        ids[b, 1:1 + len(e)] = torch.tensor(e, dtype=torch.long)
        ids[b, 1 + len(e)] = special.sep
        noisable[b, 1 + getattr(e, "context", 0):1 + len(e)] = True  # a Window's given tokens stay as they are
    attention = ids != special.pad
    attention[:, 0] = True
    return ids.to(device), attention.to(device), noisable.to(device)


def epoch_batches(n_examples: int, batch_size: int, epoch: int, seed: int,
                  lengths: list[int] | None = None, bucket: int = 50) -> list[list[int]]:
    """The batches (lists of example indices) of one epoch, a pure function of (seed, epoch).

    With lengths, examples are sorted by length inside windows of `bucket` batches before
    batching (less padding), then the batches are shuffled. The tail that does not fill a
    batch is dropped.
    """
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(n_examples, generator=g).tolist()
    if lengths is not None and bucket > 1:  # numpy's stable sort: the order sorted(key=length) gives
        w, at, size = batch_size * bucket, np.array(order, dtype=np.int64), np.asarray(lengths)
        order = np.concatenate([at[:0]] + [at[s:s + w][np.argsort(size[at[s:s + w]], kind="stable")]
                                           for s in range(0, len(at), w)]).tolist()
    batches = [order[i:i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]


def token_counts(examples: list[list[int]], vocab_size: int) -> torch.Tensor:
    """How often each vocabulary id occurs in the examples: (V,) int64."""
    flat = torch.tensor([x for e in examples for x in e], dtype=torch.long)
    return torch.bincount(flat, minlength=vocab_size)[:vocab_size]


def count_words(text: str) -> int:
    return len(text.split())


def train_tokenizer(texts: list[str], vocab_size: int):
    """An uncased WordPiece tokenizer learnt from the training texts (for presets without --init).

    The trainer numbers its pieces in hash order and breaks ties between pairs of equal count by
    those numbers: its continuation pieces are numbered first, in sorted order
    (tokenizer.continuation_seeds), and the ids renumbered (special tokens first, then sorted), so
    the same data gives the same tokenizer, which exact resumption and reproducible runs need.
    """
    from tokenizers import BertWordPieceTokenizer

    from .pieces import pieces
    from .tokenizer import WordPieceTokenizer, continuation_seeds

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wp = BertWordPieceTokenizer(lowercase=True, strip_accents=True, clean_text=True)
    seeds = continuation_seeds(wp, texts)
    wp.train_from_iterator((p for t in texts for p in pieces(t)), vocab_size=vocab_size, min_frequency=2,
                           show_progress=False, special_tokens=specials + seeds)  # a long text in pieces (pieces.py)
    rest = sorted(set(wp.get_vocab()) - set(specials))
    vocab = {tok: i for i, tok in enumerate(specials + rest)}
    return WordPieceTokenizer.from_vocab(vocab, do_lower_case=True, strip_accents=True)
