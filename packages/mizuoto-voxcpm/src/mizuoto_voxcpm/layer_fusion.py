"""In-place rewrites of the MiniCPM-4 decoder layers under some root modules: fused
products (a fast profile's int8 ones, or the exact path's packed ones where proven), and a
fast profile's arithmetic (:func:`fast_arithmetic`: folded query heads, fused elementwise
operations, the local DiT's last layer over the patch's rows). Each returns how many it
rewrote."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from mizuoto_voxcpm.local_dit import LocalDiT
from mizuoto_voxcpm.longrope import LongRoPE
from mizuoto_voxcpm.minicpm4 import (
    MLP,
    Attention,
    DecoderLayer,
    FusePrepacked,
    FuseProducts,
    RMSNorm,
)


def fuse_products(roots: Iterable[nn.Module], fuse: FuseProducts) -> int:
    """Fuse q/k/v and gate/up in every decoder layer under ``roots`` with ``fuse``
    (:meth:`Attention.fuse_products`); how many products were made."""
    count = 0
    for root in roots:
        for module in list(root.modules()):
            if isinstance(module, Attention | MLP):
                module.fuse_products(fuse)
                count += 1
    return count


def fuse_prepacked(roots: Iterable[nn.Module], fuse: FusePrepacked) -> int:
    """:meth:`Attention.fuse_prepacked` and :meth:`MLP.fuse_prepacked` in every decoder layer
    under ``roots``; how many fused products ``fuse`` made."""
    count = 0
    for root in roots:
        for module in list(root.modules()):
            if isinstance(module, Attention | MLP):
                module.fuse_prepacked(fuse)
                count += (module.qkv_fused if isinstance(module, Attention)
                          else module.gate_up_fused) is not None
    return count


def fold_query_heads(roots: Iterable[nn.Module]) -> int:
    """:meth:`Attention.fold_query_heads` for every attention under ``roots``; how many."""
    attentions = [m for root in roots for m in root.modules() if isinstance(m, Attention)]
    for attention in attentions:
        attention.fold_query_heads()
    return len(attentions)


def fuse_elementwise(roots: Iterable[nn.Module]) -> int:
    """A fast profile's elementwise arithmetic (equal to rounding, not bit for bit) in every
    decoder layer under ``roots``: RMSNorm as torch's one call, RoPE on q and k together, the
    scaled residual add as one operation. On a 2-core CPU a decode step's layer runs some 60
    small operations besides its products, each a few microseconds; these cut about a fifth
    of them. How many decoder layers."""
    layers = 0
    for root in roots:
        for module in root.modules():
            if isinstance(module, RMSNorm):
                module.fused = True
            elif isinstance(module, LongRoPE):
                module.sign_flipped = True  # once per forward or step, not per layer
            elif isinstance(module, Attention):
                module.fused_rope = True
            elif isinstance(module, DecoderLayer):
                module.fused_add = True
                layers += 1
    return layers


def patch_rows_only(roots: Iterable[nn.Module]) -> int:
    """:attr:`LocalDiT.patch_rows_only` for every local DiT under ``roots``; how many."""
    dits = [m for root in roots for m in root.modules() if isinstance(m, LocalDiT)]
    for dit in dits:
        dit.patch_rows_only = True
    return len(dits)


def fast_arithmetic(roots: Iterable[nn.Module]) -> None:
    """A fast profile's arithmetic, one decision for the modules under ``roots`` (equal to
    rounding, not bit for bit): :func:`fold_query_heads`, :func:`fuse_elementwise` and
    :func:`patch_rows_only`. Its caches' ``attention="fast"`` (a step over the filled
    positions only) is the same decision, taken where the engine makes its caches."""
    roots = list(roots)
    fold_query_heads(roots)
    fuse_elementwise(roots)
    patch_rows_only(roots)
