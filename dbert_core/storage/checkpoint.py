"""Checkpoints: a Hugging Face model directory plus dbert's diffusion settings.

    ckpt/
      config.json, model.safetensors        BertForMaskedLM.from_pretrained(ckpt) reads these
      tokenizer.json, vocab.txt, ...        AutoTokenizer.from_pretrained(ckpt) reads these

dbert reads and writes these files itself (pretrained.py, tokenizer.py): loading a checkpoint
never imports transformers.
      dbert.json                            schedule, T, lambda, time conditioning, provenance
      dbert_tokens.safetensors              corpus token counts (the spindle schedule's table)
      dbert_time.safetensors                time-embedding weights (prefix/layerwise only)
      dbert_truecase.json                   each word's written form (truecase.py; optional)
      trainer_state/                        optimizer, RNG and data position (for --resume)

A save writes a complete new directory in a marked swap folder beside the old one and swaps
it in with two renames (temp_folders.py): a crash at any moment leaves either the old or the new
checkpoint, readers find the old one meanwhile, and the next writer finishes the swap. Nothing
is ever unpickled: tensors come from safetensors and the optimizer state is read with
torch.load(weights_only=True). `load` refuses what does not fit: dbert.json outside its schema
(schema.py), code (trust.py), missing, extra, misshapen, non-finite or non-float weights, a
tokenizer of another size than the model's vocabulary, and token counts that are not finite,
non-negative and one per token; and, when dbert.json records them (`sha256`, written by every
save since), weight files whose sha256 differs from the recorded one. A save that cannot be
written (a full disk) is one DbertError and leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import re

import torch

from ..disk import layout, temp_folders
from ..errors import DbertError
from ..disk.layout import META, STATE, TIME, TOKENS, TRUECASE, WORDS, inspect
from ..disk.layout import read_meta  # noqa: F401 - part of this module's API (tests, TUI)
from ..disk.modes import apply_umask
from ..disk.temp_folders import discard, readable, recover, temp_dir
from ..maths.model import DiffusionBert, count_parameters
from ..maths.schedule import Schedule, make_schedule
from ..disk.schema import FORMAT, check_with_model

if TYPE_CHECKING:  # loaded with the checkpoint (tokenizer.py): this module never imports transformers
    from transformers import PreTrainedTokenizerBase



@dataclass
class DBert:
    """A loaded diffusion LM: everything sampling and evaluation need."""

    model: DiffusionBert
    tokenizer: PreTrainedTokenizerBase
    schedule: Schedule
    counts: torch.Tensor
    meta: dict = field(default_factory=dict)
    path: Path | None = None
    truecase: dict | None = None  # {uncased word: written form}; None: sentence capitals and "I" only
    words: frozenset | None = None  # the training text's words (lexicon.py); None: no made-up-word check

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def decode(self, ids, *, cased: bool = True, paragraph: str | None = None,
               verbatim: dict[int, str] | None = None) -> str:
        """Token ids -> one line of text as a reader sees it (detok.detokenize: word pieces joined,
        punctuation, quotes and contractions closed up; cased: words as the training text wrote
        them, with this checkpoint's truecasing table); inner [SEP]s (story starts) become
        `paragraph` (default detok.STORY_BREAK), a masked position reads [MASK]; verbatim:
        {position: text} shown as given (a prompt's own words). The TUI lays out its token
        views with the same function."""
        from ..text.detok import STORY_BREAK, detokenize, special_names

        names = special_names(self.tokenizer)
        return detokenize(self.tokenizer.convert_ids_to_tokens([int(i) for i in ids]),
                          paragraph=STORY_BREAK if paragraph is None else paragraph, placeholder=names["mask"],
                          cased=cased, truecase=self.truecase, verbatim=verbatim, **names)


def special_forbidden(tokenizer) -> tuple[int, ...]:
    """Ids the denoiser may never predict for a content position."""
    return tuple(sorted({tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.mask_token_id}))


def assemble(bert, tokenizer, schedule_name: str, T: int, counts: torch.Tensor, lam: float = 0.3,
             time: str = "none", meta: dict | None = None) -> DBert:
    """A DBert from its parts (used by training and by load)."""
    schedule = make_schedule(schedule_name, T, counts, lam)
    model = DiffusionBert(bert, time=time, T=T, mask_id=tokenizer.mask_token_id,
                          forbidden=special_forbidden(tokenizer), sep_id=tokenizer.sep_token_id,
                          hide_end_padding=(meta or {}).get("end_padding") == "hidden")
    meta = dict(meta or {})
    meta.update(schedule.config(), time=time, schedule=schedule_name, T=T, format=FORMAT)
    meta.setdefault("lambda", lam)
    return DBert(model, tokenizer, schedule, counts.to(torch.long), meta)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save(db: DBert, path, trainer_state: dict | None = None, dtype: torch.dtype | None = None,
         extra_files: dict[str, str] | None = None) -> Path:
    """Write db (and optionally trainer state) to path atomically; returns the path written.
    db itself is left as it was (load the returned path to see what was written). dbert.json
    records the sha256 of each weight file (DIGESTS), which load checks.

    A failure to write (a full disk, a read-only folder) is one DbertError, and the previous
    checkpoint at path, if any, is left byte for byte as it was: nothing is written into it,
    and it is renamed aside only once the new one is complete.

    trainer_state: {"optimizer": state_dict, "rng": {name: tensor}, "state": json-able dict}.
    dtype: store the weights in this dtype (e.g. float16 for shipping).
    """
    path = Path(path).absolute()
    try:
        return _save(db, path, trainer_state, dtype, extra_files)
    except OSError as e:
        kept = "the previous checkpoint there is kept as it was" if temp_folders.exists(path) else "nothing was saved"
        raise DbertError(f"cannot save the checkpoint {path}: {e.strerror or e}; {kept}") from None


DIGESTS = "sha256"  # dbert.json: {weight file: its sha256}, written by save, checked by load
WEIGHT_FILES = (layout.WEIGHTS, TOKENS, TIME)


def _save(db: DBert, path: Path, trainer_state, dtype, extra_files) -> Path:
    from . import pretrained

    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    if path.is_dir() and any(path.iterdir()) and not (path / META).is_file():
        raise DbertError(f"refusing to replace {path}: it holds files but is not a dbert checkpoint")
    swap = temp_dir(path, "swap")
    new, old = swap / "new", swap / "old"
    try:
        new.mkdir()
        digests = {layout.WEIGHTS: pretrained.save(db.model.bert, new, dtype)}
        db.tokenizer.save_pretrained(new)
        digests[TOKENS] = pretrained.write_tensors({"counts": db.counts.cpu().contiguous()}, new / TOKENS)
        if db.truecase is not None:
            from ..text.truecase import to_json

            (new / TRUECASE).write_text(json.dumps(to_json(db.truecase), ensure_ascii=False, indent=0) + "\n",
                                        encoding="utf-8")
        if db.words is not None:
            from ..text.lexicon import to_json as words_json

            (new / WORDS).write_text(json.dumps(words_json(db.words), ensure_ascii=False, indent=0) + "\n",
                                     encoding="utf-8")
        tsd = db.model.time_state_dict()
        if tsd:
            digests[TIME] = pretrained.write_tensors({k: v.detach().cpu().contiguous() for k, v in tsd.items()},
                                                     new / TIME)
        meta = dict(db.meta)
        meta.setdefault("created", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        meta["saved"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        meta["parameters"] = count_parameters(db.model)
        meta[DIGESTS] = digests
        (new / META).write_text(json.dumps(meta, indent=2) + "\n")
        for name, text in (extra_files or {}).items():
            (new / name).write_text(text)
        if trainer_state is not None:
            sdir = new / STATE
            sdir.mkdir()
            pretrained.write_torch(trainer_state["optimizer"], sdir / layout.OPTIMIZER)
            pretrained.write_torch(trainer_state["rng"], sdir / layout.RNG)
            (sdir / layout.STATE_JSON).write_text(json.dumps(trainer_state["state"], indent=2) + "\n")
        apply_umask(new)  # every file gets the umask's mode
        _fsync_tree(new)
        if path.exists():
            os.rename(path, old)
        try:
            os.rename(new, path)
        except BaseException:
            if old.is_dir() and not path.exists():
                os.rename(old, path)  # put the previous checkpoint back
            raise
        _fsync_dir(path.parent)
    finally:
        if path.exists() or not old.exists():  # never delete the only copy of the previous checkpoint
            discard(swap)
    return path


def digest(file: Path) -> str:
    """sha256 of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _check_digests(source: Path, meta: dict, path: Path) -> None:
    """The weight files match the sha256 digests dbert.json records (a checkpoint saved without
    them, older or from the hub, has none to check); with digests, every weight file present
    must have one. One DbertError on a mismatch: the bytes changed after saving."""
    recorded = meta.get(DIGESTS)
    if recorded is None:
        return
    for name in WEIGHT_FILES:
        f = source / name
        if not f.is_file():
            continue  # a missing file is reported by whoever needs it
        if name not in recorded:
            raise DbertError(f"checkpoint {path}: {name} has no sha256 in {META}, which records the others; "
                             "it was added after saving")
        if digest(f) != recorded[name]:
            raise DbertError(f"checkpoint {path}: {name} does not match the sha256 recorded in {META} "
                             "(its bytes changed after saving: damaged or altered); refusing it")


def _check_files(path: Path) -> None:
    """Every safetensors file parses and is as long as its header says."""
    from safetensors import safe_open

    for name in (layout.WEIGHTS, TOKENS, TIME):
        f = path / name
        if not f.is_file():
            continue
        try:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    st.get_slice(key)
            size = f.stat().st_size
            with open(f, "rb") as fh:
                header = int.from_bytes(fh.read(8), "little")
            if header + 8 > size:
                raise ValueError("truncated")
        except Exception as e:  # noqa: BLE001 - any parse failure means a corrupt file
            raise DbertError(f"checkpoint {path}: {name} is corrupt ({str(e).splitlines()[0][:80]})") from None


def load(path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> DBert:
    """Load a checkpoint directory for sampling/evaluation (weights in dtype, float32 by default)."""
    from safetensors.torch import load_file

    from . import pretrained
    from ..text.tokenizer import WordPieceTokenizer

    path = Path(path)
    source = readable(path)
    meta = inspect(source)
    _check_files(source)
    try:
        bert = pretrained.load(source, dtype=dtype or torch.float32)
        tokenizer = WordPieceTokenizer.load(source)
        tables = load_file(str(source / TOKENS))
    except DbertError:
        raise
    except Exception as e:  # noqa: BLE001
        raise DbertError(f"checkpoint {path} cannot be loaded: {str(e).splitlines()[0][:120]}") from None
    vocab = bert.config.vocab_size
    if len(tokenizer) != vocab:
        raise DbertError(f"checkpoint {path}: the tokenizer has {len(tokenizer)} tokens but the model's vocabulary "
                         f"has {vocab} (config.json vocab_size); they must match")
    counts = _counts(tables, vocab, path)
    try:
        db = assemble(bert, tokenizer, meta["schedule"], meta["T"], counts, meta.get("lambda", 0.3),
                      meta.get("time", "none"), meta)
    except ValueError as e:
        raise DbertError(f"checkpoint {path}: {e}") from None
    _load_time(db, source, path, dtype or torch.float32)
    check_with_model(meta, db.model.max_length, db.model.config.vocab_size, path)
    db.truecase = _load_truecase(source, path)
    db.words = _load_words(source, path)
    _check_digests(source, meta, path)  # last: what is wrong with the tensors themselves is said first
    db.path = path
    db.model.to(device).eval()
    return db


def _counts(tables: dict, vocab: int, path: Path) -> torch.Tensor:
    """The spindle schedule's token counts: one finite, non-negative whole number per token."""
    if set(tables) != {"counts"}:
        raise DbertError(f"checkpoint {path}: {TOKENS} must hold exactly one tensor 'counts', "
                         f"not {', '.join(sorted(tables)) or 'none'}")
    counts = tables["counts"]
    if counts.dim() != 1 or counts.numel() != vocab:
        raise DbertError(f"checkpoint {path}: the token counts have shape {tuple(counts.shape)}; "
                         f"the model's vocabulary needs ({vocab},)")
    if counts.dtype == torch.bool or counts.is_complex():
        raise DbertError(f"checkpoint {path}: the token counts are {counts.dtype}, not numbers")
    if counts.is_floating_point():
        if not torch.isfinite(counts).all():
            raise DbertError(f"checkpoint {path}: the token counts hold NaN or infinite values")
        if not torch.equal(counts, counts.round()) or counts.abs().max() > 2**62:
            raise DbertError(f"checkpoint {path}: the token counts are not whole numbers")
    if (counts < 0).any():
        raise DbertError(f"checkpoint {path}: the token counts hold negative values")
    return counts.to(torch.long)


def _load_time(db: DBert, source: Path, path: Path, dtype: torch.dtype) -> None:
    """The time-embedding weights: present exactly when dbert.json says the model uses time."""
    from safetensors.torch import load_file

    from .pretrained import check_values

    if db.model.time_embed is None:
        if (source / TIME).exists():
            raise DbertError(f"checkpoint {path}: {TIME} is present but dbert.json says time 'none'")
        return
    if not (source / TIME).is_file():
        raise DbertError(f"checkpoint {path} is missing {TIME}")
    tsd = {k.removeprefix("time_embed."): v for k, v in load_file(str(source / TIME)).items()}
    check_values(tsd, f"checkpoint {path}: {TIME}")
    try:
        db.model.time_embed.load_state_dict(tsd)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:160]
        raise DbertError(f"checkpoint {path}: {TIME} does not fit the model ({detail})") from None
    db.model.time_embed.to(dtype)


def _load_truecase(source: Path, path: Path) -> dict | None:
    """The truecasing table, if the checkpoint has one: read as every JSON file of a checkpoint is
    (jsonfile: at most 4 MiB, 64 deep), and every entry a casing of its word with nothing a
    terminal would act on (display.is_safe), since its forms are printed in every sample."""
    from ..display import is_safe
    from ..disk.jsonfile import read_json
    from ..text.truecase import from_json

    file = source / TRUECASE
    if not file.exists():
        return None
    what = f"checkpoint {path}: {TRUECASE}"
    data = read_json(file, what)
    try:
        table = from_json(data)
    except ValueError as e:
        raise DbertError(f"{what} is not valid ({str(e).splitlines()[0][:100]})") from None
    bad = next((k for k, v in table.items() if not (isinstance(k, str) and is_safe(k) and is_safe(v))), None)
    if bad is not None:
        raise DbertError(f"{what} is not valid (the entry {bad[:40]!r} holds control characters)")
    return table


MAX_STEP = 10**12  # optimizer steps a trainer state may record


def _whole(value, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _check_state(s, where: str) -> dict:
    """trainer_state/state.json: the data position and counters, each of its type and range."""
    if not isinstance(s, dict):
        raise DbertError(f"{where} must hold a JSON object")
    step = s.get("step")

    def need(name: str, ok: bool, what: str) -> None:
        if not ok:
            shown = repr(s.get(name))
            raise DbertError(f"{where}: field {name!r} is {shown[:40]}; it must be {what}")

    need("step", _whole(step, 0, MAX_STEP), f"a whole number in [0, {MAX_STEP}]")
    assert isinstance(step, int)  # need refused anything else
    for name in ("epoch", "batch_in_epoch"):
        need(name, _whole(s.get(name), 0, step), f"a whole number in [0, step {step}]")
    need("tokens_seen", _whole(s.get("tokens_seen", 0), 0, 2**62), "a whole number >= 0")
    elapsed = s.get("elapsed", 0.0)
    need("elapsed", isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) and
         math.isfinite(elapsed) and elapsed >= 0, "a finite number of seconds >= 0")
    history = s.get("history", [])
    need("history", isinstance(history, list) and all(
        isinstance(h, dict) and all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                                    for k, v in h.items()) for h in history),
         "a list of objects of numbers")
    return s


def _check_rng(rng, where: str) -> dict:
    """trainer_state/rng.pt: {rankN: {noise, torch[, cuda]}}, each a generator state (uint8, 1-D)."""
    size = torch.get_rng_state().numel()
    if not isinstance(rng, dict) or not rng or not all(isinstance(k, str) and k.startswith("rank") for k in rng):
        raise DbertError(f"{where} must map rank0, rank1, ... to random-number states")
    for rank, states in rng.items():
        if not isinstance(states, dict) or not {"noise", "torch"} <= set(states):
            raise DbertError(f"{where}: {rank[:20]} lacks its 'noise' and 'torch' states")
        for name, t in states.items():
            ok = isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1
            if name in ("noise", "torch"):
                ok = ok and t.numel() == size
            if not ok:
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise DbertError(f"{where}: the {rank[:20]} {str(name)[:20]!r} state is {got}, not a random-number "
                                 "generator's state")
    return rng


def _check_optimizer_file(opt, where: str) -> dict:
    """trainer_state/optimizer.pt's outline: {state: {id: {...}}, param_groups: [{params: [id, ...]}]}
    (Trainer checks it against the model itself)."""
    groups = opt.get("param_groups") if isinstance(opt, dict) else None
    if not (isinstance(groups, list) and groups and isinstance(opt.get("state"), dict) and all(
            isinstance(g, dict) and isinstance(g.get("params"), list) and all(_whole(i, 0, 2**31) for i in g["params"])
            for g in groups)):
        raise DbertError(f"{where} is not an optimizer state (state and param_groups)")
    return opt


def load_trainer_state(path) -> dict | None:
    """The optimizer/RNG/data-position state saved beside the weights, or None. Every field is
    checked for its type and range here (one DbertError line naming it); Trainer checks the
    optimizer's tensors against the model."""
    from ..disk.jsonfile import read_json

    sdir = readable(Path(path)) / STATE
    if not (sdir / layout.STATE_JSON).is_file():
        return None

    def pt(name: str):
        import pickle
        import warnings

        try:
            with warnings.catch_warnings():  # torch's warnings about pickle protocols: never lines around ours
                warnings.simplefilter("ignore")
                return torch.load(sdir / name, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:  # weights_only refused an object: a pickle, never run
            found = re.search(r"GLOBAL\s+([\w.]+)", str(e))
            what = f" ({found.group(1)[:80]})" if found else ""
            raise DbertError(f"{sdir}/{name} holds Python objects that are not tensors{what}: a pickle, which dbert "
                             "never runs; this trainer state is not dbert's (resume from another checkpoint, or "
                             "train afresh)") from None
        except Exception as e:  # noqa: BLE001 - a corrupt or missing file
            text = " ".join(str(e).split())[:120] if str(e).strip() else type(e).__name__
            raise DbertError(f"{sdir}/{name} cannot be read: {text}") from None

    state = read_json(sdir / layout.STATE_JSON, f"{sdir}/state.json", max_bytes=64 << 20)
    return {"state": _check_state(state, f"{sdir}/state.json"),
            "rng": _check_rng(pt(layout.RNG), f"{sdir}/rng.pt"),
            "optimizer": _check_optimizer_file(pt(layout.OPTIMIZER), f"{sdir}/optimizer.pt")}


def _load_words(source: Path, path: Path) -> frozenset | None:
    """The word list (lexicon.py), if the checkpoint has one: read under jsonfile's limits, only looked up."""
    from ..disk.jsonfile import read_json
    from ..text.lexicon import from_json

    file = source / WORDS
    if not file.exists():
        return None
    what = f"checkpoint {path}: {WORDS}"
    try:
        return from_json(read_json(file, what))
    except ValueError as e:
        raise DbertError(f"{what} is not valid ({str(e).splitlines()[0][:100]})") from None
