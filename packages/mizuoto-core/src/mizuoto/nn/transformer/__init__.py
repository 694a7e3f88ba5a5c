"""Transformer blocks shared by Mizuoto engines (F5-TTS DiT and UNetT backbones and their parts).

Every parameter and buffer is named as in the upstream implementation it reproduces, so
upstream checkpoints load strictly.
"""

from mizuoto.nn.transformer.attention import Attention
from mizuoto.nn.transformer.dit import DiT, DiTBlock
from mizuoto.nn.transformer.rotary import RotaryEmbedding, apply_rotary
from mizuoto.nn.transformer.unett import UNetT

__all__ = ["Attention", "DiT", "DiTBlock", "RotaryEmbedding", "UNetT", "apply_rotary"]
