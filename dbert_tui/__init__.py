"""dbert-tui: a Textual app to watch DiffusionBERT fill in [MASK]s, and to fetch or train checkpoints.

It talks to `dbert_core` only through its public API (sample.frames, train.Trainer callbacks,
store, fetch); `dbert_core` never imports Textual.
"""
