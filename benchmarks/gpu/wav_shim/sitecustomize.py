"""WAV reading for upstream on a machine without FFmpeg (the GPU check's processes only).

Upstream f5-tts reads its reference and training clips with ``torchaudio.load``, which in
torchaudio >= 2.9 decodes through torchcodec and FFmpeg's libraries; the GPU machine has
neither. In a process that finds this folder on PYTHONPATH (benchmarks/gpu/checks.py puts it
there), ``torchaudio.load`` reads with soundfile instead, once torchaudio is imported: for PCM
and float WAV the same float32 tensor, ``(channels, frames)``, bit for bit (proved where both
run: packages/mizuoto-f5tts/tests/parity/test_wav_fallback_parity.py). Nothing else changes.

With ``MIZUOTO_GPU_CHECK_DETERMINISTIC=1`` (the check's training steps, both sides), torch is
put in its deterministic modes once imported: ``use_deterministic_algorithms`` (warn only:
an operation without a deterministic kernel still runs, on both sides alike) and cuDNN's
deterministic, non-benchmarking choice; ``CUBLAS_WORKSPACE_CONFIG`` is set by the check.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
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


def _patch_torchaudio(module) -> None:
    module.load = soundfile_load


def _deterministic_torch(module) -> None:
    module.use_deterministic_algorithms(True, warn_only=True)
    module.backends.cudnn.deterministic = True
    module.backends.cudnn.benchmark = False


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patches[name](module)`` right after the top-level module ``name`` is imported."""

    def __init__(self, patches) -> None:
        self.patches = dict(patches)

    def find_spec(self, name, path=None, target=None):
        patch = self.patches.pop(name, None)
        if patch is None:
            return None
        if not self.patches:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


_PATCHES = {"torchaudio": _patch_torchaudio}
if os.environ.get("MIZUOTO_GPU_CHECK_DETERMINISTIC") == "1":
    _PATCHES["torch"] = _deterministic_torch
for _name in [n for n in _PATCHES if n in sys.modules]:  # imported before site ran
    _PATCHES.pop(_name)(sys.modules[_name])
if _PATCHES:
    sys.meta_path.insert(0, _AfterImport(_PATCHES))
