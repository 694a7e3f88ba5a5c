"""The license a model directory declares in its model card, and whether it allows commercial use.

A model repository on the Hugging Face Hub states its license in its ``README.md`` front matter
(``license: cc-by-nc-4.0``); a copy of it on disk keeps saying so. An engine that loads a
directory rather than a catalog id reports that license instead of none.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

MODEL_CARD = "README.md"

#: the Hub's lower-case license ids under their SPDX names
_SPDX_NAMES = {name.lower(): name for name in (
    "Apache-2.0", "MIT", "BSD-3-Clause", "BSD-2-Clause", "CC0-1.0", "CC-BY-4.0", "CC-BY-SA-4.0",
    "CC-BY-NC-4.0", "CC-BY-NC-SA-4.0", "CC-BY-NC-ND-4.0", "CC-BY-NC-3.0", "GPL-3.0",
    "LGPL-3.0", "AGPL-3.0", "OpenRAIL", "MPL-2.0")}
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(\n|\Z)", re.DOTALL)


def model_card_license(model_dir: str | Path) -> str | None:
    """The license named in ``model_dir/README.md``'s front matter (an SPDX name where one is
    known), or None where there is no card, no front matter or no ``license`` key. A card that
    cannot be read or parsed names no license: it never stops a model from loading."""
    try:
        text = (Path(model_dir) / MODEL_CARD).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = _FRONT_MATTER.match(text)
    if match is None:
        return None
    try:
        front = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None
    value = front.get("license") if isinstance(front, dict) else None
    if not isinstance(value, str) or not value.strip():
        return None
    return _SPDX_NAMES.get(value.strip().lower(), value.strip())


def is_non_commercial(license_name: str | None) -> bool:
    """Whether ``license_name`` forbids commercial use: the Creative Commons NC licenses."""
    return license_name is not None and "-nc" in license_name.lower()
