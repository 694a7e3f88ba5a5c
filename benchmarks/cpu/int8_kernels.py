"""int8 linear kernels at VoxCPM's shapes, against the one the ``int8`` fast profile runs today
(torch's dynamic int8 ``nn.Linear``: fbgemm, per-tensor weight scale, activations quantized per
call). Paired: every repeat times each candidate once, in turn, and a candidate's figure is the
median of its per-repeat ratio to the baseline, so machine load drifting between repeats falls
on both alike. Also each candidate's output SNR (dB) against float32 ``F.linear``.

    python benchmarks/cpu/int8_kernels.py
    python benchmarks/cpu/int8_kernels.py --rows 1,10,20 --shapes 1024x4096 --threads 2

Each layer is one of several copies cycled through (``--copies``, at least ``--cold-mb`` of
weights per candidate), so its weights come from memory as they do inside a model, not from a
warm cache. Not a test: the figures depend on the machine and its load.

Candidates (those this torch lacks are reported and skipped):
- ``dynamic-fbgemm``: ``quantize_dynamic`` under the x86 quantized engine (the baseline);
- ``dynamic-onednn``: the same layer under the ``onednn`` quantized engine;
- ``fbgemm-int8-weight``: ``torch.fbgemm_linear_int8_weight`` on a packed matrix;
- ``onednn-qlinear``: ``torch.ops.onednn.qlinear_pointwise`` on a ``qlinear_prepack`` weight
  (per-channel), activations quantized to uint8 per call (VNNI);
- ``int-mm``: ``torch._int_mm`` (int8 × int8 → int32), activations per row, weights per channel;
- ``weight-int8pack``: ``torch._weight_int8pack_mm`` (weight-only int8 per channel,
  float32 or ``--act-dtype`` activations);
- ``onednn-bf16``: oneDNN bfloat16 on a packed weight (not int8: the native-bf16 reference);
- ``torchao-*``: torchao's weight-only and dynamic int8 layouts, where torchao imports (not a
  dependency: ``pip install torchao`` into a virtual environment of your own to include them).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Make = Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


def _dynamic(engine: str) -> Make:
    def make(weight):
        from torch.ao.quantization import quantize_dynamic

        previous = torch.backends.quantized.engine
        torch.backends.quantized.engine = engine
        layer = nn.Sequential(nn.Linear(weight.shape[1], weight.shape[0], bias=False))
        layer[0].weight.data.copy_(weight)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layer = quantize_dynamic(layer, {nn.Linear}, dtype=torch.qint8)
        torch.backends.quantized.engine = previous

        def run(x):
            torch.backends.quantized.engine = engine  # the kernel is chosen per call
            return layer(x)
        return run
    return make


def _fbgemm_int8_weight(weight):
    q, col_offsets, scale, zero = torch.fbgemm_linear_quantize_weight(weight)
    packed = torch.fbgemm_pack_quantized_matrix(q)
    bias = torch.zeros(weight.shape[0])
    return lambda x: torch.fbgemm_linear_int8_weight(x, q, packed, col_offsets, scale, zero,
                                                     bias)


def _per_channel(weight):
    scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
    return torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


def _onednn_qlinear(weight):
    q, scales = _per_channel(weight)
    packed = torch.ops.onednn.qlinear_prepack(q, None)
    zeros = torch.zeros(weight.shape[0], dtype=torch.int64)

    def run(x):
        low, high = x.aminmax()
        low, high = low.clamp(max=0), high.clamp(min=0)
        x_scale = ((high - low) / 255).clamp(min=1e-12)
        x_zero = torch.round(-low / x_scale).to(torch.int64)
        qx = torch.clamp(torch.round(x / x_scale) + x_zero, 0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise.tensor(
            qx, x_scale, x_zero, packed, scales, zeros, None, 1.0, 0, torch.float32,
            "none", [], "")
    return run


def _int_mm(weight):
    q, scales = _per_channel(weight)
    q_t = q.t().contiguous().t()  # (in, out) view, column-major as the kernel wants

    def run(x):
        x_scales = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        qx = torch.round(x / x_scales).to(torch.int8)
        return torch._int_mm(qx, q.t()).float() * x_scales * scales
    del q_t
    return run


def _int8pack(act_dtype: torch.dtype) -> Make:
    def make(weight):
        q, scales = _per_channel(weight)
        scales = scales.to(act_dtype)
        return lambda x: torch._weight_int8pack_mm(x.to(act_dtype), q, scales).float()
    return make


def _onednn_bf16(weight):
    w = weight.to(torch.bfloat16)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), packed, None,
                                                        "none", [], "").float()


def _torchao(config_name: str) -> Make:
    def make(weight):
        import torchao.quantization as tq

        layer = nn.Sequential(nn.Linear(weight.shape[1], weight.shape[0], bias=False))
        layer[0].weight.data.copy_(weight)
        tq.quantize_(layer, getattr(tq, config_name)())
        return layer
    return make


CANDIDATES: dict[str, Make] = {
    "dynamic-fbgemm": _dynamic("x86"),
    "dynamic-onednn": _dynamic("onednn"),
    "fbgemm-int8-weight": _fbgemm_int8_weight,
    "onednn-qlinear": _onednn_qlinear,
    "int-mm": _int_mm,
    "weight-int8pack": _int8pack(torch.float32),
    "weight-int8pack-bf16": _int8pack(torch.bfloat16),
    "onednn-bf16": _onednn_bf16,
    "torchao-int8wo": _torchao("Int8WeightOnlyConfig"),
    "torchao-int8dyn": _torchao("Int8DynamicActivationInt8WeightConfig"),
}


def _snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    noise = (reference - other.float()).pow(2).sum()
    return float(10 * torch.log10(reference.pow(2).sum() / noise.clamp(min=1e-30)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1024x1024,1024x4096,4096x1024",
                        help="in x out features, comma separated (VoxCPM-0.5B's LM and DiT)")
    parser.add_argument("--rows", default="1,10,20",
                        help="1: an LM step; 10-20: a guided DiT evaluation")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--calls", type=int, default=32, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cold-mb", type=float, default=96,
                        help="float32 weight megabytes cycled through per candidate")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    names = args.candidates.split(",")
    print(f"torch {torch.__version__}, {args.threads} threads, cpu capability "
          f"{torch.backends.cpu.get_cpu_capability()}; paired ratios: candidate time / "
          f"dynamic-fbgemm time (below 1: faster)")
    print(f"{'in->out':>10} {'rows':>4} {'candidate':>21} {'us/call':>8} {'ratio':>6} "
          f"{'GMAC/s':>7} {'SNR dB':>7}")
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        copies = max(2, int(args.cold_mb * 2 ** 20 // (4 * k * n)))
        weights = [torch.randn(n, k) / k ** 0.5 for _ in range(copies)]
        kernels: dict[str, list] = {}
        for name in names:
            try:
                with torch.no_grad():
                    kernels[name] = [CANDIDATES[name](w) for w in weights]
                    kernels[name][0](torch.randn(1, k))
            except Exception as exc:  # a candidate this torch or CPU lacks
                print(f"{shape:>10}    - {name:>21} unavailable: "
                      f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
                kernels.pop(name, None)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k)
            reference = F.linear(x, weights[0])
            times: dict[str, list[float]] = {name: [] for name in kernels}
            with torch.no_grad():
                snr = {name: _snr_db(reference, runs[0](x)) for name, runs in kernels.items()}
                for repeat in range(args.repeats + 1):
                    order = list(kernels)
                    order = order[repeat % len(order):] + order[:repeat % len(order)]
                    for name in order:
                        runs = kernels[name]
                        start = time.perf_counter()
                        for call in range(args.calls):
                            runs[call % copies](x)
                        if repeat:  # the first round warms up
                            times[name].append((time.perf_counter() - start) / args.calls)
            base = times.get("dynamic-fbgemm")
            for name, seconds in times.items():
                ratio = (statistics.median(a / b for a, b in zip(seconds, base, strict=True))
                         if base else float("nan"))
                median = statistics.median(seconds)
                print(f"{shape:>10} {rows:>4} {name:>21} {median * 1e6:>8.1f} {ratio:>6.2f} "
                      f"{rows * k * n / median / 1e9:>7.1f} {snr[name]:>7.1f}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
