"""One product for the layers of a decoder layer that read the same input (q/k/v; gate/up),
against the separate products, at VoxCPM-0.5B's shapes; and a decode step's grouped-query
attention with each kv head's query heads folded into rows, against torch's grouped call.

    python benchmarks/cpu/fused_products.py --threads 2
    python benchmarks/cpu/fused_products.py --threads 1 --rows 1,8 --dtypes bfloat16

Paired: every repeat times the separate and the fused form once each, in turn, and the figure
is the median of the per-repeat ratio fused / separate (below 1: the fused form is faster), so
load drifting between repeats falls on both alike. Each layer is one of several copies cycled
through (at least ``--cold-mb`` of weights), so weights come from memory as in a model.

- ``int8``: :class:`mizuoto.runtime.packed_int8.PackedInt8Linear` per layer against
  :meth:`~mizuoto.runtime.packed_int8.PackedInt8Linear.fused` (per-channel weights: the same
  bits, checked here);
- ``bfloat16`` / ``float32``, the exact path: each layer's product as
  :mod:`mizuoto.runtime.prepack` would run it (the first packed kernel proven equal to
  ``F.linear`` at that row count, else ``F.linear``) against one product over the concatenated
  weights, by the first kernel (or ``F.linear``) whose outputs equal the separate layers'
  ``F.linear`` bits on random inputs: ``proven`` says whether any did;
- ``--model DIR`` (a VoxCPM model directory, e.g. ``mizuoto random-model
  voxcpm/realsize-0.5b DIR``): its base LM's decode step in the ``int8`` profile (random
  float32 weights of its shape, packed int8, a 100-position prefill), the four combinations of
  separate/fused products and grouped/folded attention, paired against separate + grouped (the
  profile before fusion); ms a step;
- ``attention``: ``F.scaled_dot_product_attention`` on q ``(b, 16, 1, 64)`` against kv
  ``(b, 2, span, 64)`` with ``enable_gqa`` against the folded ``(b, 2, 8, 64)`` call, and the
  largest difference between them.

Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mizuoto.runtime.packed_int8 import PackedInt8Linear
from mizuoto.runtime.prepack import KERNELS

HIDDEN = 1024
SHAPES = {"q/k/v": (1024, 128, 128), "gate/up": (4096, 4096)}
Run = Callable[[torch.Tensor], object]


def _time(run: Run, x: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        run(x)
    return (time.perf_counter() - start) / calls


def _paired(separate: list[Run], fused: list[Run], x: torch.Tensor, repeats: int
            ) -> tuple[float, float, float]:
    """(median ms separate, median ms fused, median ratio fused/separate) over ``repeats``,
    each call cycling through the copies."""
    def cycle(runs):
        index = [0]

        def run(inputs):
            runs[index[0] % len(runs)](inputs)
            index[0] += 1
        return run

    a, b = cycle(separate), cycle(fused)
    for _ in range(3):
        a(x), b(x)
    times_a, times_b = [], []
    for _ in range(repeats):
        times_a.append(_time(a, x, 2 * len(separate)))
        times_b.append(_time(b, x, 2 * len(fused)))
    ratios = [tb / ta for ta, tb in zip(times_a, times_b, strict=True)]
    return (statistics.median(times_a) * 1e3, statistics.median(times_b) * 1e3,
            statistics.median(ratios))


def _copies(sizes: tuple[int, ...], dtype: torch.dtype, cold_mb: float) -> list[list[nn.Linear]]:
    per_copy = sum(sizes) * HIDDEN * torch.finfo(dtype).bits / 8 / 2**20
    count = max(2, int(cold_mb / per_copy) + 1)
    return [[nn.Linear(HIDDEN, size, bias=False).to(dtype) for size in sizes]
            for _ in range(count)]


def _int8(sizes, rows, repeats, cold_mb) -> str:
    layers = _copies(sizes, torch.float32, cold_mb)
    separate = [[PackedInt8Linear(layer) for layer in group] for group in layers]
    fused = [PackedInt8Linear.fused(group) for group in layers]
    x = torch.randn(rows, HIDDEN)
    with torch.no_grad():
        same = torch.equal(torch.cat([p(x) for p in separate[0]], dim=-1), fused[0](x))
        ms = _paired([lambda v, g=g: [p(v) for p in g] for g in separate],
                     [lambda v, f=f: f(v) for f in fused], x, repeats)
    return f"same bits {same}; separate {ms[0]:.3f} ms, fused {ms[1]:.3f} ms, ratio {ms[2]:.2f}"


def _exact_kernel(weight: torch.Tensor, rows: int, references: Callable[[torch.Tensor], list],
                  probes: list[torch.Tensor]) -> tuple[str, Run] | None:
    """The first kernel whose product over ``weight`` gives ``references``' bits (split as
    they are) on every probe; None: none does, not even ``F.linear``."""
    sizes = [r.shape[-1] for r in references(probes[0])]

    def proven(run):
        return all(all(torch.equal(a, b) for a, b in zip(run(p).split(sizes, dim=-1),
                                                          references(p), strict=True))
                   for p in probes)

    for name, (pack, run, _) in KERNELS.items():
        try:
            packed = pack(weight, rows)

            def kernel(x, packed=packed, run=run):
                return run(x, packed, weight, None, rows)
            if proven(kernel):
                return name, kernel
        except (RuntimeError, NotImplementedError):
            continue
    plain = lambda x: F.linear(x, weight)  # noqa: E731
    return ("F.linear", plain) if proven(plain) else None


def _exact(sizes, rows, dtype, repeats, cold_mb) -> str:
    groups = _copies(sizes, dtype, cold_mb)
    generator = torch.Generator().manual_seed(rows)
    probes = [torch.randn(rows, HIDDEN, generator=generator).to(dtype) for _ in range(3)]
    separate, fused, names = [], [], set()
    for group in groups:
        runs = []
        for layer in group:
            weight = layer.weight.detach()
            chosen = _exact_kernel(weight, rows, lambda x, w=weight: [F.linear(x, w)], probes)
            runs.append(chosen[1])
            names.add(f"separate {chosen[0]}")
        separate.append(lambda x, runs=runs: [r(x) for r in runs])
        weights = [layer.weight.detach() for layer in group]
        chosen = _exact_kernel(torch.cat(weights), rows,
                               lambda x, ws=weights: [F.linear(x, w) for w in ws], probes)
        if chosen is None:
            return f"fused never proven ({', '.join(sorted(names))})"
        names.add(f"fused {chosen[0]}")
        fused.append(chosen[1])
    with torch.no_grad():
        ms = _paired(separate, fused, probes[0], repeats)
    return (f"proven ({', '.join(sorted(names))}); separate {ms[0]:.3f} ms, "
            f"fused {ms[1]:.3f} ms, ratio {ms[2]:.2f}")


def _attention(batch, span, dtype, repeats) -> str:
    generator = torch.Generator().manual_seed(batch)
    q = torch.randn(batch, 16, 1, 64, generator=generator).to(dtype)
    k, v = (torch.randn(batch, 2, span, 64, generator=generator).to(dtype) for _ in range(2))
    mask = (torch.arange(span) < span - 17).view(1, 1, 1, -1)

    def grouped(x):
        return F.scaled_dot_product_attention(x, k, v, attn_mask=mask, enable_gqa=True)

    def folded(x):
        out = F.scaled_dot_product_attention(x.reshape(batch, 2, 8, 64), k, v, attn_mask=mask)
        return out.view(batch, 16, 1, 64)

    difference = (grouped(q).float() - folded(q).float()).abs().max().item()
    ms = _paired([grouped], [folded], q, repeats)
    return (f"max difference {difference:.1e}; grouped {ms[0]:.3f} ms, folded {ms[1]:.3f} ms, "
            f"ratio {ms[2]:.2f}")


def _lm_steps(model_dir: str, repeats: int) -> None:
    import copy

    from mizuoto.runtime.packed_int8 import pack_int8_linears
    from mizuoto_voxcpm.config import VoxCPMConfig
    from mizuoto_voxcpm.kv_cache import KVCache
    from mizuoto_voxcpm.layer_fusion import fold_query_heads, fuse_products
    from mizuoto_voxcpm.minicpm4 import MiniCPM4

    config = VoxCPMConfig.from_model_dir(model_dir).lm
    base = MiniCPM4(config)
    variants = {}
    for fused in (False, True):
        for folded in (False, True):
            model = copy.deepcopy(base)
            if fused:
                fuse_products([model], PackedInt8Linear.fused)
            pack_int8_linears([model])
            if folded:
                fold_query_heads([model])
            variants[(fused, folded)] = model
    del base
    generator = torch.Generator().manual_seed(0)
    _, pairs = variants[(False, False)](torch.randn(1, 100, config.hidden_size,
                                                    generator=generator))
    embed = torch.randn(1, config.hidden_size, generator=generator)
    caches = {}
    for key in variants:
        caches[key] = KVCache(config, 512)
        caches[key].fill(pairs)

    def step(key):
        cache = caches[key]
        variants[key].step(embed, cache)
        cache.rewind()  # the same position every call

    times = {key: [] for key in variants}
    for key in variants:
        step(key)
    for _ in range(repeats):
        for key in variants:
            start = time.perf_counter()
            for _ in range(5):
                step(key)
            times[key].append((time.perf_counter() - start) / 5 * 1e3)
    reference = times[(False, False)]
    for (fused, folded), values in times.items():
        ratio = statistics.median(v / r for v, r in zip(values, reference, strict=True))
        print(f"base LM step, {'fused' if fused else 'separate'} products, "
              f"{'folded' if folded else 'grouped'} attention: "
              f"{statistics.median(values):.2f} ms, ratio {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--dtypes", default="int8,bfloat16,float32")
    parser.add_argument("--spans", default="256,512")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--cold-mb", type=float, default=64.0)
    parser.add_argument("--model", help="a VoxCPM model directory: time its base LM's step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model:
        _lm_steps(args.model, args.repeats)
        return
    rows = [int(r) for r in args.rows.split(",")]
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    for dtype_name in args.dtypes.split(","):
        for shape, sizes in SHAPES.items():
            for count in rows:
                if dtype_name == "int8":
                    line = _int8(sizes, count, args.repeats, args.cold_mb)
                else:
                    line = _exact(sizes, count, getattr(torch, dtype_name), args.repeats,
                                  args.cold_mb)
                print(f"{dtype_name:8} {shape:8} {count:2} rows: {line}")
    for dtype_name in ("float32", "bfloat16"):
        for batch in rows:
            for span in (int(s) for s in args.spans.split(",")):
                line = _attention(batch, span, getattr(torch, dtype_name), args.repeats)
                print(f"attention {dtype_name:8} b={batch} span {span}: {line}")


if __name__ == "__main__":
    with torch.no_grad():
        main()
