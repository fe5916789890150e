"""The samplers against each other: first-hitting's call count and exactness, cached's optimality,
distribution checks, seeds, prompts, temperature vs reveals, and `dbert bench`."""

import json
import math

import pytest
import torch

from dbert_core.storage import checkpoint
from dbert_core.config import SAMPLERS
from dbert_core.sampling.sample import frames, generate, kernel, parse_prompt
from dbert_core.maths.schedule import step_grid
from helpers import goodness_p, two_sample_p


@pytest.fixture(scope="module")
def lin_db(tiny_linear_checkpoint):
    return checkpoint.load(tiny_linear_checkpoint)


@pytest.fixture(params=["spindle", "linear"])
def any_db(request, tiny_db, lin_db):
    return tiny_db if request.param == "spindle" else lin_db


def run(db, seed=0, **kw):
    kw.setdefault("n", 4)
    kw.setdefault("length", 10)
    kw.setdefault("steps", 32)
    kw.setdefault("sampler", "ancestral")  # these tests are about the step-by-step reverse process
    kw.setdefault("top_k", 0)
    kw.setdefault("pair_quotes", False)  # the reverse process alone (quotes.py's touch-up has its own tests)
    return list(frames(db, generator=torch.Generator().manual_seed(seed), **kw))


def reveal_steps(fs) -> torch.Tensor:
    """(B, L) the step (1..S) at which each position was revealed."""
    when = torch.zeros_like(fs[0].ids)
    for f in fs:
        when[f.revealed] = f.row_steps.unsqueeze(1).expand_as(when)[f.revealed]
    return when


# ---------------------------------------------------------------------------------- first-hitting
@pytest.mark.parametrize("steps", [8, 64, 256])
def test_first_hitting_one_call_per_event_at_most_L(any_db, steps):
    L = 10
    fs = run(any_db, n=4, length=L, steps=steps, sampler="first-hitting")
    last = fs[-1]
    assert last.done and not last.masked.any() and not (last.ids == any_db.model.mask_id).any()
    assert last.nfe == len(fs) <= L  # one network call per frame, never more than L
    events = torch.stack([f.revealed.any(1) for f in fs]).sum(0)  # reveal events per row
    assert int(events.max()) == last.nfe  # all rows advance one event per call: no extra calls
    # finished rows drop out of the batch; the first call's four rows are one input (all [MASK]) and are
    # computed once where it reads every position (token-aware schedules; a token-free one reads the revealed ones)
    once = 0 if any_db.schedule.token_free else 3
    assert fs[0].rows == 4 - once
    assert last.rows == int(events.sum()) - once
    for a, b in zip(fs, fs[1:]):
        assert (b.row_steps >= a.row_steps).all()
        assert torch.equal(b.revealed, a.masked & ~b.masked)
        assert torch.equal(a.ids[~a.masked], b.ids[~a.masked])  # carry-over
    if steps == 256:  # S >> L: nearly every event reveals a single token, so calls ~ L
        singles = sum(int((f.revealed.sum(1) == 1).sum()) for f in fs)
        assert singles >= 0.75 * int(events.sum())
        assert last.nfe >= L - 2


def exact_first_event_pmf(db, L: int, S: int) -> torch.Tensor:
    """P(the first reveal happens at step m), m = 0..S-1, from the all-[MASK] state, computed
    directly over the vocabulary: prod_j prod_i (1 - sum_v p_i(v) r_j(v))."""
    tok, mask = db.tokenizer, db.model.mask_id
    ids = torch.tensor([[tok.cls_token_id] + [mask] * L + [tok.sep_token_id]])
    with torch.inference_mode():
        p = torch.softmax(db.model(ids, torch.ones_like(ids, dtype=torch.bool), ids == mask).double(), -1)
    grid = step_grid(db.schedule.T, S)
    survive, pmf = 1.0, []
    for k in range(S):
        r = db.schedule.reveal_prob(torch.tensor(float(grid[k])), torch.tensor(float(grid[k + 1]))).double()
        R = (p * r).sum(-1) if k < S - 1 else torch.ones(L, dtype=torch.float64)
        stay = torch.prod(1 - R).item()
        pmf.append(survive * (1 - stay))
        survive *= stay
    return torch.tensor(pmf)


