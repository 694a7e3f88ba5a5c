"""``mizuoto.runtime.packed_int8_conv``: a decoder's transposed and pointwise convolutions as
packed int8 products (a fast profile's, never exact) stay close to torch's float32
convolutions, keep a subclass's own forward and the state dict, and leave everything else
to torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.benchmarking.quality import snr_db
from mizuoto.runtime.packed_int8 import packed_int8_unavailable
from mizuoto.runtime.packed_int8_conv import (
    Int8ConvTranspose1d,
    Int8PointwiseConv1d,
    pack_int8_convolutions,
)
from mizuoto.runtime.prepack_conv_transpose import (
    PrepackedConvTranspose1d,
    prepack_conv_transposes,
)

pytestmark = pytest.mark.skipif(packed_int8_unavailable() is not None,
                                reason=str(packed_int8_unavailable()))


class Trimmed(nn.ConvTranspose1d):
    """A causal decoder's upsampling: its own forward drops the last ``stride`` samples."""

    def forward(self, x):
        return super().forward(x)[..., :-self.stride[0]]


def _decoder():
    torch.manual_seed(0)
    return nn.Sequential(
        Trimmed(64, 32, 16, stride=8),             # kernel 2 x stride, as DAC-style decoders
        nn.Conv1d(32, 32, 7, padding=3, groups=32),  # depthwise: stays torch's
        nn.Conv1d(32, 24, 1),                      # pointwise
        nn.ConvTranspose1d(24, 16, 5, stride=2, padding=1, output_padding=1, dilation=2),
        nn.Conv1d(16, 8, 3),                        # not pointwise: stays torch's
    )


@pytest.mark.parametrize(("batch", "frames"), [(1, 6), (3, 2), (2, 31)])
def test_the_int8_decoder_is_near_the_float_one(batch, frames):
    model = _decoder()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(batch, 64, frames)
    with torch.no_grad():
        reference = model(x)
        assert pack_int8_convolutions([model]) == 3
        out = model(x)
    assert [type(layer).__name__ for layer in model] == [
        "Int8Trimmed", "Conv1d", "Int8PointwiseConv1d", "Int8ConvTranspose1d", "Conv1d"]
    assert isinstance(model[0], Trimmed) and isinstance(model[0], Int8ConvTranspose1d)
    assert isinstance(model[2], Int8PointwiseConv1d)
    assert out.shape == reference.shape
    assert not torch.equal(out, reference)  # int8: near, not exact
    assert snr_db(reference.numpy().ravel(), out.numpy().ravel()) > 25
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert pack_int8_convolutions([model]) == 0  # once


def test_gradients_and_other_dtypes_run_torchs_convolution():
    layer = nn.ConvTranspose1d(8, 4, 4, stride=2)
    x = torch.randn(1, 8, 5)
    reference = F.conv_transpose1d(x, layer.weight, layer.bias, stride=2)
    pack_int8_convolutions([layer])
    assert torch.equal(layer(x), reference)  # the weight records gradients: torch's own
    with torch.no_grad():
        assert not torch.equal(layer(x), reference)
        half = layer.to(torch.bfloat16)(x.bfloat16())
    assert half.dtype == torch.bfloat16


def test_prepacking_leaves_an_int8_layer_alone():
    layer = nn.ConvTranspose1d(8, 4, 4, stride=2)
    pack_int8_convolutions([layer])
    prepack_conv_transposes({"vae": [layer]})
    assert not isinstance(layer, PrepackedConvTranspose1d)
    assert isinstance(layer, Int8ConvTranspose1d)


def test_a_weight_loaded_after_packing_is_packed_again():
    layer, plain = nn.ConvTranspose1d(8, 4, 4, stride=2), nn.ConvTranspose1d(8, 4, 4, stride=2)
    pack_int8_convolutions([layer])
    layer.load_state_dict(plain.state_dict())
    x = torch.randn(1, 8, 5)
    with torch.no_grad():
        out, reference = layer(x), plain(x)
    assert snr_db(reference.numpy().ravel(), out.numpy().ravel()) > 25
