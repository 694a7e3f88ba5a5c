"""F5-TTS model variants: backbone configurations as released upstream, plus tiny test sizes.

- `F5Variant`: frozen config of one backbone (``dit`` or ``unett``) with the mel settings
  shared by all released models (24 kHz, n_fft 1024, hop 256, 100 mels, Vocos).
  `F5Variant.build_backbone(text_num_embeds)` builds the `mizuoto.nn.transformer` module.
- `get_variant(name, size="real")`: ``name`` in `VARIANT_NAMES` (``"v1_base"``: F5-TTS v1 Base,
  ``"base"``: F5-TTS v0 Base, ``"e2_base"``: E2-TTS Base); ``size`` ``"real"`` (the upstream
  ``configs/*.yaml`` architectures) or ``"tiny"`` (dim 64, for tests; every code path of the
  real one — text padding mask, rotary on one head, UNetT skips — is kept).
- `checkpoint_name(name)`: the file name upstream releases the variant's weights under.
"""

from __future__ import annotations

from typing import Literal

import attrs
from torch import nn

from mizuoto.nn.transformer import DiT, UNetT

VARIANT_NAMES = ("v1_base", "base", "e2_base")
SIZES = ("real", "tiny")

SAMPLE_RATE = 24000
N_FFT = 1024
HOP_LENGTH = 256
WIN_LENGTH = 1024
N_MELS = 100

# upstream's release file names (hf://SWivid/F5-TTS/F5TTS_v1_Base/model_1250000.safetensors ...)
_CHECKPOINT_STEPS = {"v1_base": 1250000, "base": 1200000, "e2_base": 1200000}


@attrs.frozen
class F5Variant:
    """One backbone architecture. ``text_dim=None`` means the mel width (E2's layout)."""

    name: str
    size: str
    backbone: Literal["dit", "unett"]
    dim: int
    depth: int
    heads: int
    dim_head: int
    ff_mult: float
    text_dim: int | None
    text_mask_padding: bool
    conv_layers: int
    pe_attn_head: int | None
    qk_norm: str | None = None
    long_skip_connection: bool = False
    skip_connect_type: Literal["add", "concat", "none"] = "concat"
    mel_dim: int = N_MELS
    dropout: float = 0.1

    def backbone_kwargs(self, text_num_embeds: int) -> dict[str, object]:
        kwargs: dict[str, object] = dict(
            dim=self.dim,
            depth=self.depth,
            heads=self.heads,
            dim_head=self.dim_head,
            dropout=self.dropout,
            ff_mult=self.ff_mult,
            mel_dim=self.mel_dim,
            text_num_embeds=text_num_embeds,
            text_dim=self.text_dim,
            text_mask_padding=self.text_mask_padding,
            qk_norm=self.qk_norm,
            conv_layers=self.conv_layers,
            pe_attn_head=self.pe_attn_head,
        )
        if self.backbone == "dit":
            kwargs["long_skip_connection"] = self.long_skip_connection
        else:
            kwargs["skip_connect_type"] = self.skip_connect_type
        return kwargs

    def build_backbone(self, text_num_embeds: int) -> nn.Module:
        cls = DiT if self.backbone == "dit" else UNetT
        return cls(**self.backbone_kwargs(text_num_embeds))

    def upstream_config(self) -> dict[str, object]:
        """The ``model.arch`` mapping upstream's ``load_model(DiT|UNetT, cfg, ...)`` takes."""
        cfg: dict[str, object] = dict(
            dim=self.dim,
            depth=self.depth,
            heads=self.heads,
            dim_head=self.dim_head,
            ff_mult=self.ff_mult,
            text_mask_padding=self.text_mask_padding,
            qk_norm=self.qk_norm,
            conv_layers=self.conv_layers,
            pe_attn_head=self.pe_attn_head,
        )
        if self.text_dim is not None:
            cfg["text_dim"] = self.text_dim
        if self.backbone == "dit":
            cfg["long_skip_connection"] = self.long_skip_connection
        else:
            cfg["skip_connect_type"] = self.skip_connect_type
        return cfg


_REAL = {
    "v1_base": F5Variant(
        name="v1_base", size="real", backbone="dit", dim=1024, depth=22, heads=16, dim_head=64,
        ff_mult=2, text_dim=512, text_mask_padding=True, conv_layers=4, pe_attn_head=None,
    ),
    "base": F5Variant(
        name="base", size="real", backbone="dit", dim=1024, depth=22, heads=16, dim_head=64,
        ff_mult=2, text_dim=512, text_mask_padding=False, conv_layers=4, pe_attn_head=1,
    ),
    "e2_base": F5Variant(
        name="e2_base", size="real", backbone="unett", dim=1024, depth=24, heads=16, dim_head=64,
        ff_mult=4, text_dim=None, text_mask_padding=False, conv_layers=0, pe_attn_head=1,
    ),
}

_TINY = {
    "v1_base": attrs.evolve(
        _REAL["v1_base"], size="tiny", dim=64, depth=2, heads=4, dim_head=16, text_dim=32,
        conv_layers=2,
    ),
    "base": attrs.evolve(
        _REAL["base"], size="tiny", dim=64, depth=2, heads=4, dim_head=16, text_dim=32,
        conv_layers=2,
    ),
    "e2_base": attrs.evolve(_REAL["e2_base"], size="tiny", dim=64, depth=4, heads=4, dim_head=16),
}


def get_variant(name: str, size: str = "real") -> F5Variant:
    if name not in VARIANT_NAMES:
        choices = ", ".join(VARIANT_NAMES)
        raise ValueError(f"unknown F5-TTS variant {name!r}; choose one of {choices}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    return (_REAL if size == "real" else _TINY)[name]


def known_variants() -> list[F5Variant]:
    """Every named variant in every size."""
    return [*_REAL.values(), *_TINY.values()]


def checkpoint_name(name: str, checkpoint_format: str = "safetensors") -> str:
    return f"model_{_CHECKPOINT_STEPS[name]}.{checkpoint_format}"


def catalog_variant(model_id: str) -> str | None:
    from mizuoto_f5tts.catalog import ENTRIES

    for entry in ENTRIES:
        if entry.id == model_id:
            return entry.variant
    return None


def variant_of_model(model) -> str:
    from mizuoto.nn.transformer import DiT

    backbone = model.transformer
    if not isinstance(backbone, DiT):
        return "e2_base"
    return "v1_base" if backbone.text_embed.mask_padding else "base"
