"""Reading checkpoint files and loading them strictly, with errors that name the keys.

Upstream loaders often use ``strict=False``, where a missing key silently keeps its random
init. Mizuoto loads strictly and, before touching the module, reports every missing key,
unexpected key and shape mismatch in one :class:`~mizuoto.errors.CheckpointMismatch`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import pickle
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import attrs
import torch
from torch import Tensor, nn

from mizuoto.errors import CheckpointMismatch, ModelFilesMissing, UnsafeCheckpoint
from mizuoto.runtime.memory import available_memory  # noqa: F401  (its home before memory.py)

logger = logging.getLogger(__name__)

SAFETENSORS_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def load_state_dict_file(
    path: str | Path,
    key: str | Sequence[str] | None = None,
) -> dict[str, Tensor]:
    """Tensors of a ``.safetensors`` or torch pickle (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) file.

    Pickles are read with ``weights_only=True`` onto the CPU. ``key`` selects a nested dict,
    e.g. ``"state_dict"``, a dotted path ``"model.ema"``, or several candidates tried in order
    (``("ema_model_state_dict", "model_state_dict")``); ``""`` stands for the top level, so
    ``("state_dict", "")`` reads a nested ``state_dict`` where there is one, else the file.
    A missing file raises
    :class:`ModelFilesMissing`; an unreadable one or a missing key :class:`CheckpointMismatch`.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFilesMissing(str(path.parent), [path.name])
    suffix = path.suffix.lower()
    try:
        if suffix in SAFETENSORS_SUFFIXES:
            from safetensors.torch import load_file

            data = load_file(str(path), device="cpu")
        elif suffix in PICKLE_SUFFIXES:
            data = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise CheckpointMismatch(
                str(path), detail=f"unknown checkpoint type {suffix!r}; use .safetensors or "
                f"one of {', '.join(PICKLE_SUFFIXES)}")
    except CheckpointMismatch:
        raise
    except pickle.UnpicklingError:
        # torch's own text suggests weights_only=False: the one thing not to do with a
        # downloaded file, so it is not passed on
        raise UnsafeCheckpoint(str(path)) from None
    except Exception as exc:  # safetensors / pickle errors have no common base class
        raise CheckpointMismatch(str(path), detail=f"cannot read it: {exc}") from exc
    if key is not None:
        data = _select(data, key, path)
    if not isinstance(data, Mapping):
        raise CheckpointMismatch(str(path), detail=f"holds a {type(data).__name__}, not a "
                                 "state dict")
    nested = [k for k, v in data.items() if not isinstance(v, Tensor)]
    if nested:
        raise CheckpointMismatch(str(path), detail=f"entries that are not tensors: "
                                 f"{', '.join(map(str, nested[:8]))}; select one with key=")
    return dict(data)


def find_weights_file(directory: str | Path, names: Sequence[str], detail: str = "") -> Path:
    """The first of ``names`` that is a file in ``directory`` (upstream's order of preference),
    else :class:`ModelFilesMissing` listing them."""
    directory = Path(directory)
    for name in names:
        if (directory / name).is_file():
            return directory / name
    raise ModelFilesMissing(str(directory), [" or ".join(names)], detail)


def check_state_dict(
    expected: Mapping[str, Sequence[int]],
    state_dict: Mapping[str, Tensor],
    path: str | Path,
    *,
    optional: Sequence[str] = (),
    tolerate_unexpected: bool = False,
    detail: str = "",
) -> list[str]:
    """Compare ``state_dict`` with the ``expected`` key -> shape layout.

    Every missing key (other than ``optional`` ones), mis-shaped key and -- unless
    ``tolerate_unexpected`` -- unexpected key is reported at once as
    :class:`CheckpointMismatch` naming ``path``. With ``tolerate_unexpected`` (for engines whose
    upstream loads with ``strict=False``, so a released checkpoint carrying extra tensors still
    loads) the unexpected keys are logged as a warning and returned for the caller to drop.
    ``detail`` is added to the error (e.g. the configuration the layout was built from).
    """
    missing = [k for k in expected if k not in state_dict and k not in optional]
    unexpected = [k for k in state_dict if k not in expected]
    shapes = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)}, model {tuple(expected[k])}"
        for k in expected
        if k in state_dict and tuple(state_dict[k].shape) != tuple(expected[k])
    ]
    if missing or shapes or (unexpected and not tolerate_unexpected):
        raise CheckpointMismatch(str(path), missing=missing,
                                 unexpected=[] if tolerate_unexpected else unexpected,
                                 shapes=shapes, detail=detail)
    if unexpected:
        shown = ", ".join(unexpected[:8]) + (" ..." if len(unexpected) > 8 else "")
        logger.warning("%s: ignoring %d tensor(s) the model does not use, as upstream does: %s",
                       path, len(unexpected), shown)
    return unexpected


