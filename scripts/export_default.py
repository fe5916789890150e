"""Export a trained checkpoint as the shipped default: half-precision weights, no trainer state.

    python scripts/export_default.py runs/minilm-wiki assets/dbert-minilm-wiki [--card CARD.md]

The weights are stored in float16 (loaded back as float32); the model card is copied in as
MODEL_CARD.md. The export is atomic like every checkpoint save. A run that continued a dbert
checkpoint (its --init) keeps that checkpoint's step, tokens and time under "parent". A story
run trained before runs recorded their sampling defaults gets them from its training files
(dbert_core/training/story_defaults.py). --steps / --top-k / --top-p / --cache-refresh record the
decoding measured best for it as its defaults (dbert.json's sampling.decoding; `dbert sample` uses them
unless told): the shipped story model's is --steps 32 --top-k 0 --top-p 0.93 --cache-refresh 8
(docs/stories.md, docs/performance.md).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from dbert_core.storage import checkpoint


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--card", help="Markdown model card to ship as MODEL_CARD.md")
    ap.add_argument("--steps", type=int, help="the reverse steps sampling uses unless told")
    ap.add_argument("--temperature", type=float, help="the softmax temperature sampling uses unless told (0: greedy)")
    ap.add_argument("--top-k", type=int, help="the top-k sampling uses unless told (0: off)")
    ap.add_argument("--top-p", type=float, help="the nucleus mass sampling uses unless told, in (0, 1]")
    ap.add_argument("--cache-refresh", type=int, help="the decided-position cache's refresh sampling uses unless told (0: the exact forward)")
    ap.add_argument("--cache-masked", action=argparse.BooleanOptionalAction, default=None,
                    help="with --cache-refresh: whether sampling keeps [MASK] positions' states too unless told")
    args = ap.parse_args()
    from dbert_core.errors import DbertError

    try:
        return export(args)
    except DbertError as e:  # a bad value, a missing checkpoint or card: one line
        from dbert_core.settings import flag  # a setting named by the script's option, as dbert does

        print(f"export_default: error: {e.said(flag)}", file=sys.stderr)
        return 2


def export(args) -> int:
    """The export main() asked for; DbertError for anything wrong, before anything is written."""
    from dbert_core.config import SampleConfig
    from dbert_core.errors import DbertError

    decoding = {k: v for k, v in (("steps", args.steps), ("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p),
                                  ("cache_refresh", args.cache_refresh), ("cache_masked", args.cache_masked))
                if v is not None}
    SampleConfig(**decoding).validate()  # before the checkpoint is read
    try:
        card = Path(args.card).read_text(encoding="utf-8") if args.card else None
    except (OSError, UnicodeDecodeError) as e:
        raise DbertError(f"cannot read --card {args.card}: {getattr(e, 'strerror', None) or e}") from None
    db = checkpoint.load(args.src)
    for key in ("train_config",):  # keep the recipe, drop machine-local paths
        cfg = db.meta.get(key, {})
        cfg.pop("out", None)
    parent = Path(str(db.meta.get("init") or "")) / "dbert.json"
    if parent.is_file():  # a stage 2 (stories_model.sh continue): keep what stage 1 was, its folder is local
        p = json.loads(parent.read_text(encoding="utf-8"))
        db.meta["parent"] = {k: p[k] for k in ("init", "step", "tokens_seen", "train_seconds", "created", "parent")
                             if k in p}
    from dbert_core.storage.store import _val_ppl

    val = _val_ppl(Path(args.src), {})  # the run's last validation bound, kept for listings
    if val is not None:
        db.meta["val_ppl_token"] = round(val, 3)
    if db.meta.get("unit") == "story" and "sampling" not in db.meta:  # trained before runs recorded it
        from dbert_core.training.story_defaults import of_run

        db.meta["sampling"] = of_run(db.meta, db.tokenizer)
        print(f"sampling defaults from the training stories: {db.meta['sampling']}", file=sys.stderr)
    if db.words is None:  # trained before runs kept their multi-piece words (text/lexicon.py)
        from dbert_core.text import lexicon
        from dbert_core.text.data import text_lines

        files = list(db.meta.get("data") or (db.meta.get("train_config") or {}).get("data") or [])
        if files and all(Path(f).is_file() for f in files):  # the documents' text, as the run read it
            db.words = lexicon.learn(text_lines(files, (db.meta.get("train_config") or {}).get("doc_sep", "auto")),
                                     db.tokenizer)
            print(f"{len(db.words)} words from the training files (dbert_words.json)", file=sys.stderr)
    if decoding:
        db.meta.setdefault("sampling", {})["decoding"] = decoding
    extra = {"MODEL_CARD.md": card} if card is not None else None
    path = checkpoint.save(db, args.dst, dtype=torch.float16, extra_files=extra)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    print(f"{path}: {size / 2**20:.1f} MiB", file=sys.stderr)
    again = checkpoint.load(path)
    assert next(again.model.parameters()).dtype == torch.float32
    return 0


if __name__ == "__main__":
    sys.exit(main())
