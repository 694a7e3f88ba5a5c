"""Whether the CPU computes bfloat16 / float16 natively, and the warning when it does not."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from mizuoto.runtime import device
from mizuoto.runtime.device import cpu_native_dtype, emulated_dtype_warning, native_from_flags


def test_float32_is_always_native():
    assert cpu_native_dtype(torch.float32) and cpu_native_dtype(torch.float64)


def test_flags_fallback():
    avx2 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})
    assert not native_from_flags(torch.bfloat16, avx2)
    assert not native_from_flags(torch.float16, avx2)
    assert native_from_flags(torch.bfloat16, avx2 | {"avx512f", "avx512_bf16"})
    assert native_from_flags(torch.bfloat16, avx2 | {"amx_bf16"})
    assert not native_from_flags(torch.float16, avx2 | {"avx512_bf16"})
    assert native_from_flags(torch.float16, avx2 | {"avx512_fp16"})
    assert native_from_flags(torch.bfloat16, frozenset({"fp", "asimd", "bf16"}))  # Arm
    assert native_from_flags(torch.float32, frozenset())


def test_warning_names_the_faster_setting(monkeypatch):
    monkeypatch.setattr(device, "cpu_native_dtype", lambda dtype: dtype == torch.float32)
    line = emulated_dtype_warning(torch.bfloat16, "cpu", setting="engines.x.dtype",
                                  speedup="about 1.6x")
    assert "bfloat16 is emulated" in line and "engines.x.dtype=float32 is about 1.6x" in line
    hinted = emulated_dtype_warning(torch.bfloat16, "cpu", setting="engines.x.dtype",
                                    speedup="about 1.6x", fast_hint="engines.x.fast=int8 is 4x")
    assert hinted == f"{line}; engines.x.fast=int8 is 4x"
    assert emulated_dtype_warning(torch.float32, "cpu", setting="s", speedup="2x") is None
    assert emulated_dtype_warning(torch.bfloat16, "cuda", setting="s", speedup="2x") is None
    monkeypatch.setattr(device, "cpu_native_dtype", lambda dtype: True)
    assert emulated_dtype_warning(torch.bfloat16, "cpu", setting="s", speedup="2x") is None


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 only")
@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch without oneDNN")
def test_an_avx2_cpu_has_no_native_reduced_precision():
    # torch and oneDNN limited to AVX2 (what an AVX2-only CPU gives them), in a fresh process
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    code = ("import torch; from mizuoto.runtime.device import cpu_native_dtype as n; "
            "print(n(torch.bfloat16), n(torch.float16), n(torch.float32))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False", "True"]
