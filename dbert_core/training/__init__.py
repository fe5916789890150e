"""training: making a checkpoint.

prepare (a run made ready: data, tokenizer, model, the resume rule), story_data (a story run's
windows, split and statistics from the token cache), train (Trainer: the loop,
reporting through callbacks), vocab (trimming a pretrained vocabulary to the training text),
story_defaults (what a story checkpoint recommends to its sampler, from its training stories).

May import: the floor, disk, text, maths, storage.
"""
