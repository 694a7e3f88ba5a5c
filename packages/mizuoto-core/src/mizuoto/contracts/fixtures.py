"""Contract fixtures: small random-init model directories an engine can write for tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs


@attrs.frozen
class ContractFixture:
    """A recipe for a small model directory in the engine's real file layout.

    ``make(directory)`` writes the files (random weights: the audio is noise, not speech).
    ``request_params`` are settings that keep contract requests fast (e.g. few steps, a length
    cap). ``stream_matches`` says whether concatenated stream chunks equal the non-streamed audio.
    ``needs_reference_text`` says whether cloning requires the reference transcript.
    """

    engine: str
    name: str
    make: Callable[[Path], None]
    request_params: Mapping[str, Any] = attrs.field(factory=dict,
                                                    converter=lambda v: MappingProxyType(dict(v)))
    steps: int | None = None
    stream_matches: bool = False
    needs_reference_text: bool = True
    description: str = ""

    @property
    def id(self) -> str:
        return f"{self.engine}/{self.name}"
