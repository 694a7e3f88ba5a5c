"""VoxCPM's ``config.json``: frozen, validated, for both generations.

``architecture`` picks the generation: ``"voxcpm"`` (VoxCPM-0.5B, VoxCPM1.5) or ``"voxcpm2"``.
Missing keys take upstream's per-generation defaults; keys upstream requires are required here.
Constraints upstream only discovers at run time (a broadcast error in the rotary embedding, a
shape error in the first prompt) are checked at load and named.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from mizuoto.errors import CheckpointMismatch, ModelFilesMissing
from mizuoto.runtime.memory import available_memory

GENERATIONS = ("voxcpm", "voxcpm2")

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


class ConfigError(CheckpointMismatch):
    """A ``config.json`` upstream would reject (or crash on), with the field named."""

    def __init__(self, path: str, field: str, problem: str) -> None:
        super().__init__(path, detail=f"config field {field!r}: {problem}")
        self.field = field


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a config or option dtype name (upstream's spellings accepted)."""
    try:
        return _DTYPES[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unsupported dtype {name!r}; use one of {', '.join(_DTYPES)}") from None


@attrs.frozen
class RopeScaling:
    type: str
    long_factor: tuple[float, ...]
    short_factor: tuple[float, ...]
    original_max_position_embeddings: int


@attrs.frozen
class TransformerConfig:
    """One MiniCPM-4 stack: the text-semantic LM, the residual LM, the local encoder or DiT."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_hidden_layers: int
    num_key_value_heads: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    vocab_size: int
    scale_emb: float
    scale_depth: float
    dim_model_base: int
    use_mup: bool = True
    kv_channels: int | None = None
    no_rope: bool = False
    bos_token_id: int = 1
    eos_token_id: int = 2

    @property
    def head_dim(self) -> int:
        if self.kv_channels is not None:
            return self.kv_channels
        return self.hidden_size // self.num_attention_heads


@attrs.frozen
class LocalConfig:
    """``encoder_config`` / ``dit_config``: width and depth of a local (per-patch) transformer."""

    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None


@attrs.frozen
class CfmConfig:
    """The parts of ``dit_config.cfm_config`` that inference reads."""

    sigma_min: float = 1e-6
    solver: str = "euler"
    inference_cfg_rate: float = 1.0


@attrs.frozen
class VoxCPMConfig:
    path: str
    architecture: str
    lm: TransformerConfig
    encoder: LocalConfig
    dit: LocalConfig
    cfm: CfmConfig
    patch_size: int
    feat_dim: int
    residual_lm_num_layers: int
    residual_lm_no_rope: bool
    scalar_quantization_latent_dim: int
    scalar_quantization_scale: int
    max_length: int
    dtype: str
    dit_mean_mode: bool
    audio_vae: Mapping[str, Any] | None = None
    device: str = "cuda"  # upstream's preferred device when the caller says auto

    @property
    def is_v2(self) -> bool:
        return self.architecture == "voxcpm2"

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    def residual_lm(self) -> TransformerConfig:
        """The residual acoustic LM: the base LM's settings, its own depth, no vocabulary."""
        return attrs.evolve(self.lm, num_hidden_layers=self.residual_lm_num_layers, vocab_size=0,
                            no_rope=self.residual_lm_no_rope if self.is_v2 else self.lm.no_rope)

    def local(self, which: LocalConfig) -> TransformerConfig:
        """A local encoder / DiT stack: the base LM's settings with the local width and depth."""
        return attrs.evolve(self.lm, hidden_size=which.hidden_dim,
                            intermediate_size=which.ffn_dim, num_attention_heads=which.num_heads,
                            num_hidden_layers=which.num_layers, kv_channels=which.kv_channels,
                            vocab_size=0)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> VoxCPMConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelFilesMissing(str(model_dir), ["config.json"],
                                    "a VoxCPM model directory holds config.json, model.safetensors"
                                    " (or pytorch_model.bin), audiovae.* and tokenizer files")
        config = cls.from_dict(read_config_json(model_dir), str(path))
        _check_memory(config)
        return config

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], path: str = "config.json") -> VoxCPMConfig:
        return _parse(raw, path)


