"""sampling: the reverse process, from settings to text.

A run: sample (frames, generate: the frames generator and its batches), parallel (a run's batches
side by side on a CPU's cores, their frames handed on in order), settings (resolve: a
SampleConfig made concrete for a checkpoint, once per run), prompt (templates -> ids), blocks (whole
stories: the story's start, the end rule, block continuation past one window).
The samplers: base (what a sampler family is: Frame, the Kernel of reveal probabilities, the Net
wrapper), draw (the token choice every family shares: top-k, top-p, the repeat block), one module
per family: ancestral (the reverse step; ancestral and cached), first_hitting, ordered (confidence,
margin, entropy, threshold, entropy-bounded), remdm; touchup (the refill rounds after the last step).
Around a run: inspector (each reveal's candidates), trajectory and replay (a run written down and
read back), share (a run as a cast or HTML), distance (how far a strategy's law is from the
model's own), infill (spans of unknown length, ranked by the bound), preflight (what a run checks
before its first step: every prompt, infill length and batch).

May import: the floor, disk, text, maths.
"""
