"""Core's modules import downwards only, in the order ``mizuoto/loading.py`` states.

Every first-party import counts (at the top, in a function, under ``if TYPE_CHECKING:``; the
edges of ``test_import_cycles``). A module imports its own layer or those below it; a module
of core not named in :data:`LAYERS` is a front end (the CLI, the server, batch, long-form,
training), above every named layer, and the engines are above core.
"""

from __future__ import annotations

import pytest
from test_import_cycles import ROOT, _modules, import_edges, local_import_edges

#: Core's layers, lowest first: each layer's module prefixes (a prefix names a module and the
#: modules under it; ``mizuoto`` alone is the package's ``__init__``).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("mizuoto.errors", "mizuoto.key_values"),
    ("mizuoto.validation",),
    ("mizuoto.settings_files", "mizuoto.json_files", "mizuoto.regular_files",
     "mizuoto.adapter_files"),
    ("mizuoto.options",),
    ("mizuoto.runtime",),
    ("mizuoto.text", "mizuoto.audio_formats", "mizuoto.audio_encoders", "mizuoto.audio_encoding"),
    ("mizuoto.contracts",),
    ("mizuoto.nn",),
    ("mizuoto.catalog",),
    ("mizuoto.hookspecs", "mizuoto.plugins"),
    ("mizuoto.registry",),
    ("mizuoto.loading",),
    ("mizuoto.adapters",),
    ("mizuoto", "mizuoto.plugin"),
)
FRONT_ENDS = len(LAYERS)
ENGINES = FRONT_ENDS + 1
#: Old import paths kept for third-party plugins, re-exporting what moved up (on first use):
#: they sit above every layer, as a front end does
KEPT_FOR_OLD_PLUGINS = {"mizuoto.runtime.placement", "mizuoto.runtime.precision"}

#: Imports from contracts into a lower layer made inside a function, each on purpose: the
#: module imported loads numpy, which ``import mizuoto`` does not (test_startup.py). Any other
#: belongs at the top of the module, where a reader sees it.
LAZY_ON_PURPOSE = {
    ("mizuoto.contracts.audio", "mizuoto.audio_encoding"),  # Audio.save
}


def _in(module: str, prefix: str) -> bool:
    return module == prefix or (prefix != "mizuoto" and module.startswith(prefix + "."))


def layer_of(module: str) -> int:
    if module.partition(".")[0] != "mizuoto":
        return ENGINES
    if module in KEPT_FOR_OLD_PLUGINS:
        return FRONT_ENDS
    for level, prefixes in enumerate(LAYERS):
        if any(_in(module, prefix) for prefix in prefixes):
            return level
    return FRONT_ENDS


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in edges.items()
                  for target in targets if layer_of(target) > layer_of(module))


def test_no_module_imports_a_higher_layer():
    found = upward_imports(import_edges(_modules()))
    assert not found, (f"imports of a higher layer: {found}; move the shared piece down (or the "
                       "importing module up), and keep LAYERS and mizuoto/loading.py's "
                       "statement in step")


def test_contracts_import_lower_layers_at_the_top():
    found = {(module, target) for module, targets in local_import_edges(_modules()).items()
             if module.startswith("mizuoto.contracts.")
             for target in targets if not target.startswith("mizuoto.contracts")}
    assert found <= LAZY_ON_PURPOSE, (
        f"imported inside a function: {sorted(found - LAZY_ON_PURPOSE)}; import it at the top "
        "(or, when it loads numpy or torch, list it in LAZY_ON_PURPOSE)")
    assert LAZY_ON_PURPOSE <= found, f"gone, remove: {sorted(LAZY_ON_PURPOSE - found)}"


def test_the_stated_order_is_the_tested_one():
    """``mizuoto/loading.py``'s header names the layers in this order."""
    header = (ROOT / "packages/mizuoto-core/src/mizuoto/loading.py").read_text().split('"""')[1]
    names = [" / ".join(p.removeprefix("mizuoto.") for p in prefixes) for prefixes in LAYERS]
    assert " -> ".join(names) + " -> the front ends" in " ".join(header.split())


@pytest.mark.parametrize(("edges", "expected"), [
    ({"mizuoto.runtime.seeds": {"mizuoto.contracts.requests"}},
     ["mizuoto.runtime.seeds -> mizuoto.contracts.requests"]),
    ({"mizuoto.contracts.engine": {"mizuoto.runtime.seeds", "mizuoto.options"}}, []),
    ({"mizuoto.nn.dsp": {"mizuoto.cli"}}, ["mizuoto.nn.dsp -> mizuoto.cli"]),
    ({"mizuoto.contracts.requests": {"mizuoto.nn.dsp.audio_io"}},
     ["mizuoto.contracts.requests -> mizuoto.nn.dsp.audio_io"]),
    ({"mizuoto.cli": {"mizuoto_f5tts.engine"}}, ["mizuoto.cli -> mizuoto_f5tts.engine"]),
    ({"mizuoto_f5tts.engine": {"mizuoto.cli", "mizuoto"}}, []),
    ({"mizuoto.loading": {"mizuoto"}}, ["mizuoto.loading -> mizuoto"]),
])
def test_upward_imports_are_found(edges, expected):
    assert upward_imports(edges) == expected