def load_into(module: nn.Module, state_dict: Mapping[str, Tensor], path: str | Path, *,
              tolerate_unexpected: bool = False) -> nn.Module:
    """Load ``state_dict`` into ``module`` strictly; return the module.

    Missing keys, unexpected keys and shape mismatches are all collected first and raised
    together as :class:`CheckpointMismatch` naming ``path``; nothing is loaded then (see
    :func:`check_state_dict` for ``tolerate_unexpected``).
    """
    layout = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    extra = set(check_state_dict(layout, state_dict, path,
                                 tolerate_unexpected=tolerate_unexpected))
    module.load_state_dict({k: v for k, v in state_dict.items() if k not in extra}, strict=True)
    return module


def load_weights_into(module: nn.Module, path: str | Path, *,
                      key: str | Sequence[str] | None = None, skip_prefixes: Sequence[str] = (),
                      tolerate_unexpected: bool = False) -> nn.Module:
    """Load the weights file ``path`` into ``module`` strictly, as :func:`load_into` does.

    A ``.safetensors`` file is read one tensor at a time with plain file reads, straight into
    the parameter or buffer when the dtypes match, else into a scratch tensor that is cast in
    (``copy_``: the cast ``load_state_dict`` does, so the same bits). Memory peaks at the
    module plus its largest tensor: reading the whole file first (or mapping it, whose touched
    pages count as resident until it is closed) holds the file and the module at once, 17 GB
    instead of 9 for VoxCPM2 in float32. Other formats are read whole
    (:func:`load_state_dict_file`, with ``key``). Entries whose key starts with one of
    ``skip_prefixes`` are not the module's weights and are dropped before the strict check.
    """
    path = Path(path)
    if path.suffix.lower() not in SAFETENSORS_SUFFIXES or sys.byteorder != "little":
        state = load_state_dict_file(path, key=key)
        state = {k: v for k, v in state.items() if not k.startswith(tuple(skip_prefixes))}
        return load_into(module, state, path, tolerate_unexpected=tolerate_unexpected)
    if not path.is_file():
        raise ModelFilesMissing(str(path.parent), [path.name])
    with path.open("rb") as handle:
        entries = {name: entry for name, entry in _safetensors_index(handle, path).items()
                   if not name.startswith(tuple(skip_prefixes))}
        # shapes without reading the data: meta tensors cost no memory
        found = {name: torch.empty(entry.shape, dtype=entry.dtype, device="meta")
                 for name, entry in entries.items()}
        targets = module.state_dict(keep_vars=True)
        layout = {k: tuple(v.shape) for k, v in targets.items()}
        extra = set(check_state_dict(layout, found, path,
                                     tolerate_unexpected=tolerate_unexpected))
        with torch.no_grad():
            for name, entry in entries.items():
                if name not in extra:
                    _read_tensor_into(handle, entry, targets[name].detach(), path)
    return module


def check_weights_file(module: nn.Module, path: str | Path, *,
                       skip_prefixes: Sequence[str] = (), tolerate_unexpected: bool = False,
                       detail: str = "") -> None:
    """Compare a ``.safetensors`` file's tensor names and shapes, read from its header alone,
    with ``module``'s (built on the meta device: nothing allocated yet), as
    :func:`load_weights_into` later does; a mismatch is a :class:`CheckpointMismatch` before
    the model costs any memory. Other formats are compared when they are loaded."""
    path = Path(path)
    if path.suffix.lower() not in SAFETENSORS_SUFFIXES or not path.is_file():
        return
    with path.open("rb") as handle:
        found = {name: torch.empty(entry.shape, dtype=entry.dtype, device="meta")
                 for name, entry in _safetensors_index(handle, path).items()
                 if not name.startswith(tuple(skip_prefixes))}
    layout = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    check_state_dict(layout, found, path, tolerate_unexpected=tolerate_unexpected,
                     detail=detail)


