"""The measurement inside one benchmark child process (``mizuoto bench-run``, hidden).

A fresh interpreter per measurement: loading, caches, the allocator and peak memory start from
nothing, as a user's first request does. Times are wall clock (``time.perf_counter``) with the
process's CPU time beside them (steadier on a shared machine); importing the engine or the
upstream package (torch with it) is timed apart from loading the model.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mizuoto.benchmarking.spec import RunSpec

#: What each measurement reports (docs/performance.md, "mizuoto bench").
FIELDS = ("side", "import_s", "load_s", "load_cpu_s", "request_s", "request_cpu_s",
          "warm_request_s", "first_audio_s", "audio_s", "rtf", "sample_rate", "samples",
          "chunks", "audio_sha256", "same_audio_every_request", "peak_rss_mb", "peak_gpu_mb",
          "threads", "device", "dtype", "compute", "upstream_version", "profile", "patches")


class _Side:
    """A loaded model on one side: its sample rate and how to send it a request."""

    def __init__(self, sample_rate: int, synthesize: Callable, stream: Callable,
                 describe: Callable[[], dict[str, Any]], components: Callable | None = None
                 ) -> None:
        self.components = components  # () -> the engine's profile_components(), if any
        self.sample_rate = sample_rate
        self.synthesize = synthesize  # request -> mono float32 samples
        self.stream = stream  # request -> iterator of mono float32 samples
        self.describe = describe  # () -> device, dtype, compute after the last request


def _load_mizuoto(spec: RunSpec, options, imported: Callable[[], None]) -> _Side:
    import mizuoto
    from mizuoto.registry import get_engine

    get_engine(spec.engine)  # the engine module, torch with it
    imported()
    tts = mizuoto.load(spec.model, engine=spec.engine, options=options)
    last: dict[str, Any] = {}

    def synthesize(request):
        result = tts.synthesize(request)
        last["applied"] = result.applied
        return result.audio.numpy()

    def stream(request) -> Iterator:
        for chunk in tts.stream(request):
            if chunk.applied is not None:
                last["applied"] = chunk.applied
            yield chunk.audio.numpy()

    def describe() -> dict[str, Any]:
        applied = last.get("applied")
        # patches: where the engine reports how many it generated (VoxCPM), where speech ended
        return {"device": tts.info.device, "dtype": tts.info.dtype,
                "compute": dict(applied.compute) if applied is not None else {},
                "upstream_version": None,
                "patches": applied.extra.get("patches") if applied is not None else None}

    return _Side(tts.info.sample_rate, synthesize, stream, describe,
                 getattr(tts, "profile_components", None))


def _load_upstream(spec: RunSpec, options, imported: Callable[[], None]) -> _Side:
    from mizuoto.registry import upstream_baselines

    baseline = upstream_baselines()[spec.engine]
    driver_class = baseline.load_driver()  # the upstream package, torch with it
    imported()
    from mizuoto.runtime.device import select_device
    from mizuoto.runtime.threads import apply_cpu_threads

    apply_cpu_threads(options.compute)
    device = str(select_device(options.compute))  # where Mizuoto's base configuration runs
    driver = driver_class.load(Path(spec.model_dir), device=device)
    version = importlib.metadata.version(baseline.distribution)

    def describe() -> dict[str, Any]:
        return {"device": device, "dtype": None, "compute": {}, "upstream_version": version,
                "patches": None}

    return _Side(driver.sample_rate, driver.synthesize, driver.stream, describe)


def _request(side: _Side, request, stream: bool) -> dict[str, Any]:
    import numpy as np

    start, start_cpu = time.perf_counter(), time.process_time()
    first = None
    pieces = []
    for piece in side.stream(request) if stream else iter((side.synthesize(request),)):
        if first is None:
            first = time.perf_counter() - start
        pieces.append(np.asarray(piece, dtype=np.float32))
    done, done_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    return {"request_s": done, "request_cpu_s": done_cpu,
            "first_audio_s": first if stream else None, "samples": int(audio.size),
            "chunks": [int(p.size) for p in pieces] if stream else None,
            "audio_sha256": hashlib.sha256(np.ascontiguousarray(audio, "<f4").tobytes())
            .hexdigest(), "audio": audio}


def _peak_rss_mb() -> float:
    """This process's peak resident memory. On Linux ``VmHWM`` (the high-water mark of this
    program's own memory): ``ru_maxrss`` would start at the parent's peak, which survives fork
    and exec. Elsewhere ``ru_maxrss``."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024  # bytes / KiB


