"""The plugin API has an edge: ``mizuoto.plugin`` is documented whole, the example plugin
stands on it alone, and the base-class helpers it offers do what plugins wrote by hand."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mizuoto
import mizuoto.plugin
from mizuoto.plugin import (
    Audio,
    Capability,
    Engine,
    InvalidAudio,
    InvalidOption,
    InvalidRequest,
    ModelInfo,
    Options,
    Reference,
    Rendered,
    SynthesisRequest,
    check_output_length,
    read_reference,
)

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "docs" / "examples" / "mizuoto-example" / "src" / "mizuoto_example"
_START = "<!-- mizuoto.plugin:"
_END = "<!-- end of mizuoto.plugin -->"


def _documented_names() -> set[str]:
    """The names heading each top-level bullet between the markers in docs/api.md: the
    backticked names before the bullet's first "`:"."""
    text = (ROOT / "docs" / "api.md").read_text()
    region = text[text.index(_START):text.index(_END)]
    names = set()
    for bullet in re.split(r"^- ", region, flags=re.MULTILINE)[1:]:
        head = bullet.split("`:", 1)[0] + "`"
        names.update(re.findall(r"`([A-Za-z_]\w*)[`(]", head))
    return names


def test_api_docs_list_exactly_the_plugin_module():
    documented, exported = _documented_names(), set(mizuoto.plugin.__all__)
    assert not exported - documented, f"not in docs/api.md: {sorted(exported - documented)}"
    assert not documented - exported, f"documented, not exported: {sorted(documented - exported)}"


def test_the_plugin_module_holds_mizuotos_names_once_and_resolves_each():
    assert len(mizuoto.plugin.__all__) == len(set(mizuoto.plugin.__all__))
    assert set(mizuoto.__all__) <= set(mizuoto.plugin.__all__)
    missing = [name for name in mizuoto.plugin.__all__ if not hasattr(mizuoto.plugin, name)]
    assert not missing
    assert set(mizuoto.plugin.__all__) <= set(dir(mizuoto.plugin))
    with pytest.raises(AttributeError, match="no_such_name"):
        mizuoto.plugin.no_such_name  # noqa: B018


def test_importing_the_plugin_module_imports_no_torch():
    code = "import sys, mizuoto.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


_PUBLIC = {"mizuoto", "mizuoto.plugin"}


def _mizuoto_imports(path: Path) -> dict[str, set[str]]:
    """``{module: names imported from it}`` for the mizuoto modules ``path`` imports."""
    modules: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.setdefault(node.module, set()).update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                modules.setdefault(alias.name, set())
    return {m: names for m, names in modules.items()
            if m == "mizuoto" or m.startswith("mizuoto.")}


@pytest.mark.parametrize("module", sorted(p.name for p in EXAMPLE.glob("*.py")))
def test_the_example_plugin_imports_only_the_public_modules(module):
    imports = _mizuoto_imports(EXAMPLE / module)
    deep = set(imports) - _PUBLIC
    assert not deep, f"{module} imports internal modules {sorted(deep)}: import from " \
                     "mizuoto.plugin"


def test_the_import_check_sees_a_deep_import(tmp_path):
    source = tmp_path / "engine.py"
    source.write_text("from mizuoto.runtime.placement import place\nimport mizuoto.nn\n")
    assert _mizuoto_imports(source) == {"mizuoto.runtime.placement": {"place"},
                                        "mizuoto.nn": set()}


# -- the base class's helpers -------------------------------------------------------------

RATE = 8000


class _Base(Engine):
    name = "helper"
    request_settings = frozenset()

    def __init__(self, capabilities=frozenset({Capability.ZERO_SHOT, Capability.STREAM})):
        self._info = ModelInfo("helper", "m", "v", RATE, "float32", "cpu", capabilities,
                               fingerprint="f" * 64)

    @classmethod
    def load(cls, model_dir, *, options=None, model_id=None, progress=None):
        cls.loaded = True
        return cls()

    @property
    def info(self):
        return self._info


class _StreamOnly(_Base):
    def _stream(self, request, params, generator, progress):
        for index in range(3):
            noise = torch.randn(4, generator=generator)
            yield Rendered(Audio(noise, RATE), sampler={"piece": index}, chunks=3,
                           last=index == 2)


