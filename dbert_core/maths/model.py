"""The denoiser: a BERT in plain torch plus optional time conditioning.

Bert is transformers' BertForMaskedLM re-written small (fused QKV, scaled_dot_product_attention
for inference, an explicit attention and a cheaper dropout mask for CPU training, the MLM
decoder tied to the word embeddings); `pretrained.py` reads and writes its weights in
transformers' checkpoint format, so a checkpoint stays loadable by BertForMaskedLM.

time="none"      time-agnostic decoding (TAD): the model infers t from the number of masks.
time="prefix"    a learned time-token embedding is inserted after [CLS] (PTE).
time="layerwise" a sinusoidal embedding of t -> MLP, added to the input of every layer (LTE).

Only the positions that need predictions are projected to the vocabulary, so a step never
builds a (B, L, V) tensor.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..config import TIME_MODES
from ..errors import DbertError
from .end_padding import hidden_keys

if TYPE_CHECKING:  # maths.prefix_cache and maths.decided_cache import this module: named here, not imported
    from .decided_cache import DecidedCache
    from .prefix_cache import PrefixCache

# a layer's keys and values (B, h, N, d) -> the ones its queries attend to (Layer.forward's kv)
KeysValues = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


# BERT sizes: tiny for tests, mini/small after Turc et al. 2019, base = bert-base.
PRESETS = {  # keys: config.PRESETS
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=160, vocab_size=1024),
    "mini": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                 max_position_embeddings=512, vocab_size=8192),
    "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048,
                  max_position_embeddings=512, vocab_size=16384),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512, vocab_size=30522),
}

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {  # transformers' names for the ones BERTs use
    "gelu": F.gelu,
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}


_LIMITS: dict[str, tuple[float, float]] = {"vocab_size": (1, 10_000_000), "hidden_size": (1, 65_536), "num_hidden_layers": (1, 512),
           "num_attention_heads": (1, 4096), "intermediate_size": (1, 1 << 20),
           "max_position_embeddings": (1, 1 << 20), "type_vocab_size": (1, 4096)}  # config.json's sizes


@dataclass
class BertConfig:
    """config.json of a BERT, with transformers' key names and defaults."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1            # embeddings, attention output, FFN output
    attention_probs_dropout_prob: float = 0.1   # attention weights (training only)
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02             # std of the normal init of weights
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0                # its embedding row starts at zero and gets no gradient
    position_embedding_type: str = "absolute"
    tie_word_embeddings: bool = True
    extra: dict = field(default_factory=dict, repr=False)  # every other key, written back unchanged

    @classmethod
    def from_dict(cls, d: dict) -> "BertConfig":
        names = {f.name for f in fields(cls)} - {"extra"}
        config = cls(**{k: v for k, v in d.items() if k in names},
                     extra={k: v for k, v in d.items() if k not in names})
        config.check()
        return config

    def to_dict(self, dtype: torch.dtype | None = None) -> dict:
        """The keys BertForMaskedLM.from_pretrained reads; dtype: that of the saved weights."""
        d = dict(self.extra)
        d.pop("torch_dtype", None)  # transformers < 5 spelling of "dtype"
        d.update({f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"})
        d.update(architectures=["BertForMaskedLM"], model_type="bert")
        if dtype is not None:
            d["dtype"] = str(dtype).removeprefix("torch.")
        return dict(sorted(d.items()))

    def check(self) -> None:
        """Refuse what this BERT does not implement (rather than compute something else), and
        sizes of the wrong type or beyond any real BERT (which would crash or hang building it)."""
        for name, (lo, hi) in _LIMITS.items():
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi):
                raise DbertError(f"config.json: {name} is {value!r}; it must be a whole number in [{lo}, {hi}]")
        for name, lo, hi in (("hidden_dropout_prob", 0.0, 1.0), ("attention_probs_dropout_prob", 0.0, 1.0),
                             ("initializer_range", 0.0, 10.0), ("layer_norm_eps", 1e-30, 1.0)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi):
                raise DbertError(f"config.json: {name} is {value!r}; it must be a number in [{lo:g}, {hi:g}]")
        if self.pad_token_id is not None and not (isinstance(self.pad_token_id, int) and
                                                  0 <= self.pad_token_id < self.vocab_size):
            raise DbertError(f"config.json: pad_token_id is {self.pad_token_id!r}; it must be a token id or null")
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACTIVATIONS:
            raise DbertError(f"unsupported hidden_act {self.hidden_act!r} in config.json; "
                             f"supported: {', '.join(ACTIVATIONS)}")
        if self.position_embedding_type != "absolute":
            raise DbertError(f"unsupported position_embedding_type {self.position_embedding_type!r} in "
                             "config.json; only absolute positions are supported")
        if not self.tie_word_embeddings:
            raise DbertError("config.json has tie_word_embeddings=false; only tied MLM decoders are supported")
        if self.extra.get("is_decoder") or self.extra.get("add_cross_attention"):
            raise DbertError("config.json describes a decoder BERT; only bidirectional encoders are supported")
        if self.hidden_size % self.num_attention_heads:
            raise DbertError(f"hidden_size {self.hidden_size} does not divide into "
                             f"{self.num_attention_heads} attention heads")


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout for training: zero each element with probability p, scale the rest by 1/(1-p).

    On the CPU the mask comes from the four 16-bit lanes of 64-bit random integers: one generator
    call per four elements, where F.dropout's bernoulli_ draws a double per element (about 4x the
    cost; docs/performance.md). p is rounded to a multiple of 2^-16 and the scale uses the rounded
    value, so E[out] = x exactly. On CUDA torch's fused kernel is faster and is used.
    """
    if p <= 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    drop = round(p * 65536)
    if drop >= 65536:
        return x * 0.0
    n = x.numel()
    lanes = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-2 ** 63, 2 ** 63 - 1).view(torch.int16)[:n]
    keep = (lanes >= drop - 32768).view(x.shape)  # int16 lanes are uniform on [-32768, 32767]
    scale = torch.tensor(65536 / (65536 - drop), dtype=x.dtype)
    return x * torch.where(keep, scale, scale.new_zeros(()))  # the scaled mask in one pass, not a cast and a multiply


class Dropout(nn.Dropout):
    """nn.Dropout (same name, same `p`) through `dropout` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p) if self.training else x


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, p: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with dropout p on the weights; q, k, v (B, h, N, d), mask as Layer's.

    Training on the CPU takes the explicit path (two matmuls, a softmax and `dropout`):
    measured 2.3-4x faster than scaled_dot_product_attention's backward with dropout at every
    length up to 512, and without dropout in bf16 up to 256 tokens (docs/performance.md).
    CPU inference in bf16 takes the same products with the score and weight arrays kept across
    calls (workspace_attention): 1.2-2x faster than SDPA's bf16 kernel from 1 to 32 rows of 130
    to 514 tokens on a 2-core AMD EPYC with AVX512-BF16; written out with fresh arrays it lost
    at 258 tokens and more, to page faults on arrays of tens of MB (docs/performance.md, 2026-12-04).
    fp32 inference and CUDA use scaled_dot_product_attention (its fused kernels win there).
    """
    path = attention_path(q.device.type, torch.is_grad_enabled(), q.dtype, q.shape[-2], p, q.shape[0] * q.shape[1],
                          keys=k.shape[-2])
    if path == "explicit":
        return explicit_attention(q, k, v, mask, p)
    if path == "workspace":
        return workspace_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


WORKSPACE_BYTES = 256 * 2**20  # the most the two kept (B, h, N, N) arrays may take; above it: SDPA


def attention_path(device: str, grad: bool, dtype: torch.dtype, N: int, p: float, rows: int = 1,
                   keys: int | None = None) -> str:
    """"explicit", "workspace" or "sdpa": which form `attention` takes (the rule measured in
    docs/performance.md); N: query positions, keys: key positions (default N); rows: batch x heads
    (the workspace's size)."""
    bf16 = dtype == torch.bfloat16
    if device == "cpu" and grad and (p > 0 or (bf16 and N <= 256)):
        return "explicit"
    if device == "cpu" and not grad and bf16 and 2 * rows * N * (keys or N) * 2 <= WORKSPACE_BYTES:
        return "workspace"
    return "sdpa"


def explicit_attention(q, k, v, mask: torch.Tensor | None, p: float) -> torch.Tensor:
    """`attention` written out: the path CPU training takes. The 1/sqrt(d) scale is the product's
    own (baddbmm's alpha, as in workspace_attention): applied to the fp32 sums before the one
    rounding, and one pass over the (N, K) scores fewer in the forward and in the backward."""
    B, h, N, d = q.shape
    K = k.shape[-2]
    s = torch.baddbmm(q.new_zeros(1, 1, 1), q.reshape(B * h, N, d), k.reshape(B * h, K, d).transpose(1, 2),
                      beta=0, alpha=d ** -0.5).view(B, h, N, K)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return dropout(s.softmax(-1), p) @ v  # in bf16 too: torch's CPU softmax accumulates in fp32


_WORKSPACE = threading.local()  # per thread (the TUI's and the server's workers sample in their own)


def workspace_attention(q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
    """explicit_attention without dropout or autograd, its scores and weights written into two
    arrays this thread keeps from call to call (grown when a call needs more, replaced when the
    dtype or device change; any shape is a view of their start; normal tensors, never inference
    ones, so a thread may sample under inference_mode and then validate under no_grad), so a sampler's every layer and
    step reuses the same pages instead of faulting in fresh ones, also when its calls change
    length (a cropped end: maths/end_padding.py). q (B, h, N, d) and k may differ in length (N, K)."""
    B, h, N, _ = q.shape
    K = k.shape[-2]
    size, key = B * h * N * K, (q.dtype, q.device)
    kept = getattr(_WORKSPACE, "arrays", None)
    if kept is None or kept[0] != key or kept[1].numel() < size:
        _WORKSPACE.arrays = None  # the old arrays go before the new ones are made
        # normal tensors even when made under torch.inference_mode (a sampler): a later caller in the same
        # thread outside it (a trainer's no_grad validation; the TUI's workers share a pool of threads)
        # may not write into inference tensors
        with torch.inference_mode(False):
            kept = _WORKSPACE.arrays = (key, torch.empty(size, dtype=q.dtype, device=q.device),
                                        torch.empty(size, dtype=q.dtype, device=q.device))
    s, w = kept[1][:size].view(B, h, N, K), kept[2][:size].view(B, h, N, K)
    d = q.shape[-1]  # the scale inside the product (alpha): one pass over the scores fewer than a mul_
    torch.baddbmm(s.view(B * h, N, K), q.reshape(B * h, N, d), k.reshape(B * h, K, d).transpose(1, 2),
                  beta=0, alpha=d ** -0.5, out=s.view(B * h, N, K))
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))
    torch.softmax(s, -1, out=w)  # accumulates in fp32 on the CPU, like Tensor.softmax
    return w @ v


