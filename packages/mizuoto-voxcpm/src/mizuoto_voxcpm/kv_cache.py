"""The static key/value cache VoxCPM's transformers decode against, and one sequence's part of a
batched decoding step."""

from __future__ import annotations

import attrs
import torch

from mizuoto_voxcpm.config import TransformerConfig

# On CPU a decoding step attends over the cache only up to the next multiple of this past the
# current length; the masked tail contributes exact zeros, so the bits equal attending over the
# whole cache as upstream does (proven at the real shapes in tests/test_attention_span.py).
# On CUDA only the whole cache is bit-identical to upstream (the kernels split the reduction by
# length), so there ``attention="exact"`` attends over all of it and ``"fast"`` over the filled
# part only.
ATTEND_SPAN_MULTIPLE = 256
ATTENTION_MODES = ("exact", "fast")


class CacheFull(RuntimeError):
    """The static KV cache has no room for another position."""


class KVCache:
    """A static key/value cache: ``(2, layers, batch, kv_heads, max_length, head_dim)``.

    The next position is kept twice: ``length`` on the host (to check room and pick the attention
    span) and ``position`` on the device (a one-element tensor that steps read and advance
    themselves, so a step can be replayed as a CUDA graph).
    """

    def __init__(self, config: TransformerConfig, max_length: int, *, batch_size: int = 1,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 attention: str = "exact") -> None:
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        self.max_length = max_length
        self.attention = attention
        self.tensor = torch.zeros(2, config.num_hidden_layers, batch_size,
                                  config.num_key_value_heads, max_length, config.head_dim,
                                  device=device, dtype=dtype)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.length = 0
        # positions below this may hold keys and values (steps past ``length`` that were
        # rewound, an earlier request's); from here on the tensor is zeros
        self._written = 0

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tensor[0, index], self.tensor[1, index]

    def fill(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Reset the cache to a prefill's keys and values."""
        length = pairs[0][0].size(2)
        if length > self.max_length:
            raise CacheFull(f"the prompt is {length} positions long but the model's context "
                            f"(max_length) holds {self.max_length}")
        self.length = length
        self.position.fill_(length)
        # the masked positions must be zeros, as in a new cache (what attention reads there is
        # multiplied by zero weights, but not a NaN left by an earlier request): only those
        # written since they last were are zeroed, not the whole slot (62 MB at real size)
        if self._written > length:
            self.tensor[:, :, :, :, length:self._written].zero_()
        self._written = length
        for index, (key, value) in enumerate(pairs):
            self.tensor[0, index, :, :, :length] = key
            self.tensor[1, index, :, :, :length] = value

    @property
    def has_room(self) -> bool:
        return self.length < self.max_length

    def next_position(self) -> int:
        """Claim the next position on the host; the step advances ``position`` itself."""
        if not self.has_room:
            raise CacheFull(f"the model's context (max_length {self.max_length}) is full")
        position = self.length
        self.length += 1
        self._written = max(self._written, self.length)
        return position

    def rewind(self) -> None:
        """Discard the last step (its keys and values stay behind the mask until overwritten)."""
        if self.length == 0:
            raise ValueError("nothing to rewind: the cache is empty")
        self.length -= 1
        self.position.sub_(1)

    def attend_span(self, position: int) -> int:
        """How many cache positions a step at ``position`` attends over."""
        if self.attention == "fast":
            return position + 1
        if self.tensor.device.type != "cpu":
            return self.max_length
        span = (position // ATTEND_SPAN_MULTIPLE + 1) * ATTEND_SPAN_MULTIPLE
        return min(span, self.max_length)


@attrs.frozen
class RowStep:
    """One sequence's part of a batched decoding step that attends row by row (``fast``
    attention: each row over its own filled span; see :meth:`MiniCPM4.step_rows`)."""

    position: torch.Tensor
    span: int
    mask: torch.Tensor | None
    cache: tuple[torch.Tensor, torch.Tensor]


@attrs.frozen
class RowsStep:
    """The rows of a batched decoding step at one layer, attending together (``exact``
    attention): each row's cache (keys, values), the rows' positions ``(b,)`` on the device,
    the span they all attend over (the longest of theirs: a masked tail adds exact zeros) and
    the mask ``(b, 1, 1, span)`` of each row's filled positions."""

    caches: list[tuple[torch.Tensor, torch.Tensor]]
    positions: torch.Tensor
    span: int
    mask: torch.Tensor

    def gather(self, new: torch.Tensor, which: int) -> torch.Tensor:
        """The rows' keys (``which`` 0) or values (1) over ``span``, ``(b, kv_heads, span,
        head_dim)``, with each row's ``new`` ``(b, kv_heads, 1, head_dim)`` at its position:
        what each row's own step reads from its cache after writing there."""
        gathered = torch.cat([cache[which][:, :, :self.span] for cache in self.caches])
        rows = torch.arange(len(self.caches), device=gathered.device)
        gathered[rows, :, self.positions] = new[:, :, 0]
        return gathered
