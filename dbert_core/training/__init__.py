"""training: making a checkpoint.

prepare (a run made ready: data, tokenizer, model, the resume rule), train (Trainer: the loop,
reporting through callbacks), vocab (trimming a pretrained vocabulary to the training text).

May import: the floor, disk, text, maths, storage.
"""
