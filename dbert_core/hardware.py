"""What this machine computes fast: the CPU's name and whether it does bfloat16 natively.

bf16 halves memory traffic and, on CPUs with bf16 dot-product instructions (x86 AVX512-BF16 or
AMX), doubles the matmul peak; elsewhere torch emulates it and it is several times slower than
fp32. So "auto" precision means bf16 autocast on CUDA GPUs that support it and on CPUs whose
flags say native bf16, and fp32 everywhere else.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

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


def auto_dtype(device: torch.device | str = "cpu") -> torch.dtype:
    """The compute dtype "auto" picks: bfloat16 where it is native, else float32."""
    return torch.bfloat16 if native_bf16(device) else torch.float32
