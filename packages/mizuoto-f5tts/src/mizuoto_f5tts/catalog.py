"""Released F5-TTS models: where each file of a model directory comes from.

File names are upstream's (``api.F5TTS`` / ``infer_cli``): ``hf://SWivid/F5-TTS/F5TTS_v1_Base/
model_1250000.safetensors``, ``F5TTS_Base/model_1200000.safetensors`` and ``hf://SWivid/E2-TTS/
E2TTS_Base/model_1200000.safetensors``, with Vocos from ``charactr/vocos-mel-24khz``. The
weights are CC-BY-NC-4.0 (trained on Emilia): non-commercial use only.
"""

from __future__ import annotations

from mizuoto.catalog import CatalogEntry, HubFile

LICENSE = "CC-BY-NC-4.0"

_VOCOS = {
    "vocos/config.yaml": HubFile("charactr/vocos-mel-24khz", "config.yaml"),
    "vocos/pytorch_model.bin": HubFile("charactr/vocos-mel-24khz", "pytorch_model.bin"),
}


def _entry(name: str, variant: str, repo: str, folder: str, step: int, description: str,
           *, vocab_in_repo: bool) -> CatalogEntry:
    checkpoint = f"model_{step}.safetensors"
    files = {checkpoint: HubFile(repo, f"{folder}/{checkpoint}"), **_VOCOS}
    optional: set[str] = set()
    if vocab_in_repo:
        files["vocab.txt"] = HubFile(repo, f"{folder}/vocab.txt")
    else:
        # upstream loads every variant with its packaged vocab, which this package ships too
        files["vocab.txt"] = HubFile("SWivid/F5-TTS", "F5TTS_v1_Base/vocab.txt")
        optional.add("vocab.txt")
    return CatalogEntry(id=f"f5tts/{name}", engine="f5tts", files=files, license=LICENSE,
                        non_commercial=True, description=description, variant=variant,
                        optional=optional)


ENTRIES = (
    _entry("v1-base", "v1_base", "SWivid/F5-TTS", "F5TTS_v1_Base", 1250000,
           "F5-TTS v1 Base (337 M), English and Chinese", vocab_in_repo=True),
    _entry("base", "base", "SWivid/F5-TTS", "F5TTS_Base", 1200000,
           "F5-TTS Base (v0, 337 M), English and Chinese", vocab_in_repo=True),
    _entry("e2-base", "e2_base", "SWivid/E2-TTS", "E2TTS_Base", 1200000,
           "E2-TTS Base (333 M), English and Chinese", vocab_in_repo=False),
)
