"""Generative perplexity: samples scored under a causal language model (the "judge").

The convention of MDLM, SEDD and ReMDM: re-tokenise each text with the judge's own tokenizer,
score it under the judge (GPT-2 large in those papers) from its beginning-of-text token, and
report exp(total negative log-likelihood / total judge tokens). A low gen-PPL alone can be
gamed (a sampler that repeats "the the the" scores well), so the samples' entropy is reported
beside it: each text's unigram entropy over the judge's tokens, averaged over texts (ReMDM's
figure), and the same two figures for held-out human text of about the samples' length.

The judge is any Hugging Face causal LM: a local folder or a hub id. It is loaded from
safetensors only, with no remote code (trust.py's rules: a folder asking for custom code, or
carrying code files, is refused; pickled weights are never read).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import torch

from ..disk import layout
from ..errors import DbertError

HUB_FILES = [layout.CONFIG, "generation_config.json", "*.safetensors", layout.TOKENIZER, layout.TOKENIZER_CONFIG,
             "vocab.json", "merges.txt", layout.VOCAB, layout.SPECIAL_TOKENS]


def judge_dir(name: str) -> Path:
    """The folder of the judge `name`: the path itself, or a hub snapshot of its safe files."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise DbertError(f"names no such directory: {name}", "judge", name)
    from huggingface_hub import snapshot_download

    from ..storage.net import configure_hub

    configure_hub()
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except Exception as e:  # noqa: BLE001 - offline, no such repo, network errors: one line for the user
        raise DbertError(f"{name}: " + (str(e).splitlines()[0][:160] or type(e).__name__), "judge", name) from None


ENCODERS = ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert", "deberta", "deberta-v2",
            "camembert", "mpnet", "modernbert")  # model types that are masked LMs unless is_decoder says otherwise


def check_judge(name: str) -> Path:
    """The judge's folder, checked before any sampling: it exists (a hub id is downloaded now),
    carries no code, has safetensors weights, and its config.json describes a causal LM (an
    architecture `*ForCausalLM` or `*LMHeadModel`; a masked LM such as BERT scores every token
    seeing the ones after it, so its "perplexity" would mean nothing). One DbertError otherwise."""
    from ..disk.jsonfile import read_json
    from ..disk.layout import refuse_code

    if not name or not name.strip():
        raise DbertError("must name a causal LM (a folder or a hub id such as gpt2-large)", "judge", name)
    path = judge_dir(name)
    refuse_code(path)
    if not list(path.glob("*.safetensors")):
        raise DbertError(f"{name}: no .safetensors weights in {path} (pickled weights are never read)", "judge", name)
    config = read_json(path / layout.CONFIG) if (path / layout.CONFIG).is_file() else None
    if not isinstance(config, dict):
        raise DbertError(f"{name}: no readable {layout.CONFIG} in {path}", "judge", name)
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    kind = str(config.get("model_type", ""))
    causal = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs) if archs else kind not in ENCODERS
    if not causal or (kind in ENCODERS and config.get("is_decoder") is not True):
        what = ", ".join(archs) or kind or "unknown"
        raise DbertError(f"{name} is not a causal language model ({what}); gen-PPL needs one that "
                         "reads left to right, such as gpt2-large")
    return path


