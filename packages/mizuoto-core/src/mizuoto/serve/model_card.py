"""What ``GET /v1/models`` says about a served model beyond OpenAI's fields, under the key
``mizuoto``: what it can do and which settings it takes, so that a client (the server's page)
shows only the controls that apply.

OpenAI's model object has ``id``, ``object``, ``created`` and ``owned_by``; its clients ignore
other keys, so the card is an addition, not a change.
"""

from __future__ import annotations

import attrs

from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.fixtures import is_random_init

#: A request setting's kind, from its default (settings without a plain default are listed
#: with kind None: a client may send them but has no control for them).
_KINDS = ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"))


def model_card(engine, *, max_input_chars: int, stream_rate: int, formats) -> dict:
    """The ``mizuoto`` key of ``engine``'s entry in ``GET /v1/models``."""
    info = engine.info
    return {
        "engine": engine.name,
        "variant": info.variant,
        "sample_rate": info.sample_rate,
        "pcm_sample_rate": stream_rate,
        "capabilities": sorted(c.value for c in info.capabilities),
        "streams": Capability.STREAM in info.capabilities,
        "license": info.license,
        "non_commercial": bool(info.non_commercial),
        "random_init": is_random_init(info.model),
        "max_input_chars": max_input_chars,
        "sampler": dict(engine.sampler_defaults()),
        "params": _params(type(engine).params_class, engine.model_defaults),
        "formats": list(formats),
    }


def _params(params_class, model_defaults) -> list[dict]:
    """Each request setting with the default a request gets: the model directory's
    (``model_default``: true) over the engine's."""
    if params_class is None:
        return []
    found = []
    for field in attrs.fields(params_class):
        from_model = field.name in model_defaults
        default = model_defaults[field.name] if from_model else field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = None
        kind = next((name for type_, name in _KINDS if isinstance(default, type_)), None)
        found.append({"name": field.name, "default": default if kind else None, "kind": kind,
                      "model_default": from_model})
    return found
