"""weight_stamp: what tells a packed copy that its weight changed."""

from __future__ import annotations

import torch

from mizuoto.runtime.weight_stamp import weight_stamp


def test_weight_stamps_see_in_place_changes_and_accept_inference_tensors():
    weight = torch.ones(3, 4)
    before = weight_stamp(weight)
    weight.add_(1)
    assert weight_stamp(weight) != before
    with torch.inference_mode():
        made_inside = torch.ones(3, 4)
    assert weight_stamp(made_inside) == (None, made_inside.data_ptr(), torch.float32)