class Judge:
    """A causal LM and its tokenizer, ready to score texts."""

    def __init__(self, name: str, device: torch.device | str = "cpu"):
        path = check_judge(name)
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, trust_remote_code=False,
                                                              local_files_only=True)
        except DbertError:
            raise
        except Exception as e:  # noqa: BLE001 - a broken or foreign folder: one line, not a traceback
            raise DbertError(f"{name}: cannot load a causal LM from {path}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") from None
        self.name = name
        self.device = torch.device(device)
        self.model.to(self.device).eval()  # type: ignore[arg-type]  # transformers' stub of to() is the decorated one's
        tok = self.tokenizer
        config_bos = getattr(self.model.config, "bos_token_id", None)  # the model's own start token, where
        if not (isinstance(config_bos, int) and 0 <= config_bos < len(tok)):  # its tokenizer names none
            config_bos = None
        start = next((i for i in (tok.bos_token_id, config_bos, tok.eos_token_id, getattr(tok, "cls_token_id", None))
                      if i is not None), None)
        self.start = start  # scored from this token; without one the first token is not scored
        self.context = int(getattr(self.model.config, "n_positions", None) or
                           getattr(self.model.config, "max_position_embeddings", None) or 1024)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.inference_mode()
    def nll(self, texts: list[str], batch_size: int = 16) -> tuple[list[float], list[int], list[list[int]]]:
        """Per text: the summed negative log-likelihood in nats, the scored token count, the ids."""
        rows = []
        for text in texts:
            ids = self.encode(text)
            ids = ([self.start] if self.start is not None else []) + ids
            rows.append(ids[: self.context])
        nats, counts = [0.0] * len(rows), [0] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # similar lengths share a batch
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for lo in range(0, len(order), batch_size):
            idx = [i for i in order[lo: lo + batch_size] if len(rows[i]) > 1]
            if not idx:
                continue
            width = max(len(rows[i]) for i in idx)
            batch = torch.full((len(idx), width), pad, dtype=torch.long)  # not `ids`: a text's list above
            att = torch.zeros((len(idx), width), dtype=torch.long)
            for j, i in enumerate(idx):
                batch[j, : len(rows[i])] = torch.tensor(rows[i])
                att[j, : len(rows[i])] = 1
            logits = self.model(input_ids=batch.to(self.device), attention_mask=att.to(self.device)).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1)
            target = batch[:, 1:].to(self.device)
            got = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1) * att[:, 1:].to(self.device)
            for j, i in enumerate(idx):
                nats[i] = -float(got[j].sum())
                counts[i] = len(rows[i]) - 1
        return nats, counts, [r[1:] if self.start is not None else r for r in rows]

    def score(self, texts: list[str], batch_size: int = 16) -> dict:
        """gen-PPL of texts (exp of nats per judge token over all of them) with the standard error
        of its log, and their mean unigram entropy over the judge's tokens."""
        nats, counts, ids = self.nll(texts, batch_size)
        total = sum(counts)
        if total == 0:
            raise DbertError("the texts have no tokens to score")
        rate = sum(nats) / total
        n = len(texts)  # the ratio estimator's standard error (texts are the independent units)
        se = math.sqrt(n / max(n - 1, 1) * sum((a - rate * c) ** 2 for a, c in zip(nats, counts))) / total
        return {"gen_ppl": math.exp(rate), "log_gen_ppl_se": se, "judge_tokens_per_text": total / n,
                "entropy": sum(token_entropy(r) for r in ids) / n}


def token_entropy(ids: list[int]) -> float:
    """The entropy (nats) of one text's unigram distribution over its tokens."""
    if not ids:
        return 0.0
    counts = Counter(ids)
    n = len(ids)
    return -sum(c / n * math.log(c / n) for c in counts.values())


def human_chunks(examples: list[str], n: int, words: float) -> list[str]:
    """n pieces of held-out text of about `words` words each: consecutive examples joined, cut at
    that many words (the samples' mean length), so human text and samples are scored alike."""
    target = max(1, round(words))
    out, current = [], []
    for text in examples:
        current.extend(text.split())
        while len(current) >= target:
            out.append(" ".join(current[:target]))
            current = current[target:]
            if len(out) == n:
                return out
    if current and len(out) < n:
        out.append(" ".join(current))
    return out


def causal_batch(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows -> (ids, labels) for a causal LM's loss: padded with pad_id, labels -100 on the
    padding (the model shifts labels itself, so a row's first token is context, never a target)."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id)
    labels = torch.full((len(rows), width), -100)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        labels[i, :len(r)] = torch.tensor(r)
    return ids, labels
