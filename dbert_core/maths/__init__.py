"""maths: the diffusion itself.

schedule (a_t(v): linear and spindle, the step grid), model (the BERT denoiser, presets, FLOPs),
diffusion (the forward process, the per-step KL, the ELBO).

May import: the floor.
"""
