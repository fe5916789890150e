"""dbert's own BERT against transformers' BertForMaskedLM: the same logits, checkpoint files read
and written both ways, time conditioning as the hook-based version computed it, optimizer
state of older runs carried over, and sampling that never imports transformers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from dbert_core.storage import checkpoint, pretrained
from dbert_core.errors import DbertError
from dbert_core.maths.model import Bert, BertConfig, DiffusionBert
from dbert_core.text.tokenizer import WordPieceTokenizer
from helpers import ROOT, TEXTS, TINYSTORIES, TINYSTORIES_VALID, cli_words, minilm_dir, train_tiny

SMALL = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=40, hidden_act="gelu")


def batch(vocab: int, B: int = 3, N: int = 14, seed: int = 0, pad: bool = True):
    """ids (B, N) and attention (B, N) bool with rows of different lengths when pad."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, N), generator=g)
    attention = torch.ones(B, N, dtype=torch.bool)
    if pad:
        for b in range(1, B):
            attention[b, N - 3 * b:] = False
        ids[~attention] = 0
    return ids, attention


def hf_logits(mlm, ids, attention):
    with torch.no_grad():
        return mlm(input_ids=ids, attention_mask=attention.long()).logits


def our_logits(bert, ids, attention):
    with torch.no_grad():
        return bert.logits(bert(ids, attention))


def hf_load(path):
    from transformers import BertForMaskedLM

    mlm, info = BertForMaskedLM.from_pretrained(path, output_loading_info=True)
    return mlm.eval(), info


# ------------------------------------------------------------------------------ logits and files
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_saved_bert_loads_in_transformers_with_the_same_logits(tmp_path, act):
    torch.manual_seed(0)
    bert = Bert(BertConfig(**{**SMALL, "hidden_act": act})).eval()
    pretrained.save(bert, tmp_path)
    mlm, info = hf_load(tmp_path)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids, attention = batch(SMALL["vocab_size"])
    ours, theirs = our_logits(bert, ids, attention), hf_logits(mlm, ids, attention)
    assert torch.allclose(ours[attention], theirs[attention], atol=1e-4, rtol=0)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=0)  # padded rows too
    no_pad = batch(SMALL["vocab_size"], pad=False)  # the mask-free attention path
    assert torch.allclose(our_logits(bert, *no_pad), hf_logits(mlm, *no_pad), atol=1e-4, rtol=0)


def test_transformers_checkpoint_loads_with_the_same_logits(tmp_path):
    from transformers import BertConfig as HFConfig, BertForMaskedLM

    torch.manual_seed(1)
    mlm = BertForMaskedLM(HFConfig(**SMALL)).eval()
    with torch.no_grad():  # non-trivial head bias and LayerNorms
        for name, p in mlm.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    mlm.save_pretrained(tmp_path / "st")
    ids, attention = batch(SMALL["vocab_size"], seed=1)
    want = hf_logits(mlm, ids, attention)
    bert = pretrained.load(tmp_path / "st")
    assert not bert.fresh_head and not bert.training
    assert torch.allclose(our_logits(bert, ids, attention), want, atol=1e-4, rtol=0)
    # the same weights as a pickled pytorch_model.bin (decoder and its bias included), read with weights_only
    (tmp_path / "bin").mkdir()
    shutil.copy(tmp_path / "st" / "config.json", tmp_path / "bin")
    torch.save(mlm.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    assert torch.allclose(our_logits(pretrained.load(tmp_path / "bin"), ids, attention), want, atol=1e-4, rtol=0)
    torch.save({"weights": object()}, tmp_path / "bin" / "pytorch_model.bin")  # a pickle that is not weights
    with pytest.raises(DbertError, match="cannot be read safely"):
        pretrained.load(tmp_path / "bin")


def test_float16_save_is_read_by_both(tmp_path):
    torch.manual_seed(2)
    bert = Bert(BertConfig(**SMALL)).eval()
    pretrained.save(bert, tmp_path, dtype=torch.float16)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "float16"
    mlm, info = hf_load(tmp_path)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    again = pretrained.load(tmp_path)
    assert next(again.parameters()).dtype == torch.float32
    for name, p in bert.state_dict().items():
        assert torch.equal(again.state_dict()[name], p.half().float()), name


def test_minilm_matches_transformers(tmp_path):
    from transformers import BertModel

    path = minilm_dir()
    bert = pretrained.load(path, require_head=False)
    assert bert.fresh_head  # a BertModel checkpoint: pooler ignored, head initialised
    ref = BertModel.from_pretrained(path).eval()
    tok = WordPieceTokenizer.load(path)
    rows = [tok.encode(t) for t in TEXTS]
    N = max(map(len, rows))
    ids = torch.tensor([r + [0] * (N - len(r)) for r in rows])
    attention = ids != 0
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=attention.long()).last_hidden_state
        got = bert(ids, attention)
    assert torch.allclose(got[attention], want[attention], atol=1e-4, rtol=0)
    # the initialised head: transformers' rules, and the whole MLM reads back in transformers
    head = bert.head
    assert torch.all(head.bias == 0) and torch.all(head.dense.bias == 0) and torch.all(head.LayerNorm.weight == 1)
    assert abs(head.dense.weight.std().item() - bert.config.initializer_range) < 0.002
    pretrained.save(bert, tmp_path)
    mlm, info = hf_load(tmp_path)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.allclose(our_logits(bert, ids, attention)[attention], hf_logits(mlm, ids, attention)[attention],
                          atol=1e-4, rtol=0)


