"""One patch of VoxCPM generation on fixed tensors, with one wait for the device per patch.

A patch is: the local DiT's guided Euler steps from fresh noise, the stop head on the LM state
the patch was sampled from, the local encoder on the new patch and one step of each LM. All of
it reads and writes the same :class:`PatchBuffers` every patch, so it can also be replayed as a
CUDA graph (:mod:`mizuoto_voxcpm.patch_graphs`).

Upstream reads the stop flag (``.cpu().item()``) before stepping the LMs and creates each
step's position tensor on the host (two more transfers). Here the LMs step before the flag is
read, and reading it is the only time the host waits: when it says stop, that step is
discarded (:meth:`CacheSlot.rewind`; its keys and values stay behind the attention mask until
the next prefill overwrites them). The values are the same either way: the extra step feeds
nothing that was already decided. On the CPU, where reading the flag costs no wait, the LMs
step after the patch is handed on instead, as upstream orders it: a stream's first chunk then
does not wait for an LM step, and no step is thrown away.
"""

from __future__ import annotations

import attrs
import torch

from mizuoto_voxcpm.cache_pool import CacheSlot
from mizuoto_voxcpm.model import VoxCPMModel


@attrs.define
class PatchBuffers:
    """The fixed tensors one patch reads and writes (each patch overwrites them in place)."""

    lm_hidden: torch.Tensor  # (1, hidden): the LM state the next patch is sampled from
    residual_hidden: torch.Tensor  # (1, hidden)
    previous: torch.Tensor  # (1, patch_size, feat_dim): the DiT's prefix condition
    patch: torch.Tensor  # (1, patch_size, feat_dim): the patch just sampled
    stop: torch.Tensor  # (1,) bool: the stop head's verdict on the state ``patch`` came from

    @classmethod
    def allocate(cls, model: VoxCPMModel) -> PatchBuffers:
        hidden = model.config.lm.hidden_size
        kwargs = dict(device=model.device, dtype=model.dtype)
        return cls(lm_hidden=torch.zeros(1, hidden, **kwargs),
                   residual_hidden=torch.zeros(1, hidden, **kwargs),
                   previous=torch.zeros(1, model.patch_size, model.feat_dim, **kwargs),
                   patch=torch.zeros(1, model.patch_size, model.feat_dim, **kwargs),
                   stop=torch.zeros(1, dtype=torch.bool, device=model.device))

    def start(self, lm_hidden: torch.Tensor, residual_hidden: torch.Tensor,
              previous: torch.Tensor) -> None:
        """Load the prefill's last states and the prompt's last patch."""
        self.lm_hidden.copy_(lm_hidden)
        self.residual_hidden.copy_(residual_hidden)
        self.previous.copy_(previous)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.lm_hidden, self.residual_hidden, self.previous, self.patch, self.stop)


def decode_patch(model: VoxCPMModel, buffers: PatchBuffers, slot: CacheSlot, *, steps: int,
                 guidance: float, generator: torch.Generator, step_lms: bool = True
                 ) -> torch.Tensor:
    """Sample one patch into ``buffers`` and (``step_lms``) feed it to both LMs (caches in
    ``slot``); return it.

    Nothing here waits for the device: no ``.item()``, no host tensors. The noise is one
    ``randn`` in the model dtype from ``generator``, as upstream's single draw per patch.
    """
    shape = (1, model.feat_dim, model.patch_size)
    noise = torch.randn(shape, generator=generator, device=model.device, dtype=model.dtype)
    patch = model.sample(buffers.lm_hidden, buffers.residual_hidden, buffers.previous, noise,
                         steps=steps, guidance=guidance)
    buffers.stop.copy_(model.stop_flag(buffers.lm_hidden))
    buffers.patch.copy_(patch)
    buffers.previous.copy_(patch)
    if step_lms:
        step_language_models(model, buffers, patch, slot)
    return patch


def step_language_models(model: VoxCPMModel, buffers: PatchBuffers, patch: torch.Tensor,
                         slot: CacheSlot) -> None:
    """Feed ``patch`` through the local encoder to both LMs; their new states go to
    ``buffers`` (the states the next patch is sampled from)."""
    embed = model.encode_patches(patch.unsqueeze(1))[:, 0]
    lm_hidden, residual_hidden = model.advance(embed, slot)
    buffers.lm_hidden.copy_(lm_hidden)
    buffers.residual_hidden.copy_(residual_hidden)


@torch.inference_mode()
def rehearse_patches(model: VoxCPMModel, patches: int = 1) -> None:
    """Decode ``patches`` patches from random states in the model's own cache slot, then put the slot
    back, so that every prepacked linear layer proves (or rejects) its packed kernel for the
    row counts and input layouts of a single stream's decode (:mod:`mizuoto.runtime.prepack`)
    while the model loads instead of on a request's first patch. Two steps: the first is
    CFG-zero*'s zero velocity, the second one guided evaluation of the DiT. Other row counts
    (continuous batching) and thread counts still prove on first use. Two patches where the
    LMs' steps are traced, so that their trace (one for every position) is confirmed at its
    second position while loading too (:meth:`mizuoto_voxcpm.minicpm4.MiniCPM4.trace_steps`);
    one does for the packed kernels alone."""
    generator = torch.Generator(device=model.device).manual_seed(0)
    buffers = PatchBuffers.allocate(model)
    for tensor in buffers.tensors()[:3]:
        tensor.copy_(torch.randn(tensor.shape, generator=generator, device=model.device))
    for _ in range(patches):
        decode_patch(model, buffers, model.caches, steps=2, guidance=2.0,
                     generator=generator)
    # the next prefill writes over the steps' keys and values (KVCache.fill zeroes the rest)
    for _ in range(patches):
        model.caches.rewind()
