"""Conditional flow matching: sampling mel spectrograms with a backbone (F5-TTS ``CFM``).

`ConditionalFlowMatching(transformer, *, num_channels=100, mel_spec=None, ode_method="euler")`
wraps a backbone with the `DiT`/`UNetT` call signature. The backbone is the only registered
child (``transformer.*``), so an upstream ``CFM`` state dict loads into it strictly. ``mel_spec``
(audio ``(b, samples)`` -> ``(b, num_channels, frames)``) is kept outside the module tree on
purpose: upstream computes the reference mel in float32 even when the model runs in half.

`sample(cond, text, duration, *, lens=None, steps=32, cfg_strength=1.0,
sway_sampling_coef=None, use_epss=True, method=None, edit_mask=None, no_ref_audio=False,
max_duration=65536, seed=None, generator=None, keep_trajectory=False, on_step=None)`
-> ``(mel (b, n, num_channels), trajectory (steps + 1, b, n, num_channels) or None)``:

- ``cond``: reference mel ``(b, frames, num_channels)`` or audio ``(b, samples)`` (needs
  ``mel_spec``); cast to the model dtype. ``lens`` ``(b,)``: valid reference frames (default all).
- ``text``: ``(b, nt)`` long token ids, -1 = batch padding (tokenising is the engine's job).
- ``duration``: total frames, int or ``(b,)``; raised to ``max(text length, lens) + 1`` and
  clamped to ``max_duration``; the batch is padded to the longest.
- noise: one ``randn(duration_i, num_channels)`` per item in the model dtype, on the model
  device, drawn in batch order from ``generator``, else from a fresh generator seeded with
  ``seed`` for *every* item (upstream re-seeds per item, so each item draws what it would
  alone), else from torch's global generator (what upstream does without a seed).
- time grid: EPSS when ``use_epss`` (falls back to uniform for other step counts), then sway.
- CFG: when ``cfg_strength >= 1e-5`` one batch of 2b (conditional, then without audio condition
  and text), ``pred + (pred - null_pred) * cfg_strength``.
- ``edit_mask`` ``(b, lens.max())``: frames kept from ``cond`` (AND-ed with ``lens``);
  ``no_ref_audio`` zeroes the condition. The result equals ``cond`` wherever it was kept.
- with b > 1 the backbone gets a padding mask from the durations; with b == 1 no mask.
- ``on_step(done, total)`` is called after each ODE step (progress reporting).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from mizuoto.nn.flow.ode import METHODS, odeint_fixed
from mizuoto.nn.flow.timesteps import time_grid

MelSpec = Callable[[torch.Tensor], torch.Tensor]


def _lens_to_mask(lens: torch.Tensor, length: int | None = None) -> torch.Tensor:
    if length is None:
        length = int(lens.amax())
    return torch.arange(length, device=lens.device)[None, :] < lens[:, None]


class ConditionalFlowMatching(nn.Module):
    def __init__(
        self,
        transformer: nn.Module,
        *,
        num_channels: int = 100,
        mel_spec: MelSpec | None = None,
        ode_method: str = "euler",
    ) -> None:
        super().__init__()
        if ode_method not in METHODS:
            raise ValueError(f"ode_method must be one of {METHODS}, got {ode_method!r}")
        self.transformer = transformer
        self.num_channels = num_channels
        self.ode_method = ode_method
        # not a submodule: `.to(half)` must not touch the mel filterbank (see module docstring)
        self.__dict__["mel_spec"] = mel_spec

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def _reference_mel(self, cond: torch.Tensor) -> torch.Tensor:
        if cond.ndim == 3:
            return cond
        if cond.ndim != 2:
            shape = tuple(cond.shape)
            raise ValueError(f"cond must be mel (b, n, c) or audio (b, samples), got {shape}")
        if self.mel_spec is None:
            raise ValueError("cond is audio but this sampler has no mel_spec; pass a mel instead")
        mel = self.mel_spec(cond).permute(0, 2, 1)
        if mel.shape[-1] != self.num_channels:
            raise ValueError(
                f"mel_spec gives {mel.shape[-1]} channels, model expects {self.num_channels}"
            )
        return mel

    def _noise(
        self,
        duration: torch.Tensor,
        dtype: torch.dtype,
        seed: int | None,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        device = self.device
        noise = []
        for frames in duration.tolist():
            if generator is None and seed is not None:
                # upstream calls torch.manual_seed(seed) before each item's draw
                item_gen = torch.Generator(device=device).manual_seed(seed)
            else:
                item_gen = generator
            noise.append(
                torch.randn(
                    frames, self.num_channels, device=device, dtype=dtype, generator=item_gen
                )
            )
        return pad_sequence(noise, padding_value=0, batch_first=True)

    @torch.no_grad()
    def sample(
        self,
        cond: torch.Tensor,
        text: torch.Tensor,
        duration: int | torch.Tensor,
        *,
        lens: torch.Tensor | None = None,
        steps: int = 32,
        cfg_strength: float = 1.0,
        sway_sampling_coef: float | None = None,
        use_epss: bool = True,
        method: str | None = None,
        edit_mask: torch.Tensor | None = None,
        no_ref_audio: bool = False,
        max_duration: int = 65536,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        keep_trajectory: bool = False,
        on_step: Callable[[int, int], None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.eval()
        method = self.ode_method if method is None else method
        if not torch.is_tensor(text) or text.ndim != 2:
            raise TypeError("text must be a (b, nt) tensor of token ids (-1 = padding)")

        cond = self._reference_mel(cond).to(self.dtype)
        batch, cond_seq_len, device = cond.shape[0], cond.shape[1], cond.device
        if text.shape[0] != batch:
            raise ValueError(f"text has batch {text.shape[0]}, cond has {batch}")
        text = text.to(device)
        if lens is None:
            lens = torch.full((batch,), cond_seq_len, device=device, dtype=torch.long)

        cond_mask = _lens_to_mask(lens)
        if edit_mask is not None:
            cond_mask = cond_mask & edit_mask

        if not torch.is_tensor(duration):
            duration = torch.full((batch,), int(duration), device=device, dtype=torch.long)
        # at least one frame past the text and the reference, so something is generated
        duration = torch.maximum(torch.maximum((text != -1).sum(dim=-1), lens) + 1, duration)
        duration = duration.clamp(max=max_duration)
        total = int(duration.amax())

        cond = F.pad(cond, (0, 0, 0, total - cond_seq_len), value=0.0)
        if no_ref_audio:
            cond = torch.zeros_like(cond)
        cond_mask = F.pad(cond_mask, (0, total - cond_mask.shape[-1]), value=False).unsqueeze(-1)
        step_cond = torch.where(cond_mask, cond, torch.zeros_like(cond))
        mask = _lens_to_mask(duration) if batch > 1 else None

        def velocity(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            if cfg_strength < 1e-5:
                return self.transformer(
                    x=x, cond=step_cond, text=text, time=t, mask=mask, cache=True
                )
            both = self.transformer(
                x=x, cond=step_cond, text=text, time=t, mask=mask, cfg_infer=True, cache=True
            )
            pred, null_pred = torch.chunk(both, 2, dim=0)
            # pred + (pred - null_pred) * cfg_strength, written into null_pred's half of the
            # backbone's output (nothing else reads it): one tensor fewer per step, no new
            # one; the same operations on the same values (x + y == y + x in IEEE arithmetic)
            guided = torch.sub(pred, null_pred, out=null_pred)
            return guided.mul_(cfg_strength).add_(pred)

        y0 = self._noise(duration, step_cond.dtype, seed, generator)
        t = time_grid(steps, use_epss=use_epss, sway_sampling_coef=sway_sampling_coef,
                      device=self.device, dtype=step_cond.dtype)

        # the backbone caches the text embedding in itself for this run only (callers keep
        # two threads' runs apart; a run nested in on_step gets its own cache)
        with self.transformer.own_text_cache():
            result = odeint_fixed(
                velocity,
                y0,
                t,
                method,
                keep_trajectory=keep_trajectory,
                on_step=None if on_step is None else lambda j, _t, _y: on_step(j, len(t) - 1),
            )
        trajectory = result if keep_trajectory else None
        sampled = result[-1] if keep_trajectory else result
        return torch.where(cond_mask, cond, sampled), trajectory
