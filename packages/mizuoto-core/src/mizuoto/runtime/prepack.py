"""Prepacked linear weights (``compute.prepack``): a layer's weight reordered once into the
blocked layout a CPU matrix kernel streams fastest, used only where that gives the very bits
``F.linear`` gives.

``F.linear`` on the CPU repacks its weight on every call (MKL for float32, oneDNN for bfloat16
where the CPU has native bfloat16). Two kernels take a weight packed once: oneDNN's
(``torch.ops.mkldnn._linear_pointwise`` on a ``_reorder_linear_weight``; any row count) and
MKL's packed GEMM (``torch.ops.mkl._mkl_linear``; float32, one row count fixed when packing).
Whether either sums in the same order as ``F.linear`` depends on the CPU, the dtype, the shape,
the row count and the thread count: on an AMD EPYC (AVX2) oneDNN's float32 kernel differs from
MKL's at every row count and its bfloat16 reorder is refused, while MKL's packed GEMM matches
``F.linear`` from 3-4 rows up but not at 1 (``F.linear`` takes MKL's GEMV there). A third,
``bf16dot`` (:mod:`mizuoto.runtime.bf16_dot`), sums bfloat16 products in the order of torch's
own kernel for a CPU without native bfloat16 (AVX2), where neither of the others runs.

So nothing is assumed: a layer packs lazily, the first time it sees a small row count
(``MAX_ROWS`` at most, or its group's own limit: decode steps; a prefill keeps the plain
kernel), and only after the packed kernel gave ``torch.equal`` results against ``F.linear`` on
that layer's own weight for random inputs at that row count and thread count (a kernel that
sums in another order differs on random inputs at once). A combination that differs is remembered and never packed again.
Anything else (gradients, another dtype, a weight changed in place, another thread count not
yet proven) runs ``F.linear``. :func:`prepack_report` says, per module group, which kernel ran.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime import bf16_dot  # compiled on first use only, where it can run
from mizuoto.runtime.weight_stamp import weight_stamp

log = logging.getLogger(__name__)

#: The largest row count (tokens × batch flattened) a layer packs for: decode steps and the
#: local DiT/encoder's short sequences; longer inputs are prefills, where repacking per call
#: costs little against the product itself.
MAX_ROWS = 16
_PROBES = 2

# (kernel, out, in, bias, dtype, rows, threads) -> bool: whether the kernel matched F.linear
_proven: dict[tuple, bool] = {}
_lock = threading.Lock()


def _onednn_pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def _onednn_run(x, packed, weight, bias, rows):
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _mkl_pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if weight.dtype != torch.float32:
        raise RuntimeError("MKL's packed GEMM is float32 only")
    return torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)


def _mkl_run(x, packed, weight, bias, rows):
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


#: Kernels that compute each output row on its own, as torch's kernel they match does: proven
#: once for inputs longer than a layer's ``max_rows`` (the key ``MANY_ROWS``), they run every
#: such input (a prefill's row count changes with each text)
ROW_INVARIANT = frozenset({"bf16dot"})
MANY_ROWS = "many"

#: name -> (pack(weight, rows), run(x, packed, weight, bias, rows), covers every row count)
KERNELS: dict[str, tuple[Callable, Callable, bool]] = {
    "onednn": (_onednn_pack, _onednn_run, True),
    "mkl": (_mkl_pack, _mkl_run, False),
    # torch's own bfloat16 sums on an AVX2 CPU, 32 outputs and 3 rows at a time
    "bf16dot": (bf16_dot.pack, bf16_dot.run, True),
}


class PrepackedLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters, same state dict) that runs a packed copy of its
    weight at the row counts proven bit-identical to ``F.linear`` (module docstring)."""

    _pack: tuple[str, torch.Tensor, tuple, int] | None  # kernel, packed, weight stamp, rows
    _rows_ok: set[tuple]  # (rows, threads, input dims, contiguous) proven for the pack
    _rows_tried: set[tuple]
    _max_rows: int  # the largest row count this layer packs for

    def _init_prepack(self, max_rows: int = MAX_ROWS) -> None:
        self._max_rows = max_rows
        self._pack = None
        self._rows_ok = set()
        self._rows_tried = set()
        self._pack_lock = threading.Lock()

    @property
    def prepacked_kernel(self) -> str | None:
        """The packed kernel this layer has used, alone or fused with the layers that read
        its input (:mod:`mizuoto.runtime.prepack_fused`); ``None``: plain ``F.linear`` only."""
        if self._pack is not None:
            return self._pack[0]
        return getattr(self, "_fused_kernel", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (x.dim() < 2 or x.dtype != weight.dtype or x.device.type != "cpu"
                or (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))):
            return F.linear(x, weight, self.bias)
        rows = x.numel() // self.in_features
        if rows == 0:
            return F.linear(x, weight, self.bias)
        pack = self._pack
        if pack is not None and pack[2] != weight_stamp(weight):  # weight changed or moved
            self._drop()
            pack = None
        # F.linear's own path depends on the input's layout (a strided 3-d view is copied
        # differently from contiguous rows): proofs are per layout too
        layout = (torch.get_num_threads(), x.dim(), x.is_contiguous())
        if rows <= self._max_rows:
            key = (rows, *layout)
        elif pack is not None and pack[0] in ROW_INVARIANT:
            # a prefill: one proof for every longer input of this layout (contiguous rows
            # of any dimension are one: F.linear flattens them to the same product)
            key = (MANY_ROWS, layout[0], 2 if layout[2] else layout[1], layout[2])
        else:
            return F.linear(x, weight, self.bias)
        if key not in self._rows_ok:
            if key in self._rows_tried:
                return F.linear(x, weight, self.bias)
            with self._pack_lock:
                self._try(key, x)
            pack = self._pack
            if key not in self._rows_ok:
                return F.linear(x, weight, self.bias)
        return self._run(pack, x, rows)

    def _run(self, pack, x: torch.Tensor, rows: int) -> torch.Tensor:
        kernel, packed, _, _ = pack
        flat = x.reshape(rows, self.in_features).contiguous()
        out = KERNELS[kernel][1](flat, packed, self.weight, self.bias, rows)
        return out.view(*x.shape[:-1], self.out_features)

    def _drop(self) -> None:
        self._pack, self._rows_ok, self._rows_tried = None, set(), set()

    def _try(self, key: tuple, x: torch.Tensor) -> None:
        """Prove (or reject) a packed kernel for ``key`` (rows, threads and the layout of
        ``x``, the input about to run): the current pack's if there is one (it cannot be
        exchanged: one packed copy per layer), else each kernel in turn. The proof runs this
        layer's forward path and ``F.linear`` on ``x`` itself and on random inputs laid out
        as ``x``."""
        if key in self._rows_ok or key in self._rows_tried:
            return
        self._rows_tried.add(key)
        rows = x.numel() // self.in_features
        candidates = [self._pack[0]] if self._pack is not None else list(KERNELS)
        if key[0] == MANY_ROWS:
            candidates = [k for k in candidates if k in ROW_INVARIANT]
        for kernel in candidates:
            pack_fn, run, any_rows = KERNELS[kernel]
            if self._pack is not None and not any_rows and self._pack[3] != rows:
                continue  # packed for another row count
            proof = (kernel, self.out_features, self.in_features, self.bias is not None,
                     self.weight.dtype, *key)

            def attempt(kernel=kernel, pack_fn=pack_fn):
                if key[0] == MANY_ROWS and x.is_contiguous():
                    # the kernel's rows do not depend on their count: longer random rows than
                    # max_rows prove it for every longer input, at a fraction of a prefill's cost
                    inputs = _probes(torch.empty(self._max_rows + 1, self.in_features,
                                                 dtype=x.dtype), count=1)
                else:
                    inputs = (x, *_probes(x, count=1 if key[0] == MANY_ROWS else _PROBES))
                packed = self._pack[1] if self._pack is not None else pack_fn(self.weight, rows)
                same = all(torch.equal(
                    self._run((kernel, packed, None, 0), probe, probe.numel() // self.in_features),
                    F.linear(probe, self.weight, self.bias)) for probe in inputs)
                return packed if same else None

            packed = prove(_proven, proof, attempt)
            if packed is not None:
                if self._pack is None:
                    self._pack = (kernel, packed, weight_stamp(self.weight), rows)
                self._rows_ok.add(key)
                if kernel in ROW_INVARIANT and key[0] != MANY_ROWS and key[3]:
                    self._try((MANY_ROWS, key[1], 2, True), x)  # a prefill's, now
                return


def prove(proofs: dict[tuple, bool], proof: tuple, attempt: Callable[[], Any]) -> Any:
    """Run ``attempt`` for the combination ``proof`` unless it already failed, and remember
    the outcome in ``proofs``. ``attempt`` packs, runs the kernel on the probes and returns what
    to keep (the packed weight) where every output was ``torch.equal`` to the reference, else
    ``None``; a kernel that refuses the shape (``RuntimeError``) fails it. A combination that
    failed once is never tried again (a kernel's order of sums does not change while the
    process runs)."""
    if proofs.get(proof) is False:
        return None
    try:
        kept = attempt()
    except (RuntimeError, NotImplementedError) as exc:
        log.debug("prepack %s refused: %s", proof, exc)
        kept = None
    with _lock:
        proofs[proof] = proofs.get(proof, True) and kept is not None
    return kept


def _probes(x: torch.Tensor, count: int) -> list[torch.Tensor]:
    """``count`` random inputs with ``x``'s shape, strides and dtype (a generator of its own:
    probing never moves the request's random streams); one for a long input (a prefill's
    proof costs its products)."""
    rows = x.numel() // x.shape[-1]
    generator = torch.Generator().manual_seed(rows)
    probes = []
    for _ in range(count):
        probe = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype)
        probe.copy_(torch.randn(x.size(), generator=generator))
        probes.append(probe)
    return probes


