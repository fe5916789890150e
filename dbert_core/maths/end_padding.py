"""End padding a model does not attend to (`dbert train --unit story --hide-end-padding`).

A story window is [CLS] [SEP] story [SEP] [SEP] ... [SEP]: the [SEP] after the story is its end, the
ones after it are padding (text.data.story_windows). A model trained with hidden end padding never
uses a *visible* padding [SEP] as a key: a [SEP] whose left neighbour is a visible [SEP] is masked
out of attention (the end itself, the story's start and any [SEP] next to a [MASK] stay seen). The
rule reads only the noised input, so training and sampling apply it alike, and it makes the decided
tail of a sample inert: once a row's end and every position after it are revealed, those positions
change nothing anyone reads, and a sampler can leave them out of the forward exactly
(`crop_length`, used by sampling.base.Net): the calls then cost what the story costs, not what the
window costs.
"""

from __future__ import annotations

import torch


def hidden_keys(ids: torch.Tensor, sep_id: int) -> torch.Tensor:
    """(B, N) bool: True at the positions attention must not read (a [SEP] right after a [SEP])."""
    sep = ids == sep_id
    out = torch.zeros_like(sep)
    out[:, 1:] = sep[:, 1:] & sep[:, :-1]
    return out


def needed_lengths(hidden: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """(B,) the columns each row's forward must keep: every column after it is hidden in that row
    and selected in none, so dropping them changes no output that is read."""
    needed = ~hidden | select
    cols = torch.arange(1, needed.shape[1] + 1).expand_as(needed)
    return (cols * needed).amax(dim=1).clamp_min(1)


def crop_length(hidden: torch.Tensor, select: torch.Tensor) -> int:
    """The columns a forward over all these rows together must keep (the longest row's need)."""
    return int(needed_lengths(hidden, select).max())


OVERHEAD = 64  # tokens: what one more forward call costs beside its tokens (a CPU call's launches; measured below)


def length_groups(needed: list[int], overhead: int = OVERHEAD) -> list[list[int]]:
    """Rows (indices into needed) in groups of like length, each run as one forward cropped to its
    longest row: the grouping of rows sorted by length that costs the fewest tokens computed plus
    `overhead` per group (dynamic programming over the sorted rows; a batch of ten rows whose ends
    are decided at 96 to 246 tokens of a 258-token window reads a third fewer tokens this way than
    cropped together: docs/performance.md)."""
    order = sorted(range(len(needed)), key=lambda r: -needed[r])
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: the cost of the first j rows (longest first)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # rows i..j-1 together, as long as row i, the longest of them
            cost = best[i] + (j - i) * needed[order[i]] + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return groups[::-1]