def read_config_json(model_dir: str | Path) -> dict[str, Any]:
    """``model_dir``'s ``config.json`` as a dict, read as a file from the internet
    (:func:`mizuoto.json_files.read_json`: bounded nesting and integers, a BOM skipped, a key
    given twice refused: a second ``architecture`` must not pick the other generation); a
    :class:`ConfigError` naming the file and the problem otherwise."""
    from mizuoto.json_files import JSONFileError, read_json

    path = Path(model_dir) / "config.json"
    try:
        return read_json(path, "config.json")
    except (OSError, JSONFileError) as exc:
        raise ConfigError(str(path), "config.json", f"cannot be read: {exc}") from None


# ---------------------------------------------------------------------------------------------
# parsing


class _Reader:
    """Reads typed fields from one JSON object, naming the dotted field on failure."""

    def __init__(self, data: Any, path: str, prefix: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(path, prefix or "config", "must be a JSON object")
        self.data, self.path, self.prefix = data, path, prefix

    def _name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def get(self, key: str, kind: type, default: Any = ..., *, nullable: bool = False) -> Any:
        if key not in self.data:
            if default is ...:
                raise ConfigError(self.path, self._name(key), "is required")
            return default
        value = self.data[key]
        if value is None:
            if nullable:
                return None
            # upstream (pydantic) rejects an explicit null for these, e.g. "kv_channels": null
            raise ConfigError(self.path, self._name(key), "must not be null (omit the key)")
        return _coerce(value, kind, self.path, self._name(key))

    def section(self, key: str, default: Any = ...) -> _Reader | None:
        if key not in self.data:
            if default is ...:
                raise ConfigError(self.path, self._name(key), "is required")
            return default
        return _Reader(self.data[key], self.path, self._name(key))


def _coerce(value: Any, kind: type, path: str, name: str) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
    elif kind is list:
        if isinstance(value, list) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return tuple(float(v) for v in value)
    raise ConfigError(path, name, f"must be {kind.__name__}, got {value!r}")


def _transformer(reader: _Reader) -> TransformerConfig:
    rope = reader.section("rope_scaling")
    scaling = RopeScaling(
        type=rope.get("type", str),
        long_factor=rope.get("long_factor", list),
        short_factor=rope.get("short_factor", list),
        original_max_position_embeddings=rope.get("original_max_position_embeddings", int),
    )
    return TransformerConfig(
        bos_token_id=reader.get("bos_token_id", int),
        eos_token_id=reader.get("eos_token_id", int),
        hidden_size=reader.get("hidden_size", int),
        intermediate_size=reader.get("intermediate_size", int),
        max_position_embeddings=reader.get("max_position_embeddings", int),
        num_attention_heads=reader.get("num_attention_heads", int),
        num_hidden_layers=reader.get("num_hidden_layers", int),
        num_key_value_heads=reader.get("num_key_value_heads", int),
        rms_norm_eps=reader.get("rms_norm_eps", float),
        rope_scaling=scaling,
        vocab_size=reader.get("vocab_size", int),
        use_mup=reader.get("use_mup", bool, True),
        scale_emb=reader.get("scale_emb", float),
        dim_model_base=reader.get("dim_model_base", int),
        scale_depth=reader.get("scale_depth", float),
        rope_theta=reader.get("rope_theta", float),
        kv_channels=reader.get("kv_channels", int, None),
        no_rope=reader.get("no_rope", bool, False),
    )


def _local(reader: _Reader) -> LocalConfig:
    return LocalConfig(
        hidden_dim=reader.get("hidden_dim", int, 1024),
        ffn_dim=reader.get("ffn_dim", int, 4096),
        num_heads=reader.get("num_heads", int, 16),
        num_layers=reader.get("num_layers", int, 4),
        kv_channels=reader.get("kv_channels", int, None),
    )


# upstream's VoxCPMConfig defaults differ between model/voxcpm.py and model/voxcpm2.py
_DEFAULTS = {
    "voxcpm": dict(patch_size=2, residual_lm_num_layers=6, scalar_quantization_latent_dim=256,
                   max_length=4096),
    "voxcpm2": dict(patch_size=4, residual_lm_num_layers=8, scalar_quantization_latent_dim=512,
                    max_length=8192),
}

# the VAE's latent width when audio_vae_config omits it (both upstream VAE classes default to 64)
_DEFAULT_LATENT_DIM = 64


def _parse(raw: Mapping[str, Any], path: str) -> VoxCPMConfig:
    top = _Reader(raw, path, "")
    architecture = top.get("architecture", str, "voxcpm").lower()
    if architecture not in GENERATIONS:
        raise ConfigError(path, "architecture",
                          f"{architecture!r} is not a VoxCPM generation ({', '.join(GENERATIONS)})")
    defaults = _DEFAULTS[architecture]
    lm = _transformer(top.section("lm_config"))
    dit_reader = top.section("dit_config")
    cfm_reader = dit_reader.section("cfm_config")
    cfm = CfmConfig(
        sigma_min=cfm_reader.get("sigma_min", float, 1e-6),
        solver=cfm_reader.get("solver", str, "euler"),
        inference_cfg_rate=cfm_reader.get("inference_cfg_rate", float, 1.0),
    )
    if architecture == "voxcpm2":
        mean_mode = dit_reader.get("dit_mean_mode", bool, False)
    else:
        mean_mode = top.get("dit_mean_mode", bool, False)
    audio_vae = raw.get("audio_vae_config")
    if audio_vae is not None and not isinstance(audio_vae, Mapping):
        raise ConfigError(path, "audio_vae_config", "must be a JSON object")
    dtype = top.get("dtype", str, "bfloat16")
    try:
        torch_dtype(dtype)
    except ValueError as exc:
        raise ConfigError(path, "dtype", str(exc)) from None
    config = VoxCPMConfig(
        path=path,
        architecture=architecture,
        lm=lm,
        encoder=_local(top.section("encoder_config")),
        dit=_local(dit_reader),
        cfm=cfm,
        patch_size=top.get("patch_size", int, defaults["patch_size"]),
        feat_dim=top.get("feat_dim", int, 64),
        residual_lm_num_layers=top.get("residual_lm_num_layers", int,
                                       defaults["residual_lm_num_layers"]),
        residual_lm_no_rope=top.get("residual_lm_no_rope", bool, False),
        scalar_quantization_latent_dim=top.get("scalar_quantization_latent_dim", int,
                                               defaults["scalar_quantization_latent_dim"]),
        scalar_quantization_scale=top.get("scalar_quantization_scale", int, 9),
        max_length=top.get("max_length", int, defaults["max_length"]),
        dtype=dtype,
        dit_mean_mode=mean_mode,
        audio_vae=dict(audio_vae) if audio_vae is not None else None,
        device=top.get("device", str, "cuda").strip().lower(),
    )
    _validate(config)
    return config


# bounds far above any released VoxCPM (2B: 28 layers, 2048 wide, 73k vocabulary) and far below
# what would make a downloaded config.json allocate gigabytes before the checkpoint is compared
_BOUNDS = {"hidden_size": 65_536, "intermediate_size": 262_144, "num_attention_heads": 1024,
           "num_hidden_layers": 512, "num_key_value_heads": 1024, "vocab_size": 1 << 22,
           "max_position_embeddings": 1 << 22, "kv_channels": 4096}
_TOP_BOUNDS = {"patch_size": 64, "feat_dim": 4096, "max_length": 1 << 22,
               "residual_lm_num_layers": 512, "scalar_quantization_latent_dim": 65_536}


def _check_ranges(config: VoxCPMConfig, stacks: Mapping[str, TransformerConfig]) -> None:
    path = config.path
    for name, stack in stacks.items():
        for field, most in _BOUNDS.items():
            value = getattr(stack, field)
            if value is None or (field == "vocab_size" and name != "lm_config"):
                continue
            least = 0 if field == "num_hidden_layers" and name == "residual_lm" else 1
            if not least <= value <= most:
                raise ConfigError(path, f"{name}.{field}",
                                  f"{value} is outside {least}..{most:,}")
        if stack.kv_channels is None and stack.hidden_size % stack.num_attention_heads:
            raise ConfigError(path, f"{name}.hidden_size", f"{stack.hidden_size} is not "
                              f"divisible by {stack.num_attention_heads} attention heads")
    for field, most in _TOP_BOUNDS.items():
        value = getattr(config, field)
        if not 1 <= value <= most:
            raise ConfigError(path, field, f"{value} is outside 1..{most:,}")


def parameter_bytes(config: VoxCPMConfig) -> int:
    """An estimate of the weights' size in ``config.dtype`` (attention, MLP and embeddings of
    every stack; norms and small projections left out, so it errs low)."""
    total = config.lm.vocab_size * config.lm.hidden_size
    for stack in (config.lm, config.residual_lm(), config.local(config.encoder),
                  config.local(config.dit)):
        heads = stack.head_dim * (stack.num_attention_heads + 2 * stack.num_key_value_heads)
        attention = stack.hidden_size * heads + stack.head_dim * stack.num_attention_heads \
            * stack.hidden_size
        total += stack.num_hidden_layers * (attention + 3 * stack.hidden_size
                                            * stack.intermediate_size)
    return total * torch.empty((), dtype=config.torch_dtype).element_size()


def _available_memory(needed: int) -> int | None:
    # a name of its own: the tests make a machine of any size; what this process has freed
    # counts as available (`mizuoto.runtime.memory`)
    return available_memory(needed)


#: Parameters of the largest release, VoxCPM2, by `parameter_bytes`' estimate (2.26 billion),
#: with room: a config above it is not a release
LARGEST_RELEASE_PARAMETERS = 2_500_000_000


def _check_memory(config: VoxCPMConfig) -> None:
    """Refuse, by name, a config whose weights alone would not fit in the free memory; the
    message says whether the machine's free memory is the cause (a release's size) or the
    config (larger than any release)."""
    needed = parameter_bytes(config)
    available = _available_memory(needed)
    if available is None or needed <= available:
        return
    sizes = f"its weights need about {needed / 2**30:.1f} GiB but {available / 2**30:.1f} GiB " \
        "of memory is available"
    parameters = needed // torch.empty((), dtype=config.torch_dtype).element_size()
    if parameters > LARGEST_RELEASE_PARAMETERS:
        raise ConfigError(config.path, "lm_config",
                          f"{sizes}; a config.json this large is not a VoxCPM release")
    raise ConfigError(config.path, "lm_config", f"{sizes}: a release's size, so the machine's "
                      "free memory is short, not the config; close other programs, or load it "
                      "in bfloat16 (--option compute.dtype=bfloat16)")


def _validate(config: VoxCPMConfig) -> None:
    path = config.path
    stacks = {
        "lm_config": config.lm,
        "residual_lm": config.residual_lm(),
        "encoder_config": config.local(config.encoder),
        "dit_config": config.local(config.dit),
    }
    _check_ranges(config, stacks)
    rope = config.lm.rope_scaling
    if len(rope.long_factor) != len(rope.short_factor):
        raise ConfigError(path, "lm_config.rope_scaling",
                          "long_factor and short_factor must have the same length")
    for name, stack in stacks.items():
        if stack.num_attention_heads % stack.num_key_value_heads:
            raise ConfigError(path, name, f"{stack.num_attention_heads} attention heads are not a "
                                          f"multiple of {stack.num_key_value_heads} key/value heads")
        if stack.no_rope:
            continue
        # upstream multiplies (.., head_dim) by a table of 2 × len(factors): anything else fails
        if stack.head_dim != 2 * len(rope.long_factor):
            raise ConfigError(path, name, f"head dim {stack.head_dim} must equal twice the "
                                          f"{len(rope.long_factor)} rope scaling factors")
    for name in ("patch_size", "feat_dim", "max_length"):
        if getattr(config, name) < 1:
            raise ConfigError(path, name, "must be positive")
    if config.audio_vae is not None:
        latent = config.audio_vae.get("latent_dim", _DEFAULT_LATENT_DIM)
        if latent is not None and latent != config.feat_dim:
            raise ConfigError(path, "feat_dim", f"{config.feat_dim} must equal the audio VAE's "
                                                f"latent_dim {latent}")