def first_event_counts(db, sampler, L, S, N, seed):
    first = torch.full((N,), -1)
    for f in frames(db, n=N, length=L, steps=S, sampler=sampler, pair_quotes=False,
                    generator=torch.Generator().manual_seed(seed)):
        new = f.revealed.any(1) & (first < 0)
        first[new] = f.row_steps[new] - 1
    return torch.bincount(first, minlength=S)


@pytest.mark.parametrize("schedule", ["spindle", "linear"])
def test_first_event_time_follows_the_exact_law(schedule, tiny_db, lin_db):
    db = tiny_db if schedule == "spindle" else lin_db
    L, S, N = 3, 32, 3000
    pmf = exact_first_event_pmf(db, L, S)
    for sampler in ("ancestral", "first-hitting"):
        counts = first_event_counts(db, sampler, L, S, N, seed=11)
        assert goodness_p(counts, pmf) > 1e-3, sampler


class FixedDenoiser(torch.nn.Module):
    """A denoiser whose p(x_0 | x_t) is one fixed distribution, whatever x_t: then every position
    is revealed independently, and the law of its reveal step and token is known exactly."""

    def __init__(self, inner, logits):
        super().__init__()
        self.inner = inner
        self.logits = logits
        self.mask_id, self.forbidden, self.time = inner.mask_id, inner.forbidden, inner.time
        self.max_length, self.config = inner.max_length, inner.config

    def forward(self, ids, attention, select, t=None):
        return self.logits.expand(int(select.sum()), -1).clone()


def fixed_db(db, logits):
    import dataclasses

    return dataclasses.replace(db, model=FixedDenoiser(db.model, logits))


def test_reveal_steps_and_tokens_follow_the_exact_law(tiny_db):
    """p puts 80% of its mass on rare tokens (masked early, revealed late by the spindle schedule)
    and 20% on frequent ones. Each position is revealed at step m with probability
    prod_{j<m} (1 - R_j) R_m, R_j = sum_v p(v) r_j(v), with token v with probability
    p(v) r_m(v) / R_m. Both samplers must follow that law; the linear law must be rejected."""
    V = tiny_db.model.config.vocab_size
    c = tiny_db.schedule.centered
    allowed = torch.ones(V, dtype=torch.bool)
    allowed[list(tiny_db.model.forbidden) + [tiny_db.tokenizer.unk_token_id]] = False
    order = torch.argsort(torch.where(allowed, c, torch.tensor(float("nan"))).nan_to_num(0.0))
    rare = [int(v) for v in order if allowed[v]][:4]
    common = [int(v) for v in order.flip(0) if allowed[v]][:4]
    logits = torch.full((V,), float("-inf"))
    logits[rare] = 0.0
    logits[common] = math.log(0.25)
    db = fixed_db(tiny_db, logits)
    S, L, N = 24, 8, 300
    p = torch.softmax(logits.double(), -1)
    r = kernel(db.schedule, S).r_vocab(torch.arange(S))  # (S, V)
    R = (r @ p)  # (S,)
    R[-1] = 1.0
    survive = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(1 - R, 0)[:-1]])
    step_pmf = survive * R
    token_pmf = (step_pmf.unsqueeze(1) * p * r / R.unsqueeze(1)).sum(0)  # (V,)
    grid = torch.tensor(step_grid(db.schedule.T, S), dtype=torch.float64)
    linear_pmf = (grid[:-1] - grid[1:]) / grid[0]
    for sampler in SAMPLERS:
        fs = run(db, seed=5, n=N, length=L, steps=S, sampler=sampler)
        steps = torch.bincount(reveal_steps(fs).flatten() - 1, minlength=S)
        assert goodness_p(steps, step_pmf) > 1e-3, sampler
        assert goodness_p(steps, linear_pmf) < 1e-6, sampler  # the check has power
        tokens = torch.bincount(fs[-1].ids.flatten(), minlength=V)
        assert goodness_p(tokens[rare + common], token_pmf[rare + common]) > 1e-3, sampler


