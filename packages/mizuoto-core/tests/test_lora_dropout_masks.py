"""LoRA dropout with masks from a run's own generator (`dropout_from`, `draw_dropout_from`):
``F.dropout``'s arithmetic, so that a trainer matching an upstream that draws from the global
generator replays the same masks from its private one."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mizuoto.nn.lora import LoRALinear, apply_lora, draw_dropout_from, dropout_from


def test_the_masks_are_f_dropouts_from_the_given_generator():
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(7)
    expected = F.dropout(x, 0.25)
    drawn = dropout_from(torch.Generator().manual_seed(7), 0.25)(x)
    assert torch.equal(drawn, expected)
    assert not torch.equal(drawn, x)


def test_every_lora_layer_draws_from_the_generator():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    apply_lora(model, ["0", "1"], r=2, alpha=4, dropout=0.5)
    for layer in model:
        torch.nn.init.normal_(layer.lora_B)
        torch.nn.init.normal_(layer.lora_A)
    generator = torch.Generator().manual_seed(3)
    draw_dropout_from(model, generator)
    assert all(isinstance(m, LoRALinear) and m.dropout_fn is not None for m in model)
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    first = model(x)
    generator.manual_seed(3)
    assert torch.equal(model(x), first)  # the same generator state: the same masks
    assert not torch.equal(model(x), first)  # drawn on: other masks