def test_random_init_follows_transformers_rules():
    torch.manual_seed(0)
    bert = Bert(BertConfig(**{**SMALL, "vocab_size": 4000, "hidden_size": 64, "pad_token_id": 3}))
    for name, p in bert.named_parameters():
        if name.endswith("bias") or "LayerNorm" in name or "_ln." in name:
            assert torch.all(p == (1.0 if "weight" in name else 0.0)), name
        else:
            assert abs(p.std().item() - 0.02) < 0.003 and abs(p.mean().item()) < 0.003, name
    assert torch.all(bert.embeddings.word_embeddings.weight[3] == 0)  # the [PAD] row
    assert bert.embeddings.word_embeddings.padding_idx == 3


def test_bad_configs_and_weights_are_clear_errors(tmp_path):
    for key, value, needle in [("hidden_act", "swish", "unsupported hidden_act"),
                               ("position_embedding_type", "relative_key", "only absolute"),
                               ("tie_word_embeddings", False, "tied"), ("is_decoder", True, "decoder")]:
        with pytest.raises(DbertError, match=needle):
            BertConfig.from_dict({**SMALL, key: value})
    torch.manual_seed(0)
    pretrained.save(Bert(BertConfig(**SMALL)), tmp_path)
    from safetensors.torch import load_file, save_file

    good = load_file(str(tmp_path / "model.safetensors"))

    def load_with(tensors):
        save_file(tensors, str(tmp_path / "model.safetensors"))
        return pretrained.load(tmp_path)

    no_key = {k: v for k, v in good.items() if k != "bert.encoder.layer.1.attention.self.key.weight"}
    with pytest.raises(DbertError, match="missing tensors encoder.layer.1.attention.self.key.weight"):
        load_with(no_key)
    with pytest.raises(DbertError, match="unexpected tensors encoder.layer.2"):
        load_with({**good, "bert.encoder.layer.2.output.dense.weight": torch.zeros(32, 48)})
    with pytest.raises(DbertError, match=r"shape \(20, 32\)"):
        load_with({**good, "bert.embeddings.position_embeddings.weight": torch.zeros(20, 32)})
    no_head = {k: v for k, v in good.items() if not k.startswith("cls.")}
    with pytest.raises(DbertError, match="no MLM head"):
        load_with(no_head)  # a dbert checkpoint must have one
    assert pretrained.load(tmp_path, require_head=False).fresh_head
    half_head = {k: v for k, v in good.items() if k != "cls.predictions.transform.dense.weight"}
    with pytest.raises(DbertError, match="missing tensors cls.predictions.transform.dense.weight"):
        load_with(half_head)


