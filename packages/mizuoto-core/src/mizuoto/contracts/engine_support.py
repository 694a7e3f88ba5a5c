"""What every engine wrote by hand, done once: references read, streams joined, lengths refused.

The :class:`~mizuoto.contracts.engine.Engine` base class uses :func:`join_stream` and
:func:`one_chunk` to give an engine that implements only ``_stream`` (or only ``_synthesize``)
the other; :func:`read_reference` and :func:`check_output_length` are for an engine's own
methods. Torch is imported when they run, not with this module (plugin listing stays light).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

from mizuoto.contracts.audio import Audio
from mizuoto.contracts.requests import Reference
from mizuoto.contracts.results import Rendered
from mizuoto.errors import InvalidRequest


def read_reference(source: Reference | Audio | str | Path, sample_rate: int, *,
                   field: str = "reference.audio") -> Audio:
    """A reference recording as mono float32 ``Audio`` at ``sample_rate`` (the engine's).

    ``source``: a :class:`Reference`, an :class:`Audio`, or a path to a WAV, FLAC, OGG or MP3
    file. A missing, unreadable or silent recording raises
    :class:`~mizuoto.errors.InvalidAudio` naming ``field``. Other rates are resampled with a
    windowed-sinc filter (``torchaudio.functional.resample``'s arithmetic).
    """
    import torch

    from mizuoto.nn.dsp.audio_io import check_not_silent, read_audio, to_mono
    from mizuoto.nn.dsp.resample import resample

    if isinstance(source, Reference):
        source = source.audio
    if isinstance(source, Audio):
        samples, rate = source.samples.to(torch.float32), source.sample_rate
    else:
        channels, rate = read_audio(source, field=field)
        samples = to_mono(channels)[0]
    check_not_silent(samples, field)
    return Audio(resample(samples, rate, sample_rate), sample_rate)


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
