"""Parity tests: upstream f5-tts 1.1.22 (+ vocos 0.1.0) as the reference, on CPU, one thread.

Puts the stand-ins for `wandb` and `cached_path` (see oracle_stubs/) on sys.path before any
upstream import, and pins torch to one thread so both sides run the same kernels (or to
MIZUOTO_TEST_THREADS, to prove the parity at another count).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

_STUBS = str(Path(__file__).parent / "oracle_stubs")
if _STUBS not in sys.path:
    sys.path.insert(0, _STUBS)

torch.set_num_threads(int(os.environ.get("MIZUOTO_TEST_THREADS", "1")))
