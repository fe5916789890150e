"""The decoding strategies (dbert_core/strategies.py, the heuristic samplers of sampling/ordered.py and remdm.py): the
registry every surface reads, what each heuristic reveals, and how far from the model's law
they are (total-variation distance against the noise floor, dbert_core/sampling/distance.py)."""

from __future__ import annotations

import json
import math
import sys

import pytest
from helpers import cli_words
import torch

from dbert_core.storage import checkpoint
from dbert_core import config, strategies
from dbert_core.errors import DbertError
from dbert_core.sampling.sample import frames, generate, parse_prompt, position_scores, remdm_kernel, remdm_path

HEURISTIC = strategies.HEURISTIC


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
    kw.setdefault("top_k", 0)
    kw.setdefault("pair_quotes", False)  # the reverse process alone (quotes.py's touch-up has its own tests)
    return list(frames(db, generator=torch.Generator().manual_seed(seed), **kw))


# ---------------------------------------------------------------------------------- the registry
def test_one_registry_names_every_strategy_its_label_and_parameters():
    assert config.STRATEGIES == strategies.NAMES == strategies.names()
    assert config.SAMPLERS == strategies.EXACT == ("ancestral", "cached", "first-hitting")
    assert set(HEURISTIC) == {"confidence", "margin", "entropy", "blockwise", "threshold", "entropy-bounded", "remdm"}
    assert all(strategies.get(n).label == "exact" for n in strategies.EXACT)
    assert all(strategies.get(n).label == "heuristic" for n in HEURISTIC)
    assert strategies.get("threshold").resolve(None) == {"tau": 0.9}
    assert strategies.get("blockwise").resolve({"block": 8}) == {"block": 8, "by": "confidence", "opening": -1.0}
    for bad in ({"block": 0}, {"block": 2.5}, {"by": "chance"}, {"opening": -2}):
        with pytest.raises(DbertError, match="blockwise's"):
            strategies.get("blockwise").resolve(bad)
    assert strategies.get("entropy-bounded").resolve({"gamma": 1}) == {"gamma": 1.0}
    remdm = strategies.get("remdm")
    assert remdm.resolve(None) == {"schedule": "cap", "eta": 0.008}
    assert remdm.resolve({"schedule": "loop"}) == {"schedule": "loop", "eta": 0.02, "t_on": 0.55, "t_off": 0.05,
                                                   "alpha_on": 0.9}
    assert remdm.describe({"schedule": "rescale"}) == "remdm (heuristic; schedule=rescale, eta=0.015)"
    for bad, needle in [({"tau": 2.0}, r"tau must be a finite number in \[0, 1\]"), ({"gamma": 1}, "no parameter")]:
        with pytest.raises(DbertError, match=needle):
            strategies.get("threshold").resolve(bad)
    with pytest.raises(DbertError, match="only with schedule=loop"):
        remdm.resolve({"t_on": 0.5})
    with pytest.raises(DbertError, match="t_off < t_on"):
        config.SampleConfig(sampler="remdm", params={"schedule": "loop", "t_on": 0.1, "t_off": 0.2}).validate()
    with pytest.raises(DbertError) as e:
        config.SampleConfig(params={"tau": 0.5}).validate()
    assert "--param needs --sampler" in cli_words(e.value)
    assert strategies.parse_params("threshold", ["tau=0.5"]) == {"tau": 0.5}
    with pytest.raises(DbertError, match="NAME=VALUE"):
        strategies.parse_params("threshold", ["tau"])


