"""mizuoto.runtime.prepack_fused: layers that read one input run as one packed product only
where it gives each layer's F.linear bits; anywhere else (a kernel that differs, a layer
replaced, a weight changed, gradients, a long input) each layer runs on its own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime import prepack, prepack_fused
from mizuoto.runtime.prepack import prepack_linears
from mizuoto.runtime.prepack_fused import FusedPrepack


def _layers(dtype=torch.float32, sizes=(256, 32, 32), bias=False):
    torch.manual_seed(0)
    layers = [nn.Linear(256, size, bias=bias).to(dtype) for size in sizes]
    plain = [nn.Linear(256, size, bias=bias).to(dtype) for size in sizes]
    for a, b in zip(plain, layers, strict=True):
        a.load_state_dict(b.state_dict())
    prepack_linears({"layers": layers})
    return plain, layers


# q/k/v and gate/up, with the kernels this CPU has: the bits of the separate products
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sizes", [(256, 32, 32), (512, 512)])
def test_a_fused_product_gives_each_layers_bits(threads, dtype, sizes):
    for bias in (False, True):
        plain, layers = _layers(dtype, sizes, bias)
        fused = FusedPrepack.over(layers)
        with torch.inference_mode():
            for rows in (1, 2, 8, prepack.MAX_ROWS + 1):
                x = torch.randn(2, rows, 256).to(dtype)[:1]
                for _ in range(2):  # the second call runs a proven pack
                    outs = fused(x, layers)
                    assert all(torch.equal(out, layer(x)) for out, layer in
                               zip(outs, plain, strict=True)), (dtype, sizes, bias, rows)


def _same(x, packed, weight, bias, rows):
    _same.calls += 1
    return F.linear(x, packed, bias)


@pytest.fixture
def same_kernel(monkeypatch):
    _same.calls = 0
    monkeypatch.setattr(prepack, "KERNELS", {"same": (lambda w, r: w.clone(), _same, True)})
    monkeypatch.setattr(prepack, "_proven", {})
    monkeypatch.setattr(prepack_fused, "_proven", {})


def test_a_kernel_that_differs_is_never_used(monkeypatch):
    def off_by_one_ulp(x, packed, weight, bias, rows):
        out = F.linear(x, packed, bias)
        return torch.nextafter(out, torch.full_like(out, torch.inf))

    monkeypatch.setattr(prepack, "KERNELS", {"wrong": (lambda w, r: w.clone(), off_by_one_ulp,
                                                        True)})
    monkeypatch.setattr(prepack, "_proven", {})
    monkeypatch.setattr(prepack_fused, "_proven", {})
    plain, layers = _layers()
    fused = FusedPrepack.over(layers)
    with torch.inference_mode():
        for rows in (1, 4):
            x = torch.randn(rows, 256)
            outs = fused(x, layers)
            assert all(torch.equal(o, p(x)) for o, p in zip(outs, plain, strict=True))
    assert fused.kernel is None and layers[0].prepacked_kernel is None
    assert prepack_fused._proven and not any(prepack_fused._proven.values())


def test_an_identical_kernel_runs_once_for_all_layers_and_is_reported(same_kernel):
    plain, layers = _layers()
    fused = FusedPrepack.over(layers)
    x = torch.randn(1, 256)
    with torch.inference_mode():
        fused(x, layers)  # the proof
        before = _same.calls
        outs = fused(x, layers)
    assert _same.calls == before + 1  # one product for the three layers
    assert fused.kernel == "same" and all(layer.prepacked_kernel == "same" for layer in layers)
    assert all(torch.equal(o, p(x)) for o, p in zip(outs, plain, strict=True))


def test_a_replaced_layer_a_changed_weight_gradients_and_long_inputs_run_separately(
        same_kernel):
    plain, layers = _layers()
    fused = FusedPrepack.over(layers)
    x = torch.randn(1, 256)
    with torch.inference_mode():
        fused(x, layers)
    replaced = [layers[0], nn.Linear(256, 32), layers[2]]  # e.g. a LoRA layer
    with torch.inference_mode():
        assert torch.equal(fused(x, replaced)[1], replaced[1](x))
        with torch.no_grad():
            layers[1].weight.mul_(2)
            plain[1].weight.mul_(2)
        assert torch.equal(fused(x, layers)[1], plain[1](x))
        long = torch.randn(prepack.MAX_ROWS + 1, 256)
        calls = _same.calls
        assert torch.equal(fused(long, layers)[0], plain[0](long))
    assert _same.calls == calls  # F.linear per layer past the row limit: no packed product
    trained = torch.randn(1, 256, requires_grad=True)
    outs = fused(trained, layers)
    assert all(out.requires_grad for out in outs)
    assert FusedPrepack.over([nn.Linear(4, 4), nn.Linear(4, 4)]) is None
    with pytest.raises(ValueError, match="one input size"):
        FusedPrepack([layers[0], nn.Linear(8, 4)])


@pytest.mark.parametrize("invariant", [True, False])
def test_a_prefill_runs_fused_through_a_row_invariant_kernel_proven_at_the_first_step(
        monkeypatch, invariant):
    """A kernel whose rows do not depend on their count (bf16dot) proves, with a decode
    step's rows, every longer contiguous input too (the load's rehearsal), so a prefill runs
    the fused product: not torch's own kernel per layer until some later proof (on an AVX2
    CPU torch's bfloat16 F.linear is several times slower than bf16dot)."""
    calls = []

    def run(x, packed, weight, bias, rows):  # F.linear's bits by construction
        calls.append(x.shape[0])
        return F.linear(x, packed, bias)

    monkeypatch.setattr(prepack, "KERNELS", {"rows": (lambda w, r: w.clone(), run, True)})
    monkeypatch.setattr(prepack, "ROW_INVARIANT", frozenset({"rows"} if invariant else ()))
    monkeypatch.setattr(prepack, "_proven", {})
    monkeypatch.setattr(prepack_fused, "_proven", {})
    plain, layers = _layers()
    fused = FusedPrepack.over(layers)
    with torch.inference_mode():
        fused(torch.randn(1, 256), layers)  # a decode step: proves 1 row (and long inputs)
        proven = set(fused._rows_ok)
        assert any(key[0] == prepack.MANY_ROWS for key in proven) == invariant
        calls.clear()
        for rows in (prepack.MAX_ROWS + 1, 40, 129):  # prefills of changing length
            x = torch.randn(1, rows, 256)
            outs = fused(x, layers)
            assert all(torch.equal(o, p(x)) for o, p in zip(outs, plain, strict=True))
        assert fused._rows_ok == proven  # no proof per length
    assert calls == ([17, 40, 129] if invariant else [])
