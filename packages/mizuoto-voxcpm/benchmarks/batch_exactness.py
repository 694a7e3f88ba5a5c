"""How far a stream's audio in a continuous batch is from its audio alone (VoxCPM).

    python packages/mizuoto-voxcpm/benchmarks/batch_exactness.py MODEL_DIR \
        [--dtype float32 --dtype bfloat16] [--sizes 1,2,4,8] [--max-len 12] [--json OUT]

For each dtype and batch size ``b``: ``b`` streams of sentences of mixed lengths (seeds differ)
are consumed round-robin in one thread by an engine loaded with ``engines.voxcpm.max_batch=b``,
so they join one by one and then step together (``--threads``: each on its own thread, started
together, so they are admitted together and their prompts prefilled in one packed pass); each
is compared with the same stream from an engine that steps each row alone (``max_batch=1``).
Size 1 runs on an engine with ``max_batch`` 2 too: its row is a request alone in a batching
engine against the unbatched one, and ``steps`` says the scheduler stepped it. Reports per row: bit-identical or not, max |diff|
over the common length, SNR (dB) of the batched audio against the alone audio, and the number
of patches each produced (a moved stop patch changes the length). One CPU thread.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

import mizuoto
from mizuoto import ComputeOptions, Options, SynthesisRequest
from mizuoto_voxcpm.listeners import listen_together, round_robin

SENTENCES = (
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "One, two, three.",
    "A longer sentence for a longer stream, with a comma or two, and an end.",
    "Short one.",
    "Streams join and leave the batch at patch boundaries.",
    "Good morning to you all.",
    "Eight listeners, one model.",
)


def _requests(count: int, max_len: int) -> list[SynthesisRequest]:
    return [SynthesisRequest(text=SENTENCES[i % len(SENTENCES)], seed=100 + i,
                             params={"max_len": max_len, "retry_badcase": False})
            for i in range(count)]


def _load(model_dir: str, dtype: str, max_batch: int, device: str = "cpu"):
    options = Options(compute=ComputeOptions(device=device, cpu_threads=1),
                      engines={"voxcpm": {"dtype": dtype, "max_batch": max_batch,
                                          "cache_slots": max(4, max_batch)}})
    return mizuoto.load(model_dir, options=options)


def compare(alone: torch.Tensor, batched: torch.Tensor) -> dict:
    common = min(alone.numel(), batched.numel())
    a, b = alone[:common].double(), batched[:common].double()
    diff = (a - b).abs().max().item() if common else 0.0
    noise = (a - b).pow(2).sum().item()
    snr = math.inf if noise == 0 else 10 * math.log10(a.pow(2).sum().item() / noise)
    return {"identical": bool(torch.equal(alone, batched)), "max_abs_diff": diff,
            "snr_db": snr}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--dtype", action="append", default=None)
    parser.add_argument("--sizes", default="1,2,4,8")
    parser.add_argument("--max-len", type=int, default=12)
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cpu", help="where both engines run (cuda: the "
                        "GPU check, benchmarks/gpu/checks.py)")
    parser.add_argument("--threads", action="store_true",
                        help="each stream on its own thread, started together (as a server's "
                             "listeners: prefills packed) instead of round-robin in one thread")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    report = []
    for dtype in args.dtype or ["float32", "bfloat16"]:
        single = _load(args.model_dir, dtype, 1, args.device)
        requests = _requests(max(sizes), args.max_len)
        alone = []
        for request in requests:
            alone.append([c.audio.samples for c in single.stream(request)])
        del single
        for size in sizes:
            # at least 2: size 1 on max_batch=1 would compare the unbatched engine with itself
            engine = _load(args.model_dir, dtype, max(size, 2), args.device)
            started = time.perf_counter()
            if args.threads:
                opens = [lambda r=r, e=engine: e.stream(r) for r in requests[:size]]
                batched = [[c.audio.samples for c in chunks]
                           for chunks in listen_together(opens)]
            else:
                batched = [[c.audio.samples for c in chunks] for chunks in
                           round_robin([engine.stream(r) for r in requests[:size]])]
            seconds = time.perf_counter() - started
            stats = engine.batch_stats
            for index in range(size):
                row = compare(torch.cat(alone[index]), torch.cat(batched[index]))
                row.update(dtype=dtype, batch=size, row=index, seconds=seconds,
                           patches_alone=len(alone[index]), patches_batched=len(batched[index]),
                           steps=stats.steps, batched_rows=stats.batched_rows)
                report.append(row)
                print(json.dumps(row), flush=True)
            print(f"# {dtype} b={size}: {stats.steps} steps, mean batch "
                  f"{stats.rows / max(stats.steps, 1):.2f}, {stats.prefills} prefills, "
                  f"{seconds:.2f} s", flush=True)
            del engine
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)
    same = sum(r["identical"] for r in report)
    print(f"# {same}/{len(report)} rows bit-identical to their audio alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
