"""evaluation: how good a checkpoint is.

metrics (the bound, samples' measures: dbert eval), story_metrics (is a sample one whole story, its
length, its names), judge (gen-PPL under a causal model), bench
(speed: dbert bench), rates (the machine's matrix rate at a model's own shapes, the limit bench's
figures are put against).

May import: the floor, disk, text, maths, sampling, storage, training.
"""