def test_cli_help_stats_and_trajectory_say_whether_exact(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    from typer.testing import CliRunner

    from dbert_core.cli import app, main

    help_text = " ".join(CliRunner().invoke(app, ["sample", "--help-all"], env={"COLUMNS": "200"}).output.split())
    for name in strategies.NAMES:
        assert name in help_text
    assert "exact (the model's own law)" in help_text and "heuristic" in help_text and "tau=0.9" in help_text

    def sample(*args):
        monkeypatch.setattr(sys, "argv", ["dbert", "sample", "--checkpoint", str(tiny_checkpoint), "--n", "2",
                                          "--length", "10", "--steps", "16", "--seed", "1", *args])
        with pytest.raises(SystemExit) as e:
            main()
        out, err = capsys.readouterr()
        return e.value.code or 0, out, err

    traj = tmp_path / "t.json"
    code, out, err = sample("--sampler", "threshold", "--param", "tau=0.5", "--stats", "--trajectory", str(traj))
    assert code == 0 and len(out.splitlines()) == 2
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["sampler"] == "threshold" and stats["exact"] is False and stats["params"] == {"tau": 0.5}
    t = json.loads(traj.read_text())
    assert t["strategy"] == {"name": "threshold", "label": "heuristic", "exact": False, "params": {"tau": 0.5}}
    assert t["settings"]["params"] == {"tau": 0.5}
    code, out, err = sample("--stats")
    assert json.loads(err.strip().splitlines()[-1])["exact"] is True
    code, out, err = sample("--sampler", "remdm", "--param", "schedule=loop", "--param", "eta=0.3",
                            "--trajectory", str(traj))
    assert code == 0
    t = json.loads(traj.read_text())
    assert t["strategy"]["params"]["schedule"] == "loop" and all("remasked" in f for f in t["frames"])
    for args, needle in [(["--sampler", "threshold", "--param", "gamma=1"], "no parameter 'gamma'"),
                         (["--param", "tau=1"], "--param needs --sampler"),
                         (["--sampler", "threshold", "--param", "tau=x"], "takes a number")]:
        code, out, err = sample(*args)
        assert code == 2 and needle in err and out == "" and len(err.strip().splitlines()) == 1


def test_tui_control_bar_and_m_key(tiny_db):
    from dbert_tui.controller import Session, Settings
    from dbert_tui.widgets.controls import _value

    assert _value(Settings(sampler="first-hitting"), "sampler") == "first-hitting"  # exact: as before
    assert _value(Settings(sampler="threshold"), "sampler") == "threshold~ tau 0.9"
    assert _value(Settings(sampler="remdm", params={"schedule": "loop"}), "sampler").startswith("remdm~ schedule loop")
    s = Session(Settings(sampler="first-hitting", steps=16, length=8))
    seen = []
    for _ in range(len(strategies.NAMES)):
        s.next_sampler(tiny_db)
        seen.append(s.active.sampler)
    assert seen == list(strategies.NAMES[3:]) + list(strategies.NAMES[:3])  # every strategy, then around
    s.change(tiny_db, sampler="threshold", params={"tau": 0.5})
    s.next_sampler(tiny_db)  # the next strategy starts at its own defaults
    assert s.active.sampler == "entropy-bounded" and s.active.params is None


# ---------------------------------------------------------------------------------- every heuristic
@pytest.mark.parametrize("sampler", HEURISTIC)
def test_seeded_prompted_complete_and_refuses_a_broken_model(any_db, sampler):
    a, st = generate(any_db, n=5, batch_size=3, seed=7, length=12, steps=24, sampler=sampler)
    b, _ = generate(any_db, n=5, batch_size=3, seed=7, length=12, steps=24, sampler=sampler)
    c, _ = generate(any_db, n=5, batch_size=3, seed=8, length=12, steps=24, sampler=sampler)
    assert a == b and a != c and st["exact"] is False
    template = parse_prompt(any_db, "once upon a [MASK] there was a [MASK] girl", 14)
    fixed = template != any_db.model.mask_id
    fs = run(any_db, n=6, length=14, steps=40, template=template, sampler=sampler, top_k=5, top_p=0.9)
    for f in fs:
        assert torch.equal(f.ids[:, fixed], template[fixed].expand(6, -1))
    last = fs[-1]
    assert last.done and not last.masked.any() and not (last.ids == any_db.model.mask_id).any()
    assert last.nfe == sum(1 for a, b in zip([0] + [f.nfe for f in fs], [f.nfe for f in fs]) if b > a)
    full = parse_prompt(any_db, "once upon a time", 4)
    fs = run(any_db, n=2, length=4, steps=10, template=full, sampler=sampler)
    assert fs[-1].done and fs[-1].nfe == 0 and torch.equal(fs[-1].ids[0], full)
    import copy

    broken = copy.deepcopy(any_db)
    with torch.no_grad():
        next(broken.model.parameters()).fill_(math.nan)
    with pytest.raises(DbertError, match="not finite"):
        generate(broken, n=2, length=8, steps=16, seed=0, sampler=sampler)


@pytest.mark.parametrize("sampler", HEURISTIC)
def test_only_revealed_rows_of_logits_reach_the_host(any_db, sampler):
    """As for the exact samplers: the scores that rank positions are reduced where the model
    runs; only the rows of revealed positions are copied (remdm: once per reveal, and a position
    masked again is revealed again)."""
    from torch.overrides import TorchFunctionMode

    V = any_db.model.bert.config.vocab_size
    moved = []

    class Transfers(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            to_host = func is torch.Tensor.cpu or (func is torch.Tensor.to and "cpu" in map(str, args[1:]))
            if to_host and args[0].dim() == 2 and args[0].shape[-1] == V:
                moved.append(args[0].shape[0])
            return out

    with Transfers():
        fs = run(any_db, sampler=sampler, n=4, length=10, steps=32)
    reveals = sum(int(f.revealed.sum()) for f in fs)
    assert not fs[-1].masked.any() and 0 < sum(moved) == reveals and (sampler == "remdm" or reveals == 40)


def test_temperature_shapes_tokens_not_which_positions(tiny_db):
    for sampler in ("confidence", "entropy-bounded"):
        cold = run(tiny_db, n=6, length=12, steps=16, sampler=sampler, temperature=0.3)
        hot = run(tiny_db, n=6, length=12, steps=16, sampler=sampler, temperature=3.0)
        assert torch.equal(cold[0].revealed, hot[0].revealed)  # from the same all-[MASK] raw p
        assert not torch.equal(cold[-1].ids, hot[-1].ids)


# ---------------------------------------------------------------------------------- each one's rule
@pytest.mark.parametrize("by", ["confidence", "margin", "entropy"])
def test_ordered_reveals_the_surest_positions_at_the_schedules_pace(any_db, by):
    from dbert_core.sampling.base import Net, masked_curve

    L, S = 10, 8
    fs = run(any_db, n=3, length=L, steps=S, sampler=by)
    curve = masked_curve(any_db, S)
    revealed = torch.stack([f.revealed.sum(1) for f in fs]).cumsum(0)  # (S, B)
    expected = torch.round(L * (1 - curve[1:])).long()
    assert torch.equal(revealed, expected.unsqueeze(1).expand_as(revealed))
    assert fs[-1].nfe == int((expected.diff(prepend=torch.zeros(1, dtype=torch.long)) > 0).sum())  # no idle calls
    # the first reveals are the top-scoring positions of the all-[MASK] input
    x = torch.full((3, L), any_db.model.mask_id)
    with torch.inference_mode():
        logits = Net(any_db)(x, x == any_db.model.mask_id, torch.full((3,), any_db.schedule.T))
    no_draw = sorted(set(any_db.model.forbidden) | {any_db.tokenizer.unk_token_id})
    score = position_scores(logits, no_draw, by).view(3, L).clone()
    score = -score if by == "entropy" else score
    first = next(f for f in fs if f.revealed.any()).revealed
    k = int(first[0].sum())
    for b in range(3):
        assert set(first[b].nonzero().squeeze(1).tolist()) == set(score[b].topk(k).indices.tolist())


@pytest.mark.parametrize("by", ["confidence", "entropy"])
def test_blockwise_fills_the_blocks_left_to_right_at_the_schedules_pace(any_db, by):
    """Each step reveals in the first block that still has a [MASK] (spilling into the next only when
    it has fewer left than the step reveals), as many as the ordered samplers do; a block as long
    as the canvas is the ordered sampler itself."""
    L, S, block = 12, 6, 4
    fs = run(any_db, n=3, length=L, steps=S, sampler="blockwise", params={"block": block, "by": by})
    plain = run(any_db, n=3, length=L, steps=S, sampler=by)
    assert torch.equal(torch.stack([f.revealed.sum(1) for f in fs]), torch.stack([f.revealed.sum(1) for f in plain]))
    assert not fs[-1].masked.any()
    before = torch.ones(3, L, dtype=torch.bool)
    for f in fs:
        for b in range(3):
            where = f.revealed[b].nonzero().squeeze(1)
            if not len(where):
                continue
            left = before[b].nonzero().squeeze(1)  # masked before this step, left to right
            # in the leading blocks that hold this many masked positions, and in the first of them
            assert int(where.max()) // block <= int(left[len(where) - 1]) // block
            assert int(where.min()) // block == int(left[0]) // block
        before = f.masked.clone()
    whole = run(any_db, n=3, length=L, steps=S, sampler="blockwise", params={"block": L, "by": by})
    assert all(torch.equal(a.ids, b.ids) and torch.equal(a.revealed, b.revealed) for a, b in zip(whole, plain))


def test_blockwise_computes_only_the_blocks_it_may_reveal_in():
    from dbert_core.sampling.ordered import _rank, _window

    mk = torch.tensor([[False, True, True, False, True, True, True, True],
                       [False, False, False, False, False, True, False, True]])
    # every position of the first unfinished blocks that hold the step's reveals (a finished block: none)
    assert _window(mk, torch.tensor([2, 1]), 4).tolist() == [[True] * 4 + [False] * 4, [False] * 4 + [True] * 4]
    assert _window(mk, torch.tensor([3, 2]), 4).tolist() == [[True] * 8, [False] * 4 + [True] * 4]  # block 1 too
    full = torch.full(mk.shape, float("-inf"), dtype=torch.float64)
    full[mk] = torch.linspace(0.1, 0.9, int(mk.sum()), dtype=torch.float64)
    rank = _rank(full, 4)
    assert rank[0, 2] == 0 and rank[0, 1] == 1 and rank[0, 7] == 2  # block 0 first, the surest first within
    assert rank[0, 0] > rank[0, 4] and rank[0, 3] > rank[0, 4]  # a decided position after every masked one


def test_threshold_and_entropy_bound_set_how_many_per_call(any_db):
    L = 10
    one_call = run(any_db, n=3, length=L, sampler="threshold", params={"tau": 0.0})
    assert one_call[-1].nfe == 1 and len(one_call) == 1 and one_call[-1].done  # all above 0: all at once
    each = run(any_db, n=3, length=L, sampler="threshold", params={"tau": 1.0})
    assert each[-1].nfe == L and all(int(f.revealed.sum(1).max()) == 1 for f in each)  # at least one, only one
    assert [f.step for f in each] == sorted(f.step for f in each) and each[-1].step == 32  # the grid reached
    wide = run(any_db, n=3, length=L, sampler="entropy-bounded", params={"gamma": 1e6})
    assert wide[-1].nfe == 1
    tight = run(any_db, n=3, length=L, sampler="entropy-bounded", params={"gamma": 0.0})
    assert tight[-1].nfe >= L - 1  # one per call unless a position is certain (zero entropy)
    mid = run(any_db, n=3, length=L, sampler="entropy-bounded", params={"gamma": 2.0})
    assert 1 <= mid[-1].nfe <= L
    # each call's set is the lowest-entropy prefix whose sum minus its largest stays under gamma
    from dbert_core.sampling.base import Net

    x = torch.full((3, L), any_db.model.mask_id)
    with torch.inference_mode():
        logits = Net(any_db)(x, x == any_db.model.mask_id, torch.full((3,), any_db.schedule.T))
    no_draw = sorted(set(any_db.model.forbidden) | {any_db.tokenizer.unk_token_id})
    h = position_scores(logits, no_draw, "entropy").view(3, L).clone()
    for b in range(3):
        chosen = mid[0].revealed[b]
        hs = h[b][chosen]
        assert float(hs.sum() - hs.max()) <= 2.0 + 1e-9
        assert float(h[b][~chosen].min()) >= float(hs.max()) - 1e-12  # the lowest entropies, in order
        if (~chosen).any():  # and one more would break the bound
            assert float(hs.sum()) > 2.0 - 1e-9


def test_remdm_remasks_and_reduces_to_ancestral_without_it(any_db):
    loop = {"schedule": "loop", "eta": 0.2}
    path = remdm_path(any_db, 40, strategies.get("remdm").resolve(loop))
    T = any_db.schedule.T
    assert path[0] == T and path[-1] == 0 and len(path) == 41
    plateau = [t for t in path if path.count(t) > 1]
    assert len(plateau) == 40 - round(40 * 0.45) - round(40 * 0.05) + 1  # the steps at constant alpha
    fs = run(any_db, n=6, length=12, steps=40, sampler="remdm", params=loop)
    assert any(f.remasked.any() for f in fs) and not fs[-1].masked.any()
    assert all(not (f.remasked & f.revealed).any() for f in fs)
    template = parse_prompt(any_db, "once upon a time", 12)
    fs = run(any_db, n=6, length=12, steps=40, sampler="remdm", params=loop, template=template)
    assert not any(f.remasked[:, :4].any() for f in fs)  # the prompt is never masked again
    # eta = 0: no remasking, and the reveal kernel is ancestral's
    from dbert_core.sampling.sample import kernel

    kern, sigma = remdm_kernel(any_db, 16, {"schedule": "cap", "eta": 0.0})
    assert torch.equal(sigma, torch.zeros_like(sigma))
    assert torch.allclose(kern.r, kernel(any_db.schedule, 16).r)
    kern, sigma = remdm_kernel(any_db, 16, {"schedule": "cap", "eta": 0.05})
    assert (sigma <= 0.05).all() and (sigma[-1] == 0).all() and (kern.r <= 1).all() and (kern.r[-1] == 1).all()


# ---------------------------------------------------------------------------------- how far from the law
def test_tv_distance_exact_within_the_floor_heuristic_outside(tiny_db):
    """Whole sequences of 3 tokens (top-3 choices): the exact samplers' estimated TV to ancestral
    stays within the noise floor of two ancestral runs; confidence ordering and parallel
    threshold decoding sample another law, and the measurement says so."""
    from dbert_core.sampling.distance import tv_table

    rows = [("cached", None), ("first-hitting", None), ("confidence", None), ("threshold", {"tau": 0.0})]
    r = tv_table(tiny_db, rows, draws=3000, length=3, steps=16, top_k=3, floor_pairs=4, seed=0)
    by = {row["sampler"]: row for row in r["rows"]}
    assert 0 < r["floor"]["mean"] < 0.15
    assert not by["cached"]["outside"] and not by["first-hitting"]["outside"]
    assert by["confidence"]["outside"] and by["threshold"]["outside"]
    assert by["confidence"]["tv"] > 2 * r["floor"]["mean"]


@pytest.mark.anyio
async def test_tui_m_key_runs_a_heuristic_and_the_dialog_sets_its_parameters(tiny_db, monkeypatch):
    """The m key reaches the heuristic strategies; the bar says so; the settings dialog takes
    NAME=VALUE parameters for the strategy it names (and refuses a wrong one in a notification)."""
    import asyncio

    from dbert_core.storage import store
    from dbert_tui.app import create_app
    from dbert_tui.controller import Settings
    from dbert_tui.screens.dialogs import FormDialog
    from dbert_tui.widgets.controls import ControlBar

    monkeypatch.setattr(store, "shipped", lambda name: None)
    app = create_app(checkpoint=tiny_db.path, loader=lambda path: tiny_db, deterministic=True,
                     settings=Settings(steps=16, length=12, pace_ms=0, seed=0, sampler="first-hitting", top_k=0))

    async def until(pilot, condition):
        end = asyncio.get_running_loop().time() + 60
        while not condition():
            assert asyncio.get_running_loop().time() < end, "timed out"
            await pilot.pause(0.05)

    async with app.run_test(size=(100, 24)) as pilot:
        g = app.generate_screen
        done = lambda: g.run is not None and g.run.finished and g.drawn is g.run.frames[-1]  # noqa: E731
        await until(pilot, done)
        await pilot.press("m")  # first-hitting -> the first heuristic
        await until(pilot, lambda: g.run.settings.sampler == "confidence" and done())
        assert "m confidence~" in g.query_one(ControlBar).plain()
        assert not g.run.frames[-1].frame.masked.any()
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, FormDialog))
        app.screen.query_one("#field-sampler").value = "threshold"
        app.screen.query_one("#field-params").value = "tau=0.5"
        await pilot.press("enter")
        await until(pilot, lambda: g.run.settings.sampler == "threshold" and done())
        assert g.run.settings.params == {"tau": 0.5} and "m threshold~ tau 0.5" in g.query_one(ControlBar).plain()
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, FormDialog))
        app.screen.query_one("#field-params").value = "gamma=1"
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert g.run.settings.params == {"tau": 0.5}
        # refused in the dialog itself: it stays open, the parameters field marked
        assert isinstance(app.screen, FormDialog) and app.screen.error[0] == "params"
        assert "no parameter 'gamma'" in app.screen.error[1]


