"""Training: the loss falls, resume is exact, time conditioning round-trips, DDP ranks agree."""

import itertools
import json
import os
import socket

import pytest
import torch

from dbert_core.storage import checkpoint
from dbert_core.errors import DbertError
from dbert_core.sampling.sample import frames
from dbert_core.training.train import Callback, Trainer, lr_at
from helpers import cli_words, tiny_config


class Record(Callback):
    def __init__(self, stop_at=None):
        self.steps, self.evals, self.stop_at = [], [], stop_at

    def on_step(self, trainer, m):
        self.steps.append(m)
        if self.stop_at and m["step"] == self.stop_at:
            trainer.stop()

    def on_eval(self, trainer, m):
        self.evals.append(m)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_loss_finite_and_falling(tmp_path):
    rec = Record()
    Trainer(tiny_config(tmp_path / "run", max_steps=300, eval_every=100), [rec]).run()
    ce = [m["loss_ce"] for m in rec.steps]
    assert all(torch.isfinite(torch.tensor(ce)))
    first, last = sum(ce[:30]) / 30, sum(ce[-30:]) / 30
    assert last < first - 0.5, (first, last)
    vals = [e["val_nats_per_token"] for e in rec.evals]
    assert len(vals) == 3 and vals[-1] < vals[0]


def test_the_validation_bound_does_not_depend_on_the_batch_size(tmp_path):
    """Two runs that differ only in --batch-size score the same weights alike (each held-out example
    draws its own steps and masks), so their validation curves compare."""
    def score(batch_size):
        t = Trainer(tiny_config(tmp_path / str(batch_size), batch_size=batch_size))
        t.prepare()
        try:
            return t.evaluate()["val_nats_per_token"]
        finally:
            t.release()

    assert score(4) == pytest.approx(score(32), abs=1e-4)


def test_resume_is_exact(tmp_path):
    straight = Trainer(tiny_config(tmp_path / "a", max_steps=30, save_every=0))
    straight.run()
    rec = Record(stop_at=13)
    first = Trainer(tiny_config(tmp_path / "b", max_steps=30, save_every=0), [rec])
    out = first.run()
    assert out["stopped"] and first.step == 13
    resumed = Trainer(tiny_config(tmp_path / "b", max_steps=30, save_every=0, resume=True))
    resumed.run()
    assert resumed.step == 30
    a, b = weights(straight.model), weights(resumed.model)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_optimizer_is_fused_also_when_resuming_an_older_run(tmp_path):
    """AdamW runs as one fused kernel on the CPU; a run saved by an older dbert (per-tensor
    loops: fused None in its saved groups) is switched to it on --resume."""
    out = tmp_path / "run"
    first = Trainer(tiny_config(out, max_steps=3, save_every=0))
    first.run()
    assert all(g["fused"] for g in first.optimizer.param_groups)
    opt = out / "trainer_state" / "optimizer.pt"
    state = torch.load(opt, weights_only=True)
    for g in state["param_groups"]:
        g.update(fused=None, foreach=True)
    torch.save(state, opt)
    resumed = Trainer(tiny_config(out, max_steps=5, save_every=0, resume=True))
    resumed.run()
    assert resumed.step == 5
    assert all(g["fused"] and not g["foreach"] for g in resumed.optimizer.param_groups)


def test_resume_with_more_steps_extends_the_run(tmp_path):
    """--max-steps may change on --resume: the run goes on and the cosine follows the new end."""
    out = tmp_path / "run"
    Trainer(tiny_config(out, max_steps=6, warmup=2, save_every=0)).run()
    rec = Record()
    longer = tiny_config(out, max_steps=10, warmup=2, save_every=0, resume=True)
    tr = Trainer(longer, [rec])
    tr.run()
    assert tr.step == 10 and [m["step"] for m in rec.steps] == [7, 8, 9, 10]
    for m in rec.steps:  # the learning rate of each step, on the 10-step schedule
        assert m["lr"] == pytest.approx(lr_at(m["step"] - 1, longer))
    assert checkpoint.load_trainer_state(out)["state"]["step"] == 10


