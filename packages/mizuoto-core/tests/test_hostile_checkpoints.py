"""A downloaded pickle holding more than tensors is refused for safety, and says so."""

import argparse

import pytest
import torch

from mizuoto.errors import CheckpointMismatch, UnsafeCheckpoint
from mizuoto.runtime.checkpoint import load_state_dict_file


@pytest.mark.parametrize("payload", [argparse.Namespace(x=1), {"w": argparse.Namespace()}])
def test_pickle_with_objects_is_refused_for_safety(tmp_path, payload):
    path = tmp_path / "model.pt"
    torch.save(payload, path)
    with pytest.raises(UnsafeCheckpoint) as info:
        load_state_dict_file(path)
    message = str(info.value)
    assert "refused for safety" in message and str(path) in message
    assert "weights_only" not in message and "does not match" not in message
    assert isinstance(info.value, CheckpointMismatch) and info.value.exit_code == 3


def test_tensor_pickle_still_loads(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, path)
    assert torch.equal(load_state_dict_file(path)["w"], torch.ones(2))
