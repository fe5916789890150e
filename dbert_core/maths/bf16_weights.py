"""The sampler's bf16 weights: the matrices autocast would cast on every call, cast once.

Sampling in bf16 runs the float32 model under `torch.autocast`, which rounds each Linear's weight
and bias (and the tied vocabulary decoder) to bf16 inside every call: some 16 M values per call for
MiniLM, 2-3 ms of a partial call's 20-30 (docs/performance.md, 2026-12-05). A twin of the model
holds those matrices in bf16 already (autocast leaves a bf16 operand as it is), and everything
autocast keeps in float32 (embeddings, LayerNorm) as the model has it, so its logits are the
model's under autocast bit for bit. The twin shares the float32 tensors it does not cast.

Used by sampling/base.Net; one twin per loaded model, made again when the model's weights change
(a checkpoint trained further in the same process).
"""

from __future__ import annotations

import copy
import threading
import weakref

import torch
from torch import nn

from .model import DiffusionBert

_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (its weights' versions, twin)
_LOCK = threading.Lock()  # batches side by side (sampling/parallel.py) ask at once: one twin is made


def bf16_twin(model: DiffusionBert) -> DiffusionBert:
    """The model with bf16 Linear weights and biases and a bf16 copy of the tied decoder (the
    word embeddings stay float32 for the input), kept on the model and made again when any of its
    weights changed since (their version counters)."""
    with _LOCK:
        return _twin(model)


def _twin(model: DiffusionBert) -> DiffusionBert:
    version = tuple(p._version for p in model.parameters())
    kept = _TWINS.get(model)
    if kept is not None and kept[0] == version:
        return kept[1]
    _TWINS.pop(model, None)  # the old twin goes before the new one is made
    memo: dict[int, torch.Tensor] = {id(p): p for p in model.parameters()}  # deepcopy shares the parameters, then Linears get bf16 copies
    memo.update({id(b): b for b in model.buffers()})
    twin = copy.deepcopy(model, memo)
    # normal tensors even when the first caller samples under torch.inference_mode: a later call outside
    # it (autograd on, the shared float32 weights requiring grad) may not save inference tensors
    with torch.inference_mode(False):
        for m in twin.modules():
            if isinstance(m, nn.Linear):
                m.weight = nn.Parameter(m.weight.detach().to(torch.bfloat16), requires_grad=False)
                if m.bias is not None:
                    m.bias = nn.Parameter(m.bias.detach().to(torch.bfloat16), requires_grad=False)
        twin.bert.head.bias = nn.Parameter(twin.bert.head.bias.detach().to(torch.bfloat16), requires_grad=False)
        twin.bert.decoder = model.bert.embeddings.word_embeddings.weight.detach().to(torch.bfloat16)
    twin.eval()
    _TWINS[model] = (version, twin)
    return twin
