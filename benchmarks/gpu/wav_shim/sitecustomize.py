"""WAV reading for upstream on a machine without FFmpeg (the GPU check's processes only).

Upstream f5-tts reads its reference and training clips with ``torchaudio.load``, which in
torchaudio >= 2.9 decodes through torchcodec and FFmpeg's libraries; the GPU machine has
neither. In a process that finds this folder on PYTHONPATH (benchmarks/gpu/checks.py puts it
there), ``torchaudio.load`` reads with soundfile instead, once torchaudio is imported: for PCM
and float WAV the same float32 tensor, ``(channels, frames)``, bit for bit (proved where both
run: packages/mizuoto-f5tts/tests/parity/test_wav_fallback_parity.py). Nothing else changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys


def soundfile_load(uri, frame_offset: int = 0, num_frames: int = -1, normalize: bool = True,
                   channels_first: bool = True, format=None, buffer_size: int = 4096,
                   backend=None):
    """``torchaudio.load``'s signature and result for what libsndfile reads (WAV, FLAC)."""
    import numpy as np
    import soundfile
    import torch

    if not normalize:
        raise ValueError("the GPU check's WAV reader returns normalized float32 only")
    data, sample_rate = soundfile.read(uri, dtype="float32", always_2d=True,
                                       start=frame_offset, frames=num_frames)
    samples = torch.from_numpy(np.ascontiguousarray(data.T if channels_first else data))
    return samples, int(sample_rate)


class _PatchTorchaudio(importlib.abc.MetaPathFinder):
    """Replaces ``torchaudio.load`` right after torchaudio's own import."""

    def find_spec(self, name, path=None, target=None):
        if name != "torchaudio":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            module.load = soundfile_load

        spec.loader.exec_module = exec_module
        return spec


if "torchaudio" in sys.modules:  # imported before site ran (never, in practice)
    sys.modules["torchaudio"].load = soundfile_load
else:
    sys.meta_path.insert(0, _PatchTorchaudio())