class _Recorder(torch.nn.Module):
    """The tiny model, reporting itself as time-conditioned and recording the t of every call."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.mask_id, self.forbidden, self.time = inner.mask_id, inner.forbidden, "layerwise"
        self.max_length, self.config, self.bert = inner.max_length, inner.config, inner.bert
        self.calls: list[list[int]] = []

    def forward(self, ids, attention, select, t=None):
        self.calls.append(t.tolist())
        return self.inner(ids, attention, select, t=t)


@pytest.mark.parametrize("sampler,params", [("confidence", None), ("threshold", {"tau": 1.0}),
                                            ("remdm", {"schedule": "loop", "eta": 0.3})])
def test_a_time_conditioned_model_is_called_at_the_time_each_frame_stands_for(tiny_db, sampler, params):
    import dataclasses

    from dbert_core.sampling.sample import kernel

    db = dataclasses.replace(tiny_db, model=_Recorder(tiny_db.model))
    S, L = 16, 8
    fs = run(db, n=2, length=L, steps=S, sampler=sampler, params=params)
    times = [c[0] for c in db.model.calls]
    assert all(len(set(c)) == 1 for c in db.model.calls) or sampler == "threshold"
    assert times == sorted(times, reverse=True)  # never back up
    if sampler == "confidence":  # at the grid step whose reveals it makes (none expected at the first ones)
        grid = kernel(db.schedule, S).grid
        made = [grid[f.step - 1] for f in fs if f.revealed.any()]
        assert times == made
    elif sampler == "threshold":  # one reveal per call: the row's masked fraction sets the time
        assert times[0] == db.schedule.T and len(times) == L and all(f.t == kernel(db.schedule, S).grid[f.step] for f in fs)
    else:
        path = remdm_path(db, S, strategies.get("remdm").resolve(params))
        plateau = max(set(path), key=path.count)
        assert times[0] == db.schedule.T and times.count(plateau) > 1 and set(times) <= set(path[:-1])
