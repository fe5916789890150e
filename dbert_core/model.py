"""The denoiser: a Hugging Face BertForMaskedLM plus optional time conditioning.

time="none"      time-agnostic decoding (TAD): the model infers t from the number of masks.
time="prefix"    a learned time-token embedding is prepended to the sequence (PTE).
time="layerwise" a sinusoidal embedding of t -> MLP, added to the input of every layer (LTE).

Only the positions that need predictions are projected to the vocabulary, so a step never
builds a (B, L, V) tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

TIME_MODES = ("none", "prefix", "layerwise")

# BERT sizes: tiny for tests, mini/small after Turc et al. 2019, base = bert-base.
PRESETS = {
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=160, vocab_size=1024),
    "mini": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                 max_position_embeddings=512, vocab_size=8192),
    "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048,
                  max_position_embeddings=512, vocab_size=16384),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512, vocab_size=30522),
}


def sinusoid(t: torch.Tensor, dim: int, T: int) -> torch.Tensor:
    """Transformer-style sinusoidal embedding of t/T in [0, 1]: (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    ang = (t.float() / T * 1000.0).unsqueeze(-1) * freqs  # scale so small steps stay distinct
    emb = torch.cat([ang.sin(), ang.cos()], dim=-1)
    return nn.functional.pad(emb, (0, dim - 2 * half))


class TimeEmbedding(nn.Module):
    """sinusoid(t) -> Linear -> SiLU -> Linear: (B,) -> (B, hidden)."""

    def __init__(self, hidden: int, T: int):
        super().__init__()
        self.T = T
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        nn.init.zeros_(self.mlp[2].weight)  # starts as a no-op on a pretrained BERT
        nn.init.zeros_(self.mlp[2].bias)

    def forward(self, t):
        return self.mlp(sinusoid(t, self.mlp[0].in_features, self.T))


@dataclass
class Batch:
    """A batch the denoiser reads: ids (B, N) with [CLS] ... [SEP], attention (B, N) bool."""

    ids: torch.Tensor
    attention: torch.Tensor


class DiffusionBert(nn.Module):
    """BertForMaskedLM + time conditioning. forward() returns logits for selected positions."""

    def __init__(self, mlm, time: str = "none", T: int = 2048, mask_id: int = 103,
                 forbidden: tuple[int, ...] = ()):
        super().__init__()
        if time not in TIME_MODES:
            raise ValueError(f"unknown time conditioning {time!r}; choose one of: {', '.join(TIME_MODES)}")
        self.mlm = mlm
        self.time = time
        self.T = T
        self.mask_id = mask_id
        self.forbidden = list(forbidden)  # ids the model may never predict: [PAD], [CLS], [MASK]
        hidden = mlm.config.hidden_size
        self.time_embed = TimeEmbedding(hidden, T) if time != "none" else None
        self._layer_time = None  # (B, 1, hidden) while a layerwise forward runs
        if time == "layerwise":
            for layer in mlm.bert.encoder.layer:
                layer.register_forward_pre_hook(self._add_time, with_kwargs=True)

    def _add_time(self, module, args, kwargs):
        if self._layer_time is None:
            return None
        if args:
            return (args[0] + self._layer_time, *args[1:]), kwargs
        kwargs = dict(kwargs)
        kwargs["hidden_states"] = kwargs["hidden_states"] + self._layer_time
        return args, kwargs

    @property
    def config(self):
        return self.mlm.config

    @property
    def max_length(self) -> int:
        """Longest content length this model can read: positions minus [CLS], [SEP], time token."""
        return self.mlm.config.max_position_embeddings - 2 - (self.time == "prefix")

    def time_state_dict(self) -> dict:
        return {} if self.time_embed is None else {f"time_embed.{k}": v for k, v in self.time_embed.state_dict().items()}

    def hidden(self, ids: torch.Tensor, attention: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states (B, N, H) of the encoder for ids (B, N)."""
        bert = self.mlm.bert
        if self.time == "none":
            return bert(input_ids=ids, attention_mask=attention.long()).last_hidden_state
        if t is None:
            raise ValueError(f"a model with time conditioning {self.time!r} needs t")
        temb = self.time_embed(t.to(ids.device))  # (B, H)
        if self.time == "prefix":
            words = bert.embeddings.word_embeddings(ids)  # (B, N, H)
            embeds = torch.cat([words[:, :1], temb.unsqueeze(1).to(words.dtype), words[:, 1:]], dim=1)
            att = torch.cat([attention[:, :1], attention[:, :1], attention[:, 1:]], dim=1)
            h = bert(inputs_embeds=embeds, attention_mask=att.long()).last_hidden_state
            return torch.cat([h[:, :1], h[:, 2:]], dim=1)
        self._layer_time = temb.unsqueeze(1)
        try:
            return bert(input_ids=ids, attention_mask=attention.long()).last_hidden_state
        finally:
            self._layer_time = None

    def forward(self, ids, attention, select: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (M, V) at the M positions where select (B, N) is True, in row-major order.

        Forbidden ids get -inf, so p(x_0 | x_t) never puts mass on special tokens.
        """
        h = self.hidden(ids, attention, t)
        logits = self.mlm.cls(h[select])
        if self.forbidden:
            logits.index_fill_(-1, torch.tensor(self.forbidden, device=logits.device), float("-inf"))
        return logits


def quiet_transformers():
    """Silence transformers' load reports and progress bars: dbert reports on its own."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def build_bert(preset: str | None = None, init: str | None = None, vocab_size: int | None = None,
               special_ids: dict | None = None, dtype=None, from_scratch: bool = False):
    """A BertForMaskedLM from a preset's sizes (random init) or a pretrained path/hub id.

    from_scratch=True with init: the pretrained model's architecture, freshly initialised.
    """
    from transformers import BertConfig, BertForMaskedLM

    if init is not None and from_scratch:
        quiet_transformers()
        try:
            config = BertConfig.from_pretrained(init)
        except OSError as e:
            from .errors import DbertError

            raise DbertError(f"cannot load a BERT config from --init {init}: {str(e).splitlines()[0][:160]}") from None
        return BertForMaskedLM(config)
    if init is not None:
        kwargs = {"dtype": dtype} if dtype is not None else {}
        quiet_transformers()  # the "MLM head newly initialised" report is expected
        try:
            mlm = BertForMaskedLM.from_pretrained(init, **kwargs)
        except OSError as e:
            from .errors import DbertError

            raise DbertError(f"cannot load a BERT from --init {init}: {str(e).splitlines()[0][:160]}") from None
        mlm.tie_weights()
        return mlm
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    sizes = dict(PRESETS[preset])
    if vocab_size is not None:
        sizes["vocab_size"] = vocab_size
    config = BertConfig(**sizes, **(special_ids or {}))
    return BertForMaskedLM(config)


def forward_flops(config, B: int, N: int, M: int) -> float:
    """Multiply-add FLOPs (x2) of a BERT forward on (B, N) tokens projecting M positions."""
    H, I, V, layers = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_hidden_layers
    per_layer = 2 * B * N * (4 * H * H + 2 * H * I) + 2 * 2 * B * N * N * H  # projections, FFN; QK^T and AV
    head = 2 * M * (H * H + H * V)  # transform + decoder
    return layers * per_layer + head


def count_parameters(module: nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
