"""The input side both F5 backbones (DiT, UNetT) share: time embedding, the text embedding
cached across ODE steps, and classifier-free guidance as one batch of two."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class TextConditionedBackbone(nn.Module):
    """Base of :class:`DiT` and :class:`UNetT`; subclasses build ``time_embed``, ``text_embed``
    and ``input_embed``. ``uses_audio_mask``: DiT sizes the text embedding by each item's
    audio length (batch padding); UNetT, like upstream, does not."""

    uses_audio_mask = False

    def clear_cache(self) -> None:
        self.__dict__["_text_cache"] = {}

    @contextlib.contextmanager
    def own_text_cache(self) -> Iterator[None]:
        """One sampler run's text cache: empty at the start, and the cache before it back at
        the end. A run nested in another's progress callback (same thread) then neither
        reads nor clears the outer run's text."""
        outer = self._text_cache
        self.clear_cache()
        try:
            yield
        finally:
            self.__dict__["_text_cache"] = outer

    def _input_embed(
        self,
        x: torch.Tensor,
        cond: torch.Tensor,
        text: torch.Tensor,
        *,
        drop_audio_cond: bool,
        drop_text: bool,
        cache: bool,
        audio_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        if not self.uses_audio_mask:
            audio_mask = None
        text_embed = self._text_cache.get(drop_text) if cache else None
        if text_embed is None:
            seq_len = x.shape[1] if audio_mask is None else audio_mask.sum(dim=1)
            text_embed = self.text_embed(text, seq_len=seq_len, drop_text=drop_text)
            if cache:
                self._text_cache[drop_text] = text_embed
        return self.input_embed(
            x, cond, text_embed, drop_audio_cond=drop_audio_cond, audio_mask=audio_mask
        )

    def embed_inputs(
        self,
        x: torch.Tensor,
        cond: torch.Tensor,
        text: torch.Tensor,
        time: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        drop_audio_cond: bool,
        drop_text: bool,
        cfg_infer: bool,
        cache: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(x, t, mask)`` ready for the transformer; with ``cfg_infer`` the conditional and
        the unconditional (audio and text dropped) halves are stacked into one batch."""
        if time.ndim == 0:
            time = time.repeat(x.shape[0])
        t = self.time_embed(time)
        if not cfg_infer:
            x = self._input_embed(x, cond, text, drop_audio_cond=drop_audio_cond,
                                  drop_text=drop_text, cache=cache, audio_mask=mask)
            return x, t, mask
        x_cond = self._input_embed(x, cond, text, drop_audio_cond=False, drop_text=False,
                                   cache=cache, audio_mask=mask)
        x_uncond = self._input_embed(x, cond, text, drop_audio_cond=True, drop_text=True,
                                     cache=cache, audio_mask=mask)
        mask = torch.cat((mask, mask), dim=0) if mask is not None else None
        return torch.cat((x_cond, x_uncond), dim=0), torch.cat((t, t), dim=0), mask
