"""Request defaults a model directory carries: ``mizuoto-defaults.json``.

A model written for demos and plugin authors (a random-init fixture whose stop head never
fires, say) can set request ``params`` that its engine would otherwise take from upstream's
defaults, such as a short length cap and no retry, so that one sentence takes seconds with
no option given. A request's own params win over them; every result names the defaults it
took (``Applied.model_defaults``). Checkpoints from upstream carry no such file, so nothing
changes for them.

The file: ``{"params": {"max_len": 32}, "why": "random-init: the stop head never fires"}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mizuoto.errors import CheckpointMismatch, InvalidRequest
from mizuoto.runtime.atomic import atomic_path
from mizuoto.settings_files import parse_settings
from mizuoto.validation import parse_attrs

DEFAULTS_FILE = "mizuoto-defaults.json"
_NONE: Mapping[str, Any] = MappingProxyType({})


def read_model_defaults(model_dir: str | Path, params_class: type | None = None
                        ) -> Mapping[str, Any]:
    """The ``params`` of ``model_dir``'s defaults file (empty without one), checked against
    ``params_class`` when given: a key or value the engine would refuse names the file."""
    path = Path(model_dir) / DEFAULTS_FILE
    if not path.is_file():
        return _NONE
    try:
        data = parse_settings(path.read_text(encoding="utf-8"), "json", DEFAULTS_FILE)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointMismatch(str(path), detail=f"cannot read it ({exc}); fix or delete "
                                 "it") from None
    params = data.get("params") if isinstance(data, dict) else None
    if not isinstance(params, dict):
        raise CheckpointMismatch(str(path), detail='must hold {"params": {...}}; fix or '
                                 "delete it")
    if params_class is not None:
        try:
            parse_attrs(params_class, params, DEFAULTS_FILE)
        except InvalidRequest as exc:  # the file, not the request, is at fault
            raise CheckpointMismatch(str(path), detail=f"{exc}; fix or delete it") from None
    return MappingProxyType(dict(params))


def write_model_defaults(model_dir: str | Path, params: Mapping[str, Any], why: str) -> Path:
    """Write ``model_dir``'s defaults file (atomically): ``params`` and the reason for them."""
    path = Path(model_dir) / DEFAULTS_FILE
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({"params": dict(params), "why": why}, indent=2) + "\n",
                       encoding="utf-8")
    return path


def taken_defaults(defaults: Mapping[str, Any], params: Mapping[str, Any] | None
                   ) -> dict[str, Any]:
    """The defaults a request with ``params`` takes: those it does not set itself."""
    given = params or {}
    return {key: value for key, value in defaults.items() if key not in given}