def test_config_keeps_unknown_keys(tmp_path):
    d = {**SMALL, "layer_norm_eps": 1e-7, "custom_note": "kept", "transformers_version": "4.8.2",
         "architectures": ["BertModel"], "torch_dtype": "float32"}
    config = BertConfig.from_dict(d)
    out = config.to_dict(torch.float16)
    assert out["custom_note"] == "kept" and out["layer_norm_eps"] == 1e-7
    assert out["architectures"] == ["BertForMaskedLM"] and out["model_type"] == "bert"
    assert out["dtype"] == "float16" and "torch_dtype" not in out
    assert BertConfig.from_dict(out).to_dict(torch.float16) == out


def test_init_errors_are_one_clear_line(tmp_path):
    with pytest.raises(DbertError) as e:
        pretrained.build_bert(init=str(tmp_path / "nowhere"))
    assert re.search("--init .*: cannot load a BERT: .*no such directory", cli_words(e.value))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DbertError) as e:
        pretrained.build_bert(init=str(tmp_path / "empty"), from_scratch=True)
    assert re.search("--init .*: cannot load a BERT config: .*no config.json", cli_words(e.value))
    with pytest.raises(DbertError) as e:
        pretrained.build_bert(init="nobody/no-such-model")  # HF_HUB_OFFLINE=1 in the tests
    assert "--init nobody/no-such-model: cannot load a BERT" in cli_words(e.value)


def test_init_takes_a_checkpoint_of_the_store_by_name(tiny_checkpoint, tmp_path, monkeypatch):
    """--init default / dbert-minilm-stories continues from the shipped model, --init NAME from a
    trained store entry, and a folder of that name here still comes first; other names go to the hub."""
    from dbert_core.storage import store

    assert store.named("default") == str(store.default_checkpoint())
    assert store.named("dbert-minilm-stories") == str(store.default_checkpoint())
    store.import_dir(tiny_checkpoint, name="mine")
    assert store.named("mine") == str(store.store_dir() / "mine")
    assert store.named("bert-base-uncased") == "bert-base-uncased" and store.named(None) is None
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert store.named("mine") == "mine"  # a folder here comes first
    monkeypatch.chdir(ROOT)
    ckpt = train_tiny(tmp_path / "ft", max_steps=2, init="mine", preset=None, seq_len=64)
    assert json.loads((ckpt / "dbert.json").read_text())["train_config"]["init"] == "mine"


def test_from_scratch_takes_the_architecture_only():
    path = minilm_dir()
    bert = pretrained.build_bert(init=str(path), from_scratch=True)
    assert bert.config.hidden_size == 384 and bert.config.num_hidden_layers == 6
    assert abs(bert.layers[0].qkv.weight.std().item() - 0.02) < 0.002  # not MiniLM's trained weights


# ------------------------------------------------------------------------------ time conditioning
def _hooked_reference(mlm, time_mode, temb, ids, attention):
    """What dbert computed before its own BERT: transformers' model with the time token as an
    input embedding (prefix) or forward pre-hooks adding the time embedding (layerwise)."""
    bert = mlm.bert
    with torch.no_grad():
        if time_mode == "prefix":
            words = bert.embeddings.word_embeddings(ids)
            embeds = torch.cat([words[:, :1], temb.unsqueeze(1), words[:, 1:]], dim=1)
            att = torch.cat([attention[:, :1], attention[:, :1], attention[:, 1:]], dim=1)
            h = bert(inputs_embeds=embeds, attention_mask=att.long()).last_hidden_state
            h = torch.cat([h[:, :1], h[:, 2:]], dim=1)
        else:
            def add(module, args, kwargs):
                if args:
                    return (args[0] + temb.unsqueeze(1), *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + temb.unsqueeze(1)}

            handles = [layer.register_forward_pre_hook(add, with_kwargs=True) for layer in bert.encoder.layer]
            try:
                h = bert(input_ids=ids, attention_mask=attention.long()).last_hidden_state
            finally:
                for handle in handles:
                    handle.remove()
        return mlm.cls(h)