def _peak_gpu_mb() -> float | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated() / (1 << 20)


def measure(spec: RunSpec, options) -> dict[str, Any]:
    """Import, load, send the request ``spec.requests`` times; every field of :data:`FIELDS`.

    ``options`` are Mizuoto's parsed options for this configuration (on the upstream side:
    the base configuration's, for the device and the thread count)."""
    load = _load_mizuoto if spec.side == "mizuoto" else _load_upstream
    marks = [(time.perf_counter(), time.process_time())]
    side = load(spec, options, lambda: marks.append((time.perf_counter(), time.process_time())))
    marks.append((time.perf_counter(), time.process_time()))
    (start, _), (imported, imported_cpu), (loaded, loaded_cpu) = marks
    request = spec.request()
    requests = [_request(side, request, spec.stream) for _ in range(spec.requests)]
    first = requests[0]
    if spec.audio_path is not None:  # for the side-by-side SNR columns (quality.py)
        _save_audio(first["audio"], Path(spec.audio_path))
    torch = sys.modules["torch"]
    audio_s = first["samples"] / side.sample_rate
    return {
        "side": spec.side, "import_s": imported - start, "load_s": loaded - imported,
        "load_cpu_s": loaded_cpu - imported_cpu,
        "request_s": first["request_s"], "request_cpu_s": first["request_cpu_s"],
        "warm_request_s": statistics.median(r["request_s"] for r in requests[1:])
        if len(requests) > 1 else None,
        "first_audio_s": first["first_audio_s"], "audio_s": audio_s,
        "rtf": first["request_s"] / audio_s if audio_s else None,
        "sample_rate": side.sample_rate, "samples": first["samples"], "chunks": first["chunks"],
        "audio_sha256": first["audio_sha256"],
        "same_audio_every_request": len({r["audio_sha256"] for r in requests}) == 1,
        "peak_rss_mb": _peak_rss_mb(), "peak_gpu_mb": _peak_gpu_mb(),
        "threads": torch.get_num_threads(), **side.describe(),
        # after the peak memory is read: the bandwidth probe's buffers are not the model's
        "profile": _profile(side, request, spec) if spec.profile else None,
    }


def _save_audio(audio, path: Path) -> None:
    import numpy as np

    from mizuoto.runtime.atomic import atomic_path

    with atomic_path(path) as partial, open(partial, "wb") as handle:
        np.save(handle, np.ascontiguousarray(audio, np.float32))


def _profile(side: _Side, request, spec: RunSpec) -> dict[str, Any] | None:
    """One more request under :mod:`mizuoto.benchmarking.profile`'s clocks (``None`` for a
    side whose engine names no components); then the rate of each kernel that ran and the
    CPU's best per dtype (:mod:`mizuoto.benchmarking.kernels`: after the request, since
    prepacked layers choose their kernel as they run)."""
    from mizuoto.benchmarking.kernels import layer_kernel, measure_kernel_rates
    from mizuoto.benchmarking.profile import (
        component_clocks,
        measure_bandwidth,
        measure_read_rate,
        split,
    )
    from mizuoto.runtime.shape_traces import calls_run_eager_for_hooks

    if side.components is None:
        return None
    bandwidth, read_rate = measure_bandwidth(), measure_read_rate()
    components = side.components()
    modules = [module for group in components.values() for module in group]
    before = calls_run_eager_for_hooks(modules)
    with component_clocks(components) as clocks:
        total = _request(side, request, spec.stream)["request_s"]
    after = calls_run_eager_for_hooks(modules)
    rates = measure_kernel_rates({layer_kernel(layer) for group in clocks.values()
                                  for clock in group for layer in clock.layers})
    profile = split(clocks, total, bandwidth, per="stop_head" if "stop_head" in components
                    else None, rates=rates, read_gb_s=read_rate)
    # the clocks are hooks, and a trace runs none: those calls were timed eager
    profile["eager_for_hooks"] = {name: count - before.get(name, 0)
                                  for name, count in after.items()
                                  if count > before.get(name, 0)}
    return profile
