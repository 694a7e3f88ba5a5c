"""``compute.cuda_graphs``: one CUDA graph per patch, per (steps, guidance).

A patch launches a few hundred small kernels (ten guided DiT evaluations, the encoder, two LM
steps); on a GPU launching them costs more than running them. Captured once, a patch is one
graph launch. What makes the replay give the eager bits:

- every tensor a patch reads or writes is fixed: :class:`PatchBuffers`, the model's own cache
  slot (a request in another slot of the engine's pool runs eager),
  and the caches' device-side position (advanced inside the graph); the attention span is the
  whole cache (``attention="exact"`` on CUDA), so it does not change between replays;
- the DiT's noise comes from the graph's own generator, registered with the graph; before each
  replay it is loaded with the request generator's state and afterwards the advanced state is
  written back, so the request's random stream is the eager one, draw for draw.

Graphs live with the model's caches (``model.patch_graphs``) and are dropped with them when
the model is moved or cast (``VoxCPMModel._apply``), a LoRA is applied or removed, or the
engine is released.
"""

from __future__ import annotations

import logging

import torch

from mizuoto_voxcpm.model import VoxCPMModel
from mizuoto_voxcpm.patch_decoder import PatchBuffers, decode_patch

log = logging.getLogger(__name__)


class PatchGraphs:
    """The captured patches of one model on one CUDA device."""

    def __init__(self, model: VoxCPMModel) -> None:
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, not {model.device}")
        if model.caches.lm.attention != "exact":
            raise ValueError("CUDA graphs replay a fixed attention span: attention must be exact")
        self.model = model
        self.buffers = PatchBuffers.allocate(model)
        self.generator = torch.Generator(device=model.device)
        self._graphs: dict[tuple[int, float], torch.cuda.CUDAGraph] = {}
        self._pool = torch.cuda.graph_pool_handle()

    def decode_patch(self, *, steps: int, guidance: float,
                     generator: torch.Generator) -> torch.Tensor:
        """What :func:`decode_patch` does (LMs stepped), as one graph replay; returns a copy of
        the patch (the graph overwrites its output every replay)."""
        key = (steps, float(guidance))
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._capture(steps, float(guidance))
        # the host's half of the LM steps the graph takes on the device
        self.model.caches.lm.next_position()
        self.model.caches.residual.next_position()
        self.generator.set_state(generator.get_state())
        graph.replay()
        generator.set_state(self.generator.get_state())
        return self.buffers.patch.clone()

    def _capture(self, steps: int, guidance: float) -> torch.cuda.CUDAGraph:
        log.info("capturing a CUDA graph of one patch (%d steps, guidance %g)", steps, guidance)
        model, caches = self.model, (self.model.caches.lm, self.model.caches.residual)
        saved = [t.clone() for t in (*self.buffers.tensors(), *(c.position for c in caches))]
        lengths = [c.length for c in caches]

        def restore() -> None:
            targets = (*self.buffers.tensors(), *(c.position for c in caches))
            for target, value in zip(targets, saved, strict=True):
                target.copy_(value)
            for cache, length in zip(caches, lengths, strict=True):
                cache.length = length

        def run() -> None:
            decode_patch(model, self.buffers, model.caches, steps=steps, guidance=guidance,
                         generator=self.generator)

        # one eager run on a side stream first (cuBLAS handles, workspaces, the allocator), as
        # torch's capture recipe asks; it writes the cache at the next position, which the
        # first real replay overwrites, and everything else is put back
        side = torch.cuda.Stream(device=model.device)
        side.wait_stream(torch.cuda.current_stream(model.device))
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream(model.device).wait_stream(side)
        restore()
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)
        with torch.cuda.graph(graph, pool=self._pool):
            run()
        # capturing records kernels without running them, but the host claimed positions
        restore()
        return graph
