"""One packed product for several prepacked layers that read the same input (a decoder
layer's q/k/v, its gate/up), used only where it gives each layer's very bits.

Each output of ``F.linear`` is one dot product; whether a kernel sums it in the same order over
a weight of more rows (the layers' weights concatenated) is, again, the CPU's, the dtype's, the
shape's, the row count's and the thread count's business. So, as
:class:`~mizuoto.runtime.prepack.PrepackedLinear` does for one layer, nothing is assumed: at
each small row count, thread count and input layout, the concatenated weight is packed for
the kernels of :data:`~mizuoto.runtime.prepack.KERNELS` in turn, and the first whose output,
split, is ``torch.equal`` to each layer's ``F.linear`` on the input and on random probes runs
that combination from then on; a combination none passes runs the layers one by one (each
with its own proven kernel), as does anything else (gradients, another dtype, a weight
changed in place or a layer replaced, e.g. by a LoRA). A prefill's long input runs fused only
through a kernel whose rows do not depend on their count (``bf16dot``: proven once, with
longer rows than a step's, when its first step is proven), else layer by layer.

Measured at VoxCPM-0.5B's shapes on an AMD EPYC with AVX512-BF16, torch 2.14.1
(``benchmarks/cpu/fused_products.py``; paired ratios fused / separate, machine load 3-5):
bfloat16 (oneDNN) is proven at 1 and 8 rows, 0.86-0.91 of the separate products' time at
1 row on 1 thread, 0.35-0.58 on 2 threads (one parallel region instead of three, on a
loaded machine); float32 at 1 row is proven only with ``F.linear`` itself (MKL's GEMV,
0.97-0.98 on 1 thread: no gain), at 8 rows with MKL's packed GEMM (0.97-0.99).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime import prepack
from mizuoto.runtime.prepack import PrepackedLinear
from mizuoto.runtime.weight_stamp import weight_stamp

_PROBES = 2
# (kernel, out sizes, in, bias, dtype, rows, threads, dims, contiguous) -> proven
_proven: dict[tuple, bool] = {}


class FusedPrepack:
    """``layers`` (:class:`PrepackedLinear`, one input size) as one packed product where it is
    proven to give their bits (module docstring). Call it with the layers as they are now
    (the owner's attributes: a layer replaced since runs on its own); it returns one output
    per layer. Not a module: it holds no parameters, the layers stay where they are (state
    dict, LoRA, training unchanged)."""

    @classmethod
    def over(cls, layers: Sequence[nn.Module]) -> FusedPrepack | None:
        """One for ``layers`` where each is a :class:`PrepackedLinear` (None elsewhere: a
        layer left plain, e.g. inside a compiled module, or prepacking off)."""
        if all(type(layer) is PrepackedLinear for layer in layers):
            return cls(layers)
        return None

    def __init__(self, layers: Sequence[nn.Linear]) -> None:
        if len({layer.in_features for layer in layers}) != 1:
            raise ValueError("fused layers must read one input size")
        self.layers = tuple(layers)
        self.split_sizes = tuple(layer.out_features for layer in layers)
        self._max_rows = min(getattr(layer, "_max_rows", 0) for layer in layers)
        # kernel, packed, weight (or its shape), bias, the weights' stamps, rows packed for
        self._pack: tuple | None = None
        self._rows_ok: set[tuple] = set()
        self._rows_tried: set[tuple] = set()
        self._pack_lock = threading.Lock()

    @property
    def kernel(self) -> str | None:
        """The packed kernel the fused product has run (``None``: the layers one by one)."""
        return self._pack[0] if self._pack is not None and self._rows_ok else None

    def __call__(self, x: torch.Tensor, layers: Sequence[nn.Module]) -> tuple[torch.Tensor, ...]:
        if not self._eligible(x, layers):
            return tuple(layer(x) for layer in layers)
        stamps = tuple(weight_stamp(layer.weight) for layer in layers)
        if self._pack is not None and self._pack[4] != stamps:  # a weight changed or moved
            self._pack, self._rows_ok, self._rows_tried = None, set(), set()
        rows = x.numel() // x.shape[-1]
        threads, contiguous = torch.get_num_threads(), x.is_contiguous()
        if rows <= self._max_rows:
            key = (rows, threads, x.dim(), contiguous)
        elif self.kernel in prepack.ROW_INVARIANT:
            # a prefill, through a kernel whose rows do not depend on their count: one proof
            # for every longer input of this layout, as a prepacked layer's (at load, below)
            key = (prepack.MANY_ROWS, threads, 2 if contiguous else x.dim(), contiguous)
        else:
            return tuple(layer(x) for layer in layers)
        if key not in self._rows_ok:
            if key not in self._rows_tried:
                with self._pack_lock:
                    self._try(key, x)
            if key not in self._rows_ok:
                return tuple(layer(x) for layer in layers)
        out = self._run(self._pack, x, rows)
        return out.split(self.split_sizes, dim=-1)

    def _eligible(self, x: torch.Tensor, layers: Sequence[nn.Module]) -> bool:
        if len(layers) != len(self.layers) or any(
                a is not b or type(a) is not PrepackedLinear
                for a, b in zip(layers, self.layers, strict=True)):
            return False
        weight = layers[0].weight
        if (x.dim() < 2 or x.device.type != "cpu" or x.numel() == 0
                or any(layer.weight.dtype != x.dtype or layer.weight.device != weight.device
                       for layer in layers)
                or (torch.is_grad_enabled() and (x.requires_grad or any(
                    layer.weight.requires_grad for layer in layers)))):
            return False
        return True

    def _fused_bias(self) -> torch.Tensor | None:
        biases = [layer.bias for layer in self.layers]
        if all(bias is None for bias in biases):
            return None
        return torch.cat([bias.detach() if bias is not None else
                          torch.zeros(layer.out_features, dtype=layer.weight.dtype)
                          for bias, layer in zip(biases, self.layers, strict=True)])

    def _run(self, pack, x: torch.Tensor, rows: int) -> torch.Tensor:
        kernel, packed, weight, bias, _, _ = pack
        flat = x.reshape(rows, x.shape[-1]).contiguous()
        out = prepack.KERNELS[kernel][1](flat, packed, weight, bias, rows)
        return out.view(*x.shape[:-1], sum(self.split_sizes))

    def _try(self, key: tuple, x: torch.Tensor) -> None:
        """Prove (or reject) a fused kernel for ``key``: the current pack's if there is one,
        else each kernel in turn, on ``x`` and random inputs laid out as ``x``."""
        if key in self._rows_ok or key in self._rows_tried:
            return
        self._rows_tried.add(key)
        layers = self.layers
        candidates = [self._pack[0]] if self._pack is not None else list(prepack.KERNELS)
        if key[0] == prepack.MANY_ROWS:
            candidates = [k for k in candidates if k in prepack.ROW_INVARIANT]
            if key[3]:  # longer random rows than max_rows prove every longer input
                inputs = tuple(prepack._probes(torch.empty(
                    self._max_rows + 1, x.shape[-1], dtype=x.dtype), count=1))
            else:
                inputs = (x, *prepack._probes(x, count=1))
        else:
            inputs = (x, *prepack._probes(x, count=_PROBES))
        rows = inputs[0].numel() // inputs[0].shape[-1]
        with torch.no_grad():
            expected = [[F.linear(probe, layer.weight, layer.bias) for layer in layers]
                        for probe in inputs]
            for kernel in candidates:
                pack_fn, _, any_rows = prepack.KERNELS[kernel]
                if self._pack is not None and not any_rows and self._pack[5] != rows:
                    continue  # packed for another row count
                proof = (kernel, self.split_sizes, x.shape[-1],
                         any(layer.bias is not None for layer in layers),
                         x.dtype, *key)

                def attempt(kernel=kernel, pack_fn=pack_fn):
                    pack = self._pack or self._new_pack(kernel, pack_fn, rows)
                    same = all(
                        all(torch.equal(a, b) for a, b in zip(
                            self._run(pack, probe, rows).split(self.split_sizes, dim=-1),
                            reference, strict=True))
                        for probe, reference in zip(inputs, expected, strict=True))
                    return pack if same else None

                pack = prepack.prove(_proven, proof, attempt)
                if pack is not None:
                    self._pack = pack
                    self._rows_ok.add(key)
                    for layer in layers:
                        layer._fused_kernel = kernel
                    if (kernel in prepack.ROW_INVARIANT and key[0] != prepack.MANY_ROWS
                            and key[3]):
                        # a prefill's proof now (the load's rehearsal), not in the first
                        # request, whose prefill would run torch's own kernel meanwhile
                        self._try((prepack.MANY_ROWS, key[1], 2, True), x)
                    return

    def _new_pack(self, kernel: str, pack_fn, rows: int) -> tuple:
        weight = torch.cat([layer.weight.detach() for layer in self.layers])
        packed = pack_fn(weight, rows)
        if kernel != "mkl":
            # oneDNN's and bf16dot's products read only the weight's shape: the packed copy
            # alone is kept, not a second copy of the layers' weights
            weight = torch.zeros((), dtype=weight.dtype).expand(weight.shape)
        return (kernel, packed, weight, self._fused_bias(),
                tuple(weight_stamp(layer.weight) for layer in self.layers), rows)
