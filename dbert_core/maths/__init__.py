"""maths: the diffusion itself.

schedule (a_t(v): linear and spindle, the step grid), model (the BERT denoiser, presets, FLOPs),
diffusion (the forward process, the per-step KL, the ELBO), prefix_cache (a continuation window's
given context kept from its first call: `--prefix-cache`, an approximation), decided_cache (decided
positions' keys and values kept between a sampler's calls: `--cache-refresh`, an approximation), end_padding (a story's
padding after its end that a model trained with `--hide-end-padding` never reads, so a sampler crops it exactly),
bf16_weights (the sampler's bf16 twin of a model: its matrices cast once, not in every call).

May import: the floor.
"""