def test_kernel_classes_reproduce_the_vocabulary_reveal_probabilities(tiny_db):
    kern = kernel(tiny_db.schedule, 16)
    assert kern.classes < tiny_db.model.config.vocab_size
    for k in (0, 7, 14):
        t, s = kern.grid[k], kern.grid[k + 1]
        direct = tiny_db.schedule.reveal_prob(torch.tensor(float(t)), torch.tensor(float(s))).double()
        assert torch.equal(kern.r_vocab(torch.tensor([k]))[0], direct)
    assert (kern.r[-1] == 1).all()  # the last step reveals everything
    logits = torch.randn(5, tiny_db.model.config.vocab_size, dtype=torch.float32)
    p = torch.softmax(logits, -1).double()
    R_direct = p @ kern.r_vocab(torch.tensor([3]))[0]
    assert torch.allclose(kern.class_mass(logits) @ kern.r[3], R_direct, rtol=1e-5)


# ---------------------------------------------------------------------------------- all samplers
def sample_stats(db, sampler, seed, n=240, L=8, S=16, **kw):
    fs = list(frames(db, n=n, length=L, steps=S, sampler=sampler, pair_quotes=False,
                     generator=torch.Generator().manual_seed(seed), **kw))
    ids = fs[-1].ids
    vocab = db.model.config.vocab_size
    chars = torch.tensor([len(db.decode(row)) for row in ids], dtype=torch.float64)
    return {"tokens": torch.bincount(ids.flatten(), minlength=vocab), "steps": torch.bincount(
        reveal_steps(fs).flatten(), minlength=S + 1)[1:], "chars": chars, "rows": fs[-1].rows}


def test_samplers_agree_in_distribution(tiny_db):
    ref = sample_stats(tiny_db, "ancestral", seed=1)
    for sampler in ("cached", "first-hitting"):
        other = sample_stats(tiny_db, sampler, seed=2)
        assert two_sample_p(ref["tokens"], other["tokens"]) > 1e-4, sampler  # token frequencies
        assert two_sample_p(ref["steps"], other["steps"]) > 1e-4, sampler  # when positions are revealed
        se = math.sqrt(ref["chars"].var() / len(ref["chars"]) + other["chars"].var() / len(other["chars"]))
        assert abs(ref["chars"].mean() - other["chars"].mean()) < 4 * se, sampler  # text length
        assert other["rows"] < ref["rows"]  # network work
    # the checks have power: a colder sampler is told apart
    cold = sample_stats(tiny_db, "first-hitting", seed=3, temperature=0.5)
    assert two_sample_p(ref["tokens"], cold["tokens"]) < 1e-4


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_same_seed_same_output(tiny_db, sampler):
    a, _ = generate(tiny_db, n=5, batch_size=3, seed=7, length=12, steps=64, sampler=sampler)
    b, _ = generate(tiny_db, n=5, batch_size=3, seed=7, length=12, steps=64, sampler=sampler)
    c, _ = generate(tiny_db, n=5, batch_size=3, seed=8, length=12, steps=64, sampler=sampler)
    assert a == b and a != c


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_prompt_respected_no_mask_left(any_db, sampler):
    template = parse_prompt(any_db, "once upon a [MASK] there was a [MASK] girl", 14)
    fixed = template != any_db.model.mask_id
    fs = run(any_db, n=6, length=14, steps=40, template=template, sampler=sampler, top_k=5, top_p=0.9)
    for f in fs:
        assert torch.equal(f.ids[:, fixed], template[fixed].expand(6, -1))
    assert fs[-1].done and not fs[-1].masked.any() and not (fs[-1].ids == any_db.model.mask_id).any()
    full = parse_prompt(any_db, "once upon a time", 4)
    fs = run(any_db, n=2, length=4, steps=10, template=full, sampler=sampler)
    assert fs[-1].done and fs[-1].nfe == 0 and torch.equal(fs[-1].ids[0], full)


