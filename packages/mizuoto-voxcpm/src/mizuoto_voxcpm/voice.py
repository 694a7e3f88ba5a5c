"""Saved VoxCPM voices: encoded prompt and/or reference latents, bound to one model.

A voice stores what ``build_prompt_cache`` would compute (the latents, not the audio), so a
request with a voice skips reading and encoding the recording. VoxCPM2 voices built from a
reference with a transcript hold both layouts (prompt latents left-padded, reference latents
right-padded) so the request can still choose ``reference_prefix``.
"""

from __future__ import annotations

from pathlib import Path

from mizuoto.contracts.voice import Voice
from mizuoto.errors import InvalidRequest
from mizuoto.runtime.checkpoint import weights_fingerprint
from mizuoto_voxcpm.config import read_config_json
from mizuoto_voxcpm.generation import PromptCache

ENGINE = "voxcpm"
PROMPT_LATENTS = "prompt_latents"
REFERENCE_LATENTS = "reference_latents"
PROMPT_TEXT = "prompt_text"
_RESAVE = "save the voice again from its recording (--save-voice) with this model"

def model_fingerprint(model_dir: str | Path, files: list[str]) -> str:
    """Identity of a model: its config and its weight files (core's fingerprint).

    Independent of the dtype and device it runs in (voices hold float32 VAE latents), so the
    config's ``dtype`` and ``device`` keys are left out.
    """
    model_dir = Path(model_dir)
    config = read_config_json(model_dir)
    for key in ("dtype", "device"):
        config.pop(key, None)
    return weights_fingerprint([model_dir / name for name in files], context=config)


def voice_from_prompt(cache: PromptCache, *, fingerprint: str, sample_rate: int,
                      generation: str) -> Voice:
    tensors = {}
    texts = {}
    if cache.prompt_latents is not None:
        tensors[PROMPT_LATENTS] = cache.prompt_latents.float().contiguous()
        texts[PROMPT_TEXT] = cache.prompt_text
    if cache.reference_latents is not None:
        tensors[REFERENCE_LATENTS] = cache.reference_latents.float().contiguous()
    return Voice(engine=ENGINE, model_fingerprint=fingerprint, sample_rate=sample_rate,
                 tensors=tensors, texts=texts, meta={"generation": generation})


def prompt_from_voice(voice: Voice, *, fingerprint: str, reference_prefix: bool,
                      use_prompt: bool = True) -> PromptCache:
    """The prompt a voice stands for; raises ``VoiceMismatch`` for another model's voice.

    With both latents stored, ``use_prompt=False`` (an instruction) leaves the continuation
    prompt out, else ``reference_prefix=False`` leaves the reference out.
    """
    voice.check(ENGINE, fingerprint)
    prompt = voice.tensors.get(PROMPT_LATENTS)
    reference = voice.tensors.get(REFERENCE_LATENTS)
    if prompt is not None and reference is not None:
        # as for a reference given with the request: an instruction keeps the reference voice
        # only; otherwise reference_prefix=False keeps the continuation prompt only
        if not use_prompt:
            prompt = None
        elif not reference_prefix:
            reference = None
    text = voice.texts.get(PROMPT_TEXT) if prompt is not None else None
    return PromptCache(prompt_text=text, prompt_latents=prompt, reference_latents=reference)


def check_voice_latents(voice: Voice, *, patch_size: int, feat_dim: int, max_length: int,
                        is_v2: bool) -> None:
    """Refuse, naming ``voice``, a voice file this model cannot speak with: latents missing
    (VoxCPM2's voices always hold ``reference_latents``, the first generation's a prompt with
    its text), of another layout than ``(patches, patch_size, feat_dim)``, empty, or longer
    than the model's context (a voice's fault, not the text's)."""
    needed = [REFERENCE_LATENTS] if is_v2 else [PROMPT_LATENTS]
    for name in needed:
        if name not in voice.tensors:
            raise InvalidRequest("voice", f"it holds no {name}, which every "
                                 f"{'VoxCPM2' if is_v2 else 'VoxCPM'} voice has", _RESAVE)
    if PROMPT_LATENTS in voice.tensors and not voice.texts.get(PROMPT_TEXT, "").strip():
        raise InvalidRequest("voice", f"its {PROMPT_LATENTS} come without their {PROMPT_TEXT}",
                             _RESAVE)
    patches = 0
    for name in (PROMPT_LATENTS, REFERENCE_LATENTS):
        latents = voice.tensors.get(name)
        if latents is None:
            continue
        shape = tuple(latents.shape)
        if latents.ndim != 3 or shape[1:] != (patch_size, feat_dim) or shape[0] == 0:
            raise InvalidRequest("voice", f"its {name} have shape {shape}, not (patches >= 1, "
                                 f"{patch_size}, {feat_dim}) as this model's", _RESAVE)
        if not latents.is_floating_point():
            raise InvalidRequest("voice", f"its {name} are {latents.dtype}, not float", _RESAVE)
        patches += shape[0]
    if patches >= max_length:
        raise InvalidRequest("voice", f"it holds {patches} patches of prompt, more than the "
                             f"model's context of {max_length} positions leaves room for",
                             "save a voice from a shorter recording (a few seconds)")
