"""Prepacked transposed convolutions (``compute.prepack``): a ``ConvTranspose1d``'s weight
laid out once for the kernel that computes it fastest, used only for input shapes where that
gives the very bits ``F.conv_transpose1d`` gives.

``F.conv_transpose1d`` on the CPU in float32 takes one of two paths, by the input's size (and
the thread count):

- oneDNN's deconvolution (all but small inputs), which reorders the weight into oneDNN's
  blocked layout on every call: for an upsampling layer of an audio decoder at a streaming
  chunk's few frames the reorder is most of the call (VoxCPM1.5's first layer, 117 MB of
  weight at 12 frames: 60 ms plain, 6.4 ms packed, two threads). Kernel ``"onednn"``: the same
  primitive (``torch.ops.mkldnn._convolution_transpose_pointwise``) on a weight reordered once
  (``_reorder_convolution_transpose_weight``).
- torch's own ``slow_conv_transpose2d`` (small inputs): one matrix product of the transposed
  weight with the input, then ``col2im`` sums the overlapping columns, then the bias. It hands
  the weight to the BLAS transposed, which at a stream's 6 frames is 5x slower than the same
  product on a weight stored transposed (VoxCPM-0.5B's first layer: 42 ms, 8.6 ms). Kernel
  ``"gemm"``: ``torch.mm`` on that stored copy, ``F.fold`` (the same ``col2im``), the bias.

So nothing is assumed, as for the linear layers (:mod:`mizuoto.runtime.prepack`): a layer packs
only inside :func:`proving_conv_transposes` (an engine's load rehearses the fixed shapes of its
streaming decode there), for one input shape and thread count at a time, and only after a
kernel gave ``torch.equal`` results against ``F.conv_transpose1d`` on that layer's weight, on
the input itself and on a random one (``"onednn"`` tried first, then ``"gemm"``). Every other
shape, thread count, dtype, device, a changed weight or a call that records gradients runs
``F.conv_transpose1d``; so does every call outside a proven shape: a whole utterance's varying
length never pays a proof. A batch of several inputs is a shape like any other, proven at its
batch size (a batch of streams proves each size of few columns on the first step that meets
it: :func:`proving_conv_transposes`'s ``max_columns``); a oneDNN
pack proven for the same frames at another batch size is tried first, so one copy of the
weight serves them all.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime.weight_stamp import weight_stamp

__all__ = [
    "PrepackedConvTranspose1d",
    "conv_transpose_report",
    "has_packable_conv_transposes",
    "prepack_conv_transposes",
    "proving_conv_transposes",
]

log = logging.getLogger(__name__)

# the most columns (batch x frames) a shape met in proving_conv_transposes() proves for; 0: none
_proving: contextvars.ContextVar[float] = contextvars.ContextVar("proving_conv_transposes",
                                                                  default=0)

#: The most columns (batch × input frames) a batch of streams proves a shape for: there a
#: plain call is bound by reordering the whole weight; with more columns
#: ``F.conv_transpose1d`` costs about as much as a proof saves (VoxCPM-0.5B's second
#: upsampling at 8 streams' 240 columns).
BATCH_PROOF_COLUMNS = 64


@contextlib.contextmanager
def proving_conv_transposes(max_columns: float = math.inf) -> Iterator[None]:
    """Within this block a :class:`PrepackedConvTranspose1d` that meets a shape it has not
    tried, of at most ``max_columns`` columns (batch × frames), proves (or rejects) its packed
    kernel for it; outside, unproven shapes run plain.

    A batch of streams proves only a few columns (:data:`BATCH_PROOF_COLUMNS`) on the step that meets
    them: there torch's per-call reorder of the weight is most of the call, and a proof (two
    plain calls, two packed) costs little more than that; past them the arithmetic dominates
    and a proof would cost a step several calls' time for a small gain."""
    token = _proving.set(max_columns)
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

    _packs: dict[tuple, tuple[str, torch.Tensor]]  # (shape, threads) -> kernel, packed, proven
    _tried: set[tuple]
    _stamp: tuple | None
    _gemm_weight: torch.Tensor | None  # the weight stored transposed, shared by "gemm" shapes

    def _init_prepack(self) -> None:
        self._packs, self._tried, self._stamp, self._gemm_weight = {}, set(), None, None

    @property
    def prepacked(self) -> bool:
        """Whether this layer holds a packed weight proven for some input shape."""
        return bool(self._packs)

    @property
    def prepacked_kernels(self) -> set[str]:
        """The kernels proven for some input shape (``"onednn"``, ``"gemm"``)."""
        return {kernel for kernel, _ in self._packs.values()}

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        weight = self.weight
        if (output_size is not None or input.dim() != 3 or input.device.type != "cpu"
                or input.dtype != torch.float32 or weight.dtype != torch.float32
                or (torch.is_grad_enabled() and (weight.requires_grad or input.requires_grad))):
            return super().forward(input, output_size)
        if self._stamp is not None and self._stamp != weight_stamp(weight):  # changed or moved
            self._init_prepack()
        key = (tuple(input.shape), input.is_contiguous(), torch.get_num_threads())
        pack = self._packs.get(key)
        if pack is None:
            if key in self._tried or input.size(0) * input.size(-1) > _proving.get():
                return super().forward(input, output_size)
            # the proof's plain result for the input itself: the call's answer, proven or not
            return self._prove(key, input)
        return self._run(pack, input)

    def _arguments(self) -> tuple:
        # the 2-d form torch itself runs a 1-d convolution in (a unit height in front)
        return ([0, self.padding[0]], [0, self.output_padding[0]], [1, self.stride[0]],
                [1, self.dilation[0]], self.groups)

    def _run(self, pack: tuple[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        kernel, packed = pack
        if kernel == "gemm":
            return self._run_gemm(packed, x)
        padding, output_padding, stride, dilation, groups = self._arguments()
        out = torch.ops.mkldnn._convolution_transpose_pointwise(
            x.unsqueeze(2), packed, self.bias, padding, output_padding, stride, dilation,
            groups, "none", [], None)
        return out.squeeze(2)

    def _run_gemm(self, weight_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # slow_conv_transpose2d's steps: columns = W^T x per batch element, col2im, + bias
        x = x.contiguous()
        (kernel,), (stride,), (padding,) = self.kernel_size, self.stride, self.padding
        (dilation,), (output_padding,) = self.dilation, self.output_padding
        length = ((x.shape[-1] - 1) * stride - 2 * padding + dilation * (kernel - 1)
                  + output_padding + 1)
        columns = torch.stack([torch.mm(weight_t, row) for row in x.unbind(0)])
        out = F.fold(columns, output_size=(1, length), kernel_size=(1, kernel),
                     dilation=(1, dilation), padding=(0, padding), stride=(1, stride))
        out = out.squeeze(2)
        if self.bias is not None:
            out.add_(self.bias.reshape(-1, 1))
        return out

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)

    def _pack(self, kernel: str, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.detach()
        if kernel == "gemm":
            if self.groups != 1:
                raise NotImplementedError("the gemm kernel takes one group")
            if self._gemm_weight is None:
                self._gemm_weight = weight.reshape(weight.shape[0], -1).t().contiguous()
            return self._gemm_weight
        for (shape, contiguous, threads), (proven, packed) in self._packs.items():
            # the same frames at another batch size (a batch of streams): oneDNN lays the
            # weight out alike, so one copy serves every batch size (the proof still decides;
            # VoxCPM-0.5B's first upsampling: 75 MB, not 75 MB per batch size)
            if (proven == "onednn" and shape[1:] == x.shape[1:] and contiguous == x.is_contiguous()
                    and threads == torch.get_num_threads()):
                return packed
        padding, output_padding, stride, dilation, groups = self._arguments()
        return torch.ops.mkldnn._reorder_convolution_transpose_weight(
            weight.unsqueeze(2), padding, output_padding, stride, dilation, groups,
            [x.shape[0], x.shape[1], 1, x.shape[2]])

    def _prove(self, key: tuple, x: torch.Tensor) -> torch.Tensor:
        """Pack ``key``'s shape with the first kernel proven on ``x`` and a random probe (or
        none); ``F.conv_transpose1d`` of ``x``."""
        self._tried.add(key)
        generator = torch.Generator().manual_seed(x.shape[-1])
        probe = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
        probe.copy_(torch.randn(x.size(), generator=generator))
        expected = [self._plain(trial) for trial in (x, probe)]
        for kernel in KERNELS:
            try:
                pack = (kernel, self._pack(kernel, x))
                same = all(torch.equal(self._run(pack, trial), want)
                           for trial, want in zip((x, probe), expected, strict=True))
            except (RuntimeError, NotImplementedError) as exc:
                log.debug("prepacked conv-transpose %s refused for %s: %s", kernel, key, exc)
                continue
            if same:
                self._packs[key] = pack
                self._stamp = weight_stamp(self.weight)
                break
            log.debug("prepacked conv-transpose %s differs from F.conv_transpose1d for %s",
                      kernel, key)
        if not any(kernel == "gemm" for kernel, _ in self._packs.values()):
            self._gemm_weight = None  # not kept for nothing
        return expected[0]


#: the kernels a shape's proof tries, in this order
KERNELS = ("onednn", "gemm")


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
            # a layer with a kernel of its own (a fast profile's int8 one) is left alone
            if (not isinstance(module, PrepackedConvTranspose1d)
                    and getattr(module, "prepackable", True)):
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
    """Per group, how many transposed convolutions hold a proven packed weight, by kernel
    (``"onednn"``, ``"gemm"``; both where shapes differ: ``"onednn+gemm"``), and how many run
    ``F.conv_transpose1d`` only (``"plain"``)."""
    groups: dict[str, Any] = {}
    for name, roots in modules.items():
        kernels: dict[str, int] = {}
        for module in _conv_transposes(roots):
            proven = sorted(getattr(module, "prepacked_kernels", ()), reverse=True)
            kernel = "+".join(proven) if proven else "plain"
            kernels[kernel] = kernels.get(kernel, 0) + 1
        if kernels:
            groups[name] = dict(sorted(kernels.items()))
    return groups
