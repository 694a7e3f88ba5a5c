"""Time one F5-TTS request in Mizuoto and in upstream f5-tts on the same random-init model.

    python benchmarks/bench_f5tts.py --size real --runs 3 --threads 2

Writes a random-init v1 Base model directory in upstream's layout (``--size real``: the
released architecture, 337 M parameters; ``tiny`` to try the script), then runs each side
``--runs`` times, alternating, each run in its own subprocess with the same thread count, and
prints the median request time, the ratio Mizuoto / upstream, model loading time and the peak
resident memory of each side. Both sides clone the wheel's English example with the same seed;
the script also checks that they produced the same samples. Never run in CI: the real size
takes minutes per request on a CPU. Upstream needs its test-only stand-ins for ``wandb`` and
``cached_path`` (``tests/parity/oracle_stubs``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STUBS = HERE.parent / "tests" / "parity" / "oracle_stubs"
REF_TEXT = "Some call me nature, others call me mother nature."
GEN_TEXT = "I don't really care what you call me. I've been a silent spectator."
SEED = 1234

log = logging.getLogger("bench_f5tts")


def _example_wav() -> Path:
    from importlib.resources import files

    return Path(str(files("f5_tts").joinpath("infer/examples/basic/basic_ref_en.wav")))


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _run_ours(model_dir: Path, steps: int, out: Path) -> dict:
    import numpy as np

    import mizuoto
    from mizuoto_f5tts import F5Engine

    start = time.perf_counter()
    engine = F5Engine.load(model_dir, options=mizuoto.Options.from_mapping(
        {"compute.device": "cpu", "compute.dtype": "float32"}))
    loaded = time.perf_counter()
    result = engine.synthesize(mizuoto.SynthesisRequest(
        GEN_TEXT, reference=mizuoto.Reference(_example_wav(), text=REF_TEXT), seed=SEED,
        steps=steps))
    done = time.perf_counter()
    np.save(out, result.audio.numpy())
    return {"load_s": loaded - start, "request_s": done - loaded}


def _run_upstream(model_dir: Path, steps: int, out: Path) -> dict:
    import concurrent.futures

    import numpy as np
    import torch

    sys.path.insert(0, str(STUBS))
    from f5_tts.infer import utils_infer
    from f5_tts.model import DiT

    from mizuoto_f5tts.checkpoint import find_checkpoint
    from mizuoto_f5tts.variants import get_variant

    size = json.loads((model_dir / "bench.json").read_text())["size"]
    quiet = lambda *args, **kwargs: None  # noqa: E731
    start = time.perf_counter()
    model = utils_infer.load_model(DiT, get_variant("v1_base", size).upstream_config(),
                                   str(find_checkpoint(model_dir)), mel_spec_type="vocos",
                                   vocab_file=str(model_dir / "vocab.txt"), device="cpu")
    vocoder = utils_infer.load_vocoder("vocos", is_local=True,
                                       local_path=str(model_dir / "vocos"), device="cpu")
    loaded = time.perf_counter()
    # one worker, as in the parity tests: chunks draw their noise in order
    utils_infer.ThreadPoolExecutor = lambda: concurrent.futures.ThreadPoolExecutor(1)
    torch.manual_seed(SEED)
    ref_file, ref_text = utils_infer.preprocess_ref_audio_text(str(_example_wav()), REF_TEXT,
                                                               show_info=quiet)
    wave, _, _ = utils_infer.infer_process(ref_file, ref_text, GEN_TEXT, model, vocoder,
                                           show_info=quiet, progress=None, nfe_step=steps,
                                           device="cpu")
    done = time.perf_counter()
    np.save(out, np.asarray(wave, dtype=np.float32))
    return {"load_s": loaded - start, "request_s": done - loaded}


def _worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    run = _run_ours if args.worker == "ours" else _run_upstream
    timing = run(Path(args.model_dir), args.steps, Path(args.output))
    timing["peak_rss_mb"] = _peak_rss_mb()
    print("RESULT " + json.dumps(timing), flush=True)


def _spawn(side: str, args, model_dir: Path, output: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", side,
               "--model-dir", str(model_dir), "--threads", str(args.threads),
               "--steps", str(args.steps), "--output", str(output)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"{side} run failed:\n{completed.stderr[-4000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("real", "tiny"), default="real")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--workdir", type=Path, default=Path("bench-f5tts"))
    parser.add_argument("--worker", choices=("ours", "upstream"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    model_dir = args.workdir / f"v1_base-{args.size}"
    if not (model_dir / "bench.json").is_file():
        from mizuoto_f5tts.fixtures import write_random_model_dir

        log.info("writing a random-init %s v1 Base model to %s", args.size, model_dir)
        write_random_model_dir(model_dir, "v1_base", size=args.size, seed=0)
        (model_dir / "bench.json").write_text(json.dumps({"size": args.size}))

    runs: dict[str, list[dict]] = {"ours": [], "upstream": []}
    for index in range(args.runs):
        for side in ("ours", "upstream") if index % 2 == 0 else ("upstream", "ours"):
            output = args.workdir / f"{side}.npy"
            runs[side].append(_spawn(side, args, model_dir, output))
            log.info("run %d %-8s request %.2f s, load %.2f s, peak RSS %.0f MiB", index + 1,
                     side, runs[side][-1]["request_s"], runs[side][-1]["load_s"],
                     runs[side][-1]["peak_rss_mb"])

    import numpy as np

    same = np.array_equal(np.load(args.workdir / "ours.npy"),
                          np.load(args.workdir / "upstream.npy"))
    median = {side: statistics.median(r["request_s"] for r in runs[side]) for side in runs}
    load = {side: statistics.median(r["load_s"] for r in runs[side]) for side in runs}
    peak = {side: max(r["peak_rss_mb"] for r in runs[side]) for side in runs}
    print(f"F5-TTS v1 Base ({args.size}), {args.steps} steps, {args.threads} thread(s), "
          f"{args.runs} runs each")
    for side in ("ours", "upstream"):
        name = "mizuoto" if side == "ours" else "upstream"
        print(f"  {name:9s} request {median[side]:8.2f} s   load {load[side]:6.2f} s   "
              f"peak RSS {peak[side]:7.0f} MiB")
    print(f"  ratio mizuoto / upstream: time {median['ours'] / median['upstream']:.3f}, "
          f"peak RSS {peak['ours'] / peak['upstream']:.3f}")
    print(f"  identical audio: {same}")


if __name__ == "__main__":
    main()
