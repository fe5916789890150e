"""Data files read as a stream: lines and documents one at a time, never the whole corpus in memory.

The same documents as data.read_documents and the same lines as data.read_lines (the token cache
and the learnt tables are built from these), from files of any size: a file is read line by
line, and its format (jsonl, eot or blank; data.document_format) is found by a look ahead that
stops at the first <|endoftext|> line. Compressed files (`.gz`; `.zst` with the zstandard
package) are read through their decompressor; `.jsonl.gz` is JSONL. A table is one document a
row, from its "text" column (the field a JSONL line's text is read from), whatever --doc-sep
says: a `.parquet` file (with pyarrow), a batch of rows at a time, or a `.csv` or `.tsv` file
(compressed too: `.csv.gz`), a row at a time by Python's csv module, under a header row naming
its columns. Every bad input is one DbertError line naming the file: unreadable, not UTF-8,
binary (NUL bytes), empty, a JSONL line or a table without a "text" string, a CSV row whose
fields are not the header's.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import DbertError
from ..config import DOC_SEPS
from .data import EOT, expand_paths, jsonl_paragraphs

COMPRESSED = (".gz", ".zst")


def plain_name(path: str) -> str:
    """The file's name without its compression suffix (`a.jsonl.gz` -> `a.jsonl`)."""
    for suffix in COMPRESSED:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def _open_bytes(path: str):
    if path.endswith(".gz"):
        import gzip

        return gzip.open(path, "rb")
    if path.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise DbertError(f"{path}: reading .zst needs the zstandard package (pip install zstandard)") from None
        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return open(path, "rb")


PARQUET_ROWS = 4096


def parquet_texts(path: str) -> Iterator[str]:
    """The "text" column of a Parquet file, a batch of rows at a time."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DbertError(f"{path}: reading .parquet needs the pyarrow package (pip install pyarrow)") from None
    try:
        f = pq.ParquetFile(path)
        names = f.schema_arrow.names
        if "text" not in names:
            raise DbertError(f"{path}: a Parquet file needs a \"text\" column (it has: {', '.join(names[:8])})")
        kind = f.schema_arrow.field("text").type
        if str(kind) not in ("string", "large_string", "string_view"):
            raise DbertError(f"{path}: its \"text\" column holds {kind}, not strings")
        for batch in f.iter_batches(columns=["text"], batch_size=PARQUET_ROWS):
            yield from (t for t in batch.column(0).to_pylist() if t is not None)
    except DbertError:
        raise
    except Exception as e:  # pyarrow.ArrowInvalid and its kin: not a Parquet file, or a broken one
        raise DbertError(f"cannot read data file {path} as Parquet: {str(e).splitlines()[0][:160]}") from None


def _decoded_lines(path: str, newline: str | None) -> Iterator[str]:
    """A UTF-8 file's lines as they are (a BOM dropped), through its decompressor; every failure
    to read it one DbertError line."""
    try:
        with _open_bytes(path) as raw:
            lines = io.TextIOWrapper(raw, encoding="utf-8-sig", newline=newline)
            for ln in lines:
                if "\x00" in ln:  # valid UTF-8, but a binary file, not text
                    raise DbertError(f"data file is not text (it holds NUL bytes): {path}")
                yield ln
    except UnicodeDecodeError:
        raise DbertError(f"data file is not UTF-8 text: {path}") from None
    except (OSError, EOFError) as e:  # gzip's BadGzipFile is an OSError; a cut .gz an EOFError
        raise DbertError(f"cannot read data file {path}: {getattr(e, 'strerror', None) or e}") from None
    except Exception as e:  # zstandard.ZstdError: a corrupt frame
        if type(e).__module__.startswith("zstandard"):
            raise DbertError(f"cannot read data file {path}: {e}") from None
        raise


CSV_FIELD_CHARS = 1 << 26  # the csv module's longest field (its own default, 131,072, is a short book chapter)


def csv_texts(path: str, delimiter: str = ",") -> Iterator[str]:
    """The "text" column of a CSV (or, delimiter a tab, TSV) file under its header row, a row at a
    time; blank lines skipped, an empty value no document."""
    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_CHARS))
    rows = csv.reader(_decoded_lines(path, newline=""), delimiter=delimiter, strict=True)  # newline="": quoted newlines
    what = "TSV" if delimiter == "\t" else "CSV"
    try:
        header = next((r for r in rows if r), None)
        if header is None:
            raise DbertError(f"data file is empty: {path}")
        if "text" not in header:
            raise DbertError(f"{path}: a {what} file needs a \"text\" column (it has: {', '.join(header[:8])})")
        at = header.index("text")
        for row in rows:
            if row and len(row) != len(header):
                raise DbertError(f"{path}:{rows.line_num}: this row has {len(row)} fields, the header {len(header)} "
                                 f"({', '.join(header[:8])})")
            if row and row[at]:
                yield row[at]
    except csv.Error as e:  # a quote left open at the end, a field over CSV_FIELD_CHARS
        raise DbertError(f"{path}:{rows.line_num}: not {what}: {e}") from None


def table_texts(path: str) -> Iterator[str] | None:
    """The texts of a file that is a table, a document a row: a Parquet, CSV or TSV file's "text"
    column; None for any other file."""
    if path.endswith(".parquet"):
        return parquet_texts(path)
    name = plain_name(path)
    if name.endswith((".csv", ".tsv")):
        return csv_texts(path, "\t" if name.endswith(".tsv") else ",")
    return None


def raw_lines(path: str) -> Iterator[str]:
    """A UTF-8 file's lines, stripped, blank ones included, read as a stream (a BOM is dropped); a
    table's texts' lines."""
    texts = table_texts(path)
    if texts is None:
        yield from (ln.strip() for ln in _decoded_lines(path, newline=None))
        return
    for text in texts:
        if "\x00" in text:
            raise DbertError(f"data file is not text (it holds NUL bytes): {path}")
        yield from (ln.strip() for ln in text.splitlines())


def file_lines(path: str) -> Iterator[str]:
    """raw_lines, and one clear error at the end when the file had no text at all."""
    seen = False
    for ln in raw_lines(path):
        seen = seen or bool(ln)
        yield ln
    if not seen:
        raise DbertError(f"data file is empty: {path}")


def iter_lines(patterns: list[str]) -> Iterator[str]:
    """Non-empty stripped lines of the files, in order (data.read_lines, streamed)."""
    for path in expand_paths(patterns):
        yield from (ln for ln in file_lines(path) if ln)


def file_format(path: str) -> str:
    """data.document_format without reading the file whole: jsonl by name or first line, eot when
    some line is <|endoftext|> (the look ahead stops there), else blank; "table" for a file of
    rows (table_texts)."""
    if path.endswith(".parquet") or plain_name(path).endswith((".csv", ".tsv")):
        return "table"
    first = None
    for ln in file_lines(path):
        if first is None and ln:
            first = ln
            if plain_name(path).endswith(".jsonl") or (ln.startswith("{") and ln.endswith("}")):
                return "jsonl"
        if ln == EOT:
            return "eot"
    return "blank"


def _jsonl(path: str) -> Iterator[list[str]]:
    for i, ln in enumerate(file_lines(path), 1):
        paras = jsonl_paragraphs(path, i, ln) if ln else []
        if paras:
            yield paras


def iter_documents(patterns: list[str], sep: str = "auto") -> Iterator[list[str]]:
    """The documents of the files, each a list of its paragraphs, one at a time: the documents of
    data.read_documents, in its order, by its rules."""
    if sep not in DOC_SEPS:
        raise DbertError(f"must be one of: {', '.join(DOC_SEPS)} (got {sep!r})", "doc_sep", sep)
    for path in expand_paths(patterns):
        texts = table_texts(path)
        if texts is not None:  # a document a row, whatever --doc-sep says: rows are its documents
            seen = False
            for text in texts:
                paras = [p.strip() for p in text.splitlines() if p.strip()]
                if paras:
                    seen = True
                    yield paras
            if not seen:
                raise DbertError(f"data file is empty: {path}")
            continue
        fmt = file_format(path) if sep == "auto" else sep
        if fmt == "jsonl":
            yield from _jsonl(path)
            continue
        if fmt == "line":
            yield from ([ln] for ln in file_lines(path) if ln and ln != EOT)
            continue
        doc: list[str] = []
        for ln in file_lines(path):
            if ln == EOT or (fmt == "blank" and not ln):
                if doc:
                    yield doc
                doc = []
            elif ln:
                doc.append(ln)
        if doc:
            yield doc


def total_bytes(patterns: list[str]) -> int:
    """The files' size on disk (what progress counts against)."""
    return sum(os.path.getsize(p) for p in expand_paths(patterns))



