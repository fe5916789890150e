"""On a CUDA GPU: the denoiser gives the CPU's logits, bf16 autocast stays close to them, sampling
and a few training steps run there and their checkpoint loads on the CPU. Skipped without CUDA
(CI has none); scripts/recipes/gpu_stories.sh runs these on a lent GPU."""

from __future__ import annotations

import pytest
import torch

from helpers import train_tiny

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _batch(db, rows=4, length=20, masked=0.5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tok = db.tokenizer
    ids = torch.randint(1000, len(tok), (rows, length), generator=gen)
    ids[:, 0], ids[:, -1] = tok.cls_token_id, tok.sep_token_id
    hide = (torch.rand(rows, length, generator=gen) < masked)
    hide[:, 0] = hide[:, -1] = False
    ids[hide] = tok.mask_token_id
    return ids, torch.ones_like(ids), hide


def test_cuda_logits_match_the_cpus(tiny_checkpoint):
    from dbert_core.storage import checkpoint

    cpu, gpu = checkpoint.load(tiny_checkpoint), checkpoint.load(tiny_checkpoint, device="cuda")
    ids, att, hide = _batch(cpu)
    with torch.no_grad():
        want = cpu.model(ids, att, hide)
        got = gpu.model(ids.cuda(), att.cuda(), hide.cuda()).cpu()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            half = gpu.model(ids.cuda(), att.cuda(), hide.cuda()).float().cpu()
    assert want.shape == got.shape and torch.allclose(got, want, atol=1e-3, rtol=1e-3)
    # bf16 keeps the ranking where it matters: the top token mostly agrees, the logits stay close
    finite = torch.isfinite(want)  # forbidden tokens are -inf on both
    assert torch.equal(finite, torch.isfinite(half))
    assert (half.argmax(-1) == want.argmax(-1)).float().mean() > 0.9
    assert (half - want)[finite].abs().max() < 0.25 * want[finite].abs().max()


def test_sampling_on_cuda_fills_every_mask_and_repeats_with_its_seed(tiny_checkpoint):
    from dbert_core.storage import checkpoint
    from dbert_core.config import SampleConfig
    from dbert_core.sampling.sample import generate

    db = checkpoint.load(tiny_checkpoint, device="cuda")
    for sampler in ("first-hitting", "ancestral", "threshold"):
        cfg = SampleConfig(n=4, steps=16, length=20, seed=3, sampler=sampler, pair_quotes=False)
        texts, stats = generate(db, cfg)
        again, _ = generate(db, cfg)
        assert len(texts) == 4 and stats["nfe"] >= 1
        assert all("[MASK]" not in t for t in texts)
        assert texts == again, sampler


def test_training_on_cuda_in_bf16_saves_a_checkpoint_the_cpu_loads(tmp_path):
    import json

    from dbert_core.storage import checkpoint

    out = train_tiny(tmp_path / "gpu", device="cuda", dtype="bf16", max_steps=12, save_every=6)
    state = json.loads((out / "trainer_state" / "state.json").read_text())
    losses = [h["loss_elbo"] for h in state["history"] if "loss_elbo" in h]
    assert state["step"] == 12 and losses and all(torch.isfinite(torch.tensor(losses)))
    db = checkpoint.load(out)  # back on the CPU, in float32
    assert next(db.model.parameters()).device.type == "cpu"
