"""Load test of ``mizuoto serve``: concurrent streaming requests across a tiny random-init
F5-TTS model and a tiny random-init VoxCPM2 model, against a single-global-lock baseline.

Each server runs in its own process on a free loopback port (127.0.0.1 only), so that the
client's work does not share the server's interpreter. First every request runs alone, one
after the other (the reference bytes); then all of them are sent at once, streamed
(``stream_format="audio"``, raw PCM). Rounds alternate between the server as designed (one
worker per model) and the same server with one lock around every request (coqui's design).
The report gives, per round: errors, whether each concurrent response is byte-identical to its
single run, the time to first audio (p50, p95, from sending the request to its first body
bytes; and the median per model), the wall time, the throughput (seconds of audio per second,
requests per second) and the CPU the server process used (cores: CPU seconds per wall second).

    python packages/mizuoto-core/benchmarks/bench_serve.py               # 16 requests
    python packages/mizuoto-core/benchmarks/bench_serve.py --requests 8 --rounds 1

``--batching MODEL_DIR`` measures ``--max-batch`` instead (issue 25): one VoxCPM model (e.g. a
real-size random-init VoxCPM-0.5B written by ``mizuoto random-model voxcpm/realsize-0.5b``),
``--streams`` concurrent streams of one sentence, then each of its own (``--sentences``;
``--vox-patches`` patches each, no stop head), served with ``--max-batch B`` and with
``--max-batch 1``; each (server, streams) pair in a fresh server process, so its peak RSS
(VmHWM) is its own, warmed up with another sentence (no measured prompt is prefilled before it
is sent). Reports aggregate audio seconds per second (also against the unbatched server at the
same streams), TTFA p50/p95 and peak RSS, each also relative to one stream on the unbatched
server; with ``--repeat N``, the medians of N runs of each level, each on a fresh server:

    python packages/mizuoto-core/benchmarks/bench_serve.py --batching DIR --dtype bfloat16 \
        --streams 1,4,8,16 --max-batch 8 --vox-patches 24

``--busy N`` runs N CPU-bound processes (pure-Python loops, one core each) beside every
measured level of ``--batching``, from after the server is up to the end of its requests; the
server process runs with ``OMP_WAIT_POLICY`` of ``--wait-policy`` (default ``PASSIVE``, what
``mizuoto serve`` sets; ``default`` leaves libgomp's):

    python packages/mizuoto-core/benchmarks/bench_serve.py --batching DIR --streams 1,8 \
        --max-batch 8 --batched-only --busy 2

Bounded: every request has a timeout, the servers stop at the end. Never run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per worker: parallelism is ours

TEXT = "The quick brown fox jumps over the lazy dog."
TIMEOUT = 120.0


def _body(index: int, args) -> dict:
    """Request ``index``: even ones to F5-TTS, odd ones to VoxCPM2; each its own seed."""
    if index % 2 == 0:
        return {"model": "f5", "input": TEXT, "voice": "default", "response_format": "pcm",
                "mizuoto": {"seed": index, "steps": args.f5_steps}}
    return {"model": "vox", "input": TEXT, "voice": "default", "response_format": "pcm",
            "mizuoto": {"seed": index, "steps": 2, "params": {"max_len": args.vox_patches}}}


async def _one(client, url: str, body: dict) -> dict:
    started = time.perf_counter()
    first = None
    data = bytearray()
    async with client.stream("POST", f"{url}/v1/audio/speech", json=body,
                             timeout=TIMEOUT) as response:
        if response.status_code != 200:
            await response.aread()
            return {"error": f"{response.status_code} {response.text[:200]}"}
        async for piece in response.aiter_bytes():
            if first is None and piece:
                first = time.perf_counter() - started
            data += piece
    return {"ttfa": first, "seconds": time.perf_counter() - started, "data": bytes(data),
            "model": body["model"]}


async def _run(url: str, bodies: list[dict], concurrent: bool) -> tuple[list[dict], float]:
    import httpx

    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(limits=limits) as client:
        started = time.perf_counter()
        if concurrent:
            results = await asyncio.gather(*(_one(client, url, b) for b in bodies),
                                           return_exceptions=True)
        else:
            results = [await _one(client, url, b) for b in bodies]
        wall = time.perf_counter() - started
    return [r if isinstance(r, dict) else {"error": repr(r)} for r in results], wall


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _serve(args) -> None:
    """The server process (``--serve``): runs until SIGTERM."""
    from mizuoto.serve import ServeConfig
    from mizuoto.serve.app import run

    if args.batching:
        from mizuoto import ComputeOptions, Options

        options = Options(compute=ComputeOptions(cpu_threads=1),
                          engines={"voxcpm": {"dtype": args.dtype}})
        run(ServeConfig(models={"vox": str(args.batching)}, port=args.port,
                        queue_size=4 * args.requests, max_batch=args.max_batch,
                        options=options, voices_dir=args.dir / "voices", grace=5))
        return
    run(ServeConfig(models={"f5": str(args.dir / "f5"), "vox": str(args.dir / "vox")},
                    port=args.port, queue_size=4 * args.requests, shared_lock=args.shared_lock,
                    voices_dir=args.dir / "voices", grace=5))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@contextlib.contextmanager
def _server(root: Path, args, shared_lock: bool):
    from mizuoto.serve.app import wait_healthy

    port = _free_port()
    command = [sys.executable, __file__, "--serve", "--dir", str(root), "--port", str(port),
               "--requests", str(args.requests)] + (["--shared-lock"] if shared_lock else [])
    if args.batching:
        command += ["--batching", str(args.batching), "--dtype", args.dtype,
                    "--max-batch", str(args.max_batch)]
    environment = dict(os.environ)
    policy = getattr(args, "wait_policy", "PASSIVE")
    environment.pop("OMP_WAIT_POLICY", None)
    if policy != "default":
        environment["OMP_WAIT_POLICY"] = policy
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=environment)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, TIMEOUT)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _round(root: Path, args, shared_lock: bool, reference: list[bytes] | None):
    bodies = [_body(i, args) for i in range(args.requests)]
    with _server(root, args, shared_lock) as (url, pid):
        asyncio.run(_run(url, bodies[:2], concurrent=False))  # warm-up
        if reference is None:
            singles, _ = asyncio.run(_run(url, bodies, concurrent=False))
            reference = [r.get("data") for r in singles]
        cpu = _cpu_seconds(pid)
        results, wall = asyncio.run(_run(url, bodies, concurrent=True))
        cpu = _cpu_seconds(pid) - cpu
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    identical = sum(r.get("data") == ref for r, ref in zip(results, reference, strict=True))
    ttfa = [r["ttfa"] for r in ok]
    audio = sum(len(r["data"]) / 2 / 24000 for r in ok)  # pcm: 16-bit at 24 kHz
    by_model = {m: statistics.median(r["ttfa"] for r in ok if r["model"] == m)
                for m in ("f5", "vox") if any(r["model"] == m for r in ok)}
    row = {"errors": len(errors), "identical": identical, "n": len(results),
           "p50": _percentile(ttfa, 0.5), "p95": _percentile(ttfa, 0.95), "wall": wall,
           "audio_per_s": audio / wall, "req_per_s": len(ok) / wall, "cores": cpu / wall,
           "by_model": by_model, "first_error": errors[0] if errors else "",
           "load": os.getloadavg()[0]}
    return row, reference


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


#: distinct sentences of similar length (``--sentences distinct``), and the warm-up's own
#: (so that no measured request finds its prompt's prefill already made by the warm-up)
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A small boat drifted slowly toward the harbor.",
    "Please call me back after the meeting ends.",
    "The museum opens at nine on most weekdays.",
    "Fresh bread was cooling on the kitchen table.",
    "Our train leaves from the second platform.",
    "She painted the fence a bright shade of blue.",
    "Turn left at the bakery and walk two blocks.",
)
WARMUP_TEXT = "Warming up the server before the measured requests."


@contextlib.contextmanager
def _busy(count: int):
    """``count`` CPU-bound processes for the duration of the block (stopped however it ends)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5 if count else 0)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _batching_level(root: Path, args, max_batch: int, streams: int, sentences: str) -> dict:
    """``streams`` concurrent streams on a fresh server at ``max_batch``: all of one sentence
    (``same``) or each its own (``distinct``)."""
    def body(text: str, seed: int) -> dict:
        return {"model": "vox", "input": text, "voice": "default", "response_format": "pcm",
                "mizuoto": {"seed": seed, "params": {"max_len": args.vox_patches,
                                                     "retry_badcase": False}}}

    texts = [SENTENCES[0] if sentences == "same" else SENTENCES[i % len(SENTENCES)]
             for i in range(streams)]
    bodies = [body(text, i) for i, text in enumerate(texts)]
    level = argparse.Namespace(**{**vars(args), "max_batch": max_batch, "requests": streams})
    with _server(root, level, False) as (url, pid), _busy(args.busy):
        asyncio.run(_run(url, [body(WARMUP_TEXT, 999)], concurrent=False))  # first-call costs
        results, wall = asyncio.run(_run(url, bodies, concurrent=True))
        rss = _peak_rss(pid)
    ok = [r for r in results if "error" not in r]
    ttfa = [r["ttfa"] for r in ok] or [float("nan")]
    audio = sum(len(r["data"]) / 2 / 24000 for r in ok)  # pcm: 16-bit at 24 kHz
    errors = [r["error"] for r in results if "error" in r]
    return {"max_batch": max_batch, "streams": streams, "sentences": sentences,
            "errors": len(errors), "first_error": errors[0] if errors else "",
            "audio_per_s": audio / wall, "p50": _percentile(ttfa, 0.5),
            "p95": _percentile(ttfa, 0.95), "wall": wall, "rss": rss,
            "load": os.getloadavg()[0]}


