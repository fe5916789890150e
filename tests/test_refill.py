"""Refill (the TUI's edit by remasking) is exact conditional sampling under the model: the
sampler with a template, every token but the remasked ones fixed, as --prompt. A law test on
the tiny linear model: the refilled position's tokens follow the model's conditional p(x_i | the
rest), chi-square; for the spindle model they follow the reverse process's law for one masked
position, sum_m S_m p(v) r_m(v) (docs/method.md), as --prompt does."""

import pytest
import torch

from dbert_core.storage import checkpoint
from dbert_core.sampling.base import Net
from dbert_core.sampling.sample import frames, kernel
from dbert_tui.runs import Recorded
from dbert_tui.editing import Draft
from helpers import goodness_p

N = 3000


@pytest.fixture(scope="module")
def lin_db(tiny_linear_checkpoint):
    return checkpoint.load(tiny_linear_checkpoint)


def _draft_template(db, pos: int) -> torch.Tensor:
    """A finished sample with position `pos` remasked through the TUI's Draft."""
    last = list(frames(db, n=1, length=12, steps=16, sampler="ancestral", seed=11, pair_quotes=False,
                       generator=torch.Generator().manual_seed(11)))[-1]
    d = Draft.of(Recorded(last, torch.ones(1, 12, dtype=torch.int32), 0.0), 0, db.model.mask_id)
    d.cursor = pos
    assert d.remask() == 1
    return d.template()


def _conditional(db, template: torch.Tensor, pos: int) -> torch.Tensor:
    """The model's p(x_pos | the rest) as the sampler draws from it (never-drawn ids left out)."""
    select = template == db.model.mask_id
    logits = Net(db)(template.unsqueeze(0), select.unsqueeze(0), torch.tensor([0])).double()[0]
    logits[list(db.model.forbidden) + [db.tokenizer.unk_token_id]] = float("-inf")
    return torch.softmax(logits, -1)


@pytest.mark.parametrize("sampler", ["ancestral", "first-hitting"])
def test_refilled_position_follows_the_models_conditional(lin_db, sampler):
    pos = 5
    template = _draft_template(lin_db, pos)
    p = _conditional(lin_db, template, pos)
    last = list(frames(lin_db, template=template, n=N, length=12, steps=16, sampler=sampler, top_k=0,
                       block_repeats=False, pair_quotes=False, seed=3, generator=torch.Generator().manual_seed(3)))[-1]
    others = torch.arange(12) != pos
    assert (last.ids[:, others] == template[others]).all()  # everything else is kept
    counts = torch.bincount(last.ids[:, pos], minlength=p.shape[0])
    assert goodness_p(counts, p) > 1e-3
    flat = torch.ones_like(p) * (p > 0)
    assert goodness_p(counts, flat / flat.sum()) < 1e-6  # the test has power


def test_spindle_refill_follows_the_reverse_process_law(tiny_db):
    pos, S = 4, 16
    template = _draft_template(tiny_db, pos)
    p = _conditional(tiny_db, template, pos)
    r = kernel(tiny_db.schedule, S).r_vocab(torch.arange(S))  # (S, V)
    R = r @ p
    R[-1] = 1.0
    survive = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(1 - R, 0)[:-1]])
    law = (survive.unsqueeze(1) * p * r).sum(0)
    law[:] = law / law.sum()
    last = list(frames(tiny_db, template=template, n=N, length=12, steps=S, sampler="ancestral", top_k=0,
                       block_repeats=False, pair_quotes=False, seed=5, generator=torch.Generator().manual_seed(5)))[-1]
    counts = torch.bincount(last.ids[:, pos], minlength=p.shape[0])
    assert goodness_p(counts, law) > 1e-3
