"""What every engine wrote by hand, done once: streams joined, lengths refused.

The :class:`~mizuoto.contracts.engine.Engine` base class uses :func:`join_stream` and
:func:`one_chunk` to give an engine that implements only ``_stream`` (or only ``_synthesize``)
the other; :func:`check_output_length` is for an engine's own methods. Reading a reference
recording is :func:`mizuoto.nn.dsp.reference.read_reference` (file I/O and DSP, above the
contracts). Torch is imported when they run, not with this module (plugin listing stays light).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

from mizuoto.contracts.audio import Audio
from mizuoto.contracts.results import Rendered
from mizuoto.errors import InvalidRequest


def check_output_length(needed_seconds: float, maximum_seconds: float, *, setting: str,
                        fix: str | None = None) -> None:
    """Refuse a text that needs more audio than the model (or ``setting``) allows.

    Raises :class:`~mizuoto.errors.InvalidRequest` for ``text``, naming ``setting`` (e.g.
    ``params.max_seconds``): an engine must never cut the text silently.
    """
    if needed_seconds > maximum_seconds:
        raise InvalidRequest(
            "text", f"needs {needed_seconds:.1f} s of audio, more than {setting} "
            f"({maximum_seconds:g} s)",
            fix or f"raise {setting} or split the text (mizuoto longform)")


def join_stream(pieces: Iterable[Rendered], sample_rate: int) -> Rendered:
    """One :class:`Rendered` from a stream's pieces: the audio joined, the last piece's facts
    (which describe the whole stream)."""
    import torch

    pieces = list(pieces)
    if not pieces:
        raise RuntimeError("the engine's _stream() yielded nothing; it must yield at least one "
                           "Rendered, the last with last=True")
    samples = torch.cat([piece.audio.samples for piece in pieces])
    return attrs.evolve(pieces[-1], audio=Audio(samples, sample_rate), last=True)


def one_chunk(rendered: Rendered) -> Iterator[Rendered]:
    """A stream of one chunk: the whole result, marked last."""
    return iter([attrs.evolve(rendered, last=True)])
