"""Native-bf16 detection from /proc/cpuinfo text, and what "auto" precision picks."""

import pytest
import torch

from dbert_core.hardware import auto_dtype, cpu_flags, cpu_name, native_bf16

pytestmark = pytest.mark.native_bf16  # these tests read the real CPU flags

AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx avx2 fma\n"
BF16 = "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512bw\n"
AMX = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: avx2 avx512f amx_tile amx_bf16\n"


def test_flags_and_name():
    assert cpu_name(BF16) == "AMD EPYC 9B14" and "avx512_bf16" in cpu_flags(BF16)
    assert cpu_flags("") == set()


def test_native_bf16_by_flags():
    assert not native_bf16("cpu", AVX2)
    assert native_bf16("cpu", BF16) and native_bf16("cpu", AMX)
    assert not native_bf16("cpu", "")  # no cpuinfo (macOS, Windows): fp32


def test_auto_dtype_matches_this_machine():
    assert auto_dtype("cpu") == (torch.bfloat16 if native_bf16("cpu") else torch.float32)
