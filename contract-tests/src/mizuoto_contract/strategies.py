"""Hypothesis strategies for hostile input, and the property every engine call must keep.

Used by the contract suite and by each engine's own property tests (``test_fuzz_*.py``):

    from mizuoto_contract.strategies import HOSTILE_NUMBERS, TEXT, check_speaks, mostly

The property (:func:`check_speaks`): a call gives audio that is finite, in [-1, 1], non-empty
and at the model's sample rate, or raises a :class:`~mizuoto.errors.MizuotoError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from hypothesis import currently_in_test_context, event
from hypothesis import strategies as st

from mizuoto.errors import MizuotoError

#: Numbers no range accepts, and values of the wrong type.
HOSTILE_NUMBERS = st.sampled_from([0, -1, 10**9, 10**400, float("nan"), float("inf"),
                                   float("-inf"), -0.5, 1e308, True, "2", [1.0]])

#: Text extremes: any Unicode (no surrogates: a str cannot be encoded with them), combining
#: marks, format characters (zero-width, bidi controls), right-to-left scripts, emoji, long
#: words, punctuation only.
TEXT = st.one_of(
    st.text(min_size=1, max_size=60),
    st.text(alphabet=st.characters(categories=["Mn", "Me", "Cf", "Zs", "So"]), max_size=30),
    st.sampled_from(["Hello there.", "مرحبا بالعالم", "שלום עולם", "\u202eevil\u202c text",
                     "zero\u200bwidth\u200djoin", "👩‍👩‍👧 🇯🇵 emoji!", "e\u0301\u0302\u0303" * 20,
                     "你好，世界。", "a" * 300, "x", " . , ; ", "\ud7ff\ue000\U0010ffff"]),
)


def mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` five times in six, so that most examples reach the model."""
    return st.integers(0, 5).flatmap(lambda n: hostile if n == 0 else valid)


@st.composite
def reference_samples(draw) -> tuple[np.ndarray, int]:
    """``(float32 samples, rate)`` for a reference: mostly a tone or noise at a usual rate;
    else silence, NaN, infinite or huge values, too few samples or an unsupported rate."""
    rate = draw(mostly(st.sampled_from([8000, 16000, 22050, 24000, 44100]),
                       st.sampled_from([1, 999, 1000, 768000, 768001, 2**31])))
    length = draw(mostly(st.integers(800, 24000), st.integers(0, 800)))
    kind = draw(mostly(st.sampled_from(["tone", "noise"]),
                       st.sampled_from(["silence", "nan", "inf", "huge"])))
    t = np.arange(length) / 8000
    values = {"tone": 0.3 * np.sin(2 * np.pi * 200 * t),
              "noise": np.random.default_rng(length).uniform(-1, 1, length),
              "silence": np.zeros(length), "nan": np.full(length, np.nan),
              "inf": np.full(length, np.inf), "huge": np.full(length, 1e30)}[kind]
    return values.astype(np.float32), rate


def check_audio(audio, sample_rate: int, *, allow_empty: bool = False,
                full_scale: bool = True) -> None:
    """Finite samples, 1-D float32, at ``sample_rate``; in [-1, 1] unless ``full_scale`` is
    False (an engine whose upstream returns louder audio)."""
    samples = audio.samples
    assert audio.sample_rate == sample_rate
    assert samples.ndim == 1 and samples.dtype == torch.float32
    assert allow_empty or samples.numel() > 0, "empty audio"
    assert bool(torch.isfinite(samples).all()), "NaN or infinite samples"
    if full_scale and samples.numel():
        assert float(samples.abs().max()) <= 1.0, "samples beyond [-1, 1]"


def _count(outcome: str | MizuotoError) -> None:
    """A Hypothesis event (``--hypothesis-show-statistics``): what share spoke or was refused
    for which field."""
    if isinstance(outcome, MizuotoError):
        field = getattr(outcome, "field", None) or getattr(outcome, "key", None)
        outcome = f"refused: {type(outcome).__name__}" + (f" ({field})" if field else "")
    if currently_in_test_context():
        event(outcome)


def check_speaks(engine, call: Callable[[], Any], *, full_scale: bool = True) -> Any:
    """Run ``call`` (a synthesize or edit): its result keeps :func:`check_audio`, or it raises a
    MizuotoError, which is returned. Hypothesis events count both outcomes."""
    try:
        result = call()
    except MizuotoError as exc:
        _count(exc)
        return exc
    _count("spoke")
    check_audio(result.audio, engine.info.sample_rate, full_scale=full_scale)
    return result


def check_streams(engine, call: Callable[[], Any]) -> Any:
    """:func:`check_speaks` for a stream: every chunk keeps :func:`check_audio` (only the last
    may be empty) and the last carries ``applied``; or a MizuotoError is raised."""
    try:
        chunks = list(call())
    except MizuotoError as exc:
        _count(exc)
        return exc
    _count("streamed")
    assert chunks and chunks[-1].is_last and chunks[-1].applied is not None
    for chunk in chunks:
        check_audio(chunk.audio, engine.info.sample_rate, allow_empty=chunk.is_last)
    return chunks
