"""dbert-tui: a Textual app to watch DiffusionBERT fill in [MASK]s, and to fetch or train checkpoints.

It talks to `dbert_core` only through its public API (sample.frames, train.Trainer callbacks,
store, fetch); `dbert_core` never imports Textual.
"""

from .early_keys import hold as _hold_early_keys

_hold_early_keys()  # before the heavy imports: a Ctrl-Q typed while the app starts quits it (early_keys.py)
