"""`EMA`: an exponential moving average of a model's weights, ema_pytorch 0.8.3's ``EMA`` with
its defaults (beta 0.9999, update every 10 steps, a plain copy until step 100, then the decay
``1 - (1 + epoch) ** -2/3``), the copy f5-tts's recipe keeps and exports. ``state_dict`` has
ema_pytorch's keys: ``initted``, ``step``, ``ema_model.<key>``. `TrainingRunner.keep_ema`
keeps one, updated after every optimiser update.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import nn


class EMA:
    beta, update_after_step, update_every, inv_gamma, power, min_value = (
        0.9999, 100, 10, 1.0, 2 / 3, 0.0)

    def __init__(self, model: nn.Module, device: str | torch.device | None = None) -> None:
        self.ema_model = copy.deepcopy(model)
        if device is not None:
            self.ema_model.to(device)
        for p in self.ema_model.parameters():
            p.detach_()
        self.initted = torch.tensor(False)
        self.step = torch.tensor(0)

    def _pairs(self, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        params = [(e, c) for (_, e), (_, c) in zip(self.ema_model.named_parameters(),
                                                 model.named_parameters(), strict=True)
                  if e.is_floating_point()]
        buffers = [(e, c) for (_, e), (_, c) in zip(self.ema_model.named_buffers(),
                                                  model.named_buffers(), strict=True)
                   if e.is_floating_point()]
        return params + buffers

    def _copy(self, model: nn.Module) -> None:
        for ema, current in self._pairs(model):
            ema.data.copy_(current.data)

    def current_decay(self) -> float:
        epoch = (self.step - self.update_after_step - 1).clamp(min=0.0)
        value = 1 - (1 + epoch / self.inv_gamma) ** -self.power
        if epoch.item() <= 0:
            return 0.0
        return value.clamp(min=self.min_value, max=self.beta).item()

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        step = self.step.item()
        self.step += 1
        if not self.initted.item():
            self._copy(model)
            self.initted.data.copy_(torch.tensor(True))
            return
        if step % self.update_every != 0:
            return
        if step <= self.update_after_step:
            self._copy(model)
            return
        weight = 1.0 - self.current_decay()
        for ema, current in self._pairs(model):
            ema.data.lerp_(current.data.to(ema.device), weight)

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {"initted": self.initted.clone(), "step": self.step.clone()}
        state.update({f"ema_model.{k}": v for k, v in self.ema_model.state_dict().items()})
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.initted = state["initted"].clone()
        self.step = state["step"].clone()
        self.ema_model.load_state_dict(
            {k.removeprefix("ema_model."): v for k, v in state.items()
             if k.startswith("ema_model.")})
