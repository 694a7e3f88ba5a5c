#!/usr/bin/env bash
# Wheels for the GPU checks on a machine that cannot reach PyPI (the `device` machine: Python
# 3.12, torch with CUDA already installed). Run here, in the repository root; the wheels go to
# .whl/ (ignored by git), which the run carries. See docs/performance.md, "GPU checks".
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
# Mizuoto itself (pure Python)
python -m pip wheel -q --no-deps -w .whl ./packages/mizuoto-core ./packages/mizuoto-f5tts \
    ./packages/mizuoto-voxcpm
# the upstream oracles and the modules they import that the device image lacks (its image has
# torch, torchaudio, transformers, einops, safetensors, huggingface_hub, scipy, numba, ...)
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl \
    f5-tts==1.1.22 vocos==0.1.0 encodec==0.1.1 voxcpm==2.0.3 x-transformers==2.31.10 \
    ema-pytorch pypinyin==0.55.0 rjieba==0.2.2 librosa soundfile soxr audioread pooch \
    pydub wetext==0.1.2 inflect==7.5.0 typeguard more-itertools pydantic pydantic-core \
    annotated-types typing-inspection \
    accelerate datasets==3.6.0 pyarrow dill multiprocess xxhash fsspec argbind \
    docstring-parser tensorboardX torchdiffeq torchcodec==0.17.0 pytest pluggy iniconfig
# (the last line: the training checks, which run the parity tests' training cases; upstream
# F5's loader reads audio with torchaudio.load, which needs torchcodec and FFmpeg's libraries)
du -sh .whl
