"""storage: checkpoints, where they live and how they arrive.

checkpoint (load, save, the swap), pretrained (transformers' BERT format), store (names <-> paths,
listing, import, remove), fetch (the network; commits through the store), archive (unpacking without
trusting), net (what a download accepts), datasets (a hub dataset's
data files for --data hf:owner/name, downloaded once).

May import: the floor, disk, text, maths.
"""
