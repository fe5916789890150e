"""Learn a checkpoint's truecase table and word list again from its training files, read as training
reads them now (data.text_lines: a JSONL line's "text", no <|endoftext|> line), without touching
its weights.

    python scripts/recipes/relearn_tables.py assets/dbert-minilm-stories FILE... [--write]

The files must be the very files the checkpoint recorded (dbert.json's data_files: each one's
sha256 is checked, in any order). The shipped story model's are rebuilt by
`scripts/stories_model.sh story-data` (runs/data/head-train.txt, runs/data/lowercase-stories.txt)
and ../shared/data/fables/fables.txt. Prints what changes on stderr (words that leave or join the
list, forms that change); --write writes dbert_words.json and dbert_truecase.json (each whole or
not at all). One line and exit 2 for a file that is not one the checkpoint was trained on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--write", action="store_true", help="write the tables (default: only say what changes)")
    args = ap.parse_args()
    from dbert_core.disk.atomic import atomic_write_text
    from dbert_core.disk.layout import TRUECASE, WORDS
    from dbert_core.errors import DbertError
    from dbert_core.storage import checkpoint
    from dbert_core.text import lexicon, truecase
    from dbert_core.text.data import fingerprints, text_lines

    try:
        db = checkpoint.load(args.checkpoint)
        recorded = {f.get("sha256") for f in db.meta.get("data_files") or []}
        given = fingerprints(args.files)
        for f in given:
            if f["sha256"] not in recorded:
                raise DbertError(f"{f['path']} is not one of the files {args.checkpoint} was trained on "
                                 "(its sha256 is not in dbert.json's data_files)")
        if len(given) != len(recorded) or {f["sha256"] for f in given} != recorded:
            raise DbertError(f"give every file {args.checkpoint} was trained on ({len(recorded)}), once each")
        lines = text_lines(args.files, (db.meta.get("train_config") or {}).get("doc_sep", "auto"))
        words = lexicon.learn(lines, db.tokenizer)
        table = truecase.learn(lines)
    except DbertError as e:
        from dbert_core.settings import flag  # a setting named by the script's option, as dbert does

        print(f"relearn_tables: error: {e.said(flag)}", file=sys.stderr)
        return 2
    old_words, old_table = db.words or frozenset(), db.truecase or {}
    gone, new = sorted(old_words - words), sorted(words - old_words)
    changed = sorted(k for k in set(old_table) | set(table) if old_table.get(k) != table.get(k))
    print(f"words: {len(old_words)} -> {len(words)}; left the list: {gone[:20]}{' ...' if len(gone) > 20 else ''}; "
          f"joined it: {new[:20]}{' ...' if len(new) > 20 else ''}", file=sys.stderr)
    print(f"truecase: {len(old_table)} -> {len(table)} forms; changed: "
          f"{[(k, old_table.get(k), table.get(k)) for k in changed[:20]]}", file=sys.stderr)
    if args.write:
        folder = Path(args.checkpoint)
        atomic_write_text(folder / WORDS, json.dumps(lexicon.to_json(words), ensure_ascii=False, indent=0) + "\n")
        atomic_write_text(folder / TRUECASE, json.dumps(truecase.to_json(table), ensure_ascii=False, indent=0) + "\n")
        print(f"wrote {folder / WORDS} and {folder / TRUECASE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