def test_refuses_to_overwrite_and_resume_needs_state(tmp_path):
    out = tmp_path / "run"
    Trainer(tiny_config(out, max_steps=2)).run()
    with pytest.raises(DbertError, match="already holds"):
        Trainer(tiny_config(out, max_steps=2)).prepare()
    with pytest.raises(DbertError, match="nothing to resume"):
        Trainer(tiny_config(tmp_path / "empty", max_steps=2, resume=True)).prepare()


@pytest.mark.parametrize("time_mode", ["prefix", "layerwise"])
def test_time_conditioning_trains_saves_and_samples(tmp_path, time_mode):
    tr = Trainer(tiny_config(tmp_path / time_mode, max_steps=15, time=time_mode))
    tr.run()
    db = checkpoint.load(tmp_path / time_mode)
    assert db.model.time == time_mode and db.meta["time"] == time_mode
    # the time input matters: same x_t, different t, different logits
    ids = torch.tensor([[db.tokenizer.cls_token_id] + [db.model.mask_id] * 6 + [db.tokenizer.sep_token_id]])
    sel = ids == db.model.mask_id
    att = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        a = db.model(ids, att, sel, t=torch.tensor([200]))
        b = db.model(ids, att, sel, t=torch.tensor([20]))
        a2 = tr.model.eval()(ids, att, sel, t=torch.tensor([200]))
    assert not torch.allclose(a, b)
    assert torch.allclose(a, a2, atol=1e-6)  # saved and reloaded time embedding
    last = list(frames(db, n=2, length=8, steps=8, generator=torch.Generator().manual_seed(0)))[-1]
    assert not last.masked.any()
    with pytest.raises(DbertError, match="time-agnostic"):
        list(frames(db, n=1, length=8, steps=8, sampler="cached"))


def test_lr_schedule():
    cfg = tiny_config("x", lr=1.0, warmup=10, max_steps=110, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55) and lr_at(110, cfg) == pytest.approx(0.1)


