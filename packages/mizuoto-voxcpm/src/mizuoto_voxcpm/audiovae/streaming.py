"""Chunk-by-chunk decoding with carried causal state (VoxCPM2's streaming path).

Upstream (``StreamingVAEDecoder`` in voxcpm 2.0.3) patches the decoder's convolutions while a
``with vae.streaming_decode()`` block is open; here the state is an explicit object handed
down the decoder. Each ``decode_chunk`` decodes only the new latent frames, always at the
default output sample rate, and returns ``frames * decode_hop_length`` samples. Concatenated
chunks equal a whole-sequence decode up to float rounding (the same sums in another grouping),
not bit for bit.

VoxCPM2 feeds one patch per call and starts from zero state even in continuation mode: the
prompt's trailing patches are not replayed through the streaming decoder.
"""

from __future__ import annotations

import torch

from mizuoto_voxcpm.audiovae.base import AudioVAEBase
from mizuoto_voxcpm.audiovae.causal import CausalStreamState

__all__ = ["StreamingDecoder"]


class StreamingDecoder:
    """Decodes consecutive latent chunks of one utterance, carrying each convolution's context.

    Usable as a context manager (``with vae.streaming_decoder() as decoder:``), which resets
    the state on entry and exit as upstream does.
    """

    def __init__(self, vae: AudioVAEBase) -> None:
        # an AudioVAE or AudioVAEV2 (whose ``decode`` takes ``stream``); named by their base, as
        # AudioVAEV2 imports this module
        self.vae = vae
        self.state = CausalStreamState()

    def __enter__(self) -> StreamingDecoder:
        self.reset()
        return self

    def __exit__(self, *exc: object) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget all context: the next chunk is decoded as the start of an utterance."""
        self.state.reset()

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """Audio ``(B, 1, frames * decode_hop_length)`` for the next ``(B, latent_dim, frames)``."""
        return self.vae.decode(latents, stream=self.state)