@pytest.mark.parametrize("time_mode", ["prefix", "layerwise"])
def test_time_conditioning_as_before_and_a_no_op_at_start(tmp_path, time_mode):
    torch.manual_seed(3)
    bert = Bert(BertConfig(**SMALL)).eval()
    model = DiffusionBert(bert, time=time_mode, T=100, mask_id=4).eval()
    plain = DiffusionBert(bert, time="none", T=100, mask_id=4).eval()
    ids, attention = batch(SMALL["vocab_size"], seed=3)
    select = attention.clone()
    with torch.no_grad():
        start = [model(ids, attention, select, t=torch.tensor([t] * 3)) for t in (5, 90)]
    assert torch.equal(start[0], start[1])  # the zero-initialised last layer: t does not matter yet
    if time_mode == "layerwise":  # and adding nothing to every layer leaves the BERT as it was
        assert torch.equal(start[0], plain(ids, attention, select))
    with torch.no_grad():
        for p in model.time_embed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    t = torch.tensor([5, 40, 90])
    pretrained.save(bert, tmp_path)
    mlm, _ = hf_load(tmp_path)
    with torch.no_grad():
        ours = model(ids, attention, select, t=t)
        want = _hooked_reference(mlm, time_mode, model.time_embed(t), ids, attention)[select]
    assert torch.allclose(ours, want, atol=1e-4, rtol=0)
    assert not torch.allclose(ours, plain(ids, attention, select), atol=1e-3)


@pytest.mark.parametrize("time_mode", ["prefix", "layerwise"])
def test_time_conditioning_round_trips(tmp_path, time_mode):
    torch.manual_seed(4)
    tok = WordPieceTokenizer.from_vocab({t: i for i, t in enumerate(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(SMALL["vocab_size"] - 5)])})
    counts = torch.arange(SMALL["vocab_size"])
    db = checkpoint.assemble(Bert(BertConfig(**SMALL)), tok, "spindle", 100, counts, time=time_mode)
    with torch.no_grad():
        for p in db.model.time_embed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    db.model.eval()
    again = checkpoint.load(checkpoint.save(db, tmp_path / "ck"))
    assert again.model.time == time_mode
    ids, attention = batch(SMALL["vocab_size"], seed=4)
    t = torch.tensor([5, 40, 90])
    with torch.no_grad():
        assert torch.equal(db.model(ids, attention, attention, t=t), again.model(ids, attention, attention, t=t))


def test_set_dropout_reaches_every_dropout():
    bert = Bert(BertConfig(**SMALL))
    bert.set_dropout(0.0)
    bert.train()
    ids, attention = batch(SMALL["vocab_size"])
    assert torch.equal(our_logits(bert, ids, attention), our_logits(bert.eval(), ids, attention))
    bert.set_dropout(0.3)
    assert bert.config.hidden_dropout_prob == bert.config.attention_probs_dropout_prob == 0.3
    bert.train()
    assert not torch.equal(our_logits(bert, ids, attention), our_logits(bert.eval(), ids, attention))


def test_optimizer_state_of_older_dbert_is_upgraded(tmp_path):
    """A run saved before dbert had its own BERT (transformers' model, q/k/v apart) resumes: its
    Adam moments land where the fused qkv and the new parameter order put those weights."""
    import copy

    def adam(model):
        params = list(model.parameters())
        return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
                                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=1e-2)

    torch.manual_seed(5)
    ours = DiffusionBert(Bert(BertConfig(**SMALL)), time="layerwise", T=100).eval()
    pretrained.save(ours.bert, tmp_path)
    old = torch.nn.Module()
    old.mlm, _ = hf_load(tmp_path)
    old.time_embed = copy.deepcopy(ours.time_embed)
    ids, attention = batch(SMALL["vocab_size"], seed=5)
    t = torch.tensor([3, 30, 70])
    steps = {"ours": lambda: ours.bert.logits(ours.bert(ids, attention)), "old": lambda: old.mlm(
        input_ids=ids, attention_mask=attention.long()).logits}
    opts = {"ours": adam(ours), "old": adam(old)}
    for name, model in (("ours", ours), ("old", old)):
        for _ in range(2):
            loss = steps[name]().square().mean() + model.time_embed(t).square().mean()
            loss.backward()
            opts[name].step()
            opts[name].zero_grad()
    want, got = opts["ours"].state_dict(), pretrained.upgrade_optimizer_state(opts["old"].state_dict(), ours)
    assert got["param_groups"] == want["param_groups"] and got["state"].keys() == want["state"].keys()
    for i, entry in want["state"].items():
        for key, value in entry.items():
            assert torch.allclose(got["state"][i][key], value, rtol=1e-3, atol=1e-9), (i, key)
    opts["ours"].load_state_dict(got)
    assert pretrained.upgrade_optimizer_state(want, ours) is want


