"""Prepacked transposed convolutions (``compute.prepack``): a ``ConvTranspose1d``'s weight
reordered once into oneDNN's blocked layout, used only for input shapes where that gives the
very bits ``F.conv_transpose1d`` gives.

``F.conv_transpose1d`` on the CPU in float32 runs oneDNN's deconvolution for all but small
inputs and reorders the weight on every call: for an upsampling layer of an audio decoder at a
streaming chunk's few frames the reorder is most of the call (VoxCPM1.5's first layer, 117 MB
of weight at 12 frames: 60 ms plain, 6.4 ms packed, two threads). The packed call
(``torch.ops.mkldnn._convolution_transpose_pointwise`` on a
``_reorder_convolution_transpose_weight``) is the same primitive without that reorder where
torch's plain call runs oneDNN at all; for small inputs torch takes its own native kernel, which
sums in another order. Which one torch takes depends on the shape and the thread count.

So nothing is assumed, as for the linear layers (:mod:`mizuoto.runtime.prepack`): a layer packs
only inside :func:`proving_conv_transposes` (an engine's load rehearses the fixed shapes of its
streaming decode there), for one input shape and thread count at a time, and only after the
packed call gave ``torch.equal`` results against ``F.conv_transpose1d`` on that layer's weight,
on the input itself and on a random one. Every other shape, thread count, dtype, device, a
changed weight or a call that records gradients runs ``F.conv_transpose1d``; so does every call
outside a proven shape: a whole utterance's varying length never pays a proof.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "PrepackedConvTranspose1d",
    "conv_transpose_report",
    "has_packable_conv_transposes",
    "prepack_conv_transposes",
    "proving_conv_transposes",
]

log = logging.getLogger(__name__)

_proving: contextvars.ContextVar[bool] = contextvars.ContextVar("proving_conv_transposes",
                                                                default=False)


@contextlib.contextmanager
def proving_conv_transposes() -> Iterator[None]:
    """Within this block a :class:`PrepackedConvTranspose1d` that meets a shape it has not
    tried proves (or rejects) its packed kernel for it; outside, unproven shapes run plain."""
    token = _proving.set(True)
    try:
        yield
    finally:
        _proving.reset(token)


class PrepackedConvTranspose1d(nn.ConvTranspose1d):
    """An ``nn.ConvTranspose1d`` (same parameters, same state dict) that runs a packed copy
    of its weight for the input shapes proven bit-identical to ``F.conv_transpose1d``.

    A subclass of ``nn.ConvTranspose1d`` whose ``forward`` calls ``super().forward`` keeps its
    own forward: :func:`prepack_conv_transposes` puts this class between it and
    ``nn.ConvTranspose1d``.
    """

    _packs: dict[tuple, torch.Tensor]  # (shape, threads) -> packed weight, proven
    _tried: set[tuple]
    _stamp: tuple | None

    def _init_prepack(self) -> None:
        self._packs, self._tried, self._stamp = {}, set(), None

    @property
    def prepacked(self) -> bool:
        """Whether this layer holds a packed weight proven for some input shape."""
        return bool(self._packs)

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        weight = self.weight
        if (output_size is not None or input.dim() != 3 or input.device.type != "cpu"
                or input.dtype != torch.float32 or weight.dtype != torch.float32
                or (torch.is_grad_enabled() and (weight.requires_grad or input.requires_grad))):
            return super().forward(input, output_size)
        if self._stamp is not None and self._stamp != _stamp(weight):  # changed or moved
            self._init_prepack()
        key = (tuple(input.shape), input.is_contiguous(), torch.get_num_threads())
        packed = self._packs.get(key)
        if packed is None:
            if not _proving.get() or key in self._tried:
                return super().forward(input, output_size)
            packed = self._prove(key, input)
            if packed is None:
                return super().forward(input, output_size)
        return self._run(packed, input)

    def _arguments(self) -> tuple:
        # the 2-d form torch itself runs a 1-d convolution in (a unit height in front)
        return ([0, self.padding[0]], [0, self.output_padding[0]], [1, self.stride[0]],
                [1, self.dilation[0]], self.groups)

    def _run(self, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        padding, output_padding, stride, dilation, groups = self._arguments()
        out = torch.ops.mkldnn._convolution_transpose_pointwise(
            x.unsqueeze(2), packed, self.bias, padding, output_padding, stride, dilation,
            groups, "none", [], None)
        return out.squeeze(2)

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)

    def _prove(self, key: tuple, x: torch.Tensor) -> torch.Tensor | None:
        self._tried.add(key)
        padding, output_padding, stride, dilation, groups = self._arguments()
        try:
            packed = torch.ops.mkldnn._reorder_convolution_transpose_weight(
                self.weight.detach().unsqueeze(2), padding, output_padding, stride, dilation,
                groups, [x.shape[0], x.shape[1], 1, x.shape[2]])
            generator = torch.Generator().manual_seed(x.shape[-1])
            probe = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
            probe.copy_(torch.randn(x.size(), generator=generator))
            same = all(torch.equal(self._run(packed, trial), self._plain(trial))
                       for trial in (x, probe))
        except (RuntimeError, NotImplementedError) as exc:
            log.debug("prepacked conv-transpose refused for %s: %s", key, exc)
            return None
        if not same:
            log.debug("prepacked conv-transpose differs from F.conv_transpose1d for %s", key)
            return None
        self._packs[key] = packed
        self._stamp = _stamp(self.weight)
        return packed


def _stamp(weight: torch.Tensor) -> tuple:
    return weight._version, weight.data_ptr(), weight.dtype


Groups = Mapping[str, Iterable[nn.Module]]


def _conv_transposes(roots: Iterable[nn.Module]) -> Iterator[nn.Module]:
    for root in roots:
        yield from (m for m in root.modules() if isinstance(m, nn.ConvTranspose1d))


_subclasses: dict[type, type] = {}


def _prepacked_class(cls: type) -> type:
    if cls is nn.ConvTranspose1d:
        return PrepackedConvTranspose1d
    if cls not in _subclasses:
        # cls's own forward first; its super().forward() then reaches the packed one
        _subclasses[cls] = type(f"Prepacked{cls.__name__}", (cls, PrepackedConvTranspose1d),
                                {"__module__": cls.__module__})
    return _subclasses[cls]


def prepack_conv_transposes(modules: Groups, mode: str = "auto") -> None:
    """Make every ``nn.ConvTranspose1d`` under each of ``modules`` (a group name -> its
    modules) a :class:`PrepackedConvTranspose1d` in place (``mode="auto"``; ``"off"`` changes
    nothing). Nothing packs until a shape is proven in :func:`proving_conv_transposes`."""
    if mode == "off":
        return
    for roots in modules.values():
        for module in _conv_transposes(roots):
            if not isinstance(module, PrepackedConvTranspose1d):
                module.__class__ = _prepacked_class(type(module))
                module._init_prepack()


def has_packable_conv_transposes(modules: Groups) -> bool:
    """Whether any layer under ``modules`` is a float32 :class:`PrepackedConvTranspose1d` on
    the CPU and torch has oneDNN here: where none is, a rehearsal to prove shapes is wasted."""
    if not torch.backends.mkldnn.is_available():
        return False
    return any(isinstance(m, PrepackedConvTranspose1d) and m.weight.device.type == "cpu"
               and m.weight.dtype == torch.float32
               for roots in modules.values() for m in _conv_transposes(roots))


def conv_transpose_report(modules: Groups) -> dict[str, Any]:
    """Per group, how many transposed convolutions hold a proven packed weight
    (``"onednn"``) and how many run ``F.conv_transpose1d`` only (``"plain"``)."""
    groups: dict[str, Any] = {}
    for name, roots in modules.items():
        kernels: dict[str, int] = {}
        for module in _conv_transposes(roots):
            kernel = "onednn" if getattr(module, "prepacked", False) else "plain"
            kernels[kernel] = kernels.get(kernel, 0) + 1
        if kernels:
            groups[name] = dict(sorted(kernels.items()))
    return groups
