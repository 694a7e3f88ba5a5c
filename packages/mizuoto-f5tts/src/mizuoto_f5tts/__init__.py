"""F5-TTS for Mizuoto: flow-matching speech from a reference voice, with Vocos.

    import mizuoto
    tts = mizuoto.load("f5tts/v1-base")
    ref = mizuoto.Reference("voice.wav", text="What the voice says.")
    tts.synthesize(mizuoto.SynthesisRequest("Hello there.", reference=ref, seed=7)).save("a.wav")
"""

from mizuoto_f5tts.engine import F5Engine, F5Options, F5Params

__all__ = ["F5Engine", "F5Options", "F5Params"]
