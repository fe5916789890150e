"""transformers' BERT checkpoint format for model.Bert: config.json + model.safetensors.

Saved tensors carry exactly BertForMaskedLM's names (query/key/value apart, the decoder tied
to the word embeddings and so not written), so `BertForMaskedLM.from_pretrained(dir)` loads a
dbert checkpoint with nothing missing or unexpected. Loading accepts BertForMaskedLM and
BertModel checkpoints (keys with or without `bert.`; the pooler and an NSP head are ignored;
a missing MLM head is initialised), from safetensors or from pytorch_model.bin read with
torch.load(weights_only=True): nothing is ever unpickled. A folder asking for custom code
(`auto_map`, trust.py) is refused, and so is any weight that is not a finite floating-point tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..disk import layout
from ..errors import DbertError
from ..maths.model import PRESETS, Bert, BertConfig, MLMHead

IGNORED = ("pooler.", "cls.seq_relationship.", "embeddings.position_ids", "embeddings.token_type_ids",
           "cls.predictions.decoder.")  # the decoder is the word embeddings (tied), its bias cls.predictions.bias
HEAD = "cls.predictions."
HUB_FILES = [layout.CONFIG, "*.safetensors", layout.TOKENIZER, layout.TOKENIZER_CONFIG, layout.VOCAB,
             layout.SPECIAL_TOKENS]
_LAYER = {"attn_out": "attention.output.dense", "attn_ln": "attention.output.LayerNorm",
          "ffn_in": "intermediate.dense", "ffn_out": "output.dense", "ffn_ln": "output.LayerNorm"}
_HEAD = {"head.dense": "cls.predictions.transform.dense", "head.LayerNorm": "cls.predictions.transform.LayerNorm"}


def hf_names(name: str) -> list[str]:
    """transformers' name(s) of one of Bert's tensors, without the `bert.` prefix (qkv is three)."""
    if name.startswith("embeddings."):
        return [name]
    if name == "head.bias":
        return ["cls.predictions.bias"]
    module, param = name.rsplit(".", 1)
    if module in _HEAD:
        return [f"{_HEAD[module]}.{param}"]
    _, i, part = module.split(".")  # layers.{i}.{part}
    prefix = f"encoder.layer.{i}."
    if part == "qkv":
        return [f"{prefix}attention.self.{w}.{param}" for w in ("query", "key", "value")]
    return [prefix + _LAYER[part] + "." + param]


def _canonical(key: str) -> str:
    """A checkpoint key as hf_names spells it: no `bert.` prefix, LayerNorm gamma/beta renamed."""
    key = key.removeprefix("bert.")
    if key.endswith(".gamma") or key.endswith(".beta"):
        key = key.rsplit(".", 1)[0] + (".weight" if key.endswith(".gamma") else ".bias")
    return key


def hf_state_dict(bert: Bert, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Bert's weights under BertForMaskedLM's names, as BertForMaskedLM.save_pretrained writes them."""
    out = {}
    for name, tensor in bert.state_dict().items():
        names = hf_names(name)
        tensor = tensor.detach().to(dtype or tensor.dtype)
        for hf, part in zip(names, tensor.chunk(len(names))):
            out[hf if hf.startswith(HEAD) else "bert." + hf] = part.clone() if len(names) > 1 else part  # own storage
    return out


