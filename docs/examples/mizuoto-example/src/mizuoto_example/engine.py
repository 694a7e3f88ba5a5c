"""The toy engine: hums the text, one tone per character (imported when a model is loaded).

This module is the only one that imports torch; the plugin module (``mizuoto_example``)
registers the engine by its location, ``mizuoto_example.engine:ToyEngine``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import numpy as np
import torch
from torch import nn

from mizuoto.plugin import (
    AdapterHost,
    Audio,
    Engine,
    LoRATargets,
    ModelFilesMissing,
    Options,
    Placement,
    Reference,
    Rendered,
    SupportsSteps,
    SynthesisRequest,
    Voice,
    check_output_length,
    check_state_dict,
    load_state_dict_file,
    place,
    read_reference,
    report,
    save_safetensors,
    weights_fingerprint,
)
from mizuoto_example import CAPABILITIES, CONFIG_FILE, WEIGHTS_FILE, ToyOptions, ToyParams

_WEIGHT_NAMES = ("pitch", "level")  # each of shape (vocab_size,)


@attrs.frozen
class _VoiceShape:
    """What the toy takes from a reference: a pitch factor and a loudness factor."""

    pitch_scale: float
    level_scale: float

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"pitch_scale": torch.tensor([self.pitch_scale], dtype=torch.float64),
                "level_scale": torch.tensor([self.level_scale], dtype=torch.float64)}


_NEUTRAL = _VoiceShape(1.0, 1.0)

#: the layers that take LoRA adapters (both tables), under the model `Tables`
LORA_TARGETS = LoRATargets(default=("pitch", "level"), allowed=("pitch", "level"))


class Tables(nn.Module):
    """The pitch and level tables as linear layers over a one-hot character slot (exactly the
    table's entry), so that LoRA adapters can take them."""

    def __init__(self, pitch: torch.Tensor, level: torch.Tensor) -> None:
        super().__init__()
        self.pitch = nn.Linear(pitch.numel(), 1, bias=False, dtype=torch.float64)
        self.level = nn.Linear(level.numel(), 1, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.pitch.weight.copy_(pitch.view(1, -1))
            self.level.weight.copy_(level.view(1, -1))

    @torch.no_grad()
    def forward(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        one_hot = torch.zeros(self.pitch.in_features, dtype=torch.float64)
        one_hot[slot] = 1
        return self.pitch(one_hot)[0], self.level(one_hot)[0]


class ToyEngine(Engine, SupportsSteps, AdapterHost):
    """Hums the text. Zero-shot, cloning, streaming and saved voices; no editing or design.

    The base class does the shared work (capabilities, params, seed, ``Applied``, the device
    and dtype refusal, ``stream`` and ``synthesize``); the toy writes ``_stream`` (one
    request's words, as they are hummed), the step interface over it (``open_row``,
    ``step_rows``, ``close_row``) and ``_build_voice``. The core's scheduler steps every open
    request together, a word each per step: ``mizuoto serve --max-batch N`` batches up to N
    streams with no other code, and a request whose client leaves stops at the next step.
    """

    name = "toy"
    params_class = ToyParams
    options_class = ToyOptions
    # The toy has no sampler: a request's steps or guidance is refused by the base class,
    # naming the field, rather than silently ignored.
    request_settings = frozenset()
    # anything else in compute.device / compute.dtype is refused before load, by name
    devices = frozenset({"cpu"})
    dtypes = frozenset({"float32"})
    # a request's state is its row (its words, its generator): the core's scheduler steps
    # the rows together (SupportsSteps); the engine declares no lock and writes none
    # LoRA: declare which layers take adapters; AdapterHost does loading, checks and hot-swap,
    # the trainer (declaring the same) gets --method lora, and the contract suite's adapter
    # checks run on it
    lora_targets = LORA_TARGETS

    def __init__(self, *, pitch: torch.Tensor, level: torch.Tensor, placement: Placement,
                 info, options: ToyOptions) -> None:
        self._tables = Tables(pitch, level)
        self.placement = placement
        self._info = info
        self._options = options

    @classmethod
    def recognizes(cls, model_dir: Path) -> bool:
        try:
            return "toy_vocab_size" in json.loads((Path(model_dir) / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return False

    @classmethod
    def load(cls, model_dir: Path, *, options: Options | None = None,
             model_id: str | None = None, progress=None) -> ToyEngine:
        # a lora run's export (the adapter alone): its base model, loaded, with it applied
        adapted = cls.load_adapter_export(model_dir, options=options, progress=progress)
        if adapted is not None:
            return adapted
        model_dir = Path(model_dir)
        options = options or Options()
        # threads, device and dtype as every engine applies them
        placement = place(cls, options.compute, device=lambda: torch.device("cpu"))
        missing = [n for n in (CONFIG_FILE, WEIGHTS_FILE) if not (model_dir / n).is_file()]
        if missing:
            raise ModelFilesMissing(str(model_dir), missing)
        config = json.loads((model_dir / CONFIG_FILE).read_text())
        weights_path = model_dir / WEIGHTS_FILE
        weights = load_state_dict_file(weights_path)
        vocab_size = int(config["toy_vocab_size"])
        # every missing, unexpected and mis-shaped tensor reported at once (CheckpointMismatch)
        check_state_dict({name: (vocab_size,) for name in _WEIGHT_NAMES}, weights, weights_path)
        info = placement.model_info(
            model=model_id or str(model_dir),
            variant=str(config.get("variant", "toy")),
            sample_rate=int(config["sample_rate"]),
            capabilities=CAPABILITIES,
            license="Apache-2.0",
            # A voice file is only valid for the weights it was built with.
            fingerprint=weights_fingerprint([weights_path], context=config),
        )
        report(progress, "load", 1, 1)
        return cls(pitch=weights["pitch"].to(torch.float64),
                   level=weights["level"].to(torch.float64), placement=placement, info=info,
                   options=options.engine_options(cls))

    @property
    def info(self):
        return self._info

    def lora_root(self) -> nn.Module:
        return self._tables

    def base_fingerprint(self) -> str:
        return self._info.fingerprint

    def _stream(self, request: SynthesisRequest, params: ToyParams,
                generator: torch.Generator, progress) -> Iterator[Rendered]:
        # Not a generator function: the reference is read (and refused) now, not at the
        # first chunk.
        if request.voice is not None:
            shape = _VoiceShape(float(request.voice.tensors["pitch_scale"][0]),
                                float(request.voice.tensors["level_scale"][0]))
        elif request.reference is not None:
            shape = _analyse(read_reference(request.reference, self._info.sample_rate))
        else:
            shape = _NEUTRAL
        return self._hum(request.text, params, shape, generator, progress)

    def open_row(self, request: SynthesisRequest, params: ToyParams,
                 generator: torch.Generator) -> Iterator[Rendered]:
        # a row is the request's stream of words: the reference is read (and refused) now
        return iter(self._stream(request, params, generator, None))

    def step_rows(self, rows: Sequence[Iterator[Rendered]]) -> list[tuple[Rendered]]:
        # One word per row. The toy's arithmetic is per row; a model with a network would
        # stack the rows' inputs here and run one forward pass for all of them.
        return [(next(row),) for row in rows]

    def close_row(self, row: Iterator[Rendered]) -> None:
        close = getattr(row, "close", None)
        if close is not None:
            close()

    def _build_voice(self, reference: Reference) -> Voice:
        shape = _analyse(read_reference(reference, self._info.sample_rate))
        return self.make_voice(shape.tensors(), texts={"reference": reference.text or ""})

    def _hum(self, text: str, params: ToyParams, shape: _VoiceShape,
             generator: torch.Generator, progress) -> Iterator[Rendered]:
        rate = self._info.sample_rate
        per_char = max(1, round(params.char_seconds * rate))
        # refused by name, never cut: a caller must not get a fraction of the text
        check_output_length(len(text) * per_char / rate, params.max_seconds,
                            setting="params.max_seconds")
        words = _words(text)
        time = torch.arange(per_char, dtype=torch.float64) / rate
        envelope = torch.hann_window(per_char, periodic=False, dtype=torch.float64)
        breath = self._options.breathiness
        for index, word in enumerate(words):
            pieces = []
            for char in word:
                slot = ord(char) % self._tables.pitch.in_features
                noise = torch.randn(per_char, generator=generator, dtype=torch.float64)
                if char.isspace():
                    pieces.append(torch.zeros(per_char, dtype=torch.float64))
                    continue
                pitch, level = self._tables(slot)
                tone = torch.sin(2 * math.pi * pitch * shape.pitch_scale * time)
                level = level * shape.level_scale
                pieces.append(level * envelope * ((1 - breath) * tone + breath * noise))
            report(progress, "chunk", index + 1, len(words))
            yield Rendered(Audio(torch.cat(pieces).to(torch.float32), rate),
                           sampler={"char_seconds": params.char_seconds}, chunks=len(words),
                           last=index == len(words) - 1)


def _words(text: str) -> list[str]:
    """Split after each space so that the pieces join back into ``text``."""
    words, current = [], ""
    for char in text:
        current += char
        if char.isspace():
            words.append(current)
            current = ""
    if current:
        words.append(current)
    return words


def _analyse(audio: Audio) -> _VoiceShape:
    """Pitch from the zero-crossing rate and loudness from the RMS, relative to 150 Hz / 0.1."""
    samples = audio.samples.to(torch.float64)
    signs = torch.signbit(samples)
    crossings = int((signs[1:] != signs[:-1]).sum())
    pitch = crossings / 2 / audio.duration
    rms = float(samples.pow(2).mean().sqrt())
    return _VoiceShape(pitch_scale=min(max(pitch / 150.0, 0.25), 4.0),
                       level_scale=min(max(rms / 0.1, 0.1), 10.0))


def write_tiny_model(directory: Path, *, vocab_size: int = 64, sample_rate: int = 16000,
                     seed: int = 0) -> None:
    """Write a random toy model: pitches in 100–300 Hz, levels in 0.05–0.3."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(seed)
    weights = {
        "pitch": torch.from_numpy(generator.uniform(100.0, 300.0, vocab_size).astype(np.float32)),
        "level": torch.from_numpy(generator.uniform(0.05, 0.3, vocab_size).astype(np.float32)),
    }
    save_safetensors(weights, directory / WEIGHTS_FILE)
    config = {"toy_vocab_size": vocab_size, "sample_rate": sample_rate, "variant": "tiny"}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
