"""Benchmark ``compute.compile``: eager against compiled on the same random-init model.

    python packages/mizuoto-core/benchmarks/bench_compile.py --engine f5tts --threads 2
    python packages/mizuoto-core/benchmarks/bench_compile.py --engine voxcpm --dtype bfloat16
    python packages/mizuoto-core/benchmarks/bench_compile.py --engine voxcpm --dtype float32
    python packages/mizuoto-core/benchmarks/bench_compile.py --engine f5tts --size tiny  # smoke

Loads the model twice in one process (``compute.compile`` off and on), runs the same seeded
request twice on each, and prints: the time spent in the compiled module (F5-TTS: the DiT
backbone; VoxCPM: the local DiT) on the second, warm request and its ratio compiled / eager;
the whole warm request (wall and CPU time: on a shared machine the CPU time of the process is
the steadier figure); the first compiled request's extra time (the compile cost); and how far
the compiled audio is from eager (max |diff| and the signal-to-difference ratio in dB). Models
are real size by default (F5-TTS v1 Base, VoxCPM-0.5B), random weights written once into
``--dir``; the VoxCPM stop head never fires, so every run makes exactly ``--patches`` patches.
Never run in CI: a real-size inductor compile takes a minute or more on two cores.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path

F5_TEXT = "Some call me nature, others call me mother nature."
VOXCPM_TEXT = "The quick brown fox jumps over the lazy dog."
SEED = 1234


def _model_dir(engine: str, size: str, root: Path) -> Path:
    directory = root / f"{engine}-{size}"
    if (directory / "bench.done").is_file():
        return directory
    if engine == "f5tts":
        from mizuoto_f5tts.fixtures import write_random_model_dir

        write_random_model_dir(directory, "v1_base", size=size)
    else:
        from mizuoto_voxcpm.fixtures import write_random_model

        write_random_model(directory, "voxcpm-0.5b", realsize=size == "real", stop="never")
    (directory / "bench.done").write_text("")
    return directory


def _load(engine: str, directory: Path, *, compile: bool, dtype: str):
    import mizuoto

    settings = {"compute.device": "cpu", "compute.compile": compile}
    if engine == "f5tts":
        settings["compute.dtype"] = dtype
    else:
        settings["engines.voxcpm.dtype"] = dtype
    return mizuoto.load(directory, engine=engine, options=mizuoto.Options.from_mapping(settings))


def _timed_module(engine) -> tuple[object, dict[str, float]]:
    """The module ``compute.compile`` compiles, with its calls timed into the returned dict."""
    module = engine.model.transformer if engine.name == "f5tts" \
        else engine.model.feat_decoder.estimator
    clock = {"seconds": 0.0, "cpu_seconds": 0.0}
    forward = module.forward  # the guarded compiled call, or the plain bound method

    @functools.wraps(forward)
    def timed(*args, **kwargs):
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            return forward(*args, **kwargs)
        finally:
            clock["seconds"] += time.perf_counter() - start
            clock["cpu_seconds"] += time.process_time() - start_cpu

    module.forward = timed
    return module, clock


def _request(engine: str, steps: int, patches: int):
    import mizuoto

    if engine == "f5tts":
        return mizuoto.SynthesisRequest(F5_TEXT, seed=SEED, steps=steps)
    return mizuoto.SynthesisRequest(VOXCPM_TEXT, seed=SEED, params={
        "max_len": patches, "retry_badcase": False, "inference_timesteps": steps})


def _side(engine_name: str, directory: Path, request, *, compile: bool, dtype: str) -> dict:
    engine = _load(engine_name, directory, compile=compile, dtype=dtype)
    _, clock = _timed_module(engine)
    runs = []
    for _ in range(2):
        clock.update(seconds=0.0, cpu_seconds=0.0)
        start, start_cpu = time.perf_counter(), time.process_time()
        result = engine.synthesize(request)
        runs.append({"request_s": time.perf_counter() - start,
                     "request_cpu_s": time.process_time() - start_cpu,
                     "module_s": clock["seconds"], "module_cpu_s": clock["cpu_seconds"]})
    return {"runs": runs, "audio": result.audio.samples, "applied": result.applied}


def _difference(compiled, eager) -> dict:
    import torch

    if compiled.shape != eager.shape:
        return {"max_abs": None, "snr_db": None,
                "lengths": [int(compiled.numel()), int(eager.numel())]}
    diff = (compiled - eager).to(torch.float64)
    noise = float(diff.pow(2).sum())
    signal = float(eager.to(torch.float64).pow(2).sum())
    return {"max_abs": float(diff.abs().max()),
            "snr_db": math.inf if noise == 0 else 10 * math.log10(signal / noise)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("f5tts", "voxcpm"), required=True)
    parser.add_argument("--size", choices=("real", "tiny"), default="real")
    parser.add_argument("--dtype", default=None,
                        help="float32 (F5-TTS default) or bfloat16 (VoxCPM default)")
    parser.add_argument("--steps", type=int, default=None,
                        help="ODE steps (default: F5-TTS 8, VoxCPM 10 as upstream)")
    parser.add_argument("--patches", type=int, default=8, help="VoxCPM: patches per request")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "bench-compile",
                        help="where the random models are written (reused)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import torch

    torch.set_num_threads(args.threads)
    dtype = args.dtype or ("float32" if args.engine == "f5tts" else "bfloat16")
    steps = args.steps or (8 if args.engine == "f5tts" else 10)
    directory = _model_dir(args.engine, args.size, args.dir)
    request = _request(args.engine, steps, args.patches)
    eager = _side(args.engine, directory, request, compile=False, dtype=dtype)
    compiled = _side(args.engine, directory, request, compile=True, dtype=dtype)
    if not compiled["applied"].compute.get("compile"):
        raise SystemExit(f"compile did not stay on: {compiled['applied'].fallbacks}")
    (e_first, e_warm), (c_first, c_warm) = eager["runs"], compiled["runs"]
    report = {
        "engine": args.engine, "size": args.size, "dtype": dtype, "steps": steps,
        "patches": args.patches if args.engine == "voxcpm" else None,
        "threads": args.threads, "torch": torch.__version__,
        "load_average": os.getloadavg(),
        "warm_module_s": {"eager": e_warm["module_s"], "compiled": c_warm["module_s"],
                          "ratio": c_warm["module_s"] / e_warm["module_s"]},
        "warm_request_s": {"eager": e_warm["request_s"], "compiled": c_warm["request_s"],
                           "ratio": c_warm["request_s"] / e_warm["request_s"]},
        "warm_module_cpu_s": {"eager": e_warm["module_cpu_s"],
                              "compiled": c_warm["module_cpu_s"],
                              "ratio": c_warm["module_cpu_s"] / e_warm["module_cpu_s"]},
        "warm_request_cpu_s": {"eager": e_warm["request_cpu_s"],
                               "compiled": c_warm["request_cpu_s"],
                               "ratio": c_warm["request_cpu_s"] / e_warm["request_cpu_s"]},
        "first_request_s": {"eager": e_first["request_s"], "compiled": c_first["request_s"]},
        "compile_cost_s": c_first["request_s"] - c_warm["request_s"],
        "audio_difference": _difference(compiled["audio"], eager["audio"]),
    }
    if args.json:
        print(json.dumps(report))
        return
    diff = report["audio_difference"]
    print(f"{args.engine} {args.size} {dtype}, {steps} steps, {args.threads} threads, "
          f"load average {', '.join(f'{x:.2f}' for x in report['load_average'])}")
    for key in ("warm_module_s", "warm_request_s", "warm_module_cpu_s", "warm_request_cpu_s"):
        row = report[key]
        print(f"  {key:18} eager {row['eager']:8.2f} s  compiled {row['compiled']:8.2f} s  "
              f"ratio {row['ratio']:.3f}")
    print(f"  first request      eager {e_first['request_s']:8.2f} s  compiled "
          f"{c_first['request_s']:8.2f} s  (compile cost {report['compile_cost_s']:.1f} s)")
    if diff["max_abs"] is None:
        print(f"  audio lengths differ: compiled {diff['lengths'][0]}, eager {diff['lengths'][1]}")
    else:
        print(f"  audio vs eager     max |diff| {diff['max_abs']:.3g}  SNR {diff['snr_db']:.1f} dB")


if __name__ == "__main__":
    main()
