"""Shared fixtures: an isolated dbert home, offline Hugging Face, and tiny trained checkpoints."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import DATA, HAVE_DATA, NO_DATA, ROOT, TINYSTORIES, tiny_config, train_tiny  # noqa: F401 - the fixtures below use them

TESTS = Path(__file__).resolve().parent


def pytest_configure(config):
    """One torch thread, everywhere: the SVG snapshots and seeded samples depend on the tiny
    models' floating-point sums, which change with the thread count; tiny models gain nothing
    from more threads, and on a shared machine oversubscribed cores slow everyone."""
    import torch

    torch.set_num_threads(int(os.environ.get("DBERT_TEST_THREADS", "1")))


def _in_corpora(value) -> bool:
    """A path in the corpora, or a list or tuple holding one (a command line: TRAIN = [..., str(TINYSTORIES)])."""
    if isinstance(value, (list, tuple)):
        return any(_in_corpora(v) for v in value)
    return isinstance(value, (str, Path)) and str(value).startswith(str(DATA))


def _reads_corpora(func, seen: set) -> bool:
    """Whether `func` (a test, a fixture or a helper defined under tests/) names a path in the
    corpora (helpers.DATA, TINYSTORIES, a module's HEAD = DATA / ...), itself or through the tests'
    own functions it calls."""
    func = getattr(func, "__func__", func)
    code = getattr(func, "__code__", None)
    if code is None or code in seen or not code.co_filename.startswith(str(TESTS)):
        return False
    seen.add(code)
    names, stack = set(), [code]
    while stack:  # the names of the function and of its nested functions, lambdas and comprehensions
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if hasattr(k, "co_names"))
    found = [func.__globals__.get(n) for n in names]
    return any(_in_corpora(v) for v in found) or any(_reads_corpora(v, seen) for v in found)


def pytest_collection_modifyitems(config, items):
    """Without the shared corpora the suite still collects and runs: the tests that read them
    (or use a fixture that does, such as the tiny checkpoints trained on TinyStories) skip."""
    if HAVE_DATA:
        return
    skip = pytest.mark.skip(reason=NO_DATA)
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        defs = [d for ds in (fixtures.name2fixturedefs.values() if fixtures else ()) for d in ds]
        params = getattr(getattr(item, "callspec", None), "params", {}).values()  # a parametrize over corpus files
        seen: set = set()
        if any(_in_corpora(p) for p in params) or any(
                _reads_corpora(f, seen) for f in [getattr(item, "obj", None), *(d.func for d in defs)]):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Every test gets its own store and HF cache, and never touches the network."""
    monkeypatch.setenv("DBERT_HOME", str(tmp_path / "dbert_home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _portable_precision(monkeypatch, request):
    """`--dtype auto` means fp32 in tests, whatever the CPU: seeded samples and the TUI snapshots
    must not depend on whether this machine has native bf16 (tests of bf16 ask for it by name)."""
    if "native_bf16" in request.keywords:
        return
    from dbert_core import hardware

    monkeypatch.setattr(hardware, "native_bf16", lambda *a, **k: False)  # compute_dtype, the one "auto" rule, reads it


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny spindle, time-agnostic model trained for a few seconds on TinyStories."""
    return train_tiny(tmp_path_factory.mktemp("ckpt") / "tiny", max_steps=150)


@pytest.fixture(scope="session")
def tiny_linear_checkpoint(tmp_path_factory) -> Path:
    """The same with the linear schedule."""
    return train_tiny(tmp_path_factory.mktemp("ckpt") / "tiny_linear", max_steps=60, schedule="linear")


@pytest.fixture(scope="session")
def tiny_db(tiny_checkpoint):
    from dbert_core.storage import checkpoint

    return checkpoint.load(tiny_checkpoint)


@pytest.fixture(scope="session")
def snapshot_db(tmp_path_factory):
    """The SVG snapshots' model: tiny_checkpoint's recipe trained once and committed (tests/fixtures/tiny),
    because a model trained on the spot differs from CPU to CPU (AMD and Intel kernels round differently
    and 150 steps amplify it) and so would its samples; fixed weights sample the same text everywhere."""
    from dbert_core.storage import checkpoint

    folder = tmp_path_factory.mktemp("snap") / "tiny"
    shutil.copytree(Path(__file__).parent / "fixtures" / "tiny", folder)
    return checkpoint.load(folder)


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory):
    """A small pretrained-style BERT directory (HF layout) with a 1,024-piece WordPiece."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from dbert_core.text.data import read_examples, train_tokenizer

    out = tmp_path_factory.mktemp("bert") / "bert"
    texts = read_examples([str(TINYSTORIES)], "sentence")
    tok = train_tokenizer(texts[:5000], 1024)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
