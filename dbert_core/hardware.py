"""What this machine computes with and how fast: the device a run uses, the CPU's name, and
whether it does bfloat16 natively.

bf16 halves memory traffic and, on CPUs with bf16 dot-product instructions (x86 AVX512-BF16 or
AMX), doubles the matmul peak; elsewhere torch emulates it and it is several times slower than
fp32. So "auto" precision means bf16 autocast on CUDA GPUs that support it and on CPUs whose
flags say native bf16, and fp32 everywhere else. That rule is `compute_dtype`, written once:
training, sampling and the bench all ask it. `pick_device` turns --device into a torch device.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from .errors import DbertError

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo names of native bf16 on x86


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_name(cpuinfo: str | None = None) -> str:
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The x86 feature flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16(device: torch.device | str = "cpu", cpuinfo: str | None = None) -> bool:
    """True where bf16 matmuls run on native instructions (not emulated)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(cpu_flags(cpuinfo) & set(BF16_FLAGS))
    return False


def compute_dtype(dtype: str, device: torch.device | str = "cpu") -> str:
    """The precision a run computes in: "bf16" or "fp32" as asked, and for "auto" bf16 where it
    is native on `device` (native_bf16), else fp32. The one "auto" rule of dbert."""
    if dtype != "auto":
        return dtype
    return "bf16" if native_bf16(device) else "fp32"


def auto_dtype(device: torch.device | str = "cpu") -> torch.dtype:
    """The torch dtype "auto" picks on device (compute_dtype's rule)."""
    return torch.bfloat16 if compute_dtype("auto", device) == "bf16" else torch.float32


def _mps() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def pick_device(name: str) -> torch.device:
    """The torch device for --device NAME: auto takes CUDA, then MPS, then the CPU; a named one
    that is not available is one DbertError."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DbertError("cuda was asked for but no CUDA GPU is available", "device", "cuda")
    if name == "mps" and not _mps():
        raise DbertError("mps was asked for but Apple's MPS backend is not available", "device", "mps")
    if name not in ("cpu", "cuda", "mps"):
        raise DbertError(f"unknown device {name!r}; choose auto, cpu, cuda or mps")
    return torch.device(name)


# ---------------------------------------------------------------------------------- memory
def free_memory(device) -> int | None:
    """Bytes a run may still allocate on `device`: CUDA's free memory, else the kernel's
    MemAvailable plus free swap (Linux); None where that cannot be known."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return (int(fields["MemAvailable"].split()[0]) + int(fields.get("SwapFree", "0 kB").split()[0])) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(needed: float, device, what: str, lower: str, setting: str | None = None,
                 refs: tuple[str, ...] = ()) -> None:
    """Refuse, before allocating, work whose tensors alone need more memory than `device` has
    free: one DbertError saying how much and what to lower (an estimate from the shapes, a floor:
    the allocator's own overhead comes on top). On Linux a CPU allocation past free memory is
    not refused by malloc but ends in the kernel's OOM killer, with no message at all. `what`
    and `lower` name settings as DbertError does: `setting` leads, others are `$name` in `refs`."""
    free = free_memory(device)
    if free is not None and needed > free:
        raise DbertError(f"{what} needs about {_gib(needed)} of memory, but only {_gib(free)} is free "
                         f"on {torch.device(device).type}; lower {lower}", setting, refs=tuple(refs) + ((setting,) if setting else ()))


def _gib(n: float) -> str:
    if n < 2**30:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n / 2**30:,.1f} GiB" if n < 2**50 else f"{n / 2**50:,.0f} PiB"


def is_out_of_memory(error: BaseException) -> bool:
    """An allocation that failed: MemoryError, torch's OutOfMemoryError (CUDA, MPS), or the CPU
    allocator's RuntimeError."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())