def release_workspace() -> None:
    """Drop this thread's attention arrays (a long-lived process between runs)."""
    _WORKSPACE.arrays = None


class Embeddings(nn.Module):
    """word + token type 0 + absolute position, then LayerNorm and dropout (transformers' names)."""

    def __init__(self, c: BertConfig):
        super().__init__()
        H = c.hidden_size  # _weight: skip torch's init (Bert.init_weights or a checkpoint sets the values)
        self.word_embeddings = nn.Embedding(c.vocab_size, H, c.pad_token_id, _weight=torch.empty(c.vocab_size, H))
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, H,
                                                _weight=torch.empty(c.max_position_embeddings, H))
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, H, _weight=torch.empty(c.type_vocab_size, H))
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = Dropout(c.hidden_dropout_prob)

    def forward(self, words: torch.Tensor, start: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """words (B, N, H) word embeddings at positions start.. (or at positions (B, N)) -> (B, N, H) layer input."""
        x = words + self.token_type_embeddings.weight[0]
        x = x + (self.position_embeddings.weight[start:start + words.shape[1]] if positions is None
                 else self.position_embeddings(positions))
        return self.dropout(self.LayerNorm(x))


class Layer(nn.Module):
    """Post-LN encoder layer: x = LN(x + attention(x)); x = LN(x + FFN(x))."""

    def __init__(self, c: BertConfig):
        super().__init__()
        H = c.hidden_size
        self.heads = c.num_attention_heads
        self.qkv = nn.Linear(H, 3 * H)  # query, key, value stacked: transformers' three Linears in one
        self.attn_out = nn.Linear(H, H)
        self.attn_ln = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(H, c.intermediate_size)
        self.ffn_out = nn.Linear(c.intermediate_size, H)
        self.ffn_ln = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.act = ACTIVATIONS[c.hidden_act]
        self.dropout = Dropout(c.hidden_dropout_prob)
        self.attn_dropout = c.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, kv: KeysValues | None = None) -> torch.Tensor:
        """x (B, N, H); mask (B, 1, 1, N) bool, True where a key may be attended, or None (all).
        kv: a cache's part in this layer (maths/prefix_cache.py, decided_cache.py): given x's own keys
        and values (B, h, N, d), the ones its queries attend to (mask covers those)."""
        B, N, H = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, h, N, d)
        if kv is not None:
            k, v = kv(k, v)
        y = attention(q, k, v, mask, self.attn_dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, N, H)
        x = self.attn_ln(x + self.dropout(self.attn_out(y)))
        return self.ffn_ln(x + self.dropout(self.ffn_out(self.act(self.ffn_in(x)))))


