"""VoxCPM's settings: request params and ``engines.voxcpm.*`` options (no torch here, so
listing and validating options does not load the engine), as F5-TTS's ``settings``."""

from __future__ import annotations

import attrs

from mizuoto.contracts.requests import MAX_GUIDANCE, MAX_STEPS
from mizuoto.errors import InvalidOption, InvalidRequest
from mizuoto.validation.ranges import integer_in, number_in

# Ranges of the params (docs/engines/voxcpm.md, Settings): patches, retries, the length ratio.
MAX_PATCHES = 65536
MAX_RETRIES = 100
MAX_RATIO = 100.0
# requests one loaded model can hold open at once (engines.voxcpm.cache_slots)
MAX_CACHE_SLOTS = 256
#: default for ``engines.voxcpm.cache_slots``: a stream, a request made between two of its
#: chunks, and two more threads' requests
DEFAULT_CACHE_SLOTS = 4


def _integer(name: str, low: int, high: int):
    return integer_in(f"params.{name}", low, high)


def _number(name: str, low: float, high: float):
    return number_in(f"params.{name}", low, high)


def _flag(name: str):
    def check(instance, attribute, value):
        if not isinstance(value, bool):
            raise InvalidRequest(f"params.{name}", f"must be true or false, got {value!r}")
    return check


@attrs.frozen
class VoxCPMParams:
    """``request.params`` for VoxCPM, with upstream's defaults.

    ``inference_timesteps`` and ``cfg_value`` are the sampler's steps and guidance; the request's
    ``steps`` / ``guidance`` take precedence when set. ``max_len`` caps the new patches (upstream
    also caps at ``int(text tokens × retry_badcase_ratio_threshold + 10)``).
    ``reference_prefix`` (VoxCPM2): a reference with a transcript is used both as an isolated
    reference voice and as a continuation prompt; ``False`` uses it as a continuation prompt only.
    ``split_text`` splits the text at sentence ends into chunks of at most ``chunk_tokens`` text
    tokens (always done when the text would not fit the model's context).
    ``tiled_decode`` forces the AudioVAE tile decoding used as the out-of-memory fallback.
    Ranges: ``inference_timesteps`` [1, 1000], ``cfg_value`` [0, 100] (finite), ``min_len``
    [0, 65536], ``max_len`` and ``chunk_tokens`` [1, 65536], ``retry_badcase_max_times``
    [1, 100], ``retry_badcase_ratio_threshold`` [0, 100] (finite).
    """

    inference_timesteps: int = attrs.field(
        default=10, validator=_integer("inference_timesteps", 1, MAX_STEPS))
    cfg_value: float = attrs.field(default=2.0, validator=_number("cfg_value", 0.0, MAX_GUIDANCE))
    min_len: int = attrs.field(default=2, validator=_integer("min_len", 0, MAX_PATCHES))
    max_len: int = attrs.field(default=4096, validator=_integer("max_len", 1, MAX_PATCHES))
    normalize: bool = attrs.field(default=False, validator=_flag("normalize"))
    retry_badcase: bool = attrs.field(default=True, validator=_flag("retry_badcase"))
    retry_badcase_max_times: int = attrs.field(
        default=3, validator=_integer("retry_badcase_max_times", 1, MAX_RETRIES))
    retry_badcase_ratio_threshold: float = attrs.field(
        default=6.0, validator=_number("retry_badcase_ratio_threshold", 0.0, MAX_RATIO))
    reference_prefix: bool = attrs.field(default=True, validator=_flag("reference_prefix"))
    split_text: bool = attrs.field(default=False, validator=_flag("split_text"))
    chunk_tokens: int = attrs.field(default=300,
                                    validator=_integer("chunk_tokens", 1, MAX_PATCHES))
    tiled_decode: bool = attrs.field(default=False, validator=_flag("tiled_decode"))


def _dtype_option(instance, attribute, value):
    if value not in ("auto", "float32", "bfloat16", "float16"):
        raise InvalidOption("engines.voxcpm.dtype",
                            f"must be auto, float32, bfloat16 or float16, got {value!r}")


def _one_of(option: str, choices: tuple[str, ...]):
    def check(instance, attribute, value):
        if value not in choices:
            raise InvalidOption(option, f"must be one of {', '.join(choices)}, got {value!r}")
    return check


FAST_PROFILES = ("off", "int8-lm", "int8")
INT8_KERNELS = ("auto", "packed", "dynamic")  # mizuoto_voxcpm.fast's, without importing torch
FAST_VAE_DTYPES = ("auto", "float32", "bfloat16", "int8")


@attrs.frozen
class VoxCPMOptions:
    """``engines.voxcpm.*``: ``dtype`` overrides ``compute.dtype`` for the LM and DiT (the VAE
    runs in float32 but in a fast profile's ``fast_vae``). ``auto`` is the config's dtype on every device, float32 on MPS.
    ``cache_slots`` [1, 256]: how many requests (open streams included) the loaded model holds
    at once, each in its own LM caches (allocated when first needed). ``max_batch``
    [1, 256]: streams step together in batches of up to this many (continuous batching);
    1 (the default) generates each alone. A batched row's audio is not bit-identical to its
    audio alone on every CPU (docs/performance.md); results say ``compute["batched"]``."""

    dtype: str = attrs.field(default="auto", validator=_dtype_option)
    cache_slots: int = attrs.field(
        default=DEFAULT_CACHE_SLOTS,
        validator=integer_in("engines.voxcpm.cache_slots", 1, MAX_CACHE_SLOTS,
                             error=InvalidOption))
    max_batch: int = attrs.field(
        default=1, validator=integer_in("engines.voxcpm.max_batch", 1, MAX_CACHE_SLOTS,
                                        error=InvalidOption))
    #: the opt-in fast profile, never exact (mizuoto_voxcpm.fast): off, int8-lm or int8
    fast: str = attrs.field(default="off", validator=_one_of("engines.voxcpm.fast",
                                                             FAST_PROFILES))
    #: the int8 kernel of a fast profile: auto (fbgemm's packed one where torch has it),
    #: packed or dynamic (torch's dynamic int8 layer)
    int8_kernel: str = attrs.field(default="auto", validator=_one_of(
        "engines.voxcpm.int8_kernel", INT8_KERNELS))
    #: the VAE decoder's dtype in a fast profile: float32, bfloat16 (faster for a whole
    #: utterance, slower for a stream) or int8 (its transposed and pointwise convolutions as
    #: packed int8 products), auto: int8 where torch has the packed kernel, else float32
    #: (mizuoto_voxcpm.fast); the exact path keeps float32
    fast_vae: str = attrs.field(default="auto", validator=_one_of(
        "engines.voxcpm.fast_vae", FAST_VAE_DTYPES))
