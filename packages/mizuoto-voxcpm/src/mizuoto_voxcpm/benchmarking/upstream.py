"""Upstream voxcpm 2.0.3 driven for ``mizuoto bench --against-upstream`` (benchmark only).

Imported only in the benchmark's upstream child process: it imports ``voxcpm``, which
Mizuoto's runtime never does. Upstream runs through ``voxcpm.core.VoxCPM`` without denoiser or
compile, as the parity tests drive it, so identical audio here means what it means there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from voxcpm.core import VoxCPM

from mizuoto.contracts.requests import SynthesisRequest
from mizuoto.errors import InvalidRequest
from mizuoto.validation import parse_attrs
from mizuoto_voxcpm.config import VoxCPMConfig
from mizuoto_voxcpm.settings import VoxCPMParams

# Mizuoto's own settings (long texts, the VoxCPM2 reference prefix): upstream has no such
# keyword; at their defaults Mizuoto does what upstream does
_MIZUOTO_ONLY = ("reference_prefix", "split_text", "chunk_tokens")


class VoxCPMUpstream:
    """One upstream ``VoxCPM``. 2.0.3 takes no seed: the global generator is seeded before
    each attempt with ``seed + attempt``, which is what Mizuoto does with its own generator."""

    def __init__(self, tts: VoxCPM, v2: bool) -> None:
        self._tts = tts
        self._v2 = v2
        self._seed = 0
        self._attempts = 0
        self.sample_rate = int(tts.tts_model.sample_rate)
        inference = tts.tts_model._inference

        def seeded(*args, **kwargs):
            torch.manual_seed(self._seed + self._attempts)
            self._attempts += 1
            yield from inference(*args, **kwargs)

        tts.tts_model._inference = seeded

    @classmethod
    def load(cls, model_dir: Path, *, device: str = "cpu") -> VoxCPMUpstream:
        v2 = VoxCPMConfig.from_model_dir(model_dir).is_v2
        tts = VoxCPM(voxcpm_model_path=str(model_dir), enable_denoiser=False, optimize=False,
                     device=device)
        return cls(tts, v2)

    def _kwargs(self, request: SynthesisRequest) -> dict:
        if request.voice is not None or request.instruction is not None:
            raise InvalidRequest("request", "the upstream benchmark takes a text and a reference")
        params = parse_attrs(VoxCPMParams, request.params, "params")
        defaults = VoxCPMParams()
        for name in _MIZUOTO_ONLY:
            if getattr(params, name) != getattr(defaults, name):
                raise InvalidRequest(f"params.{name}", "upstream voxcpm has no such setting",
                                     "leave it unset with --against-upstream")
        kwargs = {name: getattr(params, name) for name in (
            "inference_timesteps", "cfg_value", "min_len", "max_len", "normalize",
            "retry_badcase", "retry_badcase_max_times", "retry_badcase_ratio_threshold")}
        if request.steps is not None:
            kwargs["inference_timesteps"] = request.steps
        if request.guidance is not None:
            kwargs["cfg_value"] = request.guidance
        reference = request.reference
        if reference is not None:
            if reference.text is not None:
                kwargs.update(prompt_wav_path=str(reference.audio), prompt_text=reference.text)
            if self._v2 and (reference.text is None or params.reference_prefix):
                kwargs["reference_wav_path"] = str(reference.audio)
            elif reference.text is None:
                raise InvalidRequest("--ref-text", "VoxCPM-0.5B and VoxCPM1.5 clone with the "
                                     "reference's transcript")
        self._seed = 0 if request.seed is None else request.seed
        self._attempts = 0
        return {"text": request.text, **kwargs}

    def synthesize(self, request: SynthesisRequest) -> np.ndarray:
        return self._tts.generate(**self._kwargs(request))

    def stream(self, request: SynthesisRequest) -> Iterator[np.ndarray]:
        yield from self._tts.generate_streaming(**self._kwargs(request))
