"""dbert: DiffusionBERT, a BERT trained as the reverse process of a masking diffusion.

The engine, importable as a library; it never imports Textual or the TUI. Its packages, by role
(docs/architecture.md draws which may import which; tests/test_architecture.py holds them to it):

    errors, config, settings, strategies, display, hardware   the floor (torch-free but hardware)
    disk        every on-disk name, dbert.json's schema, what counts as code, JSON read safely
    text        tokenizer, text files -> windows -> batches, detokenizing, truecasing, quote and contraction rules
    maths       the schedules (linear, spindle), the BERT denoiser, the forward process and the ELBO
    sampling    the reverse process: settings resolved, the samplers, frames, touch-ups, inspector, trajectories
    storage     checkpoints (load, save), transformers' BERT format, the store of names, fetching, archives
    training    a run made ready (prepare), the training loop (train), vocabulary trimming
    evaluation  metrics and the judge (dbert eval), the bench
    serving     dbert serve: the HTTP app and its queue
    cli         the `dbert` command (cli/commands/: one module a command), the only modules on typer and rich

    from dbert_core.sampling import sample
    from dbert_core.storage import checkpoint, store
    db = checkpoint.load(store.resolve("default"))
    texts, stats = sample.generate(db, n=4, steps=64)

The old flat names (`dbert_core.sample`, `from dbert_core import checkpoint`) still work for one
release, with a DeprecationWarning: dbert_core/_compat.py.
"""

from . import _compat

__version__ = "0.1.0"

_compat.install()


def __getattr__(name: str):
    return _compat.old_module(name)