def test_temperature_never_moves_reveal_events(tiny_db, lin_db):
    # linear: the event steps and positions do not depend on p at all
    cold = run(lin_db, n=6, length=12, steps=64, sampler="first-hitting", temperature=0.3, top_k=3)
    hot = run(lin_db, n=6, length=12, steps=64, sampler="first-hitting", temperature=3.0)
    assert [f.revealed.tolist() for f in cold] == [f.revealed.tolist() for f in hot]
    assert [f.row_steps.tolist() for f in cold] == [f.row_steps.tolist() for f in hot]
    assert not torch.equal(cold[-1].ids, hot[-1].ids)
    # spindle: the first event comes from the raw p of the all-[MASK] input, the same for both
    cold = run(tiny_db, n=6, length=12, steps=64, sampler="first-hitting", temperature=0.3)
    hot = run(tiny_db, n=6, length=12, steps=64, sampler="first-hitting", temperature=3.0)
    assert torch.equal(cold[0].revealed, hot[0].revealed) and torch.equal(cold[0].row_steps, hot[0].row_steps)


@pytest.mark.parametrize("steps", [16, 128])
def test_cached_calls_only_when_needed(any_db, steps):
    """cached evaluates a row exactly when its state is new and something needs its prediction."""
    anc = run(any_db, n=5, length=10, steps=steps, sampler="ancestral")
    cac = run(any_db, n=5, length=10, steps=steps, sampler="cached")
    assert torch.equal(anc[-1].ids, cac[-1].ids)
    token_free = kernel(any_db.schedule, steps).inverse is None
    calls = rows = 0
    masked_before = torch.ones_like(anc[0].masked)
    changed = torch.ones(5, dtype=torch.bool)  # the row's x differs from when it was last evaluated
    for f in anc:
        need = (f.revealed.any(1) if token_free else masked_before.any(1)) & changed
        calls += bool(need.any())
        same = bool(masked_before[need].all())  # the rows called are one input (all [MASK]): computed once
        rows += 1 if same and int(need.sum()) > 1 else int(need.sum())
        changed = (changed & ~need) | f.revealed.any(1)
        masked_before = f.masked
    assert cac[-1].nfe == calls and cac[-1].rows == rows
    assert cac[-1].rows < anc[-1].rows


def test_first_hitting_needs_time_agnostic_model_for_spindle(tiny_checkpoint, tmp_path):
    from dbert_core.errors import DbertError

    db = checkpoint.load(tiny_checkpoint)
    db.model.time = "layerwise"  # as a time-conditioned model would report
    with pytest.raises(DbertError, match="time-agnostic"):
        run(db, sampler="first-hitting")


def test_default_sampler_is_the_fastest_exact_one_the_model_allows(tiny_checkpoint, tiny_linear_checkpoint):
    from dbert_core.sampling.sample import default_length, default_sampler

    spindle, linear = checkpoint.load(tiny_checkpoint), checkpoint.load(tiny_linear_checkpoint)
    assert default_sampler(spindle) == default_sampler(linear) == "first-hitting"
    assert default_length(spindle) == spindle.meta["seq_len"]
    spindle.model.time = linear.model.time = "layerwise"  # as time-conditioned models would report
    assert default_sampler(spindle) == "ancestral"  # first-hitting would need p independent of t
    assert default_sampler(linear) == "first-hitting"  # linear: p only for the revealed, at the event's t