def load_state(bert: Bert, tensors: dict[str, torch.Tensor], source: str, dtype: torch.dtype) -> None:
    """Put a checkpoint's tensors (transformers' names) into bert as its parameters, in dtype;
    initialise an absent MLM head. bert may live on the meta device: every parameter is replaced.

    A missing encoder tensor, a partial MLM head, a tensor of the wrong shape or one this BERT
    has no place for is an error that names the tensors.
    """
    tensors = {_canonical(k): v for k, v in tensors.items()}
    if HEAD + "bias" not in tensors and HEAD + "decoder.bias" in tensors:  # older files keep the bias there
        tensors[HEAD + "bias"] = tensors[HEAD + "decoder.bias"]
    params = dict(bert.named_parameters())
    wanted = {name: hf_names(name) for name in params}
    known = {hf for names in wanted.values() for hf in names}
    unexpected = sorted(k for k in tensors if k not in known and not k.startswith(IGNORED))
    missing = sorted(hf for hf in known if hf not in tensors)
    head = sorted(hf for hf in known if hf.startswith(HEAD))
    if unexpected:
        raise DbertError(f"{source}: unexpected tensors {_few(unexpected)} (does config.json match the weights?)")
    if missing and missing != head:  # only the whole MLM head may be absent (a BertModel checkpoint)
        raise DbertError(f"{source}: missing tensors {_few(missing)}")
    state = {}
    for name, names in wanted.items():
        if names[0] not in tensors:
            continue
        expected = (params[name].shape[0] // len(names), *params[name].shape[1:])
        for hf in names:
            if tuple(tensors[hf].shape) != expected:
                raise DbertError(f"{source}: {hf} has shape {tuple(tensors[hf].shape)}, config.json implies {expected}")
        check_values({hf: tensors[hf] for hf in names}, source)
        state[name] = (tensors[names[0]] if len(names) == 1 else torch.cat([tensors[hf] for hf in names])).to(dtype)
    if missing:
        bert.head = MLMHead(bert.config)
        bert.init_weights(bert.head.modules())
        bert.head.to(dtype)
        state.update({f"head.{k}": v for k, v in bert.head.state_dict().items()})
        bert.fresh_head = True
    bert.load_state_dict(state, assign=True)  # the tensors themselves: no copy


def check_values(tensors: dict[str, torch.Tensor], source: str) -> None:
    """Weights must be floating-point and finite: an integer tensor would be converted silently,
    and one NaN turns every output into NaN."""
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise DbertError(f"{source}: tensor {name} is {str(tensor.dtype).removeprefix('torch.')}, not floating point")
        if not torch.isfinite(tensor).all():
            nan = int(torch.isnan(tensor).sum())
            what = f"{nan:,} NaN value{'s' if nan > 1 else ''}" if nan else "infinite values"
            raise DbertError(f"{source}: tensor {name} holds {what} (a diverged or damaged model: its outputs "
                             "would all be NaN); this checkpoint cannot be used")


def _few(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, else pytorch_model.bin through torch.load(weights_only=True)."""
    if (path / layout.WEIGHTS).is_file():
        from safetensors.torch import load_file

        return load_file(str(path / layout.WEIGHTS))
    if (path / "pytorch_model.bin").is_file():
        try:
            return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - an unpickling refusal or a corrupt file
            raise DbertError(f"{path}/pytorch_model.bin cannot be read safely: {str(e).splitlines()[0][:120]}") from None
    raise DbertError(f"{path} holds no model.safetensors or pytorch_model.bin")


def read_config(path: Path) -> BertConfig:
    """config.json of a BERT folder; refuses a folder whose configs ask for custom code."""
    from ..disk.layout import refuse_code

    from ..disk.jsonfile import read_json

    refuse_code(Path(path), files=False)
    try:
        data = read_json(Path(path) / layout.CONFIG, f"{path}/config.json")
    except FileNotFoundError:
        raise DbertError(f"{path} holds no config.json") from None
    if not isinstance(data, dict):
        raise DbertError(f"{path}/config.json is not a valid BERT config")
    try:
        return BertConfig.from_dict(data)
    except DbertError as e:
        raise DbertError(f"{path}/{e}" if str(e).startswith(layout.CONFIG) else f"{path}: {e}") from None
    except (TypeError, AttributeError):
        raise DbertError(f"{path}/config.json is not a valid BERT config") from None


def load(path, dtype: torch.dtype = torch.float32, require_head: bool = True) -> Bert:
    """A Bert from a directory in transformers' format, its weights in dtype, in eval mode.

    require_head=False: a checkpoint without MLM head (a BertModel) gets a fresh one (bert.fresh_head).
    """
    path = Path(path)
    config = read_config(path)
    tensors = read_tensors(path)
    with torch.device("meta"):  # no memory and no init: load_state puts the checkpoint's tensors in
        bert = Bert(config, init=False)
    load_state(bert, tensors, str(path), dtype)
    if require_head and bert.fresh_head:
        raise DbertError(f"{path}: model.safetensors has no MLM head (cls.predictions.*)")
    return bert.eval()  # as from_pretrained: evaluation mode until training asks otherwise


def save(bert: Bert, path, dtype: torch.dtype | None = None) -> str:
    """Write config.json and model.safetensors into the directory path (weights in dtype);
    returns the weights file's sha256."""
    path = Path(path)
    tensors = hf_state_dict(bert, dtype)
    stored = dtype or next(iter(tensors.values())).dtype
    (path / layout.CONFIG).write_text(json.dumps(bert.config.to_dict(stored), indent=2) + "\n")
    return write_tensors(tensors, path / layout.WEIGHTS)


def write_tensors(tensors: dict, file: Path) -> str:
    """A safetensors file written with Python's own I/O, so a full disk is an OSError (ENOSPC),
    not a SafetensorError; returns the sha256 of its bytes (recorded in dbert.json)."""
    import hashlib

    from safetensors.torch import save

    data = save(tensors, metadata={"format": "pt"})
    with open(file, "wb") as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


class _Recording:
    """A file for torch.save that keeps the OSError of a failed write: torch reports a full
    disk only as "unexpected pos" (a RuntimeError)."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def write_torch(obj, file: Path) -> None:
    """torch.save into a file, a full disk an OSError (ENOSPC), not torch's "unexpected pos"."""
    with open(file, "wb") as f:
        out = _Recording(f)
        try:
            torch.save(obj, out)
        except RuntimeError:
            if out.error is not None:
                raise out.error from None
            raise


def local_dir(init: str) -> Path:
    """A directory holding the pretrained BERT named by --init: the path itself or a hub snapshot."""
    path = Path(init).expanduser()
    if path.is_dir():
        return path
    if path.exists() or init.startswith((".", "/", "~")) or init.count("/") > 1:
        raise DbertError(f"no such directory: {init}")
    from huggingface_hub import snapshot_download

    from .net import configure_hub, deadline

    configure_hub()
    try:
        with deadline():  # within DBERT_FETCH_DEADLINE seconds in all
            got = Path(snapshot_download(init, allow_patterns=HUB_FILES))
            if not list(got.glob("*.safetensors")):  # an older repo: pickled weights, read with weights_only
                got = Path(snapshot_download(init, allow_patterns=HUB_FILES + ["pytorch_model.bin"]))
    except Exception as e:  # noqa: BLE001 - offline, no such repo, network errors: one line for the user
        raise DbertError(_hub_failure(init, e)) from None
    return got


def _hub_failure(init: str, error: Exception) -> str:
    text = str(error).splitlines()[0][:160] if str(error).strip() else type(error).__name__
    names = " ".join(type(c).__name__ for c in (error, error.__cause__, error.__context__) if c is not None)
    unreachable = any(w in names + text for w in ("ConnectError", "ConnectionError", "ConnectTimeout", "Timeout",
                                                   "Name or service not known", "LocalEntryNotFound",
                                                   "OfflineModeIsEnabled", "offline", "Network is unreachable"))
    if unreachable:
        return (f"the Hugging Face Hub is not reachable, so --init {init} (a hub id) cannot be downloaded; "
                f"download it where there is a network (e.g. `hf download {init} --local-dir ./{init.split('/')[-1]}`) "
                f"and pass the folder: --init ./{init.split('/')[-1]}")
    if any(w in names + text for w in ("RepositoryNotFound", "404")):
        return f"--init {init}: no such model on the Hugging Face Hub (a local folder needs ./ or a path)"
    return f"--init {init}: the download failed ({text})"


def build_bert(preset: str | None = None, init: str | None = None, vocab_size: int | None = None,
               special_ids: dict | None = None, dtype: torch.dtype | None = None,
               from_scratch: bool = False) -> Bert:
    """A Bert from a preset's sizes (random init) or a pretrained path/hub id.

    from_scratch=True with init: the pretrained model's architecture, freshly initialised.
    """
    if init is not None:
        try:
            path = local_dir(init)
            if from_scratch:
                return Bert(read_config(path))
            return load(path, dtype=dtype or torch.float32, require_head=False)
        except DbertError as e:
            what = "BERT config" if from_scratch else "BERT"
            raise DbertError(f"cannot load a {what} from --init {init}: {e}") from None
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    sizes = dict(PRESETS[preset])
    if vocab_size is not None:
        sizes["vocab_size"] = vocab_size
    return Bert(BertConfig(**sizes, **(special_ids or {})))


def _transformers_order(layers: int) -> list[str]:
    """BertForMaskedLM's parameters in its parameters() order (tied decoder left out)."""
    names = [f"embeddings.{m}.weight" for m in ("word_embeddings", "position_embeddings", "token_type_embeddings")]
    names += ["embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
    parts = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
             "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")
    names += [f"encoder.layer.{i}.{m}.{p}" for i in range(layers) for m in parts for p in ("weight", "bias")]
    return names + ["cls.predictions.bias"] + [f"cls.predictions.transform.{m}.{p}" for m in ("dense", "LayerNorm")
                                                for p in ("weight", "bias")]


def _is_matrix(name: str) -> bool:
    return name.endswith(".weight") and "LayerNorm" not in name


def upgrade_optimizer_state(state: dict, model) -> dict:
    """An optimizer state_dict saved before dbert had its own BERT, for this model (a DiffusionBert).

    Trainer groups the parameters into matrices (weight decay) and the rest, in parameters()
    order; the old model had transformers' order and separate query/key/value, whose Adam
    moments are stacked here as the fused qkv stacks the weights. A current state is returned
    as it is.
    """
    params = dict(model.named_parameters())
    groups = [[n for n, p in params.items() if p.dim() >= 2], [n for n, p in params.items() if p.dim() < 2]]
    sizes = [len(g["params"]) for g in state["param_groups"]]
    if sizes == [len(g) for g in groups]:
        return state
    time = [n for n in params if n.startswith("time_embed.")]
    old = _transformers_order(model.config.num_hidden_layers) + time
    old = [n for n in old if _is_matrix(n)] + [n for n in old if not _is_matrix(n)]
    if sizes != [sum(map(_is_matrix, old)), len(old) - sum(map(_is_matrix, old))]:
        raise DbertError("the saved optimizer state does not fit this model; start a new run with --init instead")
    index = {n: i for i, n in enumerate(old)}
    moments = {}
    for i, name in enumerate(groups[0] + groups[1]):
        olds = [index[name]] if name in time else [index[hf] for hf in hf_names(name.removeprefix("bert."))]
        entries = [state["state"][j] for j in olds if j in state["state"]]
        if entries:
            moments[i] = {k: torch.cat([e[k] for e in entries]) if k.startswith("exp_avg") else entries[0][k]
                          for k in entries[0]}
    first = len(groups[0])
    param_groups = [{**state["param_groups"][0], "params": list(range(first))},
                    {**state["param_groups"][1], "params": list(range(first, first + len(groups[1])))}]
    return {"state": moments, "param_groups": param_groups}
