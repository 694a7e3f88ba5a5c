"""F5-TTS's settings: request params and ``engines.f5tts.*`` options (no torch here, so
listing and validating options does not load the engine)."""

from __future__ import annotations

from typing import Literal

import attrs

from mizuoto.contracts.requests import MAX_SEGMENT_SECONDS
from mizuoto.errors import InvalidRequest
from mizuoto.validation.ranges import boolean, check_number, number_in

# Ranges of the params (docs/engines/f5tts.md, Settings); durations are in seconds.
SPEED_RANGE = (0.1, 10.0)
MAX_CROSS_FADE = 10.0


_boolean = boolean(prefix="params.")


def _durations(value):
    if value is None:
        return None
    if isinstance(value, (int, float)):
        value = (value,)
    if not isinstance(value, (list, tuple)):
        raise InvalidRequest("params.edit_durations", "must be a list of seconds, one per segment")
    for seconds in value:
        check_number("params.edit_durations", seconds, 0.0, MAX_SEGMENT_SECONDS, low_open=True)
    return tuple(float(v) for v in value)


def _param(name: str, low: float, high: float, **kwargs):
    return number_in(f"params.{name}", low, high, **kwargs)


@attrs.frozen
class F5Params:
    """F5-TTS settings of one request (``SynthesisRequest.params`` / ``EditRequest.params``).

    Defaults are upstream's. ``speed`` scales the estimated duration (a chunk under 10 bytes
    is spoken at 0.3, as upstream does); ``fix_duration`` (seconds) is the total length of
    reference + generated audio instead of the estimate. ``cross_fade_duration`` (seconds)
    joins chunks of long text. ``target_rms`` is the loudness a quiet reference is raised to
    (and the output lowered back from). ``method`` is the ODE solver; ``use_epss`` uses the
    pruned time grid for 5, 6, 7, 10, 12 or 16 steps; ``sway_sampling_coef`` (None: off)
    crowds the steps near the noise. ``remove_silence`` applies upstream's optional
    post-processing (cut silences over 1 s down to 0.5 s each side, on 16-bit samples).
    ``edit_durations`` (editing only) gives each regenerated span its new length in seconds.
    ``tiled_decode`` forces the Vocos tile decoding used as the out-of-memory fallback.
    Ranges (finite numbers): ``sway_sampling_coef`` [-1, 1], ``speed`` [0.1, 10],
    ``fix_duration`` and each of ``edit_durations`` (0, 3600], ``cross_fade_duration`` [0, 10],
    ``target_rms`` (0, 1].
    """

    sway_sampling_coef: float | None = attrs.field(
        default=-1.0, validator=_param("sway_sampling_coef", -1.0, 1.0, optional=True))
    speed: float = attrs.field(default=1.0, validator=_param("speed", *SPEED_RANGE))
    fix_duration: float | None = attrs.field(
        default=None, validator=_param("fix_duration", 0.0, MAX_SEGMENT_SECONDS, low_open=True,
                                       optional=True))
    cross_fade_duration: float = attrs.field(
        default=0.15, validator=_param("cross_fade_duration", 0.0, MAX_CROSS_FADE))
    target_rms: float = attrs.field(default=0.1,
                                    validator=_param("target_rms", 0.0, 1.0, low_open=True))
    method: Literal["euler", "midpoint"] = attrs.field(default="euler")
    use_epss: bool = attrs.field(default=True, validator=_boolean)
    remove_silence: bool = attrs.field(default=False, validator=_boolean)
    edit_durations: tuple[float, ...] | None = attrs.field(default=None, converter=_durations)
    tiled_decode: bool = attrs.field(default=False, validator=_boolean)

    @method.validator
    def _method(self, attribute, value):
        if value not in ("euler", "midpoint"):
            raise InvalidRequest("params.method", f"must be euler or midpoint, got {value!r}")


#: the values of ``engines.f5tts.fast`` (mizuoto_f5tts.fast)
FAST_PROFILES = ("off", "autocast", "int8", "auto")


@attrs.frozen
class F5Options:
    """``engines.f5tts.*`` options: ``variant`` (``auto`` detects it from the checkpoint),
    ``fast`` (``off``, the exact default, ``autocast``, ``int8`` or ``auto``:
    docs/performance.md)."""

    variant: str = attrs.field(default="auto")
    #: the opt-in fast profile, never exact (mizuoto_f5tts.fast): off, autocast, int8, auto
    fast: str = attrs.field(default="off")

    @fast.validator
    def _fast(self, attribute, value):
        if value not in FAST_PROFILES:
            raise InvalidRequest("engines.f5tts.fast",
                                 f"must be one of {', '.join(FAST_PROFILES)}, got {value!r}")

    @variant.validator
    def _variant(self, attribute, value):
        from mizuoto_f5tts.variants import VARIANT_NAMES

        if value != "auto" and value not in VARIANT_NAMES:
            raise InvalidRequest("engines.f5tts.variant",
                                 f"must be auto or one of {', '.join(VARIANT_NAMES)}, "
                                 f"got {value!r}")
