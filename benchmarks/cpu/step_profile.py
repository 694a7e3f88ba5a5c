"""Where one batched VoxCPM step's time goes: ``ROWS`` streams opened together on one model,
stepped past their prefill, then ``--steps`` steps timed by component (both LMs, the local
encoder, the DiT, the stop head, the noise draws, the VAE) and the rest (Python, per-row
bookkeeping, copies).

    python benchmarks/cpu/step_profile.py MODEL_DIR [--rows 8] [--steps 4]
    python benchmarks/cpu/step_profile.py --tiny   # a random tiny VoxCPM: shows it runs

Never a test: the numbers depend on the machine (``lscpu``, the threads, what else runs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import mizuoto
from mizuoto import ComputeOptions, Options, SynthesisRequest

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Streams join and leave the batch at patch boundaries.",
    "Eight listeners, one model, and every one of them hears its own voice.",
    "A short one.",
)


class _Timers:
    """Seconds per component, summed over the calls of the timed steps."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.on = False

    def wrap(self, owner, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.on:
                return inner(*args, **kwargs)
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1

        setattr(owner, name, timed)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", nargs="?", type=Path)
    parser.add_argument("--tiny", action="store_true", help="a random tiny VoxCPM-0.5B")
    parser.add_argument("--rows", default="1,8",
                        help="row counts stepped together, in turn (1: alone)")
    parser.add_argument("--torch-profile", action="store_true",
                        help="also print torch.profiler's top operators of the timed steps")
    parser.add_argument("--steps", type=int, default=4, help="steps timed (after two untimed)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    if (args.model_dir is None) == (not args.tiny):
        parser.error("give MODEL_DIR or --tiny")
    model_dir = args.model_dir
    if args.tiny:
        from mizuoto_voxcpm.fixtures import write_random_model

        model_dir = write_random_model(Path(tempfile.mkdtemp()) / "tiny", "voxcpm-0.5b")
    import torch

    import mizuoto_voxcpm.patch_rows as patch_rows

    most = max(int(count) for count in args.rows.split(","))
    options = Options(compute=ComputeOptions(device="cpu", cpu_threads=args.threads),
                      engines={"voxcpm": {"max_batch": most, "cache_slots": most}})
    engine = mizuoto.load(model_dir, options=options)
    model = engine.model
    timers = _Timers()
    # a batch's kernels and a row alone's (the single-sequence path) under the same names
    for method in ("step", "step_rows"):
        timers.wrap(model.base_lm, method, "base LM")
        timers.wrap(model.residual_lm, method, "residual LM")
    timers.wrap(model, "encode_patch_rows", "encoder")
    timers.wrap(model, "encode_patches", "encoder")
    timers.wrap(model.feat_decoder, "forward", "DiT (sampler)")
    timers.wrap(model, "stop_flag", "stop head")
    timers.wrap(patch_rows, "decode_segments", "VAE decode")
    timers.wrap(patch_rows.StreamDecoder, "decode", "VAE decode")
    timers.wrap(patch_rows.PatchSteps, "_start", "prefill")
    params = {"retry_badcase": False, "max_len": 2 + args.steps + 4, "min_len": 2 + args.steps + 2}
    counts = [int(count) for count in args.rows.split(",")]
    print(f"# {model_dir}, {args.threads} threads ({torch.get_num_threads()} torch), rows "
          f"{args.rows}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
          f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}")
    tables = {}
    for count in counts:
        rows = []
        for index in range(count):
            request = SynthesisRequest(SENTENCES[index % len(SENTENCES)], seed=100 + index,
                                       params=params)
            generator = torch.Generator().manual_seed(100 + index)
            rows.append(engine.open_row(request, engine.parse_params(request.params),
                                        generator))
        for _ in range(2):  # the prefill, then a first patch (kernels proven for these shapes)
            engine.step_rows(rows)
        timers.seconds.clear()
        timers.calls.clear()
        timers.on = True
        profiler = torch.profiler.profile() if args.torch_profile else contextlib.nullcontext()
        load = os.getloadavg()[0]
        with profiler:
            started = time.perf_counter()
            for _ in range(args.steps):
                engine.step_rows(rows)
            total = (time.perf_counter() - started) / args.steps
        timers.on = False
        for row in rows:
            engine.close_row(row)
        if args.torch_profile:
            print(f"## {count} rows")
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
        table = {label: seconds / args.steps for label, seconds in timers.seconds.items()}
        table["rest (Python)"] = total - sum(table.values())
        table["step"] = total
        tables[count] = (table, load)
    labels = sorted(tables[counts[-1]][0], key=lambda label: -tables[counts[-1]][0][label])
    labels = [label for label in labels if label not in ("step", "rest (Python)")] + \
        ["rest (Python)", "step"]
    print(f"{'ms a step':>16} " + " ".join(f"{f'{count} rows':>9} {'/row':>7}"
                                           for count in counts))
    for label in labels:
        cells = []
        for count in counts:
            seconds = tables[count][0].get(label, 0.0)
            cells.append(f"{1000 * seconds:>9.1f} {1000 * seconds / count:>7.1f}")
        print(f"{label:>16} " + " ".join(cells))
    print(f"{'load (1 min)':>16} " + " ".join(f"{tables[count][1]:>17.2f}" for count in counts))
    if len(counts) > 1:
        alone = tables[counts[0]][0]["step"] / counts[0]
        for count in counts[1:]:
            per_row = tables[count][0]["step"] / count
            print(f"# {count} rows: {alone / per_row:.2f}x the rows a second of {counts[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
