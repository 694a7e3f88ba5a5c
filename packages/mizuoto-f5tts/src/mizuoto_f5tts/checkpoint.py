"""Loading F5-TTS / E2-TTS checkpoints and their Vocos vocoder, as upstream f5-tts 1.1.22 does.

- `load_f5_model(model_dir, variant=None, *, device="cpu", dtype=None, use_ema=True,
  ode_method="euler", checkpoint=None, vocab_file=None, variant_field="variant")
  -> (ConditionalFlowMatching, vocab)`:
  ``model_dir`` holds one ``*.safetensors`` (preferred) or ``*.pt`` checkpoint (or name it with
  ``checkpoint``) and usually ``vocab.txt`` (else the vocab shipped with this package, upstream's
  default). ``variant`` is an `F5Variant` (used as is), a name in `VARIANT_NAMES` (the family:
  sizes are read from the checkpoint, so a tiny or fine-tuned model of that family loads), or
  None to identify it (`checkpoint_variant`; ``variant_field`` is the setting an
  ambiguity error names). ``dtype`` None picks float16 on
  CUDA devices of compute capability >= 7, else float32 (upstream's rule). The model is cast
  to ``dtype`` *before* the weights are copied in, so buffers stored in the file (rotary
  ``inv_freq``) end up in ``dtype`` and non-persistent tables are cast like upstream's. The
  returned sampler (eval mode) has the F5 log-mel (24 kHz, n_fft 1024, hop 256, 100 mels,
  float32) as ``mel_spec``; ``vocab`` maps token -> id (the text embedding has
  ``len(vocab) + 1`` rows; id 0 is the unknown/space token).
- `read_checkpoint(path, *, use_ema=True)`: the ``CFM`` state dict (on the CPU) exactly as
  upstream's ``load_checkpoint`` derives it (EMA: ``ema_model.`` removed, ``initted``/``step``
  and two legacy mel keys dropped; ``.pt`` files: ``ema_model_state_dict`` or
  ``model_state_dict``).
- `read_vocab(path) -> dict[str, int]`: upstream's reading (``line[:-1]``; a repeated line
  keeps its last index and counts once).
- `detect_variant(state_dict, family) -> F5Variant`: backbone and sizes from keys and shapes;
  the flags not visible in the weights (text padding mask, rotary heads) come from ``family``
  (which must match the backbone: `backbone_of`). A known variant (real or tiny) is returned
  as is, anything else as a ``size="custom"`` variant of the family.
- `checkpoint_variant(path, state_dict, requested=None, *, field="variant") -> F5Variant`:
  the family as `mizuoto_f5tts.identification` establishes it (never from the folders'
  names; an unnamed DiT is an `AmbiguousVariant` error naming ``field``), then its sizes.
- `find_checkpoint(model_dir)`, `load_vocos(vocos_dir, device="cpu")` (`mizuoto.nn.vocoders`).

Errors: `ModelFilesMissing` (no checkpoint / vocab), `CheckpointMismatch` naming missing and
unexpected keys and shape mismatches (a vocab whose size does not fit the text embedding gets
its own message).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path

import attrs
import torch

from mizuoto.errors import CheckpointMismatch, ModelFilesMissing
from mizuoto.nn.dsp.mel import log_mel_spectrogram
from mizuoto.nn.flow import ConditionalFlowMatching
from mizuoto.nn.vocoders import Vocos
from mizuoto.nn.vocoders import load_vocos as _load_vocos
from mizuoto.runtime.checkpoint import (
    check_state_dict,
    load_into,
    load_state_dict_file,
    module_bytes,
)
from mizuoto.runtime.checkpoint import weights_fingerprint as core_fingerprint
from mizuoto.runtime.memory import available_memory
from mizuoto_f5tts.text import read_vocab
from mizuoto_f5tts.variants import (
    HOP_LENGTH,
    N_FFT,
    N_MELS,
    SAMPLE_RATE,
    WIN_LENGTH,
    F5Variant,
    get_variant,
    known_variants,
)

logger = logging.getLogger(__name__)

VOCAB_FILE = "vocab.txt"
VOCOS_DIR = "vocos"
_EMA_DROPPED = ("initted", "step")
# keys of an older CFM that held a torchaudio mel module; upstream deletes them (its 305e3ea)
_LEGACY_MEL_KEYS = ("mel_spec.mel_stft.mel_scale.fb", "mel_spec.mel_stft.spectrogram.window")
TEXT_EMBED_KEY = "transformer.text_embed.text_embed.weight"


def default_vocab_path() -> Path:
    """Upstream's vocab (``f5_tts/infer/examples/vocab.txt``), shipped with this package."""
    return Path(str(files("mizuoto_f5tts").joinpath("data", VOCAB_FILE)))


