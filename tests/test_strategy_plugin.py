"""A decoding strategy added from outside the engine (strategies.register) runs everywhere a built-in
one does: `dbert sample --sampler`, the server's dbert.sampler with dbert.params, and the TUI's
controller, with nothing but this module written (the touch list in docs/architecture.md)."""

from __future__ import annotations

import json

import pytest
import torch

from dbert_core import strategies
from dbert_core.config import SampleConfig
from dbert_core.errors import DbertError
from dbert_core.sampling.draw import draw_tokens
from dbert_core.sampling.sample import frames, resolve

from helpers import post_json, run, serving


def left_to_right(state, greedy: bool = False):
    """The toy family: each call reveals the `width` leftmost masked positions of every row."""
    x, masked, kern = state.x, state.masked, state.kern
    S = len(kern.grid) - 1
    calls = 0
    while masked.any():
        rows = masked.any(1).nonzero().squeeze(1)
        mk = masked[rows]
        u = torch.rand(x.shape, generator=state.gen, dtype=torch.float64)
        logits = state.net(x[rows], mk, torch.full((len(rows),), kern.grid[min(calls, S - 1)]), rows=rows)
        rev = mk & (mk.cumsum(1) <= state.params["width"])
        shaping = state.shaping._replace(temperature=0.0) if greedy else state.shaping
        chosen, conf = draw_tokens(x[rows], mk, rev, logits[rev[mk].to(logits.device)], None, state.no_draw,
                                   shaping, u[rows][rev], state.block_repeats, state.top)
        revealed = torch.zeros_like(masked)
        revealed[rows] = rev
        state.reveal(revealed, chosen, conf)
        calls += 1
        yield state.frame(revealed, S if not masked.any() else min(calls, S - 1))
    yield from state.nothing_to_fill()


TOY = strategies.Strategy(
    "toy", False, "left to right, width tokens a call", "each position given only what is left of it",
    params=(strategies.Param("width", 1, "positions revealed per call", lo=1, hi=64, type=int),),
    family=left_to_right, options={"greedy": False}, uses_steps=False)
NEVER = strategies.Strategy("toy-never", False, "refuses every checkpoint", "none", family=left_to_right,
                            needs=lambda db: "the toy-never sampler runs on no checkpoint")


@pytest.fixture(autouse=True)
def toy():
    strategies.register(TOY)
    strategies.register(NEVER)
    try:
        yield TOY
    finally:
        strategies.unregister(TOY.name)
        strategies.unregister(NEVER.name)


def test_the_registry_holds_it_and_checks_its_declared_parameters(tiny_db):
    assert strategies.names()[-2:] == ("toy", "toy-never") and strategies.get("toy") is TOY
    assert TOY.resolve(None) == {"width": 1} and TOY.resolve({"width": 3}) == {"width": 3}
    for bad, needle in [({"width": 0}, r"toy's width must be a whole number in \[1, 64\]"),
                        ({"width": 2.5}, "whole number"), ({"depth": 1}, "no parameter 'depth'")]:
        with pytest.raises(strategies.ParamError, match=needle):
            TOY.resolve(bad)
    assert strategies.parse_params("toy", ["width=4"]) == {"width": 4}
    assert TOY.supports(tiny_db) is None and NEVER.supports(tiny_db) == "the toy-never sampler runs on no checkpoint"
    with pytest.raises(DbertError, match="runs on no checkpoint"):
        resolve(SampleConfig(sampler="toy-never"), tiny_db)
    with pytest.raises(DbertError, match="already"):
        strategies.register(TOY)
    with pytest.raises(DbertError, match="built-in"):
        strategies.unregister("ancestral")


def test_it_samples_through_the_shared_frame_path(tiny_db):
    fs = list(frames(tiny_db, n=2, length=8, steps=16, seed=3, sampler="toy", params={"width": 3},
                     pair_quotes=False, fix_contractions=False, known_words=False))
    assert [int(f.revealed.sum(1).max()) for f in fs] == [3, 3, 2] and fs[-1].done and not fs[-1].masked.any()
    assert fs[-1].nfe == 3 and all(f.revealed[:, :3].all() for f in fs[:1])  # the leftmost first
    again = list(frames(tiny_db, n=2, length=8, steps=16, seed=3, sampler="toy", params={"width": 3},
                        pair_quotes=False, fix_contractions=False, known_words=False))
    assert torch.equal(again[-1].ids, fs[-1].ids)


