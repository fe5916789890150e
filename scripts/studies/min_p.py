"""A min-p cut (Nguyen et al. 2024) on the default story model, without making it a product option: keep the
tokens whose probability is at least MIN_P times the most likely one's (on the untempered p, so the cut does not
move with the temperature), then draw from the tempered p inside the cut; top-k and nucleus off. docs/stories.md
says what it did (it narrows the stories instead of widening them towards the human ones).

    python scripts/studies/min_p.py 0.1 1.0 runs/minp10.txt      # MIN_P TEMPERATURE OUT: 100 stories, seed 0
    python scripts/studies/stories.py runs/minp10.txt --heldout runs/data/head-heldout.txt --judge runs/story-judge
"""

import sys

import torch

from dbert_core.config import SampleConfig
from dbert_core.sampling import draw
from dbert_core.sampling.sample import generate, resolve
from dbert_core.storage import checkpoint, store


def main() -> None:
    min_p, temperature, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    shape = draw.shape_probs

    def with_min_p(logits, temperature=1.0, top_k=0, top_p=1.0):
        p = shape(logits, temperature, top_k, top_p)
        p1 = torch.softmax(logits.double(), -1)
        p = p * (p1 >= min_p * p1.max(-1, keepdim=True).values)
        return p / p.sum(-1, keepdim=True)

    draw.shape_probs = with_min_p  # draw.draw looks it up at each call
    db = checkpoint.load(store.default_checkpoint())
    texts, stats = generate(db, resolve(SampleConfig(n=100, seed=0, top_k=0, top_p=1.0, temperature=temperature), db))
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(texts) + "\n")
    print(stats, file=sys.stderr)


if __name__ == "__main__":
    main()