def model_vocab_path(model_dir: str | Path) -> Path:
    """A model directory's ``vocab.txt``, else upstream's (a release without its own)."""
    own = Path(model_dir) / VOCAB_FILE
    return own if own.is_file() else default_vocab_path()


def find_checkpoint(model_dir: str | Path) -> Path:
    model_dir = Path(model_dir)
    for pattern in ("*.safetensors", "*.pt"):
        found = sorted(p for p in model_dir.glob(pattern) if p.is_file())
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise ModelFilesMissing(
                str(model_dir),
                ["a single checkpoint"],
                f"found several ({names}); pass checkpoint= to choose one",
            )
    raise ModelFilesMissing(
        str(model_dir), ["*.safetensors or *.pt checkpoint"], "an F5-TTS model directory holds one"
    )


def read_checkpoint(path: str | Path, *, use_ema: bool = True) -> dict[str, torch.Tensor]:
    path = Path(path)
    if path.suffix == ".safetensors":
        # a safetensors release is the EMA dict itself (or, without EMA, the model's)
        raw = load_state_dict_file(path)
        if not use_ema:
            return raw
    else:
        key = "ema_model_state_dict" if use_ema else "model_state_dict"
        raw = load_state_dict_file(path, key=key)
        if not use_ema:
            return raw
    # str.replace as upstream: every "ema_model." in a key goes, not only the prefix
    state = {k.replace("ema_model.", ""): v for k, v in raw.items() if k not in _EMA_DROPPED}
    for legacy in _LEGACY_MEL_KEYS:
        state.pop(legacy, None)
    return state


def _count(keys: list[str], pattern: str) -> int:
    regex = re.compile(pattern)
    return len({m.group(1) for k in keys if (m := regex.match(k))})


def _ff_mult(inner: int, dim: int) -> float:
    """A multiplier the feed-forward rebuilds ``inner`` from (``int(dim * mult)``, as
    upstream): ``inner / dim`` can round to a float whose product falls just short (dim 112,
    inner 481), so step it up to the next float until the product reaches ``inner``."""
    if inner % dim == 0:
        return inner // dim
    mult = inner / dim
    while int(dim * mult) < inner:
        mult = math.nextafter(mult, math.inf)
    return mult


