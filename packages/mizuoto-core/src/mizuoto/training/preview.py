"""A preview of an exported model: a text of the training data spoken by it, so that a user
hears the result of a run without writing a request.

The voice is the first training clip of a usable reference length (`REFERENCE_SECONDS`), with
its transcript, when there is one; else the model speaks zero-shot.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

PREVIEW = "preview.wav"
#: a data clip this long (seconds) with its transcript is the preview's voice
REFERENCE_SECONDS = (3.0, 15.0)


def speak_preview(engine, path: Path, *, text: str, clips: Iterable[tuple[np.ndarray, str]],
                  rate: int, seed: int, params: Mapping[str, Any] | None = None,
                  turn_off: str = "--param preview=false") -> Path:
    """``text`` spoken by ``engine`` (the exported model, loaded) into ``path``, cloning the
    first of ``clips`` (mono samples at ``rate``, transcript) that lasts `REFERENCE_SECONDS`
    when there is one, with ``seed`` and the request ``params``; ``turn_off``: how the user
    turns previews off (logged)."""
    import soundfile as sf

    from mizuoto.contracts import Reference, SynthesisRequest

    low, high = REFERENCE_SECONDS
    clip = next(((audio, transcript) for audio, transcript in clips
                 if low <= audio.size / rate <= high), None)
    mode = "cloned" if clip is not None else "zero-shot"
    with tempfile.TemporaryDirectory() as tmp:
        reference = None
        if clip is not None:
            file = Path(tmp) / "reference.wav"
            sf.write(file, clip[0], rate, subtype="FLOAT")
            reference = Reference(file, clip[1])
        logger.info("speaking a preview (%s) with the exported model into %s; %s turns it "
                    "off", mode, path, turn_off)
        result = engine.synthesize(SynthesisRequest(text, reference=reference, seed=seed,
                                                    params=dict(params or {})))
    result.save(path)
    logger.info("preview (%s) written to %s", mode, path)
    return path
