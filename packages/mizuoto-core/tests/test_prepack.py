"""compute.prepack: a prepacked layer gives F.linear's bits at every row count and thread count,
packs only what it proved identical, and falls back to F.linear for everything else."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.options import Options
from mizuoto.runtime import prepack
from mizuoto.runtime.prepack import PrepackedLinear, prepack_linears, prepack_report


def _pair(out_features: int, in_features: int, bias: bool, dtype=torch.float32):
    torch.manual_seed(0)
    plain = nn.Linear(in_features, out_features, bias=bias).to(dtype)
    packed = nn.Linear(in_features, out_features, bias=bias).to(dtype)
    packed.load_state_dict(plain.state_dict())
    prepack_linears({"layer": [packed]})
    return plain, packed


# the LM widths of VoxCPM-0.5B (1024 -> 1024 / 4096 and back) and a narrow head
@pytest.mark.parametrize("threads", [1, 2, 4], indirect=True)
@pytest.mark.parametrize("shape", [(1024, 1024), (1024, 4096), (64, 1024)])
def test_packed_layer_gives_f_linear_bits(threads, shape):
    for bias in (False, True):
        plain, packed = _pair(*shape, bias)
        with torch.inference_mode():
            for rows in (1, 2, 3, 4, 10, prepack.MAX_ROWS, prepack.MAX_ROWS + 1):
                x = torch.randn(2, rows, shape[1])[:1]  # a 3-d view, as the models pass
                assert torch.equal(packed(x), plain(x)), (threads, shape, bias, rows)
                assert torch.equal(packed(x), plain(x))  # the second call runs the pack
            # a strided view (the DiT's output projection gets one): F.linear copies it on
            # its own path, which at real size summed differently from the packed rows
            for rows in (2, 4, 8):
                x = torch.randn(2, rows + 3, shape[1])[:, 3:, :]
                assert torch.equal(packed(x), plain(x)) and torch.equal(packed(x), plain(x))


def test_a_kernel_that_differs_is_never_used(monkeypatch):
    def off_by_one_ulp(x, packed, weight, bias, rows):
        out = F.linear(x, weight, bias)
        return torch.nextafter(out, torch.full_like(out, torch.inf))

    monkeypatch.setattr(prepack, "KERNELS", {"wrong": (lambda w, r: w, off_by_one_ulp, True)})
    monkeypatch.setattr(prepack, "_proven", {})
    plain, packed = _pair(256, 128, True)
    with torch.inference_mode():
        for rows in (1, 4, 10):
            x = torch.randn(rows, 128)
            assert torch.equal(packed(x), plain(x))
    assert packed.prepacked_kernel is None
    assert prepack._proven and not any(prepack._proven.values())


def test_an_identical_kernel_is_used_and_reported(monkeypatch):
    calls = []

    def same(x, packed, weight, bias, rows):
        calls.append(rows)
        return F.linear(x, packed, bias)

    monkeypatch.setattr(prepack, "KERNELS", {"same": (lambda w, r: w.clone(), same, True)})
    monkeypatch.setattr(prepack, "_proven", {})
    plain, packed = _pair(64, 32, False)
    other = nn.Linear(32, 8)
    with torch.inference_mode():
        x = torch.randn(3, 32)
        assert torch.equal(packed(x), plain(x))
        calls.clear()
        packed(x)
    assert calls == [3] and packed.prepacked_kernel == "same"
    report = prepack_report({"lm": [packed], "head": [other]})
    assert report == {"mode": "auto", "modules": {"lm": {"same": 1}, "head": {"plain": 1}}}
    assert prepack_report({"lm": [packed]}, "off") == {"mode": "off"}


def test_weight_changed_in_place_drops_the_pack(monkeypatch):
    monkeypatch.setattr(prepack, "KERNELS", {"same": (lambda w, r: w.clone(),
                                                      lambda x, p, w, b, r: F.linear(x, p, b),
                                                      True)})
    monkeypatch.setattr(prepack, "_proven", {})
    plain, packed = _pair(16, 16, True)
    x = torch.randn(2, 16)
    with torch.inference_mode():
        packed(x)
    assert packed.prepacked_kernel == "same"
    with torch.no_grad():
        plain.weight.mul_(2)  # the same tensor: packed's weight changed under its pack
        packed.weight.copy_(plain.weight)
    with torch.inference_mode():
        assert torch.equal(packed(x), plain(x))


def test_gradients_and_long_inputs_run_plain(monkeypatch):
    monkeypatch.setattr(prepack, "KERNELS", {"never": (lambda w, r: w, None, True)})
    plain, packed = _pair(16, 8, True)
    x = torch.randn(4, 8)
    assert torch.equal(packed(x), plain(x))  # grad enabled, weight requires grad: plain
    with torch.inference_mode():
        long = torch.randn(prepack.MAX_ROWS + 1, 8)
        assert torch.equal(packed(long), plain(long))
    assert packed.prepacked_kernel is None


def test_off_and_skip_leave_plain_layers():
    layer, skipped = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4))
    prepack_linears({"a": [layer]}, "off")
    assert type(layer) is nn.Linear
    prepack_linears({"a": [layer, skipped]}, skip=[skipped])
    assert type(layer) is PrepackedLinear and type(skipped[0]) is nn.Linear
    assert set(layer.state_dict()) == {"weight", "bias"}


def test_option_values():
    assert Options().compute.prepack == "auto"
    assert Options.from_mapping({"compute.prepack": "off"}).compute.prepack == "off"
    with pytest.raises(Exception, match="compute.prepack"):
        Options.from_mapping({"compute.prepack": "on"})


def test_a_group_packs_up_to_its_own_row_limit(monkeypatch):
    """max_rows raises one group's limit (a decode step's fixed shape with more rows than
    MAX_ROWS); the other groups, and row counts past the limit, stay plain."""
    proofs = []
    original = PrepackedLinear._try
    monkeypatch.setattr(PrepackedLinear, "_try",
                        lambda self, key, x: proofs.append((self, key[0])) or original(self, key, x))
    dit, lm = nn.Linear(8, 8), nn.Linear(8, 8)
    prepack_linears({"dit": [dit], "lm": [lm]}, max_rows={"dit": prepack.MAX_ROWS + 6})
    rows = prepack.MAX_ROWS + 6
    with torch.inference_mode():
        for layer in (dit, lm):
            for n in (rows, rows + 1):
                x = torch.randn(n, 8)
                assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert proofs == [(dit, rows)]
    with pytest.raises(ValueError, match="encoder"):
        prepack_linears({"dit": [nn.Linear(8, 8)]}, max_rows={"encoder": 32})
