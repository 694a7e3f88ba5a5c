"""What a loaded model is, and how it runs: the record an engine's ``info`` returns.

Its own module so that :mod:`mizuoto.contracts.placement` can build it without importing the
engine base class, which holds a placement.
"""

from __future__ import annotations

import attrs

from mizuoto.contracts.capabilities import Capability


@attrs.frozen
class ModelInfo:
    """What a loaded model is, and how it runs."""

    engine: str
    model: str  # catalog id or directory
    variant: str  # e.g. "v1_base", "voxcpm2"
    sample_rate: int
    dtype: str
    device: str
    capabilities: frozenset[Capability]
    license: str | None = None
    non_commercial: bool = False
    fingerprint: str = ""  # identity of the weights, for voice files
    # what the model card says the model speaks (BCP 47); empty: not declared
    languages: tuple[str, ...] = attrs.field(default=(), converter=tuple)
