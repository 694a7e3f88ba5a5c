"""Options: nested and dotted mappings, TOML files, key=value overrides, engine sections."""

from __future__ import annotations

import attrs
import pytest
from conftest import FakeEngine, FakeOptions

from mizuoto import ComputeOptions, Options
from mizuoto.errors import InvalidOption

# Engine sections are validated against installed engines: test against the fake one only.
pytestmark = pytest.mark.usefixtures("no_plugins")


def test_defaults():
    options = Options()
    assert options.compute == ComputeOptions()
    assert (options.compute.device, options.compute.dtype) == ("auto", "auto")
    assert options.compute.cpu_threads is None
    assert dict(options.engines) == {}
    assert dict(options.engine("f5tts")) == {}


def test_nested_and_dotted_keys_are_the_same():
    nested = Options.from_mapping({"compute": {"device": "cpu", "cpu_threads": 2},
                                   "engines": {"f5tts": {"nfe_step": 16}}})
    dotted = Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 2,
                                   "engines.f5tts.nfe_step": 16})
    mixed = Options.from_mapping({"compute": {"device": "cpu"}, "compute.cpu_threads": 2,
                                  "engines.f5tts": {"nfe_step": 16}})
    assert nested == dotted == mixed
    assert nested.compute == ComputeOptions(device="cpu", cpu_threads=2)
    assert dict(nested.engine("f5tts")) == {"nfe_step": 16}


def test_device_may_name_an_index():
    assert Options.from_mapping({"compute.device": "cuda:1"}).compute.device == "cuda:1"


@pytest.mark.parametrize("values, key", [
    ({"comptue.device": "cpu"}, "comptue"),
    ({"compute.devise": "cpu"}, "compute.devise"),
    ({"compute.device": "tpu"}, "compute.device"),
    ({"compute.dtype": "float64"}, "compute.dtype"),
    ({"compute.compile": "yes"}, "compute.compile"),
    ({"compute.cpu_threads": 0}, "compute.cpu_threads"),
    ({"compute.cpu_threads": True}, "compute.cpu_threads"),
    ({"compute.cpu_threads": 1.5}, "compute.cpu_threads"),
    ({"compute.attention": "flash"}, "compute.attention"),
    ({"compute.cpu_allocator": "mimalloc"}, "compute.cpu_allocator"),
    ({"compute.cpu_pinning": "close"}, "compute.cpu_pinning"),
    ({"compute": "cpu"}, "compute"),
    ({"engines": "f5tts"}, "engines"),
    ({"engines.f5tts": 3}, "engines.f5tts"),
])
def test_bad_keys_and_values_name_the_key(values, key):
    with pytest.raises(InvalidOption) as raised:
        Options.from_mapping(values)
    assert raised.value.key == key
    assert repr(key) in str(raised.value)


def test_from_toml(tmp_path):
    path = tmp_path / "mizuoto.toml"
    path.write_text('[compute]\ndevice = "cpu"\ncpu_threads = 4\n\n'
                    '[engines.voxcpm]\ninference_timesteps = 10\n')
    options = Options.from_toml(path)
    assert options.compute == ComputeOptions(device="cpu", cpu_threads=4)
    assert dict(options.engine("voxcpm")) == {"inference_timesteps": 10}


def test_from_toml_errors_name_the_file(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[compute\n")
    with pytest.raises(InvalidOption, match="cannot read options file") as raised:
        Options.from_toml(broken)
    assert raised.value.key == str(broken)
    with pytest.raises(InvalidOption, match="cannot read options file"):
        Options.from_toml(tmp_path / "missing.toml")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[compute]\nspeed = "fast"\n')
    with pytest.raises(InvalidOption) as raised:
        Options.from_toml(unknown)
    assert raised.value.key == "compute.speed"


def test_overrides_parse_toml_scalars_else_text():
    base = Options.from_mapping({"compute.device": "cpu", "engines.f5tts.nfe_step": 16})
    options = base.with_overrides([
        "compute.cpu_threads=3", "compute.compile = true", "engines.f5tts.cfg_strength=2.5",
        "engines.f5tts.vocoder=vocos", 'engines.f5tts.note="quoted text"',
    ])
    assert options.compute == ComputeOptions(device="cpu", cpu_threads=3, compile=True)
    assert dict(options.engine("f5tts")) == {"nfe_step": 16, "cfg_strength": 2.5,
                                             "vocoder": "vocos", "note": "quoted text"}
    assert base.compute.cpu_threads is None, "with_overrides returns a new Options"


@pytest.mark.parametrize("pair, key", [
    ("compute.device", "compute.device"),
    ("compute.threads=2", "compute.threads"),
    ("compute.cpu_threads=many", "compute.cpu_threads"),
    ("compute=3", "compute"),
])
def test_bad_overrides_name_the_key(pair, key):
    with pytest.raises(InvalidOption) as raised:
        Options().with_overrides([pair])
    assert raised.value.key == key


def test_options_are_frozen():
    options = Options.from_mapping({"engines.f5tts.nfe_step": 16})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        options.compute = ComputeOptions()
    with pytest.raises(TypeError):
        options.engines["f5tts"] = {}
    with pytest.raises(TypeError):
        options.engines["f5tts"]["nfe_step"] = 8


def test_engine_sections_are_parsed_by_the_engine_options_class(fake_plugin):
    options = Options.from_mapping({"engines.fake.level": 4})
    assert options.engine_options(FakeEngine) == FakeOptions(level=4)
    assert Options().engine_options(FakeEngine) == FakeOptions()


@pytest.mark.parametrize("values, key", [
    ({"engines.fake.levle": 4}, "engines.fake.levle"),
    ({"engines.fake.level": -1}, "engines.fake.level"),  # the bad value is named
])
def test_installed_engine_sections_are_validated(fake_plugin, values, key):
    from mizuoto.registry import validate_engine_options

    options = Options.from_mapping(values)  # parsing alone imports no plugin
    with pytest.raises(InvalidOption) as raised:
        validate_engine_options(options)
    assert raised.value.key == key
    with pytest.raises(InvalidOption) as raised:
        options.engine_options(FakeEngine)  # what an engine's load does
    assert raised.value.key == key
    with pytest.raises(InvalidOption):
        validate_engine_options(Options().with_overrides([f"{k}={v}" for k, v in values.items()]))


def test_parsing_options_imports_no_plugin():
    import subprocess
    import sys

    code = ("import sys; from mizuoto import Options; from mizuoto import plugins; "
            "Options.from_mapping({'engines.f5tts.variant': 'v1_base', 'compute.device': 'cpu'}); "
            "print(plugins._loaded, sorted(m for m in sys.modules if m.startswith('mizuoto_')))")
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert output == ["False", "[]"]


def test_sections_of_engines_not_installed_are_kept(fake_plugin):
    options = Options.from_mapping({"engines.voxcpm.anything": 1})
    assert dict(options.engine("voxcpm")) == {"anything": 1}


def test_an_engine_without_options_class_takes_none(fake_plugin):
    class Bare(FakeEngine):
        name = "bare"
        options_class = None

    assert Options().engine_options(Bare) is None
    with pytest.raises(InvalidOption) as raised:
        Options(engines={"bare": {"x": 1}}).engine_options(Bare)
    assert raised.value.key == "engines.bare.x"


def test_unknown_engine_option_lists_the_known_ones(fake_plugin):
    from mizuoto.registry import validate_engine_options

    with pytest.raises(InvalidOption, match=r"known: label, level"):
        validate_engine_options(Options.from_mapping({"engines.fake.levle": 4}))
