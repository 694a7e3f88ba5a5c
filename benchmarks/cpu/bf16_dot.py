"""The ``bf16dot`` kernel against torch's own bfloat16 ``F.linear``, per layer shape, row count
and thread count: milliseconds (median of ``--repeats`` timings of ``--calls`` calls each),
multiply-adds per second, and whether the outputs were identical (they must be: the kernel
reproduces torch's order; the engines use it only where they are).

    python benchmarks/cpu/bf16_dot.py
    python benchmarks/cpu/bf16_dot.py --threads 1,2,4 --rows 1,10,100 --shapes 1024x4096

The weight stays warm in the cache across calls (a few MB): inside a model each layer's weights
come from memory, slower at one row (see docs/performance.md). Not a test: the figures depend
on the machine. Only meaningful on a CPU without native bfloat16 (torch at AVX2).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F

from mizuoto.runtime import bf16_dot


def _median_ms(call, calls: int, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1024x4096,4096x1024,1024x1024",
                        help="in x out features, comma separated")
    parser.add_argument("--rows", default="1,2,10,40,101")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-torch", action="store_true",
                        help="time the kernel only (torch's own is slow at many rows)")
    args = parser.parse_args()
    reason = bf16_dot.unavailable_reason()
    if reason is None and not bf16_dot.runs():
        reason = bf16_dot.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"the bf16dot kernel does not run here: {reason}")
    generator = torch.Generator().manual_seed(0)
    print(f"{'threads':>7} {'in->out':>11} {'rows':>5} {'F.linear ms':>12} {'bf16dot ms':>11} "
          f"{'x':>6} {'GMAC/s':>7} {'identical':>9}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for shape in args.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            weight = torch.randn(n, k, generator=generator).bfloat16()
            bias = torch.randn(n, generator=generator).bfloat16()
            packed = bf16_dot.pack(weight, 0)
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k, generator=generator).bfloat16()
                same = torch.equal(bf16_dot.run(x, packed, weight, bias, rows),
                                   F.linear(x, weight, bias))
                kernel = functools.partial(bf16_dot.run, x, packed, weight, bias, rows)
                ms = _median_ms(kernel, args.calls, args.repeats)
                torchs = functools.partial(F.linear, x, weight, bias)
                plain = None if args.skip_torch else _median_ms(torchs, args.calls, args.repeats)
                print(f"{threads:>7} {f'{k}->{n}':>11} {rows:>5} "
                      f"{'-' if plain is None else f'{plain:.3f}':>12} {ms:>11.3f} "
                      f"{'-' if plain is None else f'{plain / ms:.2f}':>6} "
                      f"{rows * k * n / ms / 1e6:>7.1f} {str(same):>9}", flush=True)


if __name__ == "__main__":
    main()