def _batching_median(root: Path, args, max_batch: int, streams: int, sentences: str) -> dict:
    """:func:`_batching_level` ``--repeat`` times, each on a fresh server: the medians (a
    two-core machine's timings move by a third from one run to the next)."""
    runs = [_batching_level(root, args, max_batch, streams, sentences)
            for _ in range(args.repeat)]
    if len(runs) > 1:
        print(f"  --max-batch {max_batch}, {streams} streams ({sentences}): p95 "
              + ", ".join(f"{r['p95']:.2f}" for r in runs) + " s; audio s / s "
              + ", ".join(f"{r['audio_per_s']:.3f}" for r in runs), file=sys.stderr)
    row = dict(runs[0])
    for key in ("audio_per_s", "p50", "p95", "wall", "rss", "load"):
        row[key] = statistics.median(r[key] for r in runs)
    row["errors"] = sum(r["errors"] for r in runs)
    row["first_error"] = next((r["first_error"] for r in runs if r["first_error"]), "")
    return row


def _batching_main(args) -> None:
    root = args.dir or Path(tempfile.mkdtemp(prefix="mizuoto-bench-batch-"))
    (root / "voices").mkdir(parents=True, exist_ok=True)
    levels = [int(n) for n in args.streams.split(",")]
    print(f"VoxCPM {args.batching} ({args.dtype}), {args.vox_patches} patches per stream, "
          f"--max-batch {args.max_batch} vs 1, {os.cpu_count()} CPUs, one thread, "
          f"OMP_WAIT_POLICY={args.wait_policy}, {args.busy} busy processes beside",
          file=sys.stderr)
    print("| sentences | --max-batch | streams | errors | audio s / s | x unbatched "
          "| TTFA p50 (s) | TTFA p95 (s) | p95 / single | peak RSS (GB) | / single | wall (s) "
          "| load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    # the reference: one stream on the unbatched server (the same for both sentence sets)
    single = _batching_median(root, args, 1, 1, "same")
    _print_level(single, single, single)
    for sentences in args.sentences.split(","):
        unbatched = {}
        for max_batch in (1, args.max_batch):
            for streams in levels:
                if max_batch == 1 and streams == 1:
                    unbatched[1] = single
                    continue
                if max_batch == 1 and args.batched_only:
                    continue
                row = _batching_median(root, args, max_batch, streams, sentences)
                if max_batch == 1:
                    unbatched[streams] = row
                _print_level(row, single, unbatched.get(streams))
                if row["first_error"]:
                    print(f"  first error: {row['first_error']}", file=sys.stderr)


def _print_level(row: dict, single: dict, unbatched: dict | None) -> None:
    """One table row; throughput against the unbatched server at the same streams."""
    versus = f"{row['audio_per_s'] / unbatched['audio_per_s']:.2f}" if unbatched else "-"
    print(f"| {row['sentences']} | {row['max_batch']} | {row['streams']} | {row['errors']} "
          f"| {row['audio_per_s']:.3f} | {versus} | {row['p50']:.2f} | {row['p95']:.2f} "
          f"| {row['p95'] / single['p95']:.2f} | {row['rss'] / 2**30:.2f} "
          f"| {row['rss'] / single['rss']:.2f} | {row['wall']:.1f} | {row['load']:.1f} |",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--f5-steps", type=int, default=8)
    parser.add_argument("--vox-patches", type=int, default=24)
    parser.add_argument("--dir", type=Path, help="model directory to reuse (default: temp)")
    parser.add_argument("--batching", type=Path, metavar="MODEL_DIR",
                        help="measure --max-batch on this VoxCPM model instead")
    parser.add_argument("--streams", default="1,4,8,16", help="--batching: concurrent streams")
    parser.add_argument("--max-batch", type=int, default=8, help="--batching: the batched "
                        "server's --max-batch")
    parser.add_argument("--dtype", default="bfloat16", help="--batching: engines.voxcpm.dtype")
    parser.add_argument("--batched-only", action="store_true",
                        help="--batching: of the unbatched server, only one stream (the "
                             "reference); the unbatched levels take most of the run")
    parser.add_argument("--busy", type=int, default=0,
                        help="--batching: CPU-bound processes beside every measured level")
    parser.add_argument("--wait-policy", default="PASSIVE",
                        choices=("PASSIVE", "ACTIVE", "default"),
                        help="--batching: the server's OMP_WAIT_POLICY (default: mizuoto "
                             "serve's)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="--batching: runs of each level, each on a fresh server; the "
                             "table gives their medians")
    parser.add_argument("--sentences", default="same,distinct",
                        help="--batching: the streams speak one sentence (same), each its own "
                             "(distinct), or both in turn")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shared-lock", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args)
        return
    if args.batching:
        _batching_main(args)
        return

    from mizuoto_f5tts.fixtures import write_random_model_dir
    from mizuoto_voxcpm.fixtures import write_random_model

    root = args.dir or Path(tempfile.mkdtemp(prefix="mizuoto-bench-serve-"))
    if not (root / "f5").is_dir():
        write_random_model_dir(root / "f5", "v1_base", size="tiny")
    if not (root / "vox").is_dir():
        write_random_model(root / "vox", "voxcpm2", dtype="float32")

    print(f"{args.requests} concurrent streaming requests (half F5-TTS tiny at "
          f"{args.f5_steps} steps, half VoxCPM2 tiny at {args.vox_patches} patches), "
          f"{args.rounds} rounds, {os.cpu_count()} CPUs, OMP_NUM_THREADS="
          f"{os.environ['OMP_NUM_THREADS']}", file=sys.stderr)
    print("| server | round | errors | identical to single runs | TTFA p50 (s) | TTFA p95 (s) "
          "| TTFA p50 F5 / VoxCPM (s) | wall (s) | audio s / s | requests / s "
          "| server CPU (cores) | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    reference = None
    for round_index in range(1, args.rounds + 1):
        for label, shared in (("one worker per model", False), ("single global lock", True)):
            row, reference = _round(root, args, shared, reference)
            per_model = " / ".join(f"{row['by_model'].get(m, float('nan')):.2f}"
                                   for m in ("f5", "vox"))
            print(f"| {label} | {round_index} | {row['errors']} | {row['identical']}/{row['n']} "
                  f"| {row['p50']:.2f} | {row['p95']:.2f} | {per_model} | {row['wall']:.2f} "
                  f"| {row['audio_per_s']:.2f} | {row['req_per_s']:.2f} | {row['cores']:.2f} "
                  f"| {row['load']:.1f} |", flush=True)
            if row["first_error"]:
                print(f"  first error: {row['first_error']}", file=sys.stderr)


if __name__ == "__main__":
    main()