def module_bytes(module: nn.Module, dtype: torch.dtype) -> int:
    """The size of ``module``'s parameters and buffers (floating ones in ``dtype``); works on
    the meta device, so a model's cost is known before it is allocated."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(t.numel() * (itemsize if t.is_floating_point() else t.element_size())
               for t in (*module.parameters(), *module.buffers()))


@attrs.frozen
class _StoredTensor:
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


# safetensors' dtype names (little-endian data)
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    **{name: getattr(torch, attr) for name, attr in
       (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")) if hasattr(torch, attr)},
}


def _safetensors_index(handle: BinaryIO, path: Path) -> dict[str, _StoredTensor]:
    """The tensors of a safetensors file (8-byte header length, JSON header, data), checked
    against the file's size so that a damaged file fails here, before anything is copied."""
    size = os.fstat(handle.fileno()).st_size

    def damaged(why: str) -> CheckpointMismatch:
        return CheckpointMismatch(str(path), detail=f"cannot read it: {why}")

    prefix = handle.read(8)
    if len(prefix) < 8:
        raise damaged("shorter than a safetensors header")
    length = int.from_bytes(prefix, "little")
    if length > size - 8:
        raise damaged(f"its header claims {length} bytes, the file has {size}")
    try:
        header = json.loads(handle.read(length))
        header.pop("__metadata__", None)
        entries = {}
        for name, info in header.items():
            kind = _SAFETENSORS_DTYPES.get(info["dtype"])
            if kind is None:
                raise damaged(f"{name} has dtype {info['dtype']}, which torch "
                              f"{torch.__version__} does not have")
            shape = tuple(int(n) for n in info["shape"])
            begin, end = (int(n) for n in info["data_offsets"])
            nbytes = math.prod(shape) * kind.itemsize
            if end - begin != nbytes or begin < 0 or 8 + length + end > size:
                raise damaged(f"{name}'s data offsets {begin}..{end} do not fit its shape "
                              f"{shape} and the file's {size} bytes")
            entries[name] = _StoredTensor(kind, shape, 8 + length + begin, nbytes)
    except CheckpointMismatch:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise damaged(f"its header is not safetensors JSON ({exc})") from exc
    return entries


def _read_tensor_into(handle: BinaryIO, stored: _StoredTensor, target: Tensor,
                      path: Path) -> None:
    direct = (target.dtype == stored.dtype and target.device.type == "cpu"
              and target.is_contiguous())
    into = target if direct else torch.empty(stored.shape, dtype=stored.dtype)
    handle.seek(stored.offset)
    if stored.nbytes and handle.readinto(into.view(-1).view(torch.uint8).numpy()) \
            != stored.nbytes:
        raise CheckpointMismatch(str(path), detail="cannot read it: the file ends early")
    if not direct:
        target.copy_(into)


def materialize_empty(module: nn.Module, device: torch.device | str,
                      dtype: torch.dtype | None = None) -> nn.Module:
    """Give a module built on the meta device uninitialised storage on ``device``, floating
    tensors in ``dtype`` when given (the checkpoint is copied in next).

    What ``module.to(dtype).to_empty(device=...)`` does, without its meta-tensor arithmetic:
    ``empty_like`` on a meta tensor runs torch's Python reference, whose first use imports
    sympy (about a second of every load).
    """
    def empty(tensor: Tensor) -> Tensor:
        kind = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        return torch.empty(tuple(tensor.shape), dtype=kind, device=device)

    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                sub._parameters[name] = nn.Parameter(empty(param),
                                                     requires_grad=param.requires_grad)
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None:
                sub._buffers[name] = empty(buffer)
    return module


def _select(data: object, key: str | Sequence[str], path: Path) -> object:
    candidates = [key] if isinstance(key, str) else list(key)
    for candidate in candidates:
        if candidate == "":
            return data
        if isinstance(data, Mapping) and candidate in data:
            return data[candidate]
        node = data
        for part in candidate.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            return node
    top = ", ".join(map(str, data)) if isinstance(data, Mapping) else type(data).__name__
    raise CheckpointMismatch(str(path), detail=f"has no {' or '.join(map(repr, candidates))} "
                             f"(top-level keys: {top})")


_FINGERPRINT_BYTES = 1 << 20


def weights_fingerprint(files: Sequence[str | Path], *, context: object = None) -> str:
    """The identity of a model's weights, for saved voices (``ModelInfo.fingerprint``).

    A SHA-256 over ``context`` (JSON: what else decides the voice's meaning, e.g. the config
    without its dtype and device, or the vocabulary) and, per file, its name, size and first
    and last MiB: cheap on multi-GB files, and different for any retrained or other model.
    """
    digest = hashlib.sha256()
    if context is not None:
        digest.update(json.dumps(context, sort_keys=True, ensure_ascii=False).encode())
    for file in files:
        path = Path(file)
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as handle:
            digest.update(handle.read(_FINGERPRINT_BYTES))
            handle.seek(max(0, size - _FINGERPRINT_BYTES))
            digest.update(handle.read(_FINGERPRINT_BYTES))
    return digest.hexdigest()
