"""compute.prepack for transposed convolutions: a layer packs only the input shapes it proved
bit-identical to F.conv_transpose1d inside proving_conv_transposes(), and runs plain for
everything else (other shapes, gradients, a changed weight, mode off)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime import prepack_conv_transpose as pct
from mizuoto.runtime.prepack_conv_transpose import (
    PrepackedConvTranspose1d,
    conv_transpose_report,
    has_packable_conv_transposes,
    prepack_conv_transposes,
    proving_conv_transposes,
)

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="torch built without oneDNN: nothing can pack")


def _pair(cin: int, cout: int, kernel: int, stride: int, seed: int = 0):
    torch.manual_seed(seed)
    plain = nn.ConvTranspose1d(cin, cout, kernel, stride=stride, padding=(kernel - stride) // 2)
    packed = nn.ConvTranspose1d(cin, cout, kernel, stride=stride,
                                padding=(kernel - stride) // 2)
    packed.load_state_dict(plain.state_dict())
    prepack_conv_transposes({"vae": [packed]})
    return plain, packed


# an audio decoder's upsampling layers at a stream chunk's frames: oneDNN's deconvolution
# where torch's plain call takes it (input numel past its native-kernel limit)
@pytest.mark.parametrize("threads", [1, 2, 4], indirect=True)
@pytest.mark.parametrize("shape", [(512, 256, 16, 8, 48), (256, 128, 10, 5, 200),
                                   (128, 64, 4, 2, 400)])
def test_a_proven_shape_gives_conv_transpose1d_bits(threads, shape):
    cin, cout, kernel, stride, frames = shape
    plain, packed = _pair(cin, cout, kernel, stride)
    x = torch.randn(1, cin, frames)
    with torch.inference_mode():
        with proving_conv_transposes():
            assert torch.equal(packed(x), plain(x))
        for _ in range(3):  # new inputs of the proven shape run the pack
            y = torch.randn(1, cin, frames)
            assert torch.equal(packed(y), plain(y))
        other = torch.randn(1, cin, frames + 1)  # never proven: plain
        assert torch.equal(packed(other), plain(other))
    # torch's plain call runs oneDNN's deconvolution at these sizes: the pack is that primitive
    assert packed.prepacked and len(packed._packs) == 1
    assert conv_transpose_report({"vae": [packed]}) == {"vae": {"onednn": 1}}


# a batch of streams' shapes: VoxCPM-0.5B's first upsampling, scaled down, where torch's plain
# call takes oneDNN's deconvolution (several inputs) and reorders the whole weight each call
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_each_batch_size_is_proven_alone_and_shares_one_packed_weight(threads):
    plain, packed = _pair(512, 256, 16, 8)
    batches = {rows: torch.randn(rows, 512, 6) for rows in (2, 3, 8)}
    with torch.inference_mode():
        with proving_conv_transposes():
            for x in batches.values():
                assert torch.equal(packed(x), plain(x))
        for rows in batches:  # each batch size runs its proven pack
            y = torch.randn(rows, 512, 6)
            assert torch.equal(packed(y), plain(y))
    onednn = [p for kernel, p in packed._packs.values() if kernel == "onednn"]
    assert len(onednn) == 3, packed._packs.keys()
    assert all(p is onednn[0] for p in onednn), "one copy of the weight for every batch size"


def test_max_columns_proves_only_shapes_of_few_columns():
    """proving_conv_transposes(max_columns=...) leaves a wider shape untried (plain, and still
    provable later); the proof's call answers with F.conv_transpose1d's bits."""
    plain, packed = _pair(512, 256, 16, 8)
    few, wide = torch.randn(4, 512, 6), torch.randn(4, 512, 20)
    with torch.inference_mode(), proving_conv_transposes(max_columns=pct.BATCH_PROOF_COLUMNS):
        assert torch.equal(packed(few), plain(few))
        assert torch.equal(packed(wide), plain(wide))
    assert [key[0] for key in packed._tried] == [(4, 512, 6)]


def test_a_kernel_that_differs_is_never_used(monkeypatch):
    plain, packed = _pair(256, 128, 8, 4)
    real_run = PrepackedConvTranspose1d._run

    def off_by_one_ulp(self, weight, x):
        out = real_run(self, weight, x)
        return torch.nextafter(out, torch.full_like(out, torch.inf))

    monkeypatch.setattr(PrepackedConvTranspose1d, "_run", off_by_one_ulp)
    x = torch.randn(1, 256, 200)
    with torch.inference_mode():
        with proving_conv_transposes():
            assert torch.equal(packed(x), plain(x))
        assert torch.equal(packed(x), plain(x))
    assert not packed.prepacked
    assert conv_transpose_report({"vae": [packed]}) == {"vae": {"plain": 1}}


def test_outside_the_proving_block_nothing_packs():
    plain, packed = _pair(256, 128, 8, 4)
    x = torch.randn(1, 256, 200)
    with torch.inference_mode():
        assert torch.equal(packed(x), plain(x))
    assert not packed.prepacked


def test_gradients_run_the_plain_kernel():
    plain, packed = _pair(256, 128, 8, 4)
    x = torch.randn(1, 256, 200)
    with torch.inference_mode(), proving_conv_transposes():
        packed(x)
    x = x.requires_grad_()
    out = packed(x)
    out.sum().backward()
    assert packed.weight.grad is not None and torch.equal(out, plain(x))


def test_a_changed_weight_drops_its_packs():
    plain, packed = _pair(256, 128, 8, 4)
    x = torch.randn(1, 256, 200)
    with torch.inference_mode(), proving_conv_transposes():
        packed(x)
    assert packed.prepacked  # oneDNN's size, as in test_a_proven_shape_gives_conv_transpose1d_bits
    with torch.no_grad():
        packed.weight.mul_(0.5)
        plain.weight.mul_(0.5)
    with torch.inference_mode():
        assert torch.equal(packed(x), plain(x))
    assert not packed.prepacked


def test_mode_off_changes_nothing_and_the_report_counts_kernels():
    layer = nn.ConvTranspose1d(8, 4, 4, stride=2)
    prepack_conv_transposes({"vae": [layer]}, "off")
    assert type(layer) is nn.ConvTranspose1d
    assert not has_packable_conv_transposes({"vae": [layer]})
    assert conv_transpose_report({"vae": [layer]}) == {"vae": {"plain": 1}}
    assert conv_transpose_report({"none": [nn.Linear(2, 2)]}) == {}
    prepack_conv_transposes({"vae": [layer]})
    assert isinstance(layer, PrepackedConvTranspose1d)
    assert has_packable_conv_transposes({"vae": [layer]})
    assert not has_packable_conv_transposes({"vae": [layer.to(torch.float64)]})


class _Scaled(nn.ConvTranspose1d):
    """A subclass with its own forward, as a model file may have (a causal crop)."""

    def forward(self, x, output_size=None):
        return super().forward(x, output_size)[..., 1:]


def test_a_subclass_keeps_its_own_forward_and_state_dict():
    torch.manual_seed(0)
    layer = _Scaled(256, 128, 8, stride=4)
    expected_keys = set(layer.state_dict())
    x = torch.randn(1, 256, 200)
    with torch.inference_mode():
        before = layer(x)
        prepack_conv_transposes({"vae": [nn.Sequential(layer)]})
        assert isinstance(layer, _Scaled) and isinstance(layer, PrepackedConvTranspose1d)
        with proving_conv_transposes():
            assert torch.equal(layer(x), before)
        assert torch.equal(layer(x), before)
    assert set(layer.state_dict()) == expected_keys
    assert pct._prepacked_class(_Scaled) is type(layer)  # one generated class per subclass


# torch runs small inputs on its own slow_conv_transpose2d (VoxCPM-0.5B's first upsampling
# at a stream's 6 frames), with padding, output padding, dilation, no bias and a batch of two
@pytest.mark.parametrize("threads", [1, 2, 4], indirect=True)
@pytest.mark.parametrize("shape", [(1536, 768, 16, 8, 6, 0, 0, 1, True, 1),
                                   (512, 256, 16, 8, 6, 4, 0, 1, True, 1),
                                   (256, 128, 7, 3, 10, 1, 2, 1, False, 2),
                                   (64, 32, 5, 2, 9, 0, 0, 2, True, 1)])
def test_small_inputs_are_proven_or_left_plain(threads, shape):
    cin, cout, kernel, stride, frames, padding, output_padding, dilation, bias, batch = shape
    torch.manual_seed(0)
    layer = nn.ConvTranspose1d(cin, cout, kernel, stride=stride, padding=padding,
                               output_padding=output_padding, dilation=dilation, bias=bias)
    x = torch.randn(batch, cin, frames)

    def plain(inputs):
        return F.conv_transpose1d(inputs, layer.weight, layer.bias, stride, padding,
                                  output_padding, 1, dilation)

    with torch.inference_mode():
        expected = plain(x)
        prepack_conv_transposes({"vae": [layer]})
        with proving_conv_transposes():
            assert torch.equal(layer(x), expected)
        y = torch.randn(batch, cin, frames)
        assert torch.equal(layer(y), plain(y))
    assert layer.prepacked_kernels <= {"onednn", "gemm"}


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_the_gemm_kernel_is_slow_conv_transpose2ds_arithmetic(threads):
    """Handed the weight as torch's native kernel hands it to the BLAS (transposed, not a
    copy), the gemm kernel's steps give its very bits; the stored copy is then a proof away."""
    plain, packed = _pair(1536, 768, 16, 8)
    x = torch.randn(1, 1536, 6)
    with torch.inference_mode():
        weight_view = packed.weight.reshape(1536, -1).t()
        assert not weight_view.is_contiguous()
        assert torch.equal(packed._run_gemm(weight_view, x), plain(x))