Groups = Mapping[str, Iterable[nn.Module]]


def _linears(roots: Iterable[nn.Module]) -> Iterable[nn.Module]:
    for root in roots:
        yield from (m for m in root.modules() if isinstance(m, nn.Linear))


def prepack_linears(modules: Groups, mode: str = "auto", *, skip: Iterable[nn.Module] = (),
                    max_rows: Mapping[str, int] | None = None) -> None:
    """Turn every ``nn.Linear`` under each of ``modules`` (a group name -> its modules) into a
    :class:`PrepackedLinear` in place (``mode="auto"``); ``"off"`` changes nothing. Modules in
    ``skip`` (and everything under them) keep the plain layer, e.g. a module being compiled.
    ``max_rows``: per group, the largest row count its layers pack for, where a decode step's
    fixed shape has more rows than ``MAX_ROWS`` (a guided DiT evaluation over a long patch);
    other groups keep ``MAX_ROWS``, so a short prefill does not pay for proofs."""
    if mode == "off":
        return
    limits = dict(max_rows or {})
    unknown = set(limits) - set(modules)
    if unknown:
        raise ValueError(f"max_rows names groups that are not there: {sorted(unknown)}")
    skipped = {id(m) for s in skip for m in s.modules()}
    for name, roots in modules.items():
        for module in _linears(roots):
            if type(module) is nn.Linear and id(module) not in skipped:
                module.__class__ = PrepackedLinear
                module._init_prepack(max(MAX_ROWS, limits.get(name, MAX_ROWS)))


