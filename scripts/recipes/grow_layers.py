"""A deeper model grown from a trained one (issue 58, item 4: capacity): every encoder layer of CK repeated in
place, so 6 layers become 12 (layer j of the new model starts as layer j // 2 of the old, the "duplicate
adjacent" order of progressive stacking, Gong et al. 2019), the embeddings, the head, the tokenizer and dbert's
files (schedule tables, decoding) copied as they are. The result is a checkpoint `dbert train --init OUT` trains
and `dbert sample -c OUT` samples; its text is not yet good (a layer run twice is not the same function): train
it. Written into a folder beside OUT and renamed at the end, so a killed run leaves no half checkpoint.

    python scripts/recipes/grow_layers.py assets/dbert-minilm-stories runs/grown12 --times 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from dbert_core.storage.checkpoint import DIGESTS, digest

LAYER = re.compile(r"^(bert\.encoder\.layer\.)(\d+)(\..*)$")


def grown(tensors: dict, times: int) -> tuple[dict, int]:
    """The state dict with each layer i repeated `times` times in place (new layer j = old layer j // times)."""
    old = 1 + max(int(m.group(2)) for k in tensors if (m := LAYER.match(k)))
    out = {}
    for key, value in tensors.items():
        m = LAYER.match(key)
        if not m:
            out[key] = value
            continue
        i = int(m.group(2))
        for r in range(times):
            out[f"{m.group(1)}{i * times + r}{m.group(3)}"] = value.clone()
    return out, old * times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--times", type=int, default=2, help="how many times each layer is repeated (2: 6 -> 12)")
    a = ap.parse_args(argv)
    if a.times < 1:
        print("grow_layers: --times must be at least 1", file=sys.stderr)
        return 2
    if a.out.exists():
        print(f"grow_layers: {a.out} exists; pick another name or remove it", file=sys.stderr)
        return 2
    if not (a.checkpoint / "model.safetensors").is_file():
        print(f"grow_layers: {a.checkpoint} has no model.safetensors", file=sys.stderr)
        return 2
    tmp = a.out.with_name(a.out.name + ".growing")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(a.checkpoint, tmp, ignore=shutil.ignore_patterns("model.safetensors", "MODEL_CARD.md", "trainer_state", "*.tmp"))
    tensors, layers = grown(load_file(a.checkpoint / "model.safetensors"), a.times)
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    meta = json.loads((tmp / "dbert.json").read_text())  # dbert refuses weights whose sha256 is not the recorded one
    meta.setdefault(DIGESTS, {})["model.safetensors"] = digest(tmp / "model.safetensors")
    meta["parent"] = str(a.checkpoint)
    meta["grown"] = {"from_layers": layers // a.times, "times": a.times, "order": "adjacent (j -> j // times)"}
    meta.pop("parameters", None)
    (tmp / "dbert.json").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, a.out)
    print(f"grow_layers: {a.out}: {layers} layers from {a.checkpoint}'s {layers // a.times}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
