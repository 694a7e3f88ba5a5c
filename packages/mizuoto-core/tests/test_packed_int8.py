"""``mizuoto.runtime.packed_int8``: fbgemm's packed int8 linear (a fast profile's kernel,
never exact) stays close to the float32 product, keeps shapes and bias, and replaces the
layers it is given once."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.benchmarking.kernels import layer_kernel
from mizuoto.benchmarking.quality import snr_db
from mizuoto.runtime.packed_int8 import (
    KERNEL_NAME,
    PackedInt8Linear,
    pack_int8_linears,
    packed_int8_unavailable,
    weight_levels,
)

pytestmark = pytest.mark.skipif(packed_int8_unavailable() is not None,
                                reason=str(packed_int8_unavailable()))


def test_a_product_warns_of_nothing():
    """torch's one deprecation warning per process is taken when the first layer packs, so
    products run without silencing it (a cost as large as a decode step's small product)."""
    import warnings

    packed = PackedInt8Linear(nn.Linear(16, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert packed(torch.randn(3, 16)).shape == (3, 8)


@pytest.mark.parametrize("rows", [(1,), (2, 10), (3, 1, 20)])
def test_the_packed_product_is_close_to_the_float_one(rows):
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    packed = PackedInt8Linear(linear)
    x = torch.randn(*rows, 64)
    with torch.no_grad():
        out = packed(x)
        reference = F.linear(x, linear.weight, linear.bias)
    assert out.shape == reference.shape and out.dtype == torch.float32
    assert not torch.equal(out, reference)  # int8: near, not exact
    assert snr_db(reference.numpy().ravel(), out.numpy().ravel()) > 30
    assert not list(packed.parameters())
    assert packed.packed_weight_bytes == 48 * (64 + 4 + 4 + 4 + 4)  # + column offsets, scales,
    # the op's zero bias and the layer's bias, 4 bytes each a channel
    assert layer_kernel(packed) == (KERNEL_NAME, "int8")


def test_full_scale_inputs_and_weights_are_not_clipped():
    """AVX2's byte products sum in pairs into 16 bits with saturation: weights of every channel
    at full scale times inputs at full scale clipped to half the product there, before the
    weights were narrowed to 7 bits on such a CPU (``weight_levels``)."""
    assert weight_levels() in (63, 127)
    linear = nn.Linear(256, 4, bias=False)
    with torch.no_grad():
        linear.weight.fill_(1.0)
        linear.weight[1].fill_(-0.5)
        linear.weight[2, ::2] = -1.0
        x = torch.full((3, 256), 2.0)
        out = PackedInt8Linear(linear)(x)
    torch.testing.assert_close(out, F.linear(x, linear.weight), rtol=0.02, atol=0.5)


def test_pack_replaces_inner_linears_and_keeps_a_bare_root():
    block = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 4), nn.ReLU()))
    bare = nn.Linear(4, 4)
    assert pack_int8_linears([block, bare]) == 2
    assert isinstance(block[0], PackedInt8Linear) and isinstance(block[1][0], PackedInt8Linear)
    assert type(bare) is nn.Linear
    with torch.no_grad():
        assert block(torch.randn(5, 8)).shape == (5, 4)


def test_a_bias_free_layer_adds_nothing():
    linear = nn.Linear(16, 16, bias=False)
    with torch.no_grad():
        assert PackedInt8Linear(linear)(torch.zeros(2, 16)).abs().max() == 0


@pytest.mark.parametrize("rows", [(1,), (3,), (2, 20)])
def test_a_fused_product_gives_each_layers_own_bits(rows):
    """Weights per output channel and one quantization of the input: q/k/v (or gate/up) as
    one product equal the separate packed products bit for bit, bias or none."""
    torch.manual_seed(0)
    layers = [nn.Linear(64, 48, bias=False), nn.Linear(64, 16, bias=False),
              nn.Linear(64, 24, bias=False)]
    with_bias = [nn.Linear(64, 40), nn.Linear(64, 40, bias=False)]
    for linears in (layers, with_bias):
        fused = PackedInt8Linear.fused(linears)
        assert fused.split_sizes == tuple(linear.out_features for linear in linears)
        x = torch.randn(*rows, 64) * 3
        with torch.no_grad():
            parts = fused(x).split(fused.split_sizes, dim=-1)
            for part, linear in zip(parts, linears, strict=True):
                assert torch.equal(part, PackedInt8Linear(linear)(x))


def test_a_fused_product_needs_one_input_size():
    with pytest.raises(ValueError, match="one input size"):
        PackedInt8Linear.fused([nn.Linear(8, 4), nn.Linear(16, 4)])


def test_weights_are_quantized_per_output_channel():
    """A channel of small weights beside one of large weights keeps its own precision (one
    scale for the tensor would round the small channel's weights to nothing)."""
    linear = nn.Linear(32, 2, bias=False)
    with torch.no_grad():
        linear.weight[0] = torch.linspace(-1e-3, 1e-3, 32)
        linear.weight[1] = torch.linspace(-100, 100, 32)
        x = torch.randn(4, 32)
        out, reference = PackedInt8Linear(linear)(x), F.linear(x, linear.weight)
    small = snr_db(reference[:, 0].numpy(), out[:, 0].numpy())
    assert small > 30
