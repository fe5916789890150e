"""dbert: DiffusionBERT, a BERT trained as the reverse process of a masking diffusion.

The engine, importable as a library; it never imports Textual.

    from dbert_core import checkpoint, sample
    db = checkpoint.load(store.resolve("default"))
    texts, stats = sample.generate(db, n=4, steps=64)
"""

__version__ = "0.1.0"
