"""The ``int8`` profile's packed product (:class:`mizuoto.runtime.packed_int8.PackedInt8Linear`)
at one row, the shape of a decode step, as bandwidth: the bytes of weights it reads per
second, against the machine's read rate (``mizuoto.benchmarking.profile.measure_read_rate``).
At one row a product is one multiply-add per weight byte, so its floor is the read, not the
arithmetic.

    python benchmarks/cpu/int8_row_bandwidth.py
    python benchmarks/cpu/int8_row_bandwidth.py --shapes 1024x1280,4096x1024 --threads 1,2

Each shape is ``--copies`` layers called in turn (VoxCPM-0.5B's base LM has 24 decoder
layers), so a layer's weights come from memory as inside a model; the figure is the median
of ``--repeats`` passes. Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from mizuoto.benchmarking.profile import measure_read_rate
from mizuoto.runtime.packed_int8 import PackedInt8Linear, packed_int8_unavailable

#: VoxCPM-0.5B's base LM products, fused as the int8 profile runs them: q/k/v, o, gate/up, down
BASE_LM_SHAPES = "1024x1280,1024x1024,1024x8192,4096x1024"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=BASE_LM_SHAPES, help="in x out, comma-separated")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--copies", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    if (reason := packed_int8_unavailable()) is not None:
        raise SystemExit(reason)
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    torch.manual_seed(0)
    layers = {shape: [PackedInt8Linear(nn.Linear(*shape, bias=False))
                      for _ in range(args.copies)] for shape in shapes}
    print(f"read rate {measure_read_rate():.1f} GB/s")
    with torch.inference_mode():
        for threads in (int(n) for n in args.threads.split(",")):
            torch.set_num_threads(threads)
            for shape in shapes:
                row = torch.randn(1, shape[0])
                for layer in layers[shape]:  # warm the code paths, not the weights
                    layer(row)
                seconds = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    for layer in layers[shape]:
                        layer(row)
                    seconds.append((time.perf_counter() - start) / args.copies)
                call = statistics.median(seconds)
                weight_mb = shape[0] * shape[1] / 1e6
                print(f"{threads} thread(s), {shape[0]}x{shape[1]}: {call * 1e6:.1f} us a call, "
                      f"{weight_mb / call / 1e3:.1f} GB/s")


if __name__ == "__main__":
    main()
