"""Mizuoto: neural text-to-speech with separately installable engines.

    import mizuoto
    tts = mizuoto.load("f5tts/v1-base")          # or a local model directory
    result = tts.synthesize(mizuoto.SynthesisRequest("Hello there.", seed=7))
    result.save("hello.wav")
"""

from __future__ import annotations

from mizuoto import contracts
from mizuoto.catalog import CatalogEntry, HubFile
from mizuoto.contracts import *  # noqa: F403  (contracts.__all__, listed once, there)
from mizuoto.errors import MizuotoError
from mizuoto.hookspecs import hookimpl
from mizuoto.loading import load, resolve_model
from mizuoto.options import ComputeOptions, Options

__version__ = "0.1.0"

__all__ = [
    "CatalogEntry",
    "ComputeOptions",
    "HubFile",
    "MizuotoError",
    "Options",
    "hookimpl",
    "load",
    "resolve_model",
]
__all__ += contracts.__all__  # the objects engines and users exchange
