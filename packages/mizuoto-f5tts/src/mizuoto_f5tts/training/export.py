"""Exporting a fine-tuned model: a directory the F5 engine (and upstream) loads.

`write_model(folder, ema_state, update, base_dir, variant, *, base_model)` writes into
``folder`` (`StepTrainer.export` gives it: core's atomic directory, swapped in whole):

- ``model_<update>.safetensors``: the EMA weights as upstream's trainer keeps them (``initted``,
  ``step``, ``ema_model.<CFM key>``), which is also the layout of upstream's releases; a v0 Base
  model is named ``F5TTS_Base_model_<update>.safetensors`` so that loaders tell it from v1;
- ``variant.json``: the variant, for that checkpoint (`mizuoto_f5tts.identification`);
- ``vocab.txt`` (``vocab_file``: the run's, extended or not) and ``vocos/`` copied from the base
  model directory;
- ``LICENSE.txt``: the base model's license terms carry over to the fine-tuned weights
  (the released F5-TTS weights are CC-BY-NC-4.0: non-commercial; ``finetuned=False``: trained
  from a random initialisation, none of the base weights are in them), and ``training.json``
  (base model, variant, updates, initialisation).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from mizuoto.runtime.atomic import save_safetensors
from mizuoto_f5tts.checkpoint import VOCAB_FILE, VOCOS_DIR, model_vocab_path
from mizuoto_f5tts.identification import write_record
from mizuoto_f5tts.variants import F5Variant

LICENSE_TEXT = """\
These weights were fine-tuned by Mizuoto from the base model {base}.

The base model's license applies to them. The released F5-TTS / E2-TTS weights are licensed
CC-BY-NC-4.0 (https://creativecommons.org/licenses/by-nc/4.0/): non-commercial use only,
with attribution. Models trained only from your own random initialisation are yours to license.
"""

SCRATCH_LICENSE_TEXT = """\
These weights were trained by Mizuoto from a random initialisation, with the architecture and
vocabulary of {base}; none of that model's weights are in them. Their license is the trainer's
choice (mind the training data's terms). The vocos/ vocoder copied beside them keeps its own
license.
"""


def write_model(build: Path, ema_state: Mapping[str, torch.Tensor], update: int,
                base_dir: str | Path, variant: F5Variant, *, base_model: str,
                vocab_file: str | Path | None = None, finetuned: bool = True) -> None:
    base_dir = Path(base_dir)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in ema_state.items()}
    name = f"{'F5TTS_Base_' if variant.name == 'base' else ''}model_{update}.safetensors"
    save_safetensors(tensors, build / name)
    write_record(build, name, variant.name)
    vocab = model_vocab_path(base_dir) if vocab_file is None else Path(vocab_file)
    shutil.copyfile(vocab, build / VOCAB_FILE)
    if (base_dir / VOCOS_DIR).is_dir():
        shutil.copytree(base_dir / VOCOS_DIR, build / VOCOS_DIR)
    license_text = LICENSE_TEXT if finetuned else SCRATCH_LICENSE_TEXT
    (build / "LICENSE.txt").write_text(license_text.format(base=base_model), encoding="utf-8")
    (build / "training.json").write_text(json.dumps(
        {"base_model": base_model, "variant": variant.name, "updates": update,
         "initialisation": "base model" if finetuned else "random",
         "license": "the base model's (CC-BY-NC-4.0 for released F5-TTS weights)"
         if finetuned else "the trainer's choice"},
        indent=1), encoding="utf-8")
