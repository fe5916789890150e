"""Set the decoding a checkpoint recommends (dbert.json's sampling.decoding) and nothing else: no weight,
lineage or other field changes (scripts/export_default.py re-exports a run; this edits a release in place).

    python scripts/recipes/set_decoding.py assets/dbert-minilm-stories --sampler blockwise --param block=32 \
        --steps 255 --temperature 0.5 --top-k 0 --top-p 0.93 --cache-refresh 32 --cache-masked

The values replace the recorded decoding whole (a field not given is dropped, so `dbert sample` falls back to
the general default for it), after the checks `dbert sample` makes; the file is written atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dbert_core import strategies
from dbert_core.config import SampleConfig
from dbert_core.disk.atomic import atomic_write_text
from dbert_core.errors import DbertError
from dbert_core.settings import flag


def decoding(args) -> dict:
    given = {"steps": args.steps, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
             "cache_refresh": args.cache_refresh, "cache_masked": args.cache_masked,
             "no_repeat_ngram": args.no_repeat_ngram}
    given = {k: v for k, v in given.items() if v is not None}
    if args.sampler is not None:
        given["sampler"] = args.sampler
        given["params"] = strategies.parse_params(args.sampler, args.param)
    elif args.param:
        raise DbertError("--param needs --sampler (parameters belong to the sampler they are named with)")
    SampleConfig(**given).validate()
    return given


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--cache-refresh", type=int)
    ap.add_argument("--cache-masked", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--no-repeat-ngram", type=int)
    ap.add_argument("--sampler", help="the strategy the checkpoint recommends (dbert sample --sampler's names)")
    ap.add_argument("--param", action="append", help="NAME=VALUE, one of that sampler's parameters (repeatable)")
    args = ap.parse_args(argv)
    path = args.checkpoint / "dbert.json"
    try:
        if not path.is_file():
            raise DbertError(f"{path}: no such file (a dbert checkpoint folder holds dbert.json)")
        meta = json.loads(path.read_text(encoding="utf-8"))
        new = decoding(args)
        if not new:
            raise DbertError("give at least one of --steps, --temperature, --top-k, --top-p, --cache-refresh, --cache-masked, "
                             "--no-repeat-ngram, --sampler")
        old = (meta.get("sampling") or {}).get("decoding")
        meta.setdefault("sampling", {})["decoding"] = new
        atomic_write_text(path, json.dumps(meta, indent=2) + "\n")
    except (DbertError, json.JSONDecodeError, OSError) as e:
        print(f"set_decoding: {e.said(flag) if isinstance(e, DbertError) else e}", file=sys.stderr)
        return 2
    print(f"{path}: decoding {old} -> {new}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