# ------------------------------------------------------------------------------ no transformers
NO_TRANSFORMERS = r"""
import asyncio, contextlib, io, sys
ckpt, valid, bench_out = sys.argv[1:4]
from dbert_core.cli import main

def cli(*args):
    sys.argv = ["dbert", *args]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main()
        except SystemExit as e:
            assert not e.code, (args, e.code)
    return out.getvalue()

assert len(cli("sample", "--checkpoint", ckpt, "--n", "2", "--length", "8", "--steps", "8").splitlines()) == 2
cli("eval", "--checkpoint", ckpt, "--data", valid, "--steps", "4", "--limit", "8", "--samples", "2",
    "--sample-steps", "4", "--sample-length", "8")
cli("checkpoints", "list")
cli("bench", "--checkpoint", ckpt, "--out", bench_out, "--quick", "--steps", "4", "--batch", "1", "--length", "8",
    "--no-bf16", "--no-train", "--samplers", "first-hitting")

from dbert_tui.app import create_app
from dbert_tui.controller import Settings

async def tui():
    app = create_app(checkpoint=ckpt, settings=Settings(steps=4, length=8, pace_ms=0))
    async with app.run_test(size=(80, 24)) as pilot:
        for _ in range(600):
            g = app.generate_screen
            if g.run is not None and g.run.finished:
                break
            await pilot.pause(0.05)
        assert app.generate_screen.run.finished

asyncio.run(tui())
loaded = sorted(m for m in sys.modules if m == "transformers" or m.startswith("transformers."))
print("transformers modules:", len(loaded), loaded[:3])
"""