def test_frames_count_the_network_flops(tiny_db, lin_db):
    from dbert_core.maths.model import forward_flops

    cfg = tiny_db.model.config
    anc = run(tiny_db, sampler="ancestral", n=3, length=10, steps=8)
    # step 1: every position masked, all projected; the three rows are one input, computed once
    assert anc[0].flops == forward_flops(cfg, 1, 12, 10) and anc[0].rows == 1
    assert all(b.flops >= a.flops for a, b in zip(anc, anc[1:])) and anc[-1].flops > anc[0].flops
    fh = run(lin_db, sampler="first-hitting", n=3, length=10, steps=8)
    # linear first-hitting projects only the positions it reveals: far less head work than ancestral
    assert fh[-1].flops < run(lin_db, sampler="ancestral", n=3, length=10, steps=8)[-1].flops


# ---------------------------------------------------------------------------------- bench
def test_bench_command(tiny_checkpoint, tmp_path):
    from typer.testing import CliRunner

    from dbert_core.cli import app

    out = tmp_path / "bench"
    res = CliRunner().invoke(app, ["bench", "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--quick",
                                   "--steps", "4,64", "--batch", "2", "--length", "8", "--no-bf16"])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "bench.json").read_text())
    rows = {(r["sampler"], r["steps"]): r for r in data["sampling"]}
    assert set(rows) == {(s, k) for s in SAMPLERS for k in (4, 64)}
    assert rows[("first-hitting", 64)]["calls_per_batch"] <= 8 < rows[("ancestral", 64)]["calls_per_batch"]
    assert rows[("ancestral", 64)]["speedup_vs_ancestral"] == 1.0
    assert data["train"]["tokens_per_s"] > 0 and data["peak"]["float32"] > 0
    assert all(r["gflop"] > 0 and r["seconds_at_peak"] > 0 for r in data["sampling"])
    assert rows[("first-hitting", 64)]["gflop"] < rows[("ancestral", 64)]["gflop"]
    cli = data["cli_defaults"]  # what `dbert sample --n 10` runs, not a sampler of the bench's own
    assert cli["sampler"] == "first-hitting" and cli["length"] == checkpoint.read_meta(tiny_checkpoint)["seq_len"]
    assert cli["steps"] == 96 and cli["cache_refresh"] == 0  # the tiny checkpoint recommends no decoding
    assert all(r["exact"] for r in data["sampling"] if r["sampler"] in ("ancestral", "first-hitting"))  # exact forward
    assert all(0 < f["percent_of_peak"] for f in data["forward"])
    assert data["model"]["attention"] == "sdpa (sampling), explicit (training)"  # the tiny model has dropout
    # the matmul rate at the model's shapes, per dtype and thread count, and each run as a fraction of it
    rates = data["rates"]["sampling"]
    assert (rates["batch"], rates["tokens"], rates["projected"]) == (2, 10, 16)
    assert {(r["dtype"], r["threads"]) for r in rates["rows"]} >= {("float32", 1)}
    for r in rates["rows"]:
        assert all(r[k] > 0 for k in ("qkv", "attn out", "ffn up", "ffn down", "head", "vocab", "model"))
        assert min(r[k] for k in ("qkv", "ffn up", "ffn down", "vocab")) <= r["model"]  # a mean of the rates
    for row in data["sampling"] + [cli]:
        rate = next(r["model"] for r in data["rates"]["cli" if row is cli else "sampling"]["rows"]
                    if (r["dtype"], r["threads"]) == (row["dtype"], row["threads"]))
        assert row["matmul_rate_gflop_per_s"] == rate
        assert row["fraction_of_matmul_rate"] == pytest.approx(row["gflop_per_s"] / rate, rel=1e-2)
    t = data["train"]
    assert t["gflop_per_step"] > 0 and t["matmul_rate_gflop_per_s"] == data["rates"]["train"]["rows"][0]["model"]
    assert t["mfu"] == pytest.approx(t["gflop_per_step"] / t["seconds_per_step"] / t["matmul_rate_gflop_per_s"], rel=2e-2)
    md = (out / "bench.md").read_text()
    assert "| first-hitting | 64 | 2 |" in md and md in res.stdout
    assert "at the model's sampling shapes" in md and "MFU" in md
    bad = CliRunner().invoke(app, ["bench", "--checkpoint", str(tiny_checkpoint), "--steps", "0"])
    assert bad.exit_code != 0 and "--steps" in str(bad.exception)


