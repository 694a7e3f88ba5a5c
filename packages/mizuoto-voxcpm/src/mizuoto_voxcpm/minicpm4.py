"""MiniCPM-4: the decoder stack behind all four VoxCPM transformers, with LongRoPE; it decodes
step by step against a static KV cache (:mod:`mizuoto_voxcpm.kv_cache`).

Arithmetic follows upstream ``voxcpm.modules.minicpm4`` operation for operation (the order of
casts decides bf16 bits); state-dict names match it so checkpoints load strictly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime.shape_traces import ShapeTraces
from mizuoto_voxcpm.config import TransformerConfig
from mizuoto_voxcpm.kv_cache import KVCache, RowsStep, RowStep
from mizuoto_voxcpm.longrope import LongRoPE, apply_rope, apply_rope_together, sign_flipped_sin


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = hidden.dtype
    variance = hidden.to(torch.float32).pow(2).mean(dim=-1, keepdim=True)
    # upstream multiplies the low-precision input by a float32 rsqrt, then casts back
    hidden = (hidden * torch.rsqrt(variance + eps)).to(dtype)
    return hidden * weight


class RMSNorm(nn.Module):
    """MiniCPM's RMSNorm. Not core's (``mizuoto.nn.transformer.norms``): those compute
    ``F.normalize`` (x-transformers) or ``F.rms_norm`` (F5-TTS), whose bf16 bits differ from
    this float32-variance, cast-back-then-scale order (measured on CPU: float32 equal to
    ``NativeRMSNorm`` bit for bit, bf16 and fp16 not: the low-precision cast comes before the
    weight here)."""

    #: torch's one-call ``F.rms_norm`` instead of the six operations (:func:`mizuoto_voxcpm.layer_fusion.fuse_elementwise`)
    fused: bool = False

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return F.rms_norm(hidden, self.weight.shape, self.weight, self.eps)
        return rms_norm(hidden, self.weight, self.eps)


#: Builds one product standing for several linear layers that read the same input: their
#: outputs concatenated, split by its ``split_sizes`` (a fast profile's, e.g.
#: :meth:`mizuoto.runtime.packed_int8.PackedInt8Linear.fused`)
FuseProducts = Callable[[Sequence[nn.Linear]], nn.Module]
#: Builds, for several linear layers that read the same input, a callable ``(x, layers)`` ->
#: one output per layer, with their bits (the exact path's, e.g.
#: :meth:`mizuoto.runtime.prepack_fused.FusedPrepack.over`), or None where it cannot
FusePrepacked = Callable[[Sequence[nn.Linear]], Callable | None]


class Attention(nn.Module):
    #: a decode step attends with each kv head's query heads as rows of one query
    #: (:meth:`fold_query_heads`), or with torch's grouped-query call
    folded_heads: bool = False
    #: RoPE on q and k as one tensor (:func:`mizuoto_voxcpm.layer_fusion.fuse_elementwise`)
    fused_rope: bool = False

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        #: q/k/v as one product (:meth:`fuse_products`), or None: three
        self.qkv_proj: nn.Module | None = None
        #: q/k/v packed together where proven exact (:meth:`fuse_prepacked`; not a module)
        self.qkv_fused: Callable | None = None

    def fuse_products(self, fuse: FuseProducts) -> None:
        """Run q/k/v as one product built by ``fuse`` (a fast profile's: inference only, the
        three layers and their parameters are dropped)."""
        self.qkv_proj = fuse([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def fuse_prepacked(self, fuse: FusePrepacked) -> None:
        """Run q/k/v through ``fuse``'s product where it gives their bits (the exact path:
        the layers stay, and run on their own wherever it does not)."""
        if self.qkv_proj is None:
            self.qkv_fused = fuse([self.q_proj, self.k_proj, self.v_proj])

    def fold_query_heads(self) -> None:
        """Attend a decode step as ``kv_heads`` sequences of ``heads / kv_heads`` query rows
        each, not with torch's grouped-query call (a fast profile's: equal to rounding, not
        bit for bit; several times faster on the CPU)."""
        self.folded_heads = True

    def _project(self, hidden: torch.Tensor, length: int, rope) -> tuple[torch.Tensor, ...]:
        batch = hidden.size(0)
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(hidden).split(self.qkv_proj.split_sizes, dim=-1)
        elif self.qkv_fused is not None:
            q, k, v = self.qkv_fused(hidden, (self.q_proj, self.k_proj, self.v_proj))
        else:
            q, k, v = self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if rope is not None:
            if self.fused_rope and q.dtype == torch.float32:
                signed = rope[2] if len(rope) > 2 else sign_flipped_sin(rope[1])
                q, k = apply_rope_together(q, k, rope[0], signed)
            else:
                q, k = apply_rope(q, k, rope[0], rope[1])
        return q, k, v

    def forward(self, hidden: torch.Tensor, rope, causal: bool,
                segments: tuple[int, ...] | None = None, last: int | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``segments``: the lengths of the sequences packed along ``hidden``'s positions
        (each attends within itself only), or None for one sequence. ``last``: only the last
        ``last`` positions' outputs (queries), against every position's keys and values (no
        segments, not causal)."""
        batch, length, _ = hidden.shape
        q, k, v = self._project(hidden, length, rope)
        if last is not None:
            if causal or segments is not None:
                raise ValueError("last applies without segments or a causal mask")
            q, length = q[:, :, length - last:], last
        if segments is None:
            out = F.scaled_dot_product_attention(q.contiguous(), k.contiguous(),
                                                 v.contiguous(), is_causal=causal,
                                                 enable_gqa=True)
        else:
            outs, start = [], 0
            for size in segments:
                end = start + size
                outs.append(F.scaled_dot_product_attention(
                    q[:, :, start:end].contiguous(), k[:, :, start:end].contiguous(),
                    v[:, :, start:end].contiguous(), is_causal=causal, enable_gqa=True))
                start = end
            out = torch.cat(outs, dim=2)
        out = out.transpose(1, 2).contiguous().reshape(batch, length, -1)
        return self.o_proj(out), (k, v)

    def step(self, hidden: torch.Tensor, rope, position: torch.Tensor, span: int,
             mask: torch.Tensor | None, cache: tuple[torch.Tensor, torch.Tensor]
             ) -> torch.Tensor:
        """One position against the cache: ``position`` is a one-element device tensor,
        ``span`` how many cache positions to attend over, ``mask`` which of them are filled
        (``None`` when all are)."""
        batch = hidden.size(0)
        q, k, v = self._project(hidden, 1, rope)
        key_cache, value_cache = cache
        key_cache.index_copy_(2, position, k)
        value_cache.index_copy_(2, position, v)
        keys, values = key_cache[:, :, :span], value_cache[:, :, :span]
        if not self.folded_heads:  # torch's grouped-query call, upstream's bits: contiguous
            keys, values = keys.contiguous(), values.contiguous()
        out = self._attend_step(q, keys, values, mask)
        out = out.transpose(1, 2).contiguous().reshape(batch, -1)
        return self.o_proj(out)

    def _attend_step(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor:
        """One position's queries ``(b, heads, 1, head_dim)`` against ``keys``/``values``
        ``(b, kv_heads, span, head_dim)``."""
        if not self.folded_heads:
            return F.scaled_dot_product_attention(q.contiguous(), keys, values,
                                                  attn_mask=mask, enable_gqa=True)
        batch, group = q.size(0), self.num_heads // self.num_kv_heads
        # query head h reads kv head h // group: consecutive heads share one, so they are rows
        rows = q.reshape(batch, self.num_kv_heads, group, self.head_dim)
        out = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask)
        return out.view(batch, self.num_heads, 1, self.head_dim)

    def step_rows(self, hidden: torch.Tensor, rope, rows: RowsStep | list[RowStep]
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """:meth:`step` for ``b`` sequences at once, each against its own cache at its own
        position: the projections run once for all rows. :class:`RowsStep` (exact attention):
        one attention call over the rows' caches gathered to one span, each row the bits of
        its own call (the extra masked positions add exact zeros, and the CPU kernel computes
        each row and head on its own); the new keys and values are returned, ``(b, kv_heads,
        1, head_dim)`` each, for the caller to write to the caches once for all layers. A list
        of :class:`RowStep` (fast attention, spans of their own): row by row, each written to
        its cache here (returns None for them)."""
        batch = hidden.size(0)
        q, k, v = self._project(hidden, 1, rope)
        if isinstance(rows, RowsStep):
            out = self._attend_step(q, rows.gather(k, 0), rows.gather(v, 1), rows.mask)
            written = (k, v)
        else:
            outs = []
            for index, row in enumerate(rows):
                key_cache, value_cache = row.cache
                key_cache.index_copy_(2, row.position, k[index:index + 1])
                value_cache.index_copy_(2, row.position, v[index:index + 1])
                outs.append(self._attend_step(
                    q[index:index + 1], key_cache[:, :, :row.span].contiguous(),
                    value_cache[:, :, :row.span].contiguous(), row.mask))
            out, written = torch.cat(outs), None
        out = out.transpose(1, 2).contiguous().reshape(batch, -1)
        return self.o_proj(out), written


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        #: gate/up as one product (:meth:`fuse_products`), or None: two
        self.gate_up_proj: nn.Module | None = None
        #: gate/up packed together where proven exact (:meth:`fuse_prepacked`; not a module)
        self.gate_up_fused: Callable | None = None

    def fuse_products(self, fuse: FuseProducts) -> None:
        """Run gate/up as one product built by ``fuse`` (as :meth:`Attention.fuse_products`)."""
        self.gate_up_proj = fuse([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def fuse_prepacked(self, fuse: FusePrepacked) -> None:
        """gate/up through ``fuse``'s product where exact (as :meth:`Attention.fuse_prepacked`)."""
        if self.gate_up_proj is None:
            self.gate_up_fused = fuse([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).split(self.gate_up_proj.split_sizes, dim=-1)
        elif self.gate_up_fused is not None:
            gate, up = self.gate_up_fused(x, (self.gate_proj, self.up_proj))
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # muP residual scaling (a Python float, as upstream multiplies by it)
        self.residual_scale = (config.scale_depth / math.sqrt(config.num_hidden_layers)
                               if config.use_mup else None)
        #: the scaled residual add as one ``torch.add(alpha=)`` (:func:`mizuoto_voxcpm.layer_fusion.fuse_elementwise`)
        self.fused_add = False

    def _add(self, residual: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        if self.residual_scale is None:
            return residual + update
        if self.fused_add:
            return torch.add(residual, update, alpha=self.residual_scale)
        return residual + update * self.residual_scale

    def forward(self, hidden: torch.Tensor, rope, causal: bool,
                segments: tuple[int, ...] | None = None, last: int | None = None):
        update, kv = self.self_attn(self.input_layernorm(hidden), rope, causal, segments, last)
        if last is not None:
            hidden = hidden[:, hidden.size(1) - last:]
        hidden = self._add(hidden, update)
        hidden = self._add(hidden, self.mlp(self.post_attention_layernorm(hidden)))
        return hidden, kv

    def step(self, hidden: torch.Tensor, rope, position: torch.Tensor, span: int,
             mask: torch.Tensor | None, cache) -> torch.Tensor:
        update = self.self_attn.step(self.input_layernorm(hidden), rope, position, span, mask,
                                     cache)
        hidden = self._add(hidden, update)
        return self._add(hidden, self.mlp(self.post_attention_layernorm(hidden)))

    def step_rows(self, hidden: torch.Tensor, rope, rows: RowsStep | list[RowStep]):
        update, written = self.self_attn.step_rows(self.input_layernorm(hidden), rope, rows)
        hidden = self._add(hidden, update)
        return self._add(hidden, self.mlp(self.post_attention_layernorm(hidden))), written


class MiniCPM4(nn.Module):
    """A stack of decoder layers; ``embed_tokens`` only when the config has a vocabulary."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        if config.vocab_size > 0:
            # built on the meta device (loading: the checkpoint fills it), the embedding skips
            # its normal_ init, whose meta kernel imports torch._dynamo: 2.5 s of every load
            weight = torch.empty(config.vocab_size, config.hidden_size) \
                if torch.get_default_device().type == "meta" else None
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                             _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope_emb = None if config.no_rope else LongRoPE(config)
        #: a fast profile's single-sequence decode steps replayed as a proven trace
        #: (:meth:`trace_steps`), else None
        self.shape_traces: ShapeTraces | None = None

    def trace_steps(self, *, name: str = "decode step") -> None:
        """Decode single-sequence steps against a cache with ``fast`` attention (over its
        filled positions only) through :meth:`step_filled` as one TorchScript trace for every
        position, proven equal to the eager step where it is traced and confirmed at the next
        position (:class:`mizuoto.runtime.shape_traces.ShapeTraces`, the filled positions as
        its varying size: a VoxCPM-0.5B base LM step in 0.76-0.78 of its eager time on two
        AVX2 cores, at positions 100 and 600 alike). Set it after any rewrite of the layers: a trace
        keeps the packed weights it met. ``name`` says which LM in a fallback's reason."""
        self.shape_traces = ShapeTraces.of_method(self, "step_filled", name=name,
                                                  varying={1: -2})

    def forward(self, embeds: torch.Tensor, *, causal: bool = True,
                segments: tuple[int, ...] | None = None, last: int | None = None
                ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Run a whole sequence; return the normed hidden states and each layer's keys/values.

        ``last`` (not causal, no segments): only the last ``last`` positions' hidden states
        are returned, and the last layer computes only theirs after its keys and values (its
        attention output, o_proj and MLP over those rows: a fast profile's DiT, whose
        velocity reads the patch's positions only).

        ``segments``: several sequences packed one after another along the positions, of
        these lengths: each has its own positions from 0 and attends within itself only, so
        the matrix products run once for all of them (a batched prefill)."""
        rope = None
        if self.rope_emb is not None:
            device = embeds.device
            positions = torch.arange(embeds.size(1), device=device) if segments is None else \
                torch.cat([torch.arange(size, device=device) for size in segments])
            rope = self.rope_emb(positions)
        hidden = embeds
        pairs = []
        final = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            hidden, kv = layer(hidden, rope, causal, segments,
                               last if index == final else None)
            pairs.append(kv)
        return self.norm(hidden), pairs

    def step(self, embed: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Decode one position (``embed``: ``(batch, hidden)``) against ``cache``.

        Reads and advances ``cache.position`` on the device (no host value enters the tensors
        but the span), so the step can be captured in a CUDA graph.
        """
        if self.shape_traces is not None and cache.attention == "fast":
            filled = cache.tensor[..., :cache.next_position() + 1, :]
            return self.shape_traces(embed, filled, cache.position)
        span = cache.attend_span(cache.next_position())
        position = cache.position
        rope = None
        if self.rope_emb is not None:
            rope = self.rope_emb(position)
        mask = _filled_mask(cache, span, position)
        hidden = embed
        for index, layer in enumerate(self.layers):
            hidden = layer.step(hidden, rope, position, span, mask, cache.layer(index))
        position.add_(1)
        return self.norm(hidden)

    def step_filled(self, embed: torch.Tensor, filled: torch.Tensor, position: torch.Tensor
                    ) -> torch.Tensor:
        """:meth:`step` with ``fast`` attention against ``filled``, a KV cache's tensor cut to
        the positions up to this step's (``position``), all attended, unmasked: writes the
        new keys and values there and advances ``position``. Tensors only, to trace; the
        tracer keeps ``filled``'s length as a size, not a constant (proven per trace)."""
        span = filled.size(-2)
        rope = None if self.rope_emb is None else self.rope_emb(position)
        hidden = embed
        for index, layer in enumerate(self.layers):
            hidden = layer.step(hidden, rope, position, span, None,
                                (filled[0, index], filled[1, index]))
        position.add_(1)
        return self.norm(hidden)

    def step_rows(self, embeds: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
        """:meth:`step` for ``b`` sequences (``embeds``: ``(b, hidden)``), row ``i`` against
        ``caches[i]`` at its own position. The row-wise arithmetic (norms, RoPE, attention) is
        the single-sequence one; the matrix products run once with ``b`` rows, which is where
        a row's bits may depend on ``b`` (the kernel a GEMM picks by shape). With exact
        attention each layer attends once for all rows (:class:`RowsStep`) and each row's new
        keys and values go to its cache once after the last layer: per row, one write a step
        instead of two calls a layer."""
        claimed = [cache.next_position() for cache in caches]
        spans = [cache.attend_span(position) for cache, position in zip(caches, claimed,
                                                                         strict=True)]
        positions = torch.cat([cache.position for cache in caches])
        rope = None
        if self.rope_emb is not None:
            rope = tuple(table[:, None, None, :] for table in self.rope_emb(positions))
        together = all(cache.attention == "exact" for cache in caches)
        if together:
            span = max(spans)
            mask = (torch.arange(span, device=positions.device).view(1, -1)
                    <= positions.view(-1, 1)).view(-1, 1, 1, span)
        else:
            masks = [_filled_mask(cache, span, cache.position)
                     for cache, span in zip(caches, spans, strict=True)]
        hidden = embeds
        keys, values = [], []
        for index, layer in enumerate(self.layers):
            if together:
                rows = RowsStep([cache.layer(index) for cache in caches], positions, span, mask)
            else:
                rows = [RowStep(cache.position, span, mask, cache.layer(index))
                        for cache, span, mask in zip(caches, spans, masks, strict=True)]
            hidden, written = layer.step_rows(hidden, rope, rows)
            if written is not None:
                keys.append(written[0])
                values.append(written[1])
        if together:
            # (2, layers, b, kv_heads, head_dim): each row's keys and values of every layer
            new = torch.stack((torch.stack(keys), torch.stack(values)))[..., 0, :]
            for row, (cache, position) in enumerate(zip(caches, claimed, strict=True)):
                cache.tensor[:, :, 0, :, position] = new[:, :, row]
        for cache in caches:
            cache.position.add_(1)
        return self.norm(hidden)


def _filled_mask(cache: KVCache, span: int, position: torch.Tensor) -> torch.Tensor | None:
    """Which of the ``span`` attended cache positions are filled (``None``: all of them)."""
    if cache.attention != "exact":
        return None
    return (torch.arange(span, device=position.device) <= position).view(1, 1, 1, -1)