def test_sampling_eval_bench_and_tui_never_import_transformers(tiny_checkpoint, tmp_path):
    proc = subprocess.run([sys.executable, "-c", NO_TRANSFORMERS, str(tiny_checkpoint), str(TINYSTORIES_VALID),
                           str(tmp_path / "bench")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "transformers modules: 0 []"


INIT_RUN = r"""
import sys
from dbert_core.cli import main
sys.argv = ["dbert", "train", "--init", sys.argv[1], "--data", sys.argv[2], "--out", sys.argv[3], "--max-steps", "1",
            "--batch-size", "4", "--seq-len", "16", "--T", "64", "--eval-every", "0", "--device", "cpu"]
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
print("transformers" in sys.modules)
"""


@pytest.mark.slow
def test_training_from_a_bertmodel_init_needs_no_transformers(tmp_path):
    path = minilm_dir()
    proc = subprocess.run([sys.executable, "-c", INIT_RUN, str(path), str(TINYSTORIES), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"
    assert "has no MLM head (a BertModel): the head starts at random" in proc.stderr
    db = checkpoint.load(tmp_path / "run")
    assert db.model.config.hidden_size == 384 and db.tokenizer.mask_token_id == 103
    encoder = pretrained.load(path, require_head=False)  # one step moved the weights, but not far
    moved = db.model.bert.layers[0].qkv.weight - encoder.layers[0].qkv.weight
    assert 0 < moved.abs().max() < 0.01


def test_dropout_drops_p_and_keeps_the_mean():
    """The CPU dropout: each of the four 16-bit lanes of a random int64 drops with probability p,
    survivors are scaled so E[out] = x, and the gradient goes through the same mask."""
    from dbert_core.maths.model import dropout
    torch.manual_seed(0)
    x = torch.ones(4 * 250_000, requires_grad=True)
    y = dropout(x, 0.1)
    kept = y != 0
    for lane in range(4):  # a biased lane (e.g. a random int64 with its top bit 0) would show here
        assert abs(kept[lane::4].float().mean().item() - 0.9) < 0.003
    scale = 65536 / (65536 - round(0.1 * 65536))
    assert torch.equal(y[kept], torch.full_like(y[kept], scale))
    assert abs(y.mean().item() - 1.0) < 0.003
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # d out / d x = mask * scale
    torch.manual_seed(1)
    a = dropout(torch.ones(4097), 0.3)
    torch.manual_seed(1)
    assert torch.equal(a, dropout(torch.ones(4097), 0.3))  # seeded like every torch draw
    assert dropout(x, 0.0) is x
    assert not dropout(torch.ones(99), 1.0).any()


def test_explicit_attention_equals_sdpa():
    """CPU training's written-out attention gives scaled_dot_product_attention's output and
    gradients (fp32, with a padding mask), and its dropout keeps the expectation."""
    import torch.nn.functional as F
    from dbert_core.maths.model import attention, explicit_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 6:] = False
    ours = explicit_attention(q, k, v, mask, 0.0)
    grads = torch.autograd.grad(ours.pow(2).sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(grads, torch.autograd.grad(ref.pow(2).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    torch.manual_seed(0)  # with dropout: one draw differs, the mean over many is the dropout-free output
    assert (attention(q, k, v, mask, 0.5) - ref).abs().max().item() > 0.1
    mean = sum(attention(q, k, v, mask, 0.5) for _ in range(4000)) / 4000
    assert (mean - ref).abs().max().item() < 0.1
    with torch.no_grad():  # inference never drops: the fused kernel, deterministic
        assert torch.equal(attention(q, k, v, mask, 0.0), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_workspace_arrays_made_under_inference_mode_serve_a_later_no_grad_call():
    """A thread that sampled under torch.inference_mode (bf16: the kept workspace) and then
    validates under no_grad with fewer rows (the TUI's training worker in the pool thread a
    sampler used) writes into the same arrays: they must be normal tensors, not inference ones."""
    from dbert_core.maths import model as M

    g = torch.Generator().manual_seed(0)
    big = [torch.randn(4, 2, 12, 8, generator=g).to(torch.bfloat16) for _ in range(3)]
    small = [t[:1] for t in big]
    M.release_workspace()
    with torch.inference_mode():
        M.workspace_attention(*big, None)
    assert not M._WORKSPACE.arrays[1].is_inference()
    with torch.no_grad():
        out = M.workspace_attention(*small, None)
    assert torch.allclose(out.float(), M.explicit_attention(*small, None, 0.0).float(), atol=0.03)
    M.release_workspace()


def test_workspace_attention_keeps_its_numbers_in_kept_arrays():
    """CPU bf16 inference writes its scores and weights into two arrays a thread keeps: the same
    numbers as written out with fresh arrays (with and without a padding mask), whatever the rows of
    the call before (the arrays grow, and a smaller or shorter call is a view of their start), and
    within bf16's rounding of explicit_attention (the scale is applied inside the product there,
    before the scores are rounded to bf16, not after);
    within a small distance of SDPA's fused kernel; training and fp32 never take it."""
    import threading

    import torch.nn.functional as F
    from dbert_core.maths import model as M

    g = torch.Generator().manual_seed(0)

    def qkv(B, N):
        return [torch.randn(B, 3, N, 8, generator=g).to(torch.bfloat16) for _ in range(3)]

    def fresh(q, k, v, mask):  # workspace_attention's own arithmetic, fresh arrays
        B, h, N, d = q.shape
        s = torch.baddbmm(torch.empty(B * h, N, k.shape[2], dtype=q.dtype), q.reshape(B * h, N, d),
                          k.reshape(B * h, -1, d).transpose(1, 2), beta=0, alpha=d ** -0.5).view(B, h, N, -1)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        out = torch.softmax(s, -1) @ v
        assert torch.allclose(out.float(), M.explicit_attention(q, k, v, mask, 0.0).float(), atol=0.03)
        return out

    M.release_workspace()
    with torch.no_grad():
        q, k, v = qkv(4, 9)
        mask = torch.ones(4, 1, 1, 9, dtype=torch.bool)
        mask[1, ..., 6:] = False
        assert torch.equal(M.workspace_attention(q, k, v, None), fresh(q, k, v, None))
        assert torch.equal(M.workspace_attention(q, k, v, mask), fresh(q, k, v, mask))
        first = M._WORKSPACE.arrays[1]
        q2, k2, v2 = qkv(2, 9)  # fewer rows: the same arrays, their first rows
        assert torch.equal(M.workspace_attention(q2, k2, v2, None), fresh(q2, k2, v2, None))
        assert M._WORKSPACE.arrays[1] is first
        q3, k3, v3 = qkv(6, 9)  # more rows: grown
        assert torch.equal(M.workspace_attention(q3, k3, v3, None), fresh(q3, k3, v3, None))
        grown = M._WORKSPACE.arrays[1]
        assert grown.numel() == 6 * 3 * 9 * 9
        q4, k4, v4 = qkv(2, 5)  # another length (a cropped end): a view of the same arrays
        assert torch.equal(M.workspace_attention(q4, k4, v4, None), fresh(q4, k4, v4, None))
        q5, k5, v5 = qkv(6, 9)  # and back: the first call's numbers again, nothing left over from the short one
        assert torch.equal(M.workspace_attention(q5, k5, v5, None), fresh(q5, k5, v5, None))
        assert M._WORKSPACE.arrays[1] is grown
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        assert (M.attention(q, k, v, mask, 0.0).float() - ref).abs().max() < 0.05  # bf16's own precision
        seen = []
        worker = threading.Thread(target=lambda: seen.append(getattr(M._WORKSPACE, "arrays", None)))
        worker.start()
        worker.join()
        assert seen == [None]  # each thread its own arrays

    M.release_workspace()
    assert M._WORKSPACE.arrays is None
    assert M.attention_path("cpu", False, torch.bfloat16, 258, 0.0, 120) == "workspace"
    assert M.attention_path("cpu", False, torch.bfloat16, 512, 0.0, 32 * 12 * 4) == "sdpa"  # over WORKSPACE_BYTES
    assert M.attention_path("cpu", False, torch.float32, 258, 0.0, 120) == "sdpa"
    assert M.attention_path("cpu", True, torch.bfloat16, 512, 0.0, 120) == "sdpa"
    assert M.attention_path("cpu", True, torch.bfloat16, 128, 0.1, 120) == "explicit"
    assert M.attention_path("cuda", False, torch.bfloat16, 258, 0.0, 120) == "sdpa"


def test_a_prefix_cache_reuses_the_prefix_and_computes_the_rest(tiny_db):
    """PrefixCache: the first call is the exact forward and keeps the prefix's keys and values; a
    second call on the same rows (any subset, any order) computes only the positions after the
    prefix and, the rest unchanged, gives the same logits; once the rest changes the prefix keeps
    its first states (the approximation), and the FLOPs counted are those of the positions computed."""
    from dbert_core.maths.model import forward_flops
    from dbert_core.maths.prefix_cache import PrefixCache

    model = tiny_db.model.eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (3, 20), generator=g)
    att = torch.ones_like(ids, dtype=torch.bool)
    sel = torch.zeros_like(ids, dtype=torch.bool)
    sel[:, 12:] = True
    cache = PrefixCache(8)
    with torch.no_grad():
        exact = model(ids, att, sel)
        assert not cache.holds(ids)
        first = model(ids, att, sel, cache=cache)
        assert torch.equal(first, exact) and cache.holds(ids) and len(cache.rows) == 3
        h = cache.forward(model.bert, ids[[2, 0]])
        assert h.shape == (2, 12, model.config.hidden_size)  # only the positions after the prefix
        again = model(ids[[2, 0]], att[[2, 0]], sel[[2, 0]], cache=cache)
        per_row = exact.view(3, 8, -1)
        assert torch.allclose(again.view(2, 8, -1), per_row[[2, 0]], atol=1e-5)
        changed = ids.clone()
        changed[:, 12:] = model.mask_id
        approx = model(changed, att, sel, cache=cache)
        assert not torch.allclose(approx, model(changed, att, sel), atol=1e-4)  # the prefix did not see the change
    cfg = model.config
    assert forward_flops(cfg, 3, 20, 24, prefix=8) < forward_flops(cfg, 3, 20, 24)
    assert forward_flops(cfg, 3, 20, 24, prefix=0) == forward_flops(cfg, 3, 20, 24)