def _ddp_worker(rank, world, port, root, result_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    tr = Trainer(tiny_config(root, max_steps=8, batch_size=16, save_every=0))
    tr.run()
    torch.save(weights(tr.model), os.path.join(result_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_process_gloo_run_keeps_ranks_identical(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_worker, args=(2, port, str(tmp_path / "ddp"), str(tmp_path)), nprocs=2, join=True)
    w0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    w1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for k in w0:
        assert torch.equal(w0[k], w1[k]), k
    db = checkpoint.load(tmp_path / "ddp")  # rank 0 wrote the checkpoint
    assert db.meta["world_size"] == 2 and db.meta["step"] == 8
    init = Trainer(tiny_config(tmp_path / "fresh", max_steps=1))
    init.prepare()
    moved = [k for k in w0 if not torch.equal(w0[k], weights(init.model)[k])]
    assert moved, "training changed the weights"


def test_short_windows_train_on_shorter_windows_and_validate_on_full_ones(tmp_path):
    from helpers import TINYSTORIES, TINYSTORIES_VALID

    from dbert_core.text.data import document_sentences, document_windows, read_documents

    cfg = tiny_config(tmp_path / "run", pack=True, val_data=[str(TINYSTORIES_VALID)], seq_len=24, max_steps=2,
                      eval_every=0, short_windows=0.3)
    tr = Trainer(cfg)
    tr.prepare()
    tok = tr.db.tokenizer
    full = document_windows(document_sentences(read_documents([str(TINYSTORIES)])), tok, 24)
    assert [x for e in tr.train_examples for x in e] == [x for e in full for x in e]  # every token, in order
    assert len(tr.train_examples) > 1.03 * len(full)  # cut in more places (24 tokens hold one or two sentences)
    val = document_windows(document_sentences(read_documents([str(TINYSTORIES_VALID)])), tok, 24)
    assert all(e in val for e in tr.val_examples)  # validation windows are full ones
    for bad in (dict(short_windows=0.3, pack=False), dict(short_windows=1.5, pack=True)):
        with pytest.raises(DbertError) as e:
            tiny_config(tmp_path / "bad", val_data=[str(TINYSTORIES_VALID)], **bad).validate()
        assert "--short-windows" in cli_words(e.value)


def test_options_of_the_shipped_recipes(tmp_path):
    """--pack, --val-data, --dropout and --grad-accum > 1, as scripts/stories_model.sh uses them
    (--init, --from-scratch and --trim-vocab have tests of their own in test_model/test_vocab)."""
    from helpers import TINYSTORIES, TINYSTORIES_VALID

    from dbert_core.text.data import read_examples

    class Tokens(Callback):
        def __init__(self):
            self.per_step, self.losses = [], []

        def on_step(self, trainer, m):
            self.per_step.append(m["tokens_seen"])
            self.losses.append(m["loss_elbo"])

    rec = Tokens()
    cfg = tiny_config(tmp_path / "run", pack=True, val_data=[str(TINYSTORIES_VALID)], dropout=0.0, grad_accum=2,
                      batch_size=8, seq_len=24, max_steps=40, eval_every=20)
    tr = Trainer(cfg, [rec])
    tr.run()
    sep = tr.special.sep
    # packing (--unit sentence): whole sentences fill each window of at most 24 tokens, in order,
    # [SEP] before each document's (here: paragraph's) first sentence
    from dbert_core.text.data import document_sentences, encode, read_documents

    docs = document_sentences(read_documents([str(TINYSTORIES)]))
    stream = [x for d in docs for j, ids in enumerate(encode(d, tr.db.tokenizer)) for x in ([sep] if j == 0 else []) + ids]
    assert [x for e in tr.train_examples for x in e] == stream
    assert all(0 < len(e) <= 24 for e in tr.train_examples)
    assert sum(e[0] == sep for e in tr.train_examples) > len(tr.train_examples) / 5
    assert sum(len(e) for e in tr.train_examples) > 0.75 * 24 * len(tr.train_examples)  # little padding
    # --val-data: all of --data trains; validation comes from the held-out file
    n_train_tokens = sum(len(e) for e in tr.train_examples)
    assert n_train_tokens > 0.9 * sum(len(tr.db.tokenizer.encode(t, add_special_tokens=False))
                                      for t in read_examples([str(TINYSTORIES)], "sentence"))
    val_vocab = {i for e in tr.val_examples for i in e}
    assert len(tr.val_examples) <= cfg.val_examples and val_vocab
    # --grad-accum 2: each optimizer step still sees the whole batch of 8 x 24 tokens
    steps = [b - a for a, b in zip([0] + rec.per_step, rec.per_step)]
    mean_len = sum(len(e) for e in tr.train_examples) / len(tr.train_examples)
    assert max(steps) <= 8 * 24 and 0.7 * 8 * mean_len < sum(steps) / len(steps) < 1.3 * 8 * mean_len
    assert sum(rec.losses[-10:]) < sum(rec.losses[:10])
    # --dropout: in the saved config and in the loaded model
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["hidden_dropout_prob"] == saved["attention_probs_dropout_prob"] == 0.0
    db = checkpoint.load(tmp_path / "run")
    assert all(m.p == 0.0 for m in db.model.modules() if isinstance(m, torch.nn.Dropout))


def test_each_step_checks_the_heap_and_a_trim_changes_nothing(tmp_path, monkeypatch):
    """After every optimizer step the loop asks its HeapCeiling (dbert_core/heap.py) whether to hand
    freed heap pages back; trimming at every step trains the same weights as never trimming."""
    import dbert_core.heap as heap

    calls = []
    real = heap.HeapCeiling.after_step
    monkeypatch.setattr(heap.HeapCeiling, "after_step", lambda self: calls.append(1) or real(self))
    plain = Trainer(tiny_config(tmp_path / "a", max_steps=12))
    plain.run()
    assert len(calls) == 12 and plain.heap.trims == 0
    monkeypatch.setattr(heap, "resident_mb", itertools.cycle([1e3, 1e6]).__next__)  # 1 TB a step after each trim
    trimmed = Trainer(tiny_config(tmp_path / "b", max_steps=12))
    trimmed.run()
    assert trimmed.heap.trims == 6  # every other step: measured, then past the ceiling
    a, b = weights(plain.model), weights(trimmed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
