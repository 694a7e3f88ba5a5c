"""Saved voices: an atomic safetensors round trip, and refusal for another model or engine."""

from __future__ import annotations

import pytest
import torch

from mizuoto import Voice
from mizuoto.errors import InvalidRequest, VoiceMismatch


def _voice() -> Voice:
    return Voice(
        engine="fake",
        model_fingerprint="ab" * 32,
        sample_rate=24000,
        tensors={"prompt_latents": torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),
                 "prompt_ids": torch.arange(5)},
        texts={"reference": "Grüß Gott, 你好"},
        meta={"frames": 3, "note": "ok"},
    )


def test_save_and_load_round_trip(tmp_path):
    voice = _voice()
    path = voice.save(tmp_path / "voices" / "anna.safetensors")
    loaded = Voice.load(path)
    assert (loaded.engine, loaded.model_fingerprint, loaded.sample_rate) == \
        ("fake", "ab" * 32, 24000)
    assert set(loaded.tensors) == set(voice.tensors)
    for name, tensor in voice.tensors.items():
        assert torch.equal(loaded.tensors[name], tensor)
        assert loaded.tensors[name].dtype == tensor.dtype
    assert dict(loaded.texts) == dict(voice.texts)
    assert dict(loaded.meta) == {"frames": 3, "note": "ok"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["anna.safetensors"]


def test_a_failed_save_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = _voice().save(tmp_path / "anna.safetensors")
    before = path.read_bytes()

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        _voice().save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["anna.safetensors"]


def test_check_refuses_another_engine_or_model():
    voice = _voice()
    voice.check("fake", "ab" * 32)
    with pytest.raises(VoiceMismatch, match="built for fake model abababababab"):
        voice.check("fake", "cd" * 32)
    with pytest.raises(VoiceMismatch, match="not other model abababababab"):
        voice.check("other", "ab" * 32)


def test_load_errors_name_the_voice(tmp_path):
    with pytest.raises(InvalidRequest, match="does not exist") as raised:
        Voice.load(tmp_path / "missing.safetensors")
    assert raised.value.field == "voice"
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(InvalidRequest, match="is not a voice file"):
        Voice.load(garbage)
    from safetensors.torch import save_file

    plain = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(InvalidRequest, match="is not a Mizuoto voice file"):
        Voice.load(plain)



@pytest.mark.parametrize("field, header, problem", [
    ("texts", '{"reference": ' + "[" * 4_321 + "]" * 4_321 + "}", "nests deeper than"),
    ("meta", '{"frames": ' + "1" * 777 + "}", "digits"),
    ("meta", '{"frames": 1, "frames": 2}', "given twice"),
    ("texts", '["reference"]', "holds an array where an object belongs"),
    ("meta", '"frames"', "holds a string where an object belongs"),
])
def test_a_voice_header_from_outside_is_a_named_error(tmp_path, field, header, problem):
    from safetensors.torch import save_file

    voice = _voice()
    path = tmp_path / "hostile.safetensors"
    metadata = {"format": "mizuoto-voice/1", "engine": "fake", "model_fingerprint": "ab" * 32,
                "sample_rate": "24000", "texts": "{}", "meta": "{}", field: header}
    save_file(dict(voice.tensors), str(path), metadata=metadata)
    with pytest.raises(InvalidRequest, match=f"damaged header .*its {field} header.*{problem}"):
        Voice.load(path)
