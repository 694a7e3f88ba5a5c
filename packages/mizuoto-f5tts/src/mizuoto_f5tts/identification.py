"""Which F5-TTS family a checkpoint holds, never guessed from the folders around it.

v1 Base and v0 Base share every weight name and shape: what tells them apart (v1's text
padding mask, v0's rotary embedding on one head) leaves no trace in a DiT's weights. So the
family comes from, in this order:

1. the caller's choice (``variant=`` in the API, ``params.variant`` in training,
   ``engines.f5tts.variant`` for the engine);
2. the model directory's record, `RECORD` (``variant.json``: ``{"checkpoint": <file name>,
   "variant": <family>}``), written by exports and random models; it counts only for the
   checkpoint file it names (a replaced checkpoint is not vouched for);
3. the weights themselves: a UNetT backbone is E2 Base;
4. the checkpoint's file name, as upstream releases and loads them (``infer_cli`` and
   ``api.F5TTS`` fetch ``F5TTS_v1_Base/model_1250000`` and ``F5TTS_Base/model_1200000``;
   ``finetune_cli`` copies the base as ``pretrained_<name>``): ``model_1250000`` is v1 Base,
   ``model_1200000`` v0 Base, and ``F5TTS_Base_model_<n>`` (older Mizuoto exports) v0 Base.

Anything else (upstream's ``model_last.pt``, ``model_<update>.pt``, a renamed file) is
ambiguous for a DiT: `AmbiguousVariant` names the choices and the setting that takes one.
A choice that contradicts the directory's record, or the backbone in the weights, is refused.

`identify_family(checkpoint, backbone, requested=None, *, field) -> Identification`;
`write_record(model_dir, checkpoint_name, family)`, `read_record(model_dir)`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs

from mizuoto.errors import CheckpointMismatch, InvalidRequest
from mizuoto.json_files import read_json
from mizuoto.runtime.atomic import atomic_path
from mizuoto_f5tts.variants import VARIANT_NAMES

RECORD = "variant.json"
DIT_FAMILIES = ("v1_base", "base")

# upstream's release names (the step each variant was released at) and the prefix the older
# exports of this package gave v0 models
_RELEASE_NAMES = {"model_1250000": "v1_base", "model_1200000": "base"}
_V0_EXPORT = re.compile(r"F5TTS_Base_model_\d+")
_FINETUNE_COPY = "pretrained_"  # finetune_cli.py's copy of the base checkpoint


class AmbiguousVariant(InvalidRequest):
    """A DiT checkpoint whose family nothing names: v1 Base or v0 Base."""


@attrs.frozen
class Identification:
    """The family and what said so (``requested``, ``variant.json``, ``weights``,
    ``file name``)."""

    family: str
    source: str


def read_record(model_dir: str | Path) -> dict | None:
    path = Path(model_dir) / RECORD
    if not path.is_file():
        return None
    try:
        record = read_json(path, RECORD)  # a model folder from the internet: bounded
    except (OSError, ValueError) as exc:  # JSONFileError is a ValueError
        raise CheckpointMismatch(str(path), detail=f"unreadable variant record: {exc}") from exc
    if not isinstance(record, dict) or record.get("variant") not in VARIANT_NAMES \
            or not isinstance(record.get("checkpoint"), str):
        raise CheckpointMismatch(str(path), detail="a variant record holds {\"checkpoint\": "
                                 f"<file name>, \"variant\": one of {VARIANT_NAMES}}}")
    return record


def write_record(model_dir: str | Path, checkpoint_name: str, family: str) -> Path:
    if family not in VARIANT_NAMES:
        raise ValueError(f"unknown F5-TTS variant {family!r}; choose one of {VARIANT_NAMES}")
    path = Path(model_dir) / RECORD
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({"checkpoint": checkpoint_name, "variant": family}) + "\n",
                       encoding="utf-8")
    return path


def family_from_file_name(name: str) -> str | None:
    """The DiT family upstream's release name says, or None when the name says nothing."""
    stem = Path(name).name.split(".", 1)[0].removeprefix(_FINETUNE_COPY)
    if stem in _RELEASE_NAMES:
        return _RELEASE_NAMES[stem]
    if _V0_EXPORT.fullmatch(stem):
        return "base"
    return None


def _backbone_family(backbone: str) -> tuple[str, ...]:
    return DIT_FAMILIES if backbone == "dit" else ("e2_base",)


def identify_family(checkpoint: str | Path, backbone: str, requested: str | None = None, *,
                    field: str = "variant") -> Identification:
    """The family of ``checkpoint`` (a ``dit`` or ``unett`` ``backbone``, as its weights
    show). ``field`` is the setting named in errors (``params.variant``, ...)."""
    checkpoint = Path(checkpoint)
    fits = _backbone_family(backbone)
    record = read_record(checkpoint.parent)
    recorded = record["variant"] if record and record["checkpoint"] == checkpoint.name else None
    if recorded is not None and recorded not in fits:
        raise CheckpointMismatch(str(checkpoint.parent / RECORD),
                                 detail=f"it records variant {recorded!r} but {checkpoint.name} "
                                 f"holds a {backbone.upper()} backbone")
    if requested is not None:
        if requested not in VARIANT_NAMES:
            raise InvalidRequest(field, f"must be one of {', '.join(VARIANT_NAMES)}, got "
                                 f"{requested!r}")
        if requested not in fits:
            raise CheckpointMismatch(
                str(checkpoint), detail=f"it holds a {backbone.upper()} backbone but variant "
                f"{requested!r} is not one; choose {' or '.join(fits)}")
        if recorded is not None and requested != recorded:
            raise InvalidRequest(field, f"{requested!r} contradicts {checkpoint.parent / RECORD}, "
                                 f"which records {checkpoint.name} as {recorded!r}",
                                 f"drop {field} (the record is used) or correct the record")
        return Identification(requested, "requested")
    if recorded is not None:
        return Identification(recorded, RECORD)
    if len(fits) == 1:
        return Identification(fits[0], "weights")
    named = family_from_file_name(checkpoint.name)
    if named is not None:
        return Identification(named, "file name")
    raise AmbiguousVariant(
        field, f"{checkpoint} holds a DiT that may be F5-TTS v1 Base ('v1_base') or v0 Base "
        "('base'): the weights cannot tell them apart and neither the file name nor a "
        f"{RECORD} says which",
        f"set {field} to v1_base or base (the CLI: --param variant=... for training, "
        "--option engines.f5tts.variant=... for synthesis)")