def backbone_of(state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> str:
    """``"dit"`` or ``"unett"``, from the block keys."""
    if any(k.startswith("transformer.transformer_blocks.") for k in state):
        return "dit"
    if any(k.startswith("transformer.layers.") for k in state):
        return "unett"
    raise CheckpointMismatch(source, detail="not an F5-TTS model: neither a DiT nor a UNetT "
                             "backbone")


def detect_variant(
    state: Mapping[str, torch.Tensor], family: str, source: str = "checkpoint"
) -> F5Variant:
    keys = list(state)
    try:
        dim = state["transformer.time_embed.time_mlp.2.weight"].shape[0]
        mel_dim = state["transformer.proj_out.weight"].shape[0]
        dim_head = 2 * state["transformer.rotary_embed.inv_freq"].numel()
        text_dim = state[TEXT_EMBED_KEY].shape[1]
    except KeyError as e:
        raise CheckpointMismatch(source, detail=f"not an F5-TTS model: no {e}") from e
    _check_size(source, "transformer width (time_embed.time_mlp.2.weight rows)", dim, 1,
                _MOST["dim"])
    _check_size(source, "head width (2 x rotary_embed.inv_freq)", dim_head, 2, _MOST["dim_head"])
    _check_size(source, "text width (text_embed.text_embed.weight columns)", text_dim, 1,
                _MOST["dim"])
    if mel_dim != N_MELS:
        raise CheckpointMismatch(source, detail=f"its mel width (proj_out.weight rows) is "
                                 f"{mel_dim}, but F5-TTS's mel has {N_MELS} channels")
    conv_layers = _count(keys, r"transformer\.text_embed\.text_blocks\.(\d+)\.")
    backbone = backbone_of(state, source)
    if backbone == "dit":
        prefix = "transformer.transformer_blocks.0."
        depth = _count(keys, r"transformer\.transformer_blocks\.(\d+)\.")
        attn, ff = prefix + "attn.", prefix + "ff.ff.0.0.weight"
    else:
        prefix = "transformer.layers.0."
        depth = _count(keys, r"transformer\.layers\.(\d+)\.")
        attn, ff = prefix + "2.", prefix + "4.ff.0.0.weight"
    family_variant = get_variant(family)
    if family_variant.backbone != backbone:
        raise CheckpointMismatch(
            source,
            detail=f"it holds a {backbone.upper()} backbone but variant {family!r} is a "
            f"{family_variant.backbone.upper()}; choose a matching variant",
        )
    _check_size(source, "depth (numbered blocks)", depth, 1, _MOST["depth"])
    _check_size(source, "text conv layers", conv_layers, 0, _MOST["conv_layers"])
    try:
        inner = state[attn + "to_q.weight"].shape[0]
        ff_inner = state[ff].shape[0]
    except KeyError as e:
        raise CheckpointMismatch(source, detail=f"not an F5-TTS model: no {e}") from e
    _check_size(source, "attention width (attn.to_q.weight rows)", inner, dim_head,
                _MOST["dim"])
    if inner % dim_head:
        raise CheckpointMismatch(source, detail=f"its attention width {inner} is not a "
                                 f"multiple of its head width {dim_head}")
    _check_size(source, "feed-forward width (ff.ff.0.0.weight rows)", ff_inner, 1,
                _MOST["ff_inner"])
    ff_mult = _ff_mult(ff_inner, dim)
    fields = dict(
        backbone=backbone,
        dim=dim,
        depth=depth,
        heads=inner // dim_head,
        dim_head=dim_head,
        ff_mult=ff_mult,
        text_dim=None if (backbone == "unett" and text_dim == mel_dim) else text_dim,
        conv_layers=conv_layers,
        qk_norm="rms_norm" if attn + "q_norm.weight" in state else None,
        mel_dim=mel_dim,
    )
    if backbone == "dit":
        fields["long_skip_connection"] = "transformer.long_skip_connection.weight" in state
    else:
        has_proj = f"transformer.layers.{depth // 2}.0.weight" in state
        fields["skip_connect_type"] = "concat" if has_proj else "add"
    for known in known_variants():
        if known.name == family_variant.name and all(
            getattr(known, k) == v for k, v in fields.items()
        ):
            return known
    return attrs.evolve(family_variant, size="custom", **fields)


# far above any released F5-TTS / E2-TTS (width 1024, 22-24 blocks, head 64) and far below a
# size that would make a file of empty tensors allocate gigabytes when the model is built
_MOST = {"dim": 16_384, "dim_head": 1024, "depth": 256, "conv_layers": 64, "ff_inner": 262_144}


def _check_size(source: str, what: str, value: int, least: int, most: int) -> None:
    if not least <= value <= most:
        raise CheckpointMismatch(source, detail=f"its {what} is {value}, outside {least}.."
                                 f"{most:,}: not an F5-TTS model this package can build")


def _check_before_building(variant: F5Variant, vocab: dict[str, int],
                           state: Mapping[str, torch.Tensor], path: Path,
                           dtype: torch.dtype) -> None:
    """The model the checkpoint describes, built on the meta device (nothing allocated, the
    random state untouched): its size against the memory there is, its layout against the
    checkpoint's shapes, so a file that does not fit fails by name before it costs anything."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        skeleton = ConditionalFlowMatching(variant.build_backbone(text_num_embeds=len(vocab)),
                                           num_channels=variant.mel_dim, mel_spec=_f5_mel)
    needed = module_bytes(skeleton, dtype)
    available = available_memory(needed)  # what this process freed counts as available
    if available is not None and needed > available:
        raise CheckpointMismatch(str(path), detail=(
            f"its model needs about {needed / 2**30:.1f} GiB but {available / 2**30:.1f} GiB "
            "of memory is available"))
    layout = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    check_state_dict(layout, state, path, detail=f"the layout of {variant.name} "
                     f"({variant.size}) with {len(vocab)} tokens")


def checkpoint_variant(
    path: Path, state: Mapping[str, torch.Tensor], requested: str | None = None, *,
    field: str = "variant",
) -> F5Variant:
    """The variant in the checkpoint file ``path`` (its ``state``): family as
    `identify_family` establishes it, sizes from the weights."""
    from mizuoto_f5tts.identification import identify_family

    found = identify_family(path, backbone_of(state, str(path)), requested, field=field)
    variant = detect_variant(state, found.family, str(path))
    logger.info("F5-TTS variant %s (%s; from the %s) in %s", variant.name, variant.size,
                found.source, path)
    return variant


def auto_dtype(device: torch.device) -> torch.dtype:
    """F5-TTS's ``auto`` dtype, as upstream: float16 on CUDA devices of compute capability 7
    or more, else float32."""
    if device.type == "cuda" and torch.cuda.get_device_properties(device).major >= 7:
        return torch.float16
    return torch.float32


def _f5_mel(audio: torch.Tensor) -> torch.Tensor:
    if audio.ndim == 3:
        audio = audio.squeeze(1)
    return log_mel_spectrogram(
        audio,
        sample_rate=SAMPLE_RATE,
        n_fft=N_FFT,
        hop_length=HOP_LENGTH,
        win_length=WIN_LENGTH,
        n_mels=N_MELS,
        clip_val=1e-5,
    )


def load_f5_model(
    model_dir: str | Path,
    variant: F5Variant | str | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    use_ema: bool = True,
    ode_method: str = "euler",
    checkpoint: str | Path | None = None,
    vocab_file: str | Path | None = None,
    variant_field: str = "variant",
) -> tuple[ConditionalFlowMatching, dict[str, int]]:
    model_dir = Path(model_dir)
    device = torch.device(device)
    ckpt_path = Path(checkpoint) if checkpoint is not None else find_checkpoint(model_dir)
    if not ckpt_path.is_file():
        raise ModelFilesMissing(str(model_dir), [str(ckpt_path)])

    vocab_file = model_vocab_path(model_dir) if vocab_file is None else Path(vocab_file)
    if not vocab_file.is_file():
        raise ModelFilesMissing(str(model_dir), [str(vocab_file)])
    vocab = read_vocab(vocab_file)

    state = read_checkpoint(ckpt_path, use_ema=use_ema)
    if not isinstance(variant, F5Variant):
        # a name fixes the family's hidden flags; sizes always come from the weights
        variant = checkpoint_variant(ckpt_path, state, variant, field=variant_field)

    embed = state.get(TEXT_EMBED_KEY)
    if embed is not None and embed.shape[0] != len(vocab) + 1:
        raise CheckpointMismatch(
            str(ckpt_path),
            shapes=[f"{TEXT_EMBED_KEY}: checkpoint {tuple(embed.shape)}"],
            detail=f"the text embedding has {embed.shape[0]} rows but {vocab_file} gives "
            f"{len(vocab)} tokens (+1 filler row = {len(vocab) + 1}); use the vocab.txt the "
            f"checkpoint was trained with",
        )

    _check_before_building(variant, vocab, state, ckpt_path,
                           dtype if dtype is not None else auto_dtype(device))
    model = ConditionalFlowMatching(
        variant.build_backbone(text_num_embeds=len(vocab)),
        num_channels=variant.mel_dim,
        mel_spec=_f5_mel,
        ode_method=ode_method,
    ).to(device)
    # cast before copying, as upstream's load_checkpoint: stored buffers arrive in `dtype`
    model = model.to(dtype if dtype is not None else auto_dtype(device))
    load_into(model, state, ckpt_path)
    del state
    return model.eval(), vocab


def load_vocos(vocos_dir: str | Path, device: str | torch.device = "cpu") -> Vocos:
    """The Vocos in ``vocos_dir`` (usually ``model_dir / "vocos"``), float32, eval mode."""
    return _load_vocos(vocos_dir, device=device)


def weights_fingerprint(checkpoint: Path, vocab: dict[str, int]) -> str:
    """Identity of the weights (core's fingerprint of the checkpoint) and the vocabulary: a
    voice's tokens depend on it."""
    return core_fingerprint([checkpoint], context={"vocab": sorted(vocab)})
