"""The bf16dot prepack kernel: torch's own bfloat16 sums on an AVX2 CPU (where it runs), one
proof for every long input of a layer, and plain F.linear wherever it cannot be built."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime import bf16_dot, prepack
from mizuoto.runtime.prepack import MANY_ROWS, prepack_linears, prepack_report


def _cancelling(rows: int, features: int) -> torch.Tensor:
    """Rows whose exact products with a weight repeated in both halves sum to zero, so the
    result is nothing but float32 rounding: any other order of the sums shows."""
    half = torch.randn(rows, features // 2) * 3
    return torch.cat([half, -half], 1).to(torch.bfloat16)


@pytest.mark.parametrize("threads", [1, 2, 4], indirect=True)
def test_the_kernel_gives_torchs_bfloat16_bits(threads):
    reason = bf16_dot.unavailable_reason()
    if reason is None and not bf16_dot.runs():
        reason = bf16_dot.unavailable_reason()
    if reason is not None:
        pytest.skip(f"bf16dot does not run here: {reason}")
    torch.manual_seed(0)
    for out_features, in_features in ((4096, 1024), (1024, 4096), (1000, 64), (24, 128)):
        half = torch.randn(out_features, in_features // 2) * 50
        weights = (torch.randn(out_features, in_features).to(torch.bfloat16),
                   torch.cat([half, half], 1).to(torch.bfloat16))
        bias = torch.randn(out_features).to(torch.bfloat16)
        for weight in weights:
            packed = bf16_dot.pack(weight, 0)
            for rows in (1, 2, 3, 4, 5, 9, 17, 100):
                for x in (torch.randn(rows, in_features).to(torch.bfloat16),
                          _cancelling(rows, in_features)):
                    for b in (None, bias):
                        assert torch.equal(bf16_dot.run(x, packed, weight, b, rows),
                                           F.linear(x, weight, b)), (out_features, rows)


def test_widths_that_are_not_whole_accumulator_groups_are_refused():
    with pytest.raises(RuntimeError, match="multiple of 64"):
        bf16_dot.pack(torch.zeros(8, 96, dtype=torch.bfloat16), 0)
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        bf16_dot.pack(torch.zeros(8, 64), 0)


def test_each_installation_builds_under_its_own_name(monkeypatch, tmp_path):
    """cpp_extension rebuilds a name whenever its ninja file changes (the source's path,
    torch's include directories): two environments sharing a name would rebuild in turn."""
    name = bf16_dot.build_name(bf16_dot.CFLAGS)
    assert name == bf16_dot.build_name(bf16_dot.CFLAGS)
    assert name.startswith("mizuoto_bf16_dot_")
    assert bf16_dot.build_name([*bf16_dot.CFLAGS, "-fopenmp"]) != name
    copy = tmp_path / "bf16_dot.cpp"
    copy.write_bytes(bf16_dot.SOURCE.read_bytes())
    monkeypatch.setattr(bf16_dot, "SOURCE", copy)  # the same source in another checkout
    assert bf16_dot.build_name(bf16_dot.CFLAGS) != name
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "torch" / "__init__.py"))
    assert bf16_dot.build_name(bf16_dot.CFLAGS) != name  # another venv's torch


def test_a_failed_build_is_refused_once_and_layers_run_f_linear(monkeypatch):
    builds = []

    def no_compiler():
        builds.append(1)
        raise OSError("g++: not found")

    monkeypatch.setattr(bf16_dot, "_built", None)
    monkeypatch.setattr(bf16_dot, "_refused", None)
    monkeypatch.setattr(bf16_dot, "unavailable_reason", lambda: bf16_dot._refused)
    monkeypatch.setattr(bf16_dot, "_build", no_compiler)
    monkeypatch.setattr(prepack, "_proven", {})
    # bf16dot alone: where another kernel is proven first (oneDNN on a CPU with native
    # bfloat16) the build would never be tried
    monkeypatch.setattr(prepack, "KERNELS", {"bf16dot": prepack.KERNELS["bf16dot"]})
    torch.manual_seed(1)
    layers = [nn.Linear(128, 64).to(torch.bfloat16) for _ in range(2)]
    plain = [nn.Linear(128, 64).to(torch.bfloat16) for _ in range(2)]
    for a, b in zip(plain, layers, strict=True):
        a.load_state_dict(b.state_dict())
    prepack_linears({"layers": layers})
    x = torch.randn(3, 128).to(torch.bfloat16)
    with torch.inference_mode():
        for a, b in zip(plain, layers, strict=True):
            assert torch.equal(b(x), a(x)) and torch.equal(b(x), a(x))
    assert len(builds) == 1
    assert not bf16_dot.runs() and "g++: not found" in bf16_dot._refused
    assert "bf16dot" not in str(prepack_report({"layers": layers}))


@pytest.fixture
def row_kernel(monkeypatch):
    calls = []

    def run(x, packed, weight, bias, rows):  # a stand-in: F.linear's bits by construction
        calls.append(x.shape[0])
        return F.linear(x, weight, bias)

    kernels = {"rows": (lambda weight, rows: weight.detach().clone(), run, True)}
    monkeypatch.setattr(prepack, "KERNELS", kernels)
    monkeypatch.setattr(prepack, "_proven", {})
    return calls


@pytest.mark.parametrize("invariant", [True, False])
def test_long_inputs_take_a_row_invariant_kernel_after_one_proof(monkeypatch, row_kernel,
                                                                invariant):
    monkeypatch.setattr(prepack, "ROW_INVARIANT", frozenset({"rows"} if invariant else ()))
    layer = nn.Linear(32, 16)
    plain = nn.Linear(32, 16)
    plain.load_state_dict(layer.state_dict())
    prepack_linears({"layer": [layer]})
    with torch.inference_mode():
        short = torch.randn(1, 2, 32)
        assert torch.equal(layer(short), plain(short))  # proves 2 rows (and, if invariant,
        proven = set(layer._rows_ok)                       # every longer contiguous input)
        assert any(key[0] == MANY_ROWS for key in proven) == invariant
        row_kernel.clear()
        for rows in (prepack.MAX_ROWS + 1, 50, 333):  # prefills of changing length
            x = torch.randn(1, rows, 32)
            assert torch.equal(layer(x), plain(x))
        assert row_kernel == ([17, 50, 333] if invariant else [])
        assert layer._rows_ok == proven  # no proof per length
        # a strided long input is another layout: proven on its own, once
        x = torch.randn(1, 80, 32)[:, ::2]
        assert torch.equal(layer(x), plain(x))
        assert (len(layer._rows_ok) > len(proven)) == invariant
