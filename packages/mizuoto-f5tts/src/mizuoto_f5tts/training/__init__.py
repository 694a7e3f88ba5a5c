"""Fine-tuning F5-TTS as upstream f5-tts 1.1.22's recipe does, without accelerate.

Modules by role: `data` (prepare a data set), `batching` (mel features, frame and sample
batching), `loop` (loss, data order, position, its checkpoint state), `export` (model
directory), `trainer` (`F5Trainer`, the `mizuoto.Trainer`).
"""

from mizuoto_f5tts.training.trainer import F5Run, F5Trainer

__all__ = ["F5Run", "F5Trainer"]
