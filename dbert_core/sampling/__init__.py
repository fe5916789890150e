"""sampling: the reverse process, from settings to text.

sample (resolve: a SampleConfig made concrete for a checkpoint; the samplers; frames and generate),
touchup (the refill rounds after the last step), inspector (each reveal's candidates), trajectory and
replay (a run written down and read back), share (a run as a cast or HTML), distance (how far a strategy's
law is from the model's own), infill (spans of unknown length, ranked by the bound), blocks (whole
stories: the story's start, the end rule, block continuation past one window).

May import: the floor, disk, text, maths.
"""