def iter_examples(patterns: list[str], unit: str = "line", sep: str = "auto") -> Iterator[str]:
    """data.read_examples, streamed: each paragraph of the documents (`--unit line`) or each of its
    sentences (`--unit sentence`)."""
    from .data import split_sentences

    if unit not in ("line", "sentence"):
        raise DbertError(f"unknown example unit {unit!r}; choose line or sentence")
    for doc in iter_documents(patterns, sep):
        for line in doc:
            if unit == "line":
                yield line
            else:
                yield from split_sentences(line)


SENTENCE_PACK = "sentence-pack"  # the token cache's unit of a `--unit sentence --pack` run


@dataclass(frozen=True)
class StoryHead:
    """In an entry of SENTENCE_PACK: where a story begins, no text of its own; its words (data.count_words
    of its paragraphs, summed) and its paragraphs, for DocumentStats."""
    words: int
    paragraphs: int


def story_units(patterns: list[str], sep: str = "auto") -> Iterator[StoryHead | str]:
    """Each story of the files as a StoryHead, then its units as data.document_sentences makes them
    (its sentences, those inside one quotation joined), a string each (a document of the entry
    that is no paragraph: token_cache gives it 0 paragraphs, its head the story's)."""
    from .data import count_words, join_open_quotes, split_sentences

    for doc in iter_documents(patterns, sep):
        yield StoryHead(sum(count_words(p) for p in doc), len(doc))
        for para in doc:
            yield from join_open_quotes(split_sentences(para))


def unit_documents(patterns: list[str], unit: str, sep: str = "auto") -> Iterator:
    """What a token cache entry of `unit` holds a document each: a story (its paragraphs); for
    line and sentence, one example (a document of one paragraph); for SENTENCE_PACK, story_units."""
    if unit == "story":
        return iter_documents(patterns, sep)
    if unit == SENTENCE_PACK:
        return story_units(patterns, sep)
    return ([e] for e in iter_examples(patterns, unit, sep))
