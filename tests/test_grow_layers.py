"""scripts/recipes/grow_layers.py: a deeper checkpoint whose layer j starts as the old layer j // times, that
dbert loads (its weights' sha256 recorded anew), samples and trains from; never a half-written folder."""

import importlib.util

import torch

from helpers import ROOT


def script():
    spec = importlib.util.spec_from_file_location("grow_layers", ROOT / "scripts" / "recipes" / "grow_layers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_grown_checkpoint_repeats_each_layer_and_loads(tiny_checkpoint, tmp_path, capsys):
    from dbert_core.sampling.sample import generate
    from dbert_core.storage import checkpoint

    out = tmp_path / "grown"
    assert script().main([str(tiny_checkpoint), str(out), "--times", "2"]) == 0
    old, new = checkpoint.load(tiny_checkpoint), checkpoint.load(out)
    n = old.model.config.num_hidden_layers
    assert new.model.config.num_hidden_layers == 2 * n
    was, now = old.model.state_dict(), new.model.state_dict()
    layered = [k for k in now if ".layers." in k or ".layer." in k]
    assert len(layered) == 2 * len([k for k in was if ".layers." in k or ".layer." in k]) > 0
    for key, value in now.items():
        if key in layered:
            head, rest = key.split(".layer" + ("s." if ".layers." in key else "."), 1)
            j, tail = rest.split(".", 1)
            sep = ".layers." if ".layers." in key else ".layer."
            assert torch.equal(value, was[f"{head}{sep}{int(j) // 2}.{tail}"]), key
        else:
            assert torch.equal(value, was[key]), key
    texts, _ = generate(new, n=2, steps=8, length=12, seed=0)
    assert len(texts) == 2
    assert not (tmp_path / "grown.growing").exists()
    assert script().main([str(tiny_checkpoint), str(out)]) == 2  # never over a folder that is there
    assert "exists" in capsys.readouterr().err
