"""What ``describe`` answers: one Wyoming TTS program per served model, its voices (``default``
and every saved voice built with that model, from the voice store ``mizuoto serve`` writes),
the languages it speaks, and its licence.

A voice's Wyoming name is ``MODEL/VOICE`` (``f5/default``, ``f5/alice``): Home Assistant shows
one list of voices across programs, so the model is part of the name.
"""

from __future__ import annotations

import logging

from mizuoto.serve.voices import DEFAULT_VOICE

log = logging.getLogger("mizuoto.wyoming")

_ATTRIBUTION = ("Mizuoto", "https://pypi.org/project/mizuoto-core/")


def voice_name(model: str, voice: str) -> str:
    return f"{model}/{voice}"


def split_voice(name: str) -> tuple[str | None, str]:
    """``(model, voice)`` of a Wyoming voice name; ``MODEL`` alone is its default voice, a bare
    ``VOICE`` has no model (None: the caller picks)."""
    model, sep, voice = name.partition("/")
    if not sep:
        return None, name
    return model, voice or DEFAULT_VOICE


def languages(engine, override: tuple[str, ...] = ()) -> list[str]:
    """What ``engine``'s model speaks, as its card says (``ModelInfo.languages``), unless
    ``--language`` overrides it. A model that declares none is announced with none: Home
    Assistant then offers it for no language, and ``--language`` is the fix (logged)."""
    spoken = list(override or engine.info.languages)
    if not spoken:
        log.warning("model %s declares no languages: Home Assistant will not offer its voices; "
                    "announce them with --language", engine.info.model)
    return spoken


def licence_line(info) -> str:
    """The model's licence, with the non-commercial notice where it applies."""
    line = f"licence: {info.license or 'see the model card'}"
    if info.non_commercial:
        line += " (non-commercial use only: these weights may not be used commercially)"
    return line


def describe(workers, saved: list[dict[str, str]], *, version: str,
             language_override: tuple[str, ...] = ()):
    """The ``info`` event's :class:`wyoming.info.Info` for the loaded models' ``workers``
    (name to :class:`~mizuoto.serve.worker.ModelWorker`) and the voice store's ``saved``
    voices (:meth:`~mizuoto.serve.voices.VoiceStore.list`)."""
    from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

    attribution = Attribution(*_ATTRIBUTION)
    programs = []
    for name, worker in workers.items():
        engine = worker.engine
        if engine is None:  # failed to load: nothing to offer
            continue
        info = engine.info
        spoken = languages(engine, language_override)
        description = f"{engine.name} {info.variant} at {info.sample_rate} Hz; " \
            f"{licence_line(info)}"
        names = [DEFAULT_VOICE] + [v["name"] for v in saved
                                   if v["fingerprint"] == info.fingerprint]
        voices = [TtsVoice(name=voice_name(name, voice), attribution=attribution,
                           installed=True, description=f"{voice} ({description})",
                           version=version, languages=spoken) for voice in names]
        programs.append(TtsProgram(name=f"mizuoto-{name}", attribution=attribution,
                                   installed=True, description=description, version=version,
                                   voices=voices, supports_synthesize_streaming=True))
    return Info(tts=programs)
