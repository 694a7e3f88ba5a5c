"""What each convolution of VoxCPM's VAE costs a call at a stream's shapes: one stream's
window (the exact path), its newest patch only (a fast profile's ``decode_tail``) or ``ROWS``
streams' segments in one batch (``decode_segments``), after the load's rehearsal and two
untimed steps (the proofs of a batch's shapes).

    python benchmarks/cpu/vae_layers.py MODEL_DIR [--rows 1] [--tail] [--threads 2]
    python benchmarks/cpu/vae_layers.py --tiny   # a random tiny VoxCPM-0.5B: shows it runs

Prints, per layer in decode order, the input shape, torch's convolution backend for a plain
``Conv1d`` (``torch._C._select_conv_backend``) or the proven packed kernel of a transposed
one, and milliseconds a call. Never a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

import mizuoto
from mizuoto_voxcpm.decoding import StreamDecoder, decode_segments
from mizuoto_voxcpm.engine import VoxCPMEngine


def _backend(layer: nn.Module, x: torch.Tensor) -> str:
    if isinstance(layer, nn.ConvTranspose1d):
        key = (tuple(x.shape), x.is_contiguous(), torch.get_num_threads())
        kernel = getattr(layer, "_packs", {}).get(key, ("plain",))[0]
        return f"conv_transpose1d {kernel}"
    left = getattr(layer, "left_pad", 0)
    padded = torch.empty(x.shape[0], x.shape[1], x.shape[2] + left)
    backend = torch._C._select_conv_backend(
        padded, layer.weight, layer.bias, list(layer.stride), [0], list(layer.dilation),
        False, [0], layer.groups, None)
    return f"conv1d {str(backend).split('.')[-1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", nargs="?", type=Path)
    parser.add_argument("--tiny", action="store_true", help="a random tiny VoxCPM-0.5B")
    parser.add_argument("--rows", type=int, default=1, help="streams decoded together")
    parser.add_argument("--tail", action="store_true", help="one stream decodes its newest "
                        "patch only (a fast profile's; a batch always does)")
    parser.add_argument("--steps", type=int, default=6, help="steps timed")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if args.tiny:
            from mizuoto_voxcpm.fixtures import with_dtype, write_random_model
            model_dir = with_dtype(write_random_model(Path(tmp) / "m", "voxcpm-0.5b", seed=3),
                                   Path(tmp) / "fp32", "float32")
        if model_dir is None:
            parser.error("give MODEL_DIR or --tiny")
        engine = VoxCPMEngine.load(model_dir, options=mizuoto.Options.from_mapping(
            {"compute.device": "cpu", "compute.cpu_threads": args.threads}))
    vae, config = engine.vae, engine.config
    if config.is_v2:
        parser.error("VoxCPM2 decodes with carried state; this times the first generation")
    seconds: dict[int, float] = defaultdict(float)
    seen: dict[int, tuple[str, str, str]] = {}
    started: dict[int, float] = {}
    timing = [False]
    layers = [m for m in vae.decoder.modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    for index, layer in enumerate(layers):
        def before(module, inputs, index=index):
            if timing[0]:
                seen[index] = (str(tuple(module.weight.shape)), str(tuple(inputs[0].shape)),
                               _backend(module, inputs[0]))
                started[index] = time.perf_counter()

        def after(module, inputs, output, index=index):
            if timing[0]:
                seconds[index] += time.perf_counter() - started[index]
        layer.register_forward_pre_hook(before)
        layer.register_forward_hook(after)
    generator = torch.Generator().manual_seed(0)
    decoders = [StreamDecoder(vae, context=[], v2=False, patch_size=config.patch_size,
                              tail=args.tail) for _ in range(args.rows)]

    def step() -> None:
        patches = [torch.randn(1, config.patch_size, config.feat_dim, generator=generator)
                   for _ in decoders]
        if args.rows == 1:
            decoders[0].decode(patches[0])
        else:
            decode_segments(decoders, patches)

    for _ in range(3):  # the window fills (and a batch proves its shapes)
        step()
    timing[0] = True
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    total = (time.perf_counter() - start) / args.steps * 1e3
    print(f"# {model_dir}, {args.threads} threads, rows {args.rows}, "
          f"{'tail' if args.tail or args.rows > 1 else 'whole window'}")
    print(f"{'weight':>18} {'input':>18} {'kernel':>28} {'ms a call':>9}")
    for index in sorted(seen):
        weight, shape, kernel = seen[index]
        print(f"{weight:>18} {shape:>18} {kernel:>28} {seconds[index] / args.steps * 1e3:9.2f}")
    convolutions = sum(seconds.values()) / args.steps * 1e3
    print(f"convolutions {convolutions:.1f} ms of the VAE's {total:.1f} ms a step; "
          f"load (1 min) {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