def test_shape_rates_combine_the_measured_rates():
    """The rate at the model's shapes is the forward's matrix FLOPs over their time at each shape's
    measured rate: between the slowest and the fastest shape, from numbers measured, not assumed."""
    from dbert_core.evaluation import bench
    from dbert_core.maths.model import BertConfig

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16)
    shapes = bench.model_shapes(cfg, 2, 6, 4)
    assert shapes["qkv"] == (12, 16, 48) and shapes["ffn down"] == (12, 32, 16) and shapes["vocab"] == (4, 16, 50)
    r = bench.shape_rates(cfg, 2, 6, 4, torch.float32, torch.device("cpu"), reps=1)
    per_shape = [r[k] for k in shapes]
    assert all(x > 0 for x in per_shape) and min(per_shape) * 0.99 <= r["model"] <= max(per_shape) * 1.01
    assert bench.fraction(50.0, 200.0) == 0.25 and bench.fraction(50.0, None) is None


def test_bench_puts_sampling_against_the_dtype_it_computes_in(tiny_db, tmp_path, monkeypatch):
    """Float32 weights sample under bf16 autocast where bf16 is native (sampling.base.Net): the bench
    reports that run as bfloat16 and puts it against the bf16 matmul rate, not the fp32 one (on the
    H200 it had compared bf16 work with the fp32 rate, and so did CPUs with AVX512-BF16)."""
    from dbert_core import hardware
    from dbert_core.evaluation import bench

    assert next(tiny_db.model.parameters()).dtype == torch.float32
    b = bench.Bench(tiny_db, tmp_path, length=8, quick=True, reps=1)
    assert b._dtype() == "float32"  # no native bf16 (the tests' default): fp32 it is
    monkeypatch.setattr(hardware, "native_bf16", lambda *a, **k: True)
    assert b._dtype() == "bfloat16"
    b.result["rates"]["sampling"] = {"rows": [{"dtype": "float32", "threads": 1, "model": 100.0},
                                              {"dtype": "bfloat16", "threads": 1, "model": 400.0}]}
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    out = b._compute({"gflop": 10.0, "seconds": 0.1})
    assert out["dtype"] == "bfloat16" and out["matmul_rate_gflop_per_s"] == 400.0 and out["fraction_of_matmul_rate"] == 0.25


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_only_revealed_rows_of_logits_reach_the_host(any_db, sampler):
    """The sampler reduces the logits where the model runs (a GPU) and copies to the host only
    the rows of the positions it reveals: at most n x length vocabulary rows per sample batch,
    where copying every call's logits would move (positions still masked) rows per call."""
    from torch.overrides import TorchFunctionMode

    V = any_db.model.bert.config.vocab_size
    if any_db.schedule.alpha_vocab(torch.tensor(0.0)).shape[-1] > 1:
        assert kernel(any_db.schedule, 32).classes != V  # else a class-mass copy would count as logits
    moved = []

    class Transfers(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            to_host = func is torch.Tensor.cpu or (func is torch.Tensor.to and "cpu" in map(str, args[1:]))
            if to_host and args[0].dim() == 2 and args[0].shape[-1] == V:
                moved.append(args[0].shape[0])
            return out

    with Transfers():
        fs = run(any_db, sampler=sampler, n=4, length=10, steps=32)
    assert not fs[-1].masked.any()
    assert 0 < sum(moved) <= 4 * 10  # each position's row once, when it is revealed
