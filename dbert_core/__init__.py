"""dbert: DiffusionBERT, a BERT trained as the reverse process of a masking diffusion.

The engine, importable as a library; it never imports Textual or the TUI. Read it bottom up:
a module imports only modules of its own floor or the floors below it, and there is no import
cycle (tests/test_architecture.py pins both).

    leaf       errors (the one-line exceptions), config (every choice, default and range check,
               torch-free), strategies (the decoding strategies' registry), display (strings for
               a person: safe text, durations, ETA), jsonfile, hardware (the device, and the one
               "auto means bf16 where native" rule), trust (what counts as code or a pickle),
               net (what a download accepts), truecase, detok (token pieces -> text), stable (a
               layout whose words stay put while they fill in)
    maths      schedule (a_t(v) and the schedule's own structure), model (the BERT denoiser),
               diffusion (the forward process, the per-step KL, the ELBO)
    sampling   sample (resolve: a SampleConfig made concrete for a checkpoint, once per run;
               frames, generate), quotes (quote marks that pair with none), contractions
               (contractions English does not write), touchup (the rounds that refill both after
               the last step), inspector (each reveal's top-k
               candidates, masking times), trajectory, replay (a trajectory read back without
               the model), share (a run as an asciinema cast or HTML), distance
    files      layout (every on-disk name, temp and swap folders, the output lock, atomic
               writes), schema (dbert.json), tokenizer, data (text files -> examples -> batches),
               vocab (trimming), pretrained (transformers' BERT format), checkpoint (load, save),
               archive (unpacking without trusting)
    store      store (names <-> paths, listing, import, remove, commit), fetch (the network
               only; it commits through the store)
    runs       prepare (a training run made ready: data, tokenizer, model, the resume rule),
               train (Trainer: the loop, reporting through callbacks), metrics and judge (dbert
               eval), infill (spans of unknown length, ranked by the model's bound), bench, serve_queue and serve (dbert serve), and the `dbert` command: cli
               and progress, the only modules that import typer and rich

    from dbert_core import checkpoint, sample, store
    db = checkpoint.load(store.resolve("default"))
    texts, stats = sample.generate(db, n=4, steps=64)
"""

__version__ = "0.1.0"
