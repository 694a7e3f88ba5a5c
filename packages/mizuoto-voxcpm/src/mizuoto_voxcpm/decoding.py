"""Latent patches to waveform: whole utterances and per-patch streaming, per generation.

The VAE runs in float32 (latents are cast from the model dtype first, as upstream), its
decoder in bfloat16 only in a fast profile that says so (:mod:`mizuoto_voxcpm.fast`): latents
are cast to the decoder's dtype and its audio back to float32.
A whole utterance that runs out of memory in the VAE is decoded in tiles of
``VAE_TILE_FRAMES`` latent frames (``compute.oom_fallback``); a stream decodes one patch at a
time and needs no fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from mizuoto.nn.dsp.tiles import decode_or_tile
from mizuoto.runtime.prepack_conv_transpose import BATCH_PROOF_COLUMNS, proving_conv_transposes
from mizuoto_voxcpm.audiovae.blocks import NoiseBlock

# The first generation decodes the last three patches for each streamed segment and, without
# streaming, drops two patches of prompt context whenever there is prompt audio.
V1_STREAM_WINDOW = 3
# Latent frames per tile of the out-of-memory fallback: 10.24 s (all generations: 25 Hz).
VAE_TILE_FRAMES = 256
# what Applied.fallbacks lists when an utterance was decoded in tiles
VAE_TILED = "vae_tiled"


def vae_tile_overlap(vae) -> int:
    """Latent frames shared by neighbouring tiles: four times the decoder's receptive field.

    The crossfade (``mizuoto.nn.dsp.tiles``) takes the first quarter of the shared frames from
    the earlier tile and blends from there on; both decoders are causal, so a later tile's
    samples are exact (up to rounding) once it has decoded ``decoder_receptive_field`` frames
    (19 to 21 for the released strides: overlaps of 76 to 84 frames).
    """
    return min(4 * vae.decoder_receptive_field, VAE_TILE_FRAMES // 2)


def patches_to_latents(patches: torch.Tensor) -> torch.Tensor:
    """``(b, t, patch, d)`` -> ``(b, d, t·patch)`` float32 VAE input."""
    b, t, p, d = patches.shape
    return patches.permute(0, 3, 1, 2).reshape(b, d, t * p).to(torch.float32)


@torch.inference_mode()
def decode_utterance(vae, patches: torch.Tensor, *, context: int, v2: bool, patch_size: int,
                     fallbacks: list[str], oom_fallback: bool = True,
                     tiled: bool = False) -> torch.Tensor:
    """Decode context + new patches; drop the context's audio. Returns ``(samples,)`` float32.

    In tiles (``vae_tile_overlap``) when ``tiled`` or, with ``oom_fallback``, when the whole
    utterance runs out of memory; then ``"vae_tiled"`` is added to ``fallbacks``. Without
    ``oom_fallback`` the out-of-memory error propagates unchanged.
    """
    audio, in_tiles = decode_or_tile(
        vae.decode, _decoder_input(vae, patches_to_latents(patches)), tile=VAE_TILE_FRAMES,
        overlap=vae_tile_overlap(vae), hop=vae.decode_hop_length, oom_fallback=oom_fallback,
        force_tiles=tiled)
    if in_tiles and VAE_TILED not in fallbacks:
        fallbacks.append(VAE_TILED)
    if v2:
        # VoxCPM2 drops exactly the decoded context patches (the prompt's last min(3, n))
        drop = patch_size * vae.decode_hop_length * context
    else:
        # upstream quirk: two patches are dropped whenever there is prompt audio, even when the
        # prompt had only one patch of context
        drop = patch_size * vae.hop_length * (V1_STREAM_WINDOW - 1) if context > 0 else 0
    return audio[..., drop:].reshape(-1).float().cpu()


class StreamDecoder:
    """One stream's decoding state: each new patch ``(1, patch, d)``, in order, to its waveform
    segment, as upstream streams. It decodes the patch it is given and nothing later, so a
    stream yields each segment as soon as its patch is sampled.

    VoxCPM2 feeds each patch to the stateful causal decoder (prompt context is not decoded);
    the first generation re-decodes the last three patches (context included) and keeps the
    newest patch's samples. Patches of several streams can be decoded in one VAE call
    (:func:`decode_segments`). With ``tail`` (a fast profile's, never exact: see
    :func:`can_decode_tails`) a first-generation window computes only what its newest patch's
    samples depend on (``AudioVAE.decode_tail``), as a batch of streams does.
    """

    def __init__(self, vae, *, context: list[torch.Tensor], v2: bool, patch_size: int,
                 tail: bool = False) -> None:
        self.vae = vae
        self.v2 = v2
        self.tail = tail and can_decode_tails(vae, v2=v2)
        if v2:
            self._streaming = vae.streaming_decoder()
            self._streaming.reset()
        else:
            self._window = [p if p.dim() == 4 else p.unsqueeze(1) for p in context]
            self.keep = patch_size * vae.hop_length

    def latents(self, patch: torch.Tensor) -> torch.Tensor:
        """What the VAE decodes for ``patch``: ``(1, d, frames)`` float32 (the first
        generation: the window of the last three patches, ``patch`` the newest)."""
        if self.v2:
            return _decoder_input(self.vae, patches_to_latents(patch.unsqueeze(1)))
        self._window.append(patch.unsqueeze(1))
        del self._window[:-V1_STREAM_WINDOW]
        return _decoder_input(self.vae, patches_to_latents(torch.cat(self._window, dim=1)))

    def segment(self, audio: torch.Tensor) -> torch.Tensor:
        """The newest patch's samples of the VAE's output ``(1, 1, samples)``."""
        if self.v2:
            return audio.reshape(-1).float().cpu()
        return audio[..., -self.keep:].reshape(-1).float().cpu()

    def window_segment(self, latents: torch.Tensor) -> torch.Tensor:
        """The newest patch's samples of a first-generation window: the whole window decoded
        (upstream's bits), or with ``tail`` only what those samples depend on."""
        if self.tail:
            return self.vae.decode_tail(latents, self.keep).reshape(-1).float().cpu()
        return self.segment(self.vae.decode(latents))

    @torch.inference_mode()
    def decode(self, patch: torch.Tensor) -> torch.Tensor:
        latents = self.latents(patch)
        if self.v2:
            return self.segment(self._streaming.decode_chunk(latents))
        return self.window_segment(latents)

    def close(self) -> None:
        if self.v2:
            self._streaming.reset()


@torch.inference_mode()
def decode_segments(decoders: list[StreamDecoder], patches: list[torch.Tensor]
                    ) -> list[torch.Tensor]:
    """The next segment of each stream (``decoders[i]`` gets ``patches[i]``), for the
    continuous batcher. First-generation windows of one length go through the VAE as one batch,
    and only the newest patch's samples are computed (``AudioVAE.decode_tail``; the window's
    first two patches are context whose audio upstream throws away); a window alone is
    decoded as :meth:`StreamDecoder.decode` does. VoxCPM2's stateful decoders one by one. Both
    can differ from :meth:`StreamDecoder.decode` by float32 rounding (a batch's convolutions,
    fewer positions); see docs/performance.md. The VAE's transposed convolutions of a few
    columns (``BATCH_PROOF_COLUMNS``: the first upsampling) prove their packed weight for each
    batch size against ``F.conv_transpose1d`` at that batch (a row's bits stay the plain
    batch's, whatever its mates): at load (:func:`rehearse_stream_decode`), or on the first
    step that meets a shape the load did not."""
    segments: list[torch.Tensor | None] = [None] * len(decoders)
    groups: dict[int, list[tuple[int, torch.Tensor]]] = {}
    for index, (decoder, patch) in enumerate(zip(decoders, patches, strict=True)):
        if decoder.v2:
            segments[index] = decoder.decode(patch)
        else:
            latents = decoder.latents(patch)
            groups.setdefault(latents.size(-1), []).append((index, latents))
    for members in groups.values():
        first = decoders[members[0][0]]
        if len(members) == 1:  # alone: the stream's own decode, exactly
            segments[members[0][0]] = first.window_segment(members[0][1])
            continue
        # at a batch's few frames torch reorders the first upsampling's whole weight on every
        # call (VoxCPM-0.5B's: 75 MB a step); proven once per batch size, then skipped
        with proving_conv_transposes(max_columns=BATCH_PROOF_COLUMNS):
            audio = first.vae.decode_tail(torch.cat([latents for _, latents in members]),
                                          first.keep)
        for row, (index, _) in enumerate(members):
            segments[index] = audio[row].reshape(-1).float().cpu()
    return segments


def can_decode_tails(vae, *, v2: bool) -> bool:
    """Whether a stream of ``vae`` can decode only its newest patch's samples: the first
    generation's re-decoded windows (VoxCPM2's causal chunks decode nothing twice) without
    noise blocks (a shorter decode would draw other noise). A 3-patch window of VoxCPM-0.5B's
    VAE: 0.62-0.69 of the whole window's time, the same samples up to float rounding (equal
    on an AMD EPYC, 1 thread)."""
    return not v2 and not any(isinstance(m, NoiseBlock) for m in vae.modules())


@contextmanager
def segment_decoder(vae, *, context: list[torch.Tensor], v2: bool, patch_size: int,
                    tail: bool = False) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """A function from each new patch ``(1, patch, d)``, in order, to its waveform segment
    (:class:`StreamDecoder`, reset on exit as upstream's ``streaming_decode()`` block)."""
    decoder = StreamDecoder(vae, context=context, v2=v2, patch_size=patch_size, tail=tail)
    try:
        yield decoder.decode
    finally:
        decoder.close()


@torch.inference_mode()
def rehearse_stream_decode(vae, *, v2: bool, patch_size: int, feat_dim: int,
                           tail: bool = False, max_batch: int = 1) -> None:
    """Decode random patches as a stream does, inside
    :func:`~mizuoto.runtime.prepack_conv_transpose.proving_conv_transposes`, so that the VAE's
    transposed convolutions prove their packed weight for exactly a stream's shapes while the
    model loads: the first generation's windows of one, two and three patches (a zero-shot
    stream's first two patches have less context; each later one, and every patch of a cloned
    voice's stream, the full window), VoxCPM2's chunk (the causal state pads its first chunk
    to the shape of the later ones). With ``max_batch`` above 1, also what
    :func:`decode_segments` proves on a batch's first step: each batch size's windows of one,
    two and three patches (those of at most ``BATCH_PROOF_COLUMNS`` columns prove), so that no
    listener of the first batches waits for a proof. A whole
    utterance's decode (any other length) stays plain."""
    generator = torch.Generator().manual_seed(0)
    device = _device(vae)
    with proving_conv_transposes(), segment_decoder(vae, context=[], v2=v2,
                                                    patch_size=patch_size, tail=tail) as decode:
        for _ in range(1 if v2 else V1_STREAM_WINDOW):
            decode(torch.randn(1, patch_size, feat_dim, generator=generator).to(device))
    if max_batch < 2 or not can_decode_tails(vae, v2=v2):
        return  # VoxCPM2's stateful decoders, and a VAE with noise, are not batched
    keep = patch_size * vae.hop_length
    with proving_conv_transposes(max_columns=BATCH_PROOF_COLUMNS):
        for rows in range(2, max_batch + 1):
            for patches in range(1, V1_STREAM_WINDOW + 1):
                latents = torch.randn(rows, feat_dim, patches * patch_size, generator=generator)
                vae.decode_tail(_decoder_input(vae, latents), keep)


def _device(vae) -> torch.device:
    return next(vae.parameters()).device


def _decoder_input(vae, latents: torch.Tensor) -> torch.Tensor:
    """``latents`` on the VAE's device in its decoder's dtype (float32 but in a fast profile)."""
    weight = next(vae.decoder.parameters())
    return latents.to(weight.device, weight.dtype)
