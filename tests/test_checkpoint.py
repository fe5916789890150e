"""Checkpoints: Hugging Face-loadable, identical after a round trip, crash-safe, validated on load."""

import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from dbert_core.storage import checkpoint
from dbert_core.errors import DbertError


def logits_of(db, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, len(db.tokenizer), (2, 12), generator=g)
    ids[:, 0], ids[:, -1] = db.tokenizer.cls_token_id, db.tokenizer.sep_token_id
    select = torch.rand(ids.shape, generator=g) < 0.5
    select[:, 0] = select[:, -1] = False
    ids = ids.masked_fill(select, db.model.mask_id)
    with torch.no_grad():
        return db.model(ids, torch.ones_like(ids, dtype=torch.bool), select, t=torch.tensor([100, 10]))


def test_hugging_face_loads_the_directory_as_is(tiny_checkpoint, tiny_db):
    from transformers import AutoTokenizer, BertForMaskedLM

    mlm, info = BertForMaskedLM.from_pretrained(tiny_checkpoint, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    assert mlm.config.vocab_size == len(tok) == len(tiny_db.tokenizer)
    text = "Once upon a time, Tom's dog didn't bark."
    assert tok(text)["input_ids"] == tiny_db.tokenizer.encode(text)
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():  # the same network: dbert's logits are transformers' (forbidden ids aside)
        want = mlm.eval()(input_ids=ids).logits[0]
        got = tiny_db.model(ids, torch.ones_like(ids, dtype=torch.bool), torch.ones_like(ids, dtype=torch.bool))
    allowed = torch.ones(want.shape[-1], dtype=torch.bool)
    allowed[tiny_db.model.forbidden] = False
    assert torch.allclose(got[:, allowed], want[:, allowed], atol=1e-4, rtol=0)
    assert (tiny_checkpoint / "dbert.json").is_file() and (tiny_checkpoint / "dbert_tokens.safetensors").is_file()
    assert not list(tiny_checkpoint.glob("*.bin")) and not list(tiny_checkpoint.glob("*.pt"))


@pytest.fixture
def own_db(tiny_checkpoint):
    """A private copy: save() records its new path and meta on the object it is given."""
    return checkpoint.load(tiny_checkpoint)


def test_save_load_identical_logits(own_db, tmp_path):
    tiny_db = own_db
    path_before, meta_before = tiny_db.path, dict(tiny_db.meta)
    path = checkpoint.save(tiny_db, tmp_path / "copy")
    assert (tiny_db.path, tiny_db.meta) == (path_before, meta_before)  # save returns what it wrote, changes nothing
    again = checkpoint.load(path)
    assert torch.equal(logits_of(tiny_db), logits_of(again))
    assert torch.equal(tiny_db.counts, again.counts)
    assert again.schedule.name == tiny_db.schedule.name and again.schedule.T == tiny_db.schedule.T


def test_missing_and_corrupt_files_are_clear_errors(tiny_checkpoint, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_checkpoint, bad)
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(DbertError, match="model.safetensors is corrupt"):
        checkpoint.load(bad)
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_checkpoint, truncated)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(DbertError, match="corrupt"):
        checkpoint.load(truncated)
    missing = tmp_path / "missing"
    shutil.copytree(tiny_checkpoint, missing)
    (missing / "dbert.json").unlink()
    with pytest.raises(DbertError, match="missing dbert.json"):
        checkpoint.load(missing)
    with pytest.raises(DbertError, match="not found"):
        checkpoint.load(tmp_path / "nowhere")


KILLER = r"""
import sys, torch
from dbert_core import checkpoint
db = checkpoint.load(sys.argv[1])
print("ready", flush=True)
i = 0
while True:
    i += 1
    with torch.no_grad():
        for p in db.model.parameters():
            p.add_(0.001)
    db.meta["generation"] = i
    checkpoint.save(db, sys.argv[2])
"""


@pytest.mark.slow
def test_kill_during_save_leaves_a_loadable_checkpoint(tiny_checkpoint, tmp_path):
    target = tmp_path / "live"
    shutil.copytree(tiny_checkpoint, target)
    for delay in (0.3, 0.55, 0.8, 1.1, 1.45):
        proc = subprocess.Popen([sys.executable, "-c", KILLER, str(tiny_checkpoint), str(target)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        db = checkpoint.load(target)  # never raises: old or new, complete either way
        assert logits_of(db).isfinite().any()
    assert checkpoint.read_meta(target).get("generation", 0) >= 1  # saves did happen
    checkpoint.save(db, target)  # the next writer clears what the killed ones left beside it
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_trainer_state_is_kept_apart_and_not_pickled(tiny_checkpoint):
    state = checkpoint.load_trainer_state(tiny_checkpoint)
    assert state is not None and state["state"]["step"] == 150
    files = {p.name for p in (tiny_checkpoint / "trainer_state").iterdir()}
    assert files == {"optimizer.pt", "rng.pt", "state.json"}
    # torch.load(weights_only=True) refuses arbitrary pickles
    evil = tiny_checkpoint.parent / "evil.pt"
    torch.save({"x": object()}, evil)
    with pytest.raises(Exception):
        torch.load(evil, weights_only=True)