class MLMHead(nn.Module):
    """dense -> act -> LayerNorm, then the decoder: the word embeddings (tied) plus a bias."""

    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.act = ACTIVATIONS[c.hidden_act]
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))

    def forward(self, h: torch.Tensor, decoder: torch.Tensor, forbidden: torch.Tensor | None = None) -> torch.Tensor:
        """forbidden: ids whose logits are -inf, set through the bias (V values), not the (M, V) logits."""
        bias = self.bias if forbidden is None else self.bias.index_fill(0, forbidden, float("-inf"))
        return F.linear(self.LayerNorm(self.act(self.dense(h))), decoder, bias)


class Bert(nn.Module):
    """BertForMaskedLM's network: hidden states, and the MLM logits of hidden states."""

    def __init__(self, config: BertConfig, init: bool = True):
        """init=False: weights left as torch makes them, for pretrained.load to replace."""
        super().__init__()
        config.check()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        self.head = MLMHead(config)
        self.fresh_head = False  # the MLM head was initialised, not loaded (pretrained.load)
        self.decoder: torch.Tensor | None = None  # the tied decoder in bf16 (maths/bf16_weights.py); None: the word embeddings
        if init:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self, modules=None) -> None:
        """transformers' BERT init: weights ~ N(0, initializer_range), biases 0, LayerNorm 1 and 0,
        the [PAD] embedding row 0."""
        std = self.config.initializer_range
        for m in (self.modules() if modules is None else modules):
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, std)
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()
            if isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
            if isinstance(m, (nn.Linear, nn.LayerNorm)):
                m.bias.zero_()
            if isinstance(m, MLMHead):
                m.bias.zero_()

    def set_dropout(self, p: float) -> None:
        """One rate for every dropout (hidden and attention), kept in the config."""
        self.config.hidden_dropout_prob = self.config.attention_probs_dropout_prob = p
        for m in self.modules():
            if isinstance(m, nn.Dropout):
                m.p = p
            if isinstance(m, Layer):
                m.attn_dropout = p

    def forward(self, ids: torch.Tensor, attention: torch.Tensor, time_token: torch.Tensor | None = None,
                layer_time: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states (B, N', H) for ids (B, N) with attention (B, N) bool (False: padding).

        time_token (B, H): an extra input embedding inserted after [CLS] (N' = N + 1).
        layer_time (B, 1, H): added to the input of every layer.
        """
        x = self.embeddings.word_embeddings(ids)  # (B, N, H)
        if time_token is not None:
            x = torch.cat([x[:, :1], time_token.unsqueeze(1).to(x.dtype), x[:, 1:]], dim=1)
            attention = torch.cat([attention[:, :1], attention], dim=1)
        x = self.embeddings(x)
        mask = None if bool(attention.all()) else attention[:, None, None, :].bool()  # no mask: the fast kernels
        for layer in self.layers:
            x = layer(x if layer_time is None else x + layer_time.to(x.dtype), mask)
        return x

    def logits(self, h: torch.Tensor, forbidden: torch.Tensor | None = None) -> torch.Tensor:
        """(..., H) hidden states -> (..., V) MLM logits; -inf at the `forbidden` ids."""
        return self.head(h, self.embeddings.word_embeddings.weight if self.decoder is None else self.decoder, forbidden)


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
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), out := nn.Linear(hidden, hidden))
        nn.init.zeros_(out.weight)  # starts as a no-op on a pretrained BERT
        nn.init.zeros_(out.bias)

    def forward(self, t):
        return self.mlp(sinusoid(t, self.mlp[0].in_features, self.T))


class DiffusionBert(nn.Module):
    """Bert + time conditioning. forward() returns logits for selected positions."""

    def __init__(self, bert: Bert, time: str = "none", T: int = 2048, mask_id: int = 103,
                 forbidden: tuple[int, ...] = (), hide_end_padding: bool = False, sep_id: int = 102):
        super().__init__()
        if time not in TIME_MODES:
            raise ValueError(f"unknown time conditioning {time!r}; choose one of: {', '.join(TIME_MODES)}")
        self.bert = bert
        self.time = time
        self.T = T
        self.mask_id = mask_id
        self.forbidden = list(forbidden)  # ids the model may never predict: [PAD], [CLS], [MASK]
        self.hide_end_padding = hide_end_padding  # a visible [SEP] after a [SEP] is no key (maths/end_padding.py)
        self.sep_id = sep_id
        self.time_embed = TimeEmbedding(bert.config.hidden_size, T) if time != "none" else None

    @property
    def config(self) -> BertConfig:
        return self.bert.config

    @property
    def max_length(self) -> int:
        """Longest content length this model can read: positions minus [CLS], [SEP], time token."""
        return self.config.max_position_embeddings - 2 - (self.time == "prefix")

    def time_state_dict(self) -> dict:
        return {} if self.time_embed is None else {f"time_embed.{k}": v for k, v in self.time_embed.state_dict().items()}

    def hidden(self, ids: torch.Tensor, attention: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states (B, N, H) of the encoder for ids (B, N)."""
        if self.hide_end_padding:
            attention = attention & ~hidden_keys(ids, self.sep_id).to(attention.device)
        if self.time_embed is None:  # time "none" (__init__ makes no embedding for it)
            return self.bert(ids, attention)
        if t is None:
            raise ValueError(f"a model with time conditioning {self.time!r} needs t")
        temb = self.time_embed(t.to(ids.device))  # (B, H)
        if self.time == "prefix":
            h = self.bert(ids, attention, time_token=temb)
            return torch.cat([h[:, :1], h[:, 2:]], dim=1)  # drop the time token's output
        return self.bert(ids, attention, layer_time=temb.unsqueeze(1))

    def forward(self, ids, attention, select: torch.Tensor, t: torch.Tensor | None = None,
                cache: PrefixCache | DecidedCache | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (M, V) at the M positions where select (B, N) is True, in row-major order.

        Forbidden ids get -inf, so p(x_0 | x_t) never puts mass on special tokens. cache: the
        keys and values kept between calls, an approximation (see there), used by time-agnostic
        models: a PrefixCache (select then False in the prefix) or a DecidedCache holding the
        batch's rows `rows` (B,) (None: rows 0..B-1). The end padding stays hidden from either.
        """
        if cache is not None and self.time == "none":
            if self.hide_end_padding:
                attention = attention & ~hidden_keys(ids, self.sep_id).to(attention.device)
            h = cache.hidden(self.bert, ids, attention, select, rows, self.mask_id)
        else:
            h = self.hidden(ids, attention, t)[select]
        forbidden = torch.tensor(self.forbidden, device=h.device) if self.forbidden else None
        return self.bert.logits(h, forbidden)


def forward_flops(config, B: int, N: int, M: int, prefix: int = 0) -> float:
    """Multiply-add FLOPs (x2) of a BERT forward on (B, N) tokens projecting M positions; prefix:
    positions whose keys and values come from a PrefixCache (computed: the N - prefix after them)."""
    H, I, V, layers = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_hidden_layers
    Q = N - prefix
    per_layer = 2 * B * Q * (4 * H * H + 2 * H * I) + 2 * 2 * B * Q * N * H  # projections, FFN; QK^T and AV
    head = 2 * M * (H * H + H * V)  # transform + decoder
    return layers * per_layer + head


def count_parameters(module: nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