def has_packable_layers(modules: Groups) -> bool:
    """Whether any layer under ``modules`` is a :class:`PrepackedLinear` on the CPU in a dtype
    that some packed kernel runs on this CPU at all (one tiny trial per dtype and process):
    where none is, a run made only to prove the layers (an engine's load) would be wasted."""
    roots = [root for group in modules.values() for root in group]
    return any(isinstance(module, PrepackedLinear) and module.weight.device.type == "cpu"
               and _kernel_runs(module.weight.dtype) for module in _linears(roots))


@functools.cache
def _kernel_runs(dtype: torch.dtype) -> bool:
    # 64 wide: bf16dot packs whole groups of its 64 accumulators only
    weight, x = torch.ones(8, 64, dtype=dtype), torch.ones(4, 64, dtype=dtype)
    for kernel, (pack, run, _) in KERNELS.items():
        try:
            run(x, pack(weight, 4), weight, None, 4)
            return True
        except (RuntimeError, NotImplementedError) as exc:
            log.debug("prepack %s does not run in %s here: %s", kernel, dtype, exc)
    return False


def prepack_report(modules: Groups, mode: str = "auto") -> dict[str, Any]:
    """For ``applied.compute["prepack"]``: per group, the packed kernels its linear layers have
    run so far and how many ran ``F.linear`` only (``"off"`` when ``mode`` is off)."""
    if mode == "off":
        return {"mode": "off"}
    groups: dict[str, Any] = {}
    for name, roots in modules.items():
        kernels: dict[str, int] = {}
        for module in _linears(roots):
            kernel = getattr(module, "prepacked_kernel", None) or "plain"
            kernels[kernel] = kernels.get(kernel, 0) + 1
        groups[name] = dict(sorted(kernels.items()))
    return {"mode": mode, "modules": groups}
