"""F5-TTS for Mizuoto: flow-matching speech from a reference voice, with Vocos.

    import mizuoto
    tts = mizuoto.load("f5tts/v1-base")
    ref = mizuoto.Reference("voice.wav", text="What the voice says.")
    tts.synthesize(mizuoto.SynthesisRequest("Hello there.", reference=ref, seed=7)).save("a.wav")
"""

__all__ = ["F5Engine", "F5Options", "F5Params"]


def __getattr__(name: str):
    # The engine (and torch) is imported on first use: the plugin module, imported whenever
    # Mizuoto lists its plugins, lives in this package.
    if name in ("F5Options", "F5Params"):  # torch-free
        from mizuoto_f5tts import settings

        return getattr(settings, name)
    if name in __all__:
        from mizuoto_f5tts import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
