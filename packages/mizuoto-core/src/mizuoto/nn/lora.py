"""LoRA layers: a linear layer plus a low-rank update, never merged into its weight.

A :class:`LoRALinear` keeps the wrapped layer's ``weight``/``bias`` under the same names (base
checkpoints load unchanged) and adds ``lora_A`` (``r × in``) and ``lora_B`` (``out × r``); the
output is ``linear(x) + dropout(x Aᵀ Bᵀ) · alpha / r`` (upstream VoxCPM's layout and
arithmetic, which peft's ``lora.Linear`` shares up to where dropout sits). Layers are named by
module path and wrapped in place (:func:`apply_lora`), unwrapped by :func:`remove_lora`;
:func:`load_lora_tensors` checks names, shapes and finiteness before it copies anything.

What a file holds and which modules an engine lets take adapters is :mod:`mizuoto.adapters`.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.errors import CheckpointMismatch, InvalidRequest

#: far above any published LoRA (r 4..64) and far below a many-gigabyte allocation
MAX_RANK = 4096
MAX_ALPHA = 1e6


def check_lora_numbers(values: Mapping[str, Any], *, prefix: str = "lora_config.",
                       names: Mapping[str, str] | None = None) -> None:
    """``r``, ``alpha`` and ``dropout`` (under the keys ``names`` maps them to) typed and in
    range before any layer is built: ``r: 1e9`` would allocate gigabytes, ``"8"`` fail deep in
    torch. A key that is absent is not checked."""
    names = names or {"r": "r", "alpha": "alpha", "dropout": "dropout"}

    def number(key: str) -> float | None:
        value = values.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise InvalidRequest(f"{prefix}{key}", f"must be a number, got {value!r}")
        return value

    r, alpha, dropout = (number(names[k]) for k in ("r", "alpha", "dropout"))
    if r is not None and (r != int(r) or not 1 <= r <= MAX_RANK):
        raise InvalidRequest(f"{prefix}{names['r']}", f"{r!r} must be a whole number in "
                             f"1..{MAX_RANK}")
    if alpha is not None and not 0 < alpha <= MAX_ALPHA:
        raise InvalidRequest(f"{prefix}{names['alpha']}", f"{alpha!r} must be in (0, 1e6]")
    if dropout is not None and not 0 <= dropout < 1:
        raise InvalidRequest(f"{prefix}{names['dropout']}", f"{dropout!r} must be in [0, 1)")


@attrs.frozen
class LoRASettings:
    """peft's ``LoraConfig`` in the fields that decide the arithmetic: rank ``r``, ``alpha``
    (the update is scaled by ``alpha / r``), ``dropout`` on the update while training, and the
    module patterns it wraps (``target_modules``: a name matches a module whose path is it or
    ends in ``.name``, as peft's; ``*`` and ``?`` glob over the whole path)."""

    r: int = 8
    alpha: float = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        check_lora_numbers({"r": self.r, "alpha": self.alpha, "dropout": self.dropout},
                           prefix="lora.")
        if not all(isinstance(t, str) and t for t in self.target_modules):
            raise InvalidRequest("lora.target_modules", f"must be module names, got "
                                 f"{list(self.target_modules)!r}")

    def as_dict(self) -> dict[str, Any]:
        """The settings as JSON holds them (``target_modules`` a list): a run's recipe."""
        return {"r": self.r, "alpha": self.alpha, "dropout": self.dropout,
                "target_modules": list(self.target_modules)}


def matches(path: str, pattern: str) -> bool:
    """Whether module ``path`` is named by ``pattern`` (see :class:`LoRASettings`)."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(path, pattern)
    return path == pattern or path.endswith("." + pattern)


def target_paths(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    """The paths of ``model``'s linear layers named by ``patterns``, in module order."""
    return [path for path, module in model.named_modules()
            if isinstance(module, (nn.Linear, LoRALinear)) and path
            and any(matches(path, p) for p in patterns)]


class LoRALinear(nn.Module):
    """A linear layer plus a low-rank update. ``dropout`` is applied by ``dropout_fn`` when set
    (a trainer that draws its masks from its own generator), else as ``nn.Dropout`` would."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.r = r
        self.alpha = alpha
        self.dropout = dropout
        device, dtype = base.weight.device, base.weight.dtype
        # a float32 0-dim buffer (upstream VoxCPM's), rounded as the model's dtype rounds it
        self.register_buffer("scaling", torch.tensor(alpha / r).to(device, dtype),
                             persistent=False)
        self.weight = base.weight
        self.bias = base.bias
        self.lora_A = nn.Parameter(torch.zeros(r, self.in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, r, device=device, dtype=dtype))
        self.dropout_fn: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = F.linear(x, self.weight, self.bias)
        update = F.linear(F.linear(x, self.lora_A), self.lora_B)
        if self.dropout > 0 and self.training:
            update = self.dropout_fn(update) if self.dropout_fn else F.dropout(update, self.dropout)
        return result + update * self.scaling


def apply_lora(model: nn.Module, paths: Iterable[str], r: int, alpha: float,
               dropout: float = 0.0, init_a: Callable[[torch.Tensor], None] | None = None
               ) -> list[LoRALinear]:
    """Wrap the linear layers at ``paths`` of ``model`` in place; ``lora_B`` starts at zero,
    ``lora_A`` at zero unless ``init_a`` fills it (a trainer's Kaiming draw), in ``paths``'
    order. Returns the new layers."""
    check_lora_numbers({"r": r, "alpha": alpha, "dropout": dropout}, prefix="lora.")
    layers = []
    for path in list(paths):
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        base = getattr(parent, name)
        if not isinstance(base, nn.Linear):
            raise InvalidRequest("lora.target_modules", f"{path} is a {type(base).__name__}, "
                                 "not a linear layer")
        layer = LoRALinear(base, r, alpha, dropout)
        if init_a is not None:
            init_a(layer.lora_A)
        setattr(parent, name, layer)
        layers.append(layer)
    return layers


def kaiming_init_a(generator: torch.Generator) -> Callable[[torch.Tensor], None]:
    """``nn.init.kaiming_uniform_(A, a=sqrt(5))`` drawn from ``generator`` (upstream VoxCPM's
    init, and peft's default)."""
    def init(tensor: torch.Tensor) -> None:
        with torch.no_grad():
            nn.init.kaiming_uniform_(tensor, a=math.sqrt(5), generator=generator)
    return init


def dropout_from(generator: torch.Generator, p: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """``F.dropout``'s CPU arithmetic (a Bernoulli keep mask scaled by ``1 / (1 - p)``) with
    its mask drawn from ``generator``: a `LoRALinear.dropout_fn` whose masks a run replays."""
    def dropout(x: torch.Tensor) -> torch.Tensor:
        noise = torch.empty_like(x).bernoulli_(1 - p, generator=generator)
        noise.div_(1 - p)
        return x * noise
    return dropout


def draw_dropout_from(model: nn.Module, generator: torch.Generator) -> None:
    """Every `LoRALinear` of ``model`` draws its dropout masks from ``generator``."""
    for layer in lora_layers(model).values():
        layer.dropout_fn = dropout_from(generator, layer.dropout)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The wrapped layers of ``model`` by module path."""
    return {path: m for path, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every ``lora_*`` tensor of ``model`` by its state-dict key (``<path>.lora_A``)."""
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


def remove_lora(model: nn.Module) -> None:
    """Put the plain linear layers back (the base weights are the same tensors)."""
    for path, module in lora_layers(model).items():
        parent_path, _, name = path.rpartition(".")
        base = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                         device="meta")
        base.weight = module.weight
        base.bias = module.bias
        setattr(model.get_submodule(parent_path), name, base)


def freeze_all_but_lora(model: nn.Module) -> list[nn.Parameter]:
    """Only the adapters train: every other parameter's ``requires_grad`` off. Returns the
    adapters' parameters (what the optimizer gets)."""
    trainable = []
    for name, parameter in model.named_parameters():
        is_lora = name.rsplit(".", 1)[-1] in ("lora_A", "lora_B")
        parameter.requires_grad_(is_lora)
        if is_lora:
            trainable.append(parameter)
    return trainable


def expected_shapes(model: nn.Module, paths: Iterable[str], r: int
                    ) -> dict[str, tuple[int, ...]]:
    """The ``lora_A``/``lora_B`` keys and shapes wrapping ``paths`` of ``model`` at rank ``r``
    gives (read from the layers, wrapped or not: nothing is changed)."""
    shapes = {}
    for path in paths:
        layer = model.get_submodule(path)
        shapes[f"{path}.lora_A"] = (r, layer.in_features)
        shapes[f"{path}.lora_B"] = (layer.out_features, r)
    return shapes


def check_lora_tensors(tensors: Mapping[str, torch.Tensor],
                       shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
    """Every key of ``shapes`` present with its shape, nothing else, every value finite: a
    :class:`CheckpointMismatch` naming the keys otherwise (upstream VoxCPM skips unknown keys
    silently and fails on a shape mismatch half way through copying)."""
    missing = sorted(k for k in shapes if k not in tensors)
    unknown = sorted(k for k in tensors if k not in shapes)
    wrong = sorted(f"{k}: {tuple(tensors[k].shape)}, not {tuple(shapes[k])}"
                   for k in tensors if k in shapes and tuple(tensors[k].shape) != tuple(shapes[k]))
    if missing or unknown or wrong:
        raise CheckpointMismatch(source, missing=missing, unexpected=unknown, shapes=wrong,
                                 detail="the LoRA does not fit this model (rank, targets or "
                                        "base model differ)")
    not_finite = sorted(k for k, v in tensors.items()
                        if v.is_floating_point() and not bool(torch.isfinite(v).all()))
    if not_finite:
        raise CheckpointMismatch(source, detail=f"NaN or Inf in {', '.join(not_finite[:5])}"
                                 f"{' …' if len(not_finite) > 5 else ''}: a diverged run's "
                                 "adapter; export an earlier checkpoint")


def load_lora_tensors(model: nn.Module, tensors: Mapping[str, torch.Tensor],
                      source: str) -> None:
    """Copy LoRA tensors into ``model``'s LoRA parameters (cast to their dtype and device),
    after :func:`check_lora_tensors` against the model's own."""
    params = {k: p for k, p in model.named_parameters() if "lora_" in k}
    check_lora_tensors(tensors, {k: tuple(p.shape) for k, p in params.items()}, source)
    with torch.no_grad():
        for key, value in tensors.items():
            params[key].copy_(value.to(params[key].device))