def test_the_cli_runs_it(tiny_checkpoint, capsys, monkeypatch):
    def sample(*args):
        return run(["sample", "--checkpoint", str(tiny_checkpoint), "--n", "2", "--length", "8", "--steps", "16",
                    "--seed", "1", *args], capsys, monkeypatch)

    code, out, err = sample("--sampler", "toy", "--param", "width=4", "--stats")
    assert code == 0 and len(out.splitlines()) == 2
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["sampler"] == "toy" and stats["params"] == {"width": 4} and not stats["exact"]
    for args, needle in [(["--sampler", "toy", "--param", "width=0"], "toy's width must be a whole number"),
                         (["--sampler", "toy", "--param", "width=x"], "--param width takes a whole number"),
                         (["--sampler", "toy-never"], "the toy-never sampler runs on no checkpoint")]:
        code, out, err = sample(*args)
        assert code == 2 and needle in err and out == "" and len(err.strip().splitlines()) == 1


def test_the_server_runs_it_with_params_and_batches_only_like_params(tiny_db):
    from dbert_core.serving.options import Limits
    from dbert_core.serving.serve import create_app
    from dbert_core.serving.serve_queue import Job

    app = create_app(tiny_db, "tiny", dtype="fp32", limits=Limits(max_n=8, max_tokens=64, max_body=4096))
    with serving(app) as (url, _):
        def ask(dbert: dict):
            return post_json(url + "/v1/completions", {"max_tokens": 6, "seed": 2, "dbert": dbert})

        status, body = ask({"sampler": "toy", "params": {"width": 3}, "steps": 16})
        assert status == 200, body
        assert body["dbert"]["sampler"] == "toy" and body["dbert"]["params"] == {"width": 3}
        for dbert, field, needle in [
                ({"sampler": "toy", "params": {"width": 99}}, "dbert.params.width", "dbert.params.width must be a whole"),
                ({"sampler": "toy", "params": {"width": "3"}}, "dbert.params.width", "whole number"),
                ({"sampler": "toy", "params": {"depth": 1}}, "dbert.params.depth", "no parameter 'depth'"),
                ({"sampler": "toy", "params": [3]}, "dbert.params", "an object"),
                ({"params": {"width": 3}}, "dbert.params", "needs dbert.sampler")]:
            status, body = ask(dbert)
            assert status == 400 and body["error"]["param"] == field and needle in body["error"]["message"], body
        status, body = ask({"sampler": "nope"})
        assert status == 400 and body["error"]["param"] == "dbert.sampler"
        assert all(name in body["error"]["message"] for name in strategies.names())  # every one, the toy too
    one, two = (resolve(SampleConfig(n=1, steps=8, length=4, sampler="toy", params={"width": w}), tiny_db)
                for w in (1, 2))
    same = resolve(SampleConfig(n=1, steps=8, length=4, sampler="toy"), tiny_db)  # width's default: 1
    assert Job(one, notify=print).batch_key == Job(same, notify=print).batch_key
    assert Job(one, notify=print).batch_key != Job(two, notify=print).batch_key


def test_the_tui_controller_runs_it(tiny_db):
    from dbert_tui.controller import Session, Settings
    from dbert_tui.runs import Run, produce
    from dbert_tui.widgets.controls import _value

    s = Session(Settings(sampler="remdm", steps=16, length=8, seed=5, pace_ms=0))
    s.next_sampler(tiny_db)  # the `m` key: the next strategy the checkpoint allows, the toy after the built-ins
    assert s.active.sampler == "toy"
    s.change(tiny_db, params={"width": 4})
    assert _value(s.active, "sampler") == "toy~ width 4"
    got = []
    assert produce(Run(1, resolve(s.active, tiny_db)), tiny_db, lambda: False, got.append) is True
    assert int(got[0].frame.revealed.sum(1).max()) == 4 and got[-1].frame.done and not got[-1].frame.masked.any()
    s.next_sampler(tiny_db)  # toy-never is not offered: it does not support this checkpoint
    assert s.active.sampler == strategies.names()[0]
