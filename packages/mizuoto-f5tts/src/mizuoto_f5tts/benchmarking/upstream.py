"""Upstream f5-tts 1.1.22 driven for ``mizuoto bench --against-upstream`` (benchmark only).

Imported only in the benchmark's upstream child process: it imports ``f5_tts``, which Mizuoto's
runtime never does. The request goes through upstream's own path (``load_model``,
``load_vocoder``, ``preprocess_ref_audio_text``, ``infer_process``) as the parity tests drive
it, so that identical audio here means what it means there.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from mizuoto.contracts.requests import SynthesisRequest
from mizuoto.errors import InvalidRequest, MizuotoError, UnsupportedCapability
from mizuoto.validation import parse_attrs
from mizuoto_f5tts.checkpoint import checkpoint_variant, default_vocab_path, find_checkpoint
from mizuoto_f5tts.reference import default_voice
from mizuoto_f5tts.settings import F5Params
from mizuoto_f5tts.variants import SAMPLE_RATE

# upstream imports wandb and cached_path at module level; in a checkout without them the
# parity tests' offline stand-ins serve (they refuse any download or logging)
_STUBS = Path(__file__).resolve().parents[3] / "tests" / "parity" / "oracle_stubs"


def _import_upstream():
    missing = [name for name in ("wandb", "cached_path") if importlib.util.find_spec(name) is None]
    if missing and _STUBS.is_dir():
        sys.path.insert(0, str(_STUBS))
    elif missing:
        raise MizuotoError(f"upstream f5-tts needs {', '.join(missing)} to import: pip install "
                           f"{' '.join(missing)} (or run from a Mizuoto checkout, whose "
                           f"tests/parity/oracle_stubs stand in for them)")
    from f5_tts.infer import utils_infer
    from f5_tts.model import DiT, UNetT

    return utils_infer, DiT, UNetT


utils_infer, DiT, UNetT = _import_upstream()

# Mizuoto's F5 params under upstream's infer_process names; the others have no upstream
# counterpart at their defaults' values only (checked in _upstream_kwargs)
_UPSTREAM_NAMES = {"sway_sampling_coef": "sway_sampling_coef", "speed": "speed",
                   "fix_duration": "fix_duration", "target_rms": "target_rms",
                   "cross_fade_duration": "cross_fade_duration"}


def _silent(*args, **kwargs) -> None:
    return None


def _checkpoint_shapes(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as shapes only (meta tensors), so that telling the variant
    costs no memory: the child's peak RSS is upstream's own."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as handle:
            return {key.replace("ema_model.", ""): torch.empty(handle.get_slice(key).get_shape(),
                                                               device="meta")
                    for key in handle.keys()}
    raw = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    state = raw.get("ema_model_state_dict", raw)
    return {key.replace("ema_model.", ""): torch.empty(value.shape, device="meta")
            for key, value in state.items()}


def _upstream_kwargs(request: SynthesisRequest) -> dict:
    params = parse_attrs(F5Params, request.params, "params")
    defaults = F5Params()
    for name in ("method", "use_epss", "remove_silence", "edit_durations", "tiled_decode"):
        if getattr(params, name) != getattr(defaults, name):
            raise InvalidRequest(f"params.{name}", "the upstream benchmark runs upstream's "
                                 "default for it", "leave it unset with --against-upstream")
    kwargs = {upstream: getattr(params, ours) for ours, upstream in _UPSTREAM_NAMES.items()}
    if request.steps is not None:
        kwargs["nfe_step"] = request.steps
    if request.guidance is not None:
        kwargs["cfg_strength"] = request.guidance
    return kwargs


class F5Upstream:
    """One upstream model and vocoder; each request seeds torch's global generator, as
    ``F5TTS.infer``'s ``seed_everything`` does."""

    sample_rate = SAMPLE_RATE

    def __init__(self, model, vocoder, device: str) -> None:
        self._model = model
        self._vocoder = vocoder
        self._device = device

    @classmethod
    def load(cls, model_dir: Path, *, device: str = "cpu") -> F5Upstream:
        model_dir = Path(model_dir)
        checkpoint = find_checkpoint(model_dir)
        variant = checkpoint_variant(checkpoint, _checkpoint_shapes(checkpoint))
        vocab = model_dir / "vocab.txt"
        model = utils_infer.load_model(
            DiT if variant.backbone == "dit" else UNetT, variant.upstream_config(),
            str(checkpoint), mel_spec_type="vocos",
            vocab_file=str(vocab if vocab.is_file() else default_vocab_path()), device=device)
        vocoder = utils_infer.load_vocoder("vocos", is_local=True,
                                           local_path=str(model_dir / "vocos"), device=device)
        return cls(model, vocoder, device)

    def synthesize(self, request: SynthesisRequest) -> np.ndarray:
        if request.voice is not None or request.instruction is not None:
            raise InvalidRequest("request", "the upstream benchmark takes a text and a reference")
        kwargs = _upstream_kwargs(request)
        reference = request.reference or default_voice()  # Mizuoto's default voice is upstream's
        if reference.text is None:
            raise InvalidRequest("--ref-text", "upstream f5-tts transcribes a reference without "
                                 "one (Whisper); the benchmark needs the transcript")
        # one worker: the chunks draw from the global generator in order (upstream's pool races)
        utils_infer.ThreadPoolExecutor = lambda: concurrent.futures.ThreadPoolExecutor(1)
        torch.manual_seed(0 if request.seed is None else request.seed)
        ref_file, ref_text = utils_infer.preprocess_ref_audio_text(
            str(reference.audio), reference.text, show_info=_silent)
        wave, _, _ = utils_infer.infer_process(ref_file, ref_text, request.text, self._model,
                                               self._vocoder, show_info=_silent, progress=None,
                                               device=self._device, **kwargs)
        # several chunks come back float64 (upstream's crossfade); Mizuoto returns that cast
        return np.asarray(wave, dtype=np.float32)

    def stream(self, request: SynthesisRequest) -> Iterator[np.ndarray]:
        raise UnsupportedCapability("F5-TTS does not stream (upstream or Mizuoto)")