class _SynthesizeOnly(_Base):
    def _synthesize(self, request, params, generator, progress):
        return Rendered(Audio(torch.randn(12, generator=generator), RATE), chunks=1,
                        extra={"made": "whole"})


class _Neither(_Base):
    pass


def test_synthesize_is_the_join_of_the_stream():
    engine = _StreamOnly()
    request = SynthesisRequest("hi", seed=3)
    result = engine.synthesize(request)
    chunks = list(engine.stream(request))
    assert torch.equal(result.audio.samples, torch.cat([c.audio.samples for c in chunks]))
    assert result.applied.sampler == {"piece": 2} and result.applied.chunks == 3


def test_a_stream_is_one_chunk_of_synthesize():
    engine = _SynthesizeOnly()
    request = SynthesisRequest("hi", seed=3)
    chunks = list(engine.stream(request))
    assert len(chunks) == 1 and chunks[0].is_last
    assert torch.equal(chunks[0].audio.samples, engine.synthesize(request).audio.samples)
    assert chunks[0].applied.extra == {"made": "whole"}


def test_an_engine_implementing_neither_is_told_both_names():
    for call in (_Neither().synthesize, _Neither().stream):
        with pytest.raises(TypeError, match=r"neither _synthesize\(\) nor _stream\(\)"):
            call(SynthesisRequest("hi"))


class _CpuFloat32(_Base):
    devices = frozenset({"cpu"})
    dtypes = frozenset({"float32"})
    loaded = False

    def _synthesize(self, request, params, generator, progress):
        raise AssertionError("not reached")


@pytest.mark.parametrize(("setting", "value"), [("device", "cuda"), ("device", "cuda:1"),
                                                ("dtype", "bfloat16")])
def test_an_undeclared_device_or_dtype_is_refused_before_load(setting, value):
    options = Options.from_mapping({"compute": {setting: value}})
    with pytest.raises(InvalidOption, match=rf"compute\.{setting}.*helper engine"):
        _CpuFloat32.load(Path("."), options=options)
    assert not _CpuFloat32.loaded


def test_a_declared_device_and_dtype_load():
    options = Options.from_mapping({"compute": {"device": "cpu", "dtype": "float32"}})
    assert isinstance(_CpuFloat32.load(Path("."), options=options), _CpuFloat32)


def test_make_voice_carries_the_engines_identity():
    voice = _SynthesizeOnly().make_voice({"v": torch.ones(2)}, texts={"reference": "hi"})
    assert (voice.engine, voice.model_fingerprint, voice.sample_rate) == ("helper", "f" * 64,
                                                                           RATE)
    voice.check("helper", "f" * 64)
    assert voice.texts == {"reference": "hi"}


def _tone(rate: int, seconds: float = 0.5) -> torch.Tensor:
    time = torch.arange(int(rate * seconds), dtype=torch.float32) / rate
    return 0.3 * torch.sin(2 * torch.pi * 220 * time)


def test_read_reference_resamples_to_the_engines_rate():
    audio = read_reference(Reference(Audio(_tone(16000), 16000)), RATE)
    assert audio.sample_rate == RATE and audio.samples.shape == (RATE // 2,)
    assert audio.samples.dtype == torch.float32
    same = read_reference(Audio(_tone(RATE), RATE), RATE)
    assert torch.equal(same.samples, _tone(RATE))


def test_read_reference_reads_a_file_as_mono(tmp_path):
    import soundfile as sf

    path = tmp_path / "stereo.wav"
    tone = _tone(RATE).numpy()
    sf.write(path, [[s, 0.0] for s in tone], RATE, subtype="FLOAT")
    audio = read_reference(path, RATE)
    assert torch.allclose(audio.samples, torch.from_numpy(tone) / 2)


def test_read_reference_refuses_silence_and_missing_files(tmp_path):
    with pytest.raises(InvalidAudio, match="reference.audio.*silent"):
        read_reference(Audio(torch.zeros(800), RATE), RATE)
    with pytest.raises(InvalidAudio, match="voice.audio"):
        read_reference(tmp_path / "missing.wav", RATE, field="voice.audio")


def test_check_output_length_refuses_by_name():
    check_output_length(10.0, 10.0, setting="params.max_seconds")
    with pytest.raises(InvalidRequest, match=r"text.*12\.0 s.*params\.max_seconds \(10 s\)"):
        check_output_length(12.0, 10.0, setting="params.max_seconds")
