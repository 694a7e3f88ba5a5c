"""Neural vocoders shared by the engines (Vocos)."""

from mizuoto.nn.vocoders.vocos import Vocos, load_vocos

__all__ = ["Vocos", "load_vocos"]
