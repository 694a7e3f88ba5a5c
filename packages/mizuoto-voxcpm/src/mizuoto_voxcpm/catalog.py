"""Catalog entries of the released VoxCPM models (Apache-2.0, openbmb on Hugging Face)."""

from __future__ import annotations

from mizuoto.catalog import CatalogEntry, HubFile

_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_OTHER_FORMAT = {
    "model.safetensors": "pytorch_model.bin",
    "pytorch_model.bin": "model.safetensors",
    "audiovae.pth": "audiovae.safetensors",
    "audiovae.safetensors": "audiovae.pth",
}


def _entry(model_id: str, repo: str, weights: str, vae: str, variant: str, description: str
           ) -> CatalogEntry:
    files = {name: HubFile(repo, name) for name in ("config.json", *_TOKENIZER)}
    # The released repositories differ in weight formats; take whichever each one has.
    files[weights] = HubFile(repo, weights, alternatives=[_OTHER_FORMAT[weights]])
    files[vae] = HubFile(repo, vae, alternatives=[_OTHER_FORMAT[vae]])
    return CatalogEntry(
        id=model_id,
        engine="voxcpm",
        files=files,
        license="Apache-2.0",
        variant=variant,
        description=description,
        optional={"special_tokens_map.json"},
    )


ENTRIES = (
    _entry("voxcpm/0.5b", "openbmb/VoxCPM-0.5B", "pytorch_model.bin", "audiovae.pth", "voxcpm",
           "VoxCPM-0.5B: 16 kHz, 12.5 Hz patches; zero-shot, continuation cloning, streaming"),
    _entry("voxcpm/1.5", "openbmb/VoxCPM1.5", "model.safetensors", "audiovae.pth", "voxcpm",
           "VoxCPM1.5: 44.1 kHz, 6.25 Hz patches; zero-shot, continuation cloning, streaming"),
    _entry("voxcpm/2", "openbmb/VoxCPM2", "model.safetensors", "audiovae.pth", "voxcpm2",
           "VoxCPM2: 16 kHz in, 48 kHz out; zero-shot, reference and continuation cloning, "
           "voice design, streaming"),
)
