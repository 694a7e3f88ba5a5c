"""The loaded model's state is upstream's (no oracle needed): kernels depend on it.

Upstream's ``from_local`` only calls ``.eval()``; its parameters keep ``requires_grad=True``.
``F.linear`` on a non-contiguous 3-D input then folds the batch into a single ``mm`` (+ bias);
frozen weights would run ``bmm`` instead, 1 ulp apart in float32 at the released widths.
"""

from __future__ import annotations

import pytest
import torch

from mizuoto_voxcpm.config import VoxCPMConfig
from mizuoto_voxcpm.fixtures import write_random_model
from mizuoto_voxcpm.model import load_model


@pytest.fixture(scope="module")
def wide_05b(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("wide") / "v05", "voxcpm-0.5b",
                              size="wide", dtype="float32")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parameters_stay_trainable_and_model_in_eval(wide_05b, dtype):
    model = load_model(wide_05b, VoxCPMConfig.from_model_dir(wide_05b), dtype=dtype)
    assert all(p.requires_grad for p in model.parameters())
    assert all(p.dtype == dtype and p.is_contiguous() for p in model.parameters())
    assert not any(m.training for m in model.modules())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_out_proj_folds_the_batch_like_upstream(wide_05b, dtype):
    model = load_model(wide_05b, VoxCPMConfig.from_model_dir(wide_05b), dtype=dtype)
    out_proj = model.feat_decoder.estimator.out_proj
    assert (out_proj.in_features, out_proj.out_features, model.patch_size) == (1024, 64, 2)
    hidden = torch.randn(2, 5, 1024, generator=torch.Generator().manual_seed(1)).to(dtype)
    sliced = hidden[:, 3:, :]  # condition + previous-patch tokens skipped: not contiguous
    with torch.inference_mode():
        got = out_proj(sliced)
        # upstream's path: at::matmul folds (2, 2, 1024) into one (4, 1024) mm, then adds bias
        folded = torch.mm(sliced.reshape(-1, 1024), out_proj.weight.t()).view(2, 2, 64)
        assert torch.equal(got, folded + out_proj.bias)
