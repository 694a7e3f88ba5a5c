"""The GPU check's steps, in order of value, each with its own time limit (benchmarks/gpu/
checks.py runs them). A step runs its commands in child processes and returns its checks; a
check passes only on a comparison that ran and held, never on an exit status alone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@attrs.frozen
class Check:
    name: str
    passed: bool
    detail: str = ""


@attrs.frozen
class Context:
    """Where and how the steps run: the device (``cuda``, or ``cpu`` when rehearsing), the
    children's environment, a scratch folder, the random models (one copy each)."""

    device: str
    rehearse: bool
    python: str
    env: dict
    work: Path

    @property
    def models(self) -> Path:
        return self.work / "models"

    def model_dir(self, fixture: str) -> Path:
        return self.models / fixture.replace("/", "--")


@attrs.frozen
class Step:
    name: str
    limit_s: int  # on the GPU; the rehearsal's own limit is rehearse_limit_s
    rehearse_limit_s: int
    run: Callable[[Context, float], tuple[list[Check], dict]]


class TimedOut(Exception):
    pass


#: For the training comparisons: torch's deterministic modes in every process, both sides
#: (wav_shim/sitecustomize.py sets them; the check sets CUBLAS_WORKSPACE_CONFIG for all).
DETERMINISTIC = {"MIZUOTO_GPU_CHECK_DETERMINISTIC": "1"}


def run_child(command: list[str], ctx: Context, timeout: float, extra_env: dict | None = None
              ) -> subprocess.CompletedProcess:
    """Run ``command`` in its own process group; on the time limit the whole group is ended
    (a bench run's children too) and :class:`TimedOut` raised."""
    process = subprocess.Popen(command, cwd=ROOT, env={**ctx.env, **(extra_env or {})}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise TimedOut(f"timed out after {timeout:.0f} s") from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def _failure(name: str, done: subprocess.CompletedProcess) -> Check:
    lines = [line for line in (done.stderr + done.stdout).strip().splitlines() if line.strip()]
    return Check(f"{name}: ran", False, f"exit {done.returncode}: "
                 + (" | ".join(lines[-3:]) if lines else "no output"))


# -- bench cases: parity against upstream, CUDA graphs, fast attention, speed --------------

@attrs.frozen
class BenchCase:
    """One ``mizuoto bench --json`` on the device, against upstream.

    ``cuda_compares`` run on the GPU only (CUDA graphs and fast attention are refused on the
    CPU); ``dtype`` is what the base must report on each device; ``rehearse_fixture`` stands
    in for a real-size fixture in the rehearsal."""

    fixture: str
    dtype: dict
    cuda_compares: tuple[str, ...] = ()
    cpu_compares: tuple[str, ...] = ()
    requests: int = 2
    stream: bool = False
    rehearse_fixture: str | None = None

    def command(self, ctx: Context) -> list[str]:
        fixture = self.rehearse_fixture if ctx.rehearse and self.rehearse_fixture else \
            self.fixture
        command = [ctx.python, "-m", "mizuoto", "-q", "bench", f"random:{fixture}", "--json",
                   "--runs", "1", "--requests", str(self.requests),
                   "--option", f"compute.device={ctx.device}",
                   "--random-dir", str(ctx.model_dir(fixture))]
        if ctx.rehearse:
            command += ["--threads", "1"]
        for compare in self.cpu_compares if ctx.rehearse else self.cuda_compares:
            command += ["--compare", compare]
        command.append("--stream" if self.stream else "--against-upstream")
        return command


def _entries(report: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in report.get("configurations", [])}


def _first_run(entry: dict) -> dict:
    return entry["runs"][0] if entry.get("runs") else {}


def _median(entry: dict, metric: str) -> float | None:
    value = (entry.get("summary") or {}).get(metric)
    return None if not value else value["median"]


def placement_checks(name: str, entries: dict[str, dict], ctx: Context, dtype: str
                     ) -> list[Check]:
    """Every configuration ran where it says: on ``ctx.device`` (on CUDA with device memory
    used, which a CPU run leaves at zero), Mizuoto's in the dtype it claims."""
    checks = []
    for label, entry in entries.items():
        run = _first_run(entry)
        device = str(run.get("device", ""))
        peak = run.get("peak_gpu_mb")
        on_device = device.startswith(ctx.device) and (
            ctx.device != "cuda" or (peak is not None and peak > 0))
        checks.append(Check(f"{name}: {label} ran on {ctx.device}", on_device,
                            f"device {device!r}, peak GPU {peak} MB"))
        if entry.get("side") == "mizuoto":
            checks.append(Check(f"{name}: {label} ran in {dtype}", run.get("dtype") == dtype,
                                f"dtype {run.get('dtype')!r}"))
    return checks


def bench_checks(name: str, case: BenchCase, report: dict, ctx: Context) -> list[Check]:
    entries = _entries(report)
    base = entries.get("base", {})
    dtype = case.dtype["cpu" if ctx.rehearse else "cuda"]
    checks = [Check(f"{name}: deterministic", base.get("deterministic") is True)]
    checks += placement_checks(name, entries, ctx, dtype)
    if not case.stream:
        checks.append(Check(f"{name}: identical to upstream",
                            base.get("identical_to_upstream") is True,
                            "" if "upstream" in entries else "upstream did not run"))
    if "graphs" in entries:
        graphs = entries["graphs"]
        checks.append(Check(f"{name}: cuda_graphs identical to eager",
                            graphs.get("identical_to_base") is True))
        compute = _first_run(graphs).get("compute", {})
        checks.append(Check(f"{name}: cuda_graphs reported", compute.get("cuda_graphs") is True,
                            str(compute)))
    if "fast" in entries:
        fast = entries["fast"]
        compute = _first_run(fast).get("compute", {})
        checks.append(Check(f"{name}: fast attention marked in applied.compute",
                            compute.get("attention") == "fast", str(compute)))
        # the warm request: the first one carries the warm-up (and the graphs' capture)
        ratios = fast.get("ratio_to_base") or {}
        ratio = ratios.get("warm_request_s") or ratios.get("request_s")
        checks.append(Check(f"{name}: fast attention not slower than the base", ratio is not None
                            and ratio <= 1.1, f"warm request time {ratio} x the base's"))
    if "autocast" in entries:  # F5's fast profile: float16 autocast on CUDA, as upstream
        compute = _first_run(entries["autocast"]).get("compute", {})
        if ctx.rehearse and compute.get("fast") == "int8":
            # the rehearsal asks for fast=auto: int8 on a CPU that only emulates bfloat16
            checks.append(Check(f"{name}: fast=auto marked (int8: this CPU emulates "
                                "bfloat16; autocast is rehearsed where it has it natively)",
                                (compute.get("fast_int8_linears") or 0) > 0, str(compute)))
        else:
            want = "bfloat16" if ctx.rehearse else "float16"
            checks.append(Check(f"{name}: autocast marked ({want})",
                                compute.get("fast") == "autocast" and compute.get("fast_dtype")
                                == want, str(compute)))
    return checks


def timing_rows(report: dict) -> list[dict]:
    rows = []
    for entry in _entries(report).values():
        rows.append({"configuration": entry["name"], "request_s": _median(entry, "request_s"),
                     "warm_request_s": _median(entry, "warm_request_s"),
                     "rtf": _median(entry, "rtf"), "first_audio_s": _median(entry,
                                                                            "first_audio_s"),
                     "peak_gpu_mb": _median(entry, "peak_gpu_mb")})
    return rows


def bench_step(name: str, *cases: BenchCase) -> Callable:
    def run(ctx: Context, limit: float) -> tuple[list[Check], dict]:
        checks, reports = [], {}
        deadline = time.monotonic() + limit
        for index, case in enumerate(cases):
            label = name if index == 0 else f"{name} ({'stream' if case.stream else index})"
            try:
                done = run_child(case.command(ctx), ctx, deadline - time.monotonic())
            except TimedOut as exc:
                checks.append(Check(f"{label}: ran", False, str(exc)))
                continue
            if done.returncode != 0:
                checks.append(_failure(label, done))
                continue
            report = json.loads(done.stdout)
            reports[label] = {"timings": timing_rows(report), "report": report}
            checks += bench_checks(label, case, report, ctx)
        return checks, reports
    return run


# VoxCPM runs its config's dtype (bfloat16) on either device; F5 picks float16 on CUDA, as
# upstream, and float32 on the CPU
VOXCPM_DTYPE = {"cuda": "bfloat16", "cpu": "bfloat16"}
F5_DTYPE = {"cuda": "float16", "cpu": "float32"}
GRAPHS_AND_FAST = ("graphs:compute.cuda_graphs=true", "fast:compute.attention=fast")
# F5's autocast profile: float16 on the GPU; the rehearsal asks for fast=auto, which is
# autocast in bfloat16 on a CPU with native bfloat16 (AVX512-BF16, AMX) and int8 on one that
# emulates it (AVX2), where autocast itself is refused
F5_AUTOCAST = ("autocast:engines.f5tts.fast=autocast",)
F5_AUTOCAST_REHEARSAL = ("autocast:engines.f5tts.fast=auto",)


# -- training: parity with upstream per step, memory levels ----------------------------------

#: The parity tests' training cases, on the device where both sides pick it. The fp16 case is
#: collected only where CUDA exists.
TRAINING_CUDA = (
    "packages/mizuoto-f5tts/tests/parity/test_training_parity.py::"
    "test_training_matches_upstream[v1-frame-accum-fp16-cuda]",
    "packages/mizuoto-f5tts/tests/parity/test_training_parity.py::"
    "test_training_matches_upstream[v1-frame-accum-bf16]",
    "packages/mizuoto-voxcpm/tests/parity/test_training_parity.py::"
    "test_every_step_matches_upstream[0.5b-lora]",
)
TRAINING_CPU = TRAINING_CUDA[1:]


def junit_counts(path: Path) -> dict:
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    root = ET.parse(path).getroot()
    for suite in root.iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    return counts


def training_passed(counts: dict | None, chosen: int, returncode: int) -> bool:
    """Every chosen case ran and compared: a skip (a missing argbind or voxcpm.training makes
    the VoxCPM test skip itself) or a deselected case is a failure, as is exit 0 with nothing
    run."""
    return counts is not None and counts["tests"] == chosen and \
        counts["failures"] == counts["errors"] == counts["skipped"] == 0 and returncode == 0


def training_parity(ctx: Context, limit: float) -> tuple[list[Check], dict]:
    nodes = TRAINING_CPU if ctx.rehearse else TRAINING_CUDA
    # each distribution's tests in their own pytest process (their test modules share
    # names), the two at once: each trains on one thread (or its own CUDA stream of work)
    packages = ("mizuoto-f5tts", "mizuoto-voxcpm")
    with ThreadPoolExecutor(len(packages)) as pool:
        results = list(pool.map(lambda p: _training_case(ctx, p, nodes, limit), packages))
    return [check for check, _ in results], {p: r for p, (_, r) in zip(packages, results,
                                                                      strict=True)}


def _training_case(ctx: Context, package: str, nodes: tuple[str, ...], limit: float
                   ) -> tuple[Check, dict]:
    chosen = [n for n in nodes if n.startswith(f"packages/{package}/")]
    junit = ctx.work / f"training-{package}.xml"
    name = f"{package} training identical to upstream per step ({len(chosen)} cases)"
    command = [ctx.python, "-m", "pytest", *chosen, "-q", "-p", "no:cacheprovider",
               "-m", "parity", f"--junitxml={junit}",
               "--basetemp", str(ctx.work / f"training-{package}")]
    try:
        done = run_child(command, ctx, limit, DETERMINISTIC)
    except TimedOut as exc:
        return Check(name, False, str(exc)), {}
    counts = junit_counts(junit) if junit.is_file() else None
    passed = training_passed(counts, len(chosen), done.returncode)
    return Check(name, passed, f"{counts}" if counts else "no junit report: "
                 + (done.stderr.strip().splitlines() or ["no output"])[-1]), \
        {"returncode": done.returncode, "counts": counts,
         "output": done.stdout[-3000:] + done.stderr[-1500:]}


def memory_levels(ctx: Context, limit: float) -> tuple[list[Check], dict]:
    out = ctx.work / "memory-levels.json"
    command = [ctx.python, str(HERE / "memory_levels.py"), "--device", ctx.device,
               "--json", str(out)]
    try:
        done = run_child(command, ctx, limit, DETERMINISTIC)
    except TimedOut as exc:
        return [Check("training memory levels: ran", False, str(exc))], {}
    if done.returncode != 0:
        return [_failure("training memory levels", done)], {}
    report = json.loads(out.read_text())
    checks = []
    for engine, levels in report.items():
        for level, row in levels.items():
            detail = (f"peak {row['peak_memory_mb']} MB, {row['tensors']} tensors, on "
                      f"{row['device']}, {row['mixed_precision']}")
            checks.append(Check(f"{engine} training memory={level}: same losses and weights "
                                "as default", row["identical_to_default"] is True, detail))
            checks.append(Check(f"{engine} training memory={level}: deterministic modes on",
                                row.get("deterministic") is True, detail))
            on_device = row["device"].startswith(ctx.device) and (
                ctx.device != "cuda" or (row["peak_memory_mb"] or 0) > 0)
            checks.append(Check(f"{engine} training memory={level}: ran on {ctx.device}",
                                on_device, detail))
        if ctx.device == "cuda" and "low" in levels:  # the point of the levels
            peaks = [levels[level]["peak_memory_mb"] for level in levels]
            checks.append(Check(f"{engine} training: lower levels peak no higher",
                                all(b <= a * 1.02 for a, b in zip(peaks, peaks[1:], strict=False)),
                                str(dict(zip(levels, peaks, strict=True)))))
    return checks, report


# -- continuous batching --------------------------------------------------------------------

def batching_step(fixture: str, rehearse_fixture: str) -> Callable:
    def run(ctx: Context, limit: float) -> tuple[list[Check], dict]:
        chosen = rehearse_fixture if ctx.rehearse else fixture
        model = ctx.model_dir(chosen)
        name = f"batching {chosen}"
        if not (model / ".mizuoto-random-model").is_file():
            # the bench step before wrote it; one copy of each model, never a second
            return [Check(f"{name}: model written by an earlier step", False,
                          f"{model} is missing (did its bench step run?)")], {}
        out = ctx.work / f"batching-{chosen.replace('/', '--')}.json"
        sizes = "1,2" if ctx.rehearse else "1,8"
        command = [ctx.python, "packages/mizuoto-voxcpm/benchmarks/batch_exactness.py",
                   str(model), "--device", ctx.device, "--dtype",
                   "float32" if ctx.rehearse else "bfloat16", "--sizes", sizes,
                   "--threads", "--max-len", "8" if ctx.rehearse else "16", "--json", str(out)]
        try:
            done = run_child(command, ctx, limit)
        except TimedOut as exc:
            return [Check(f"{name}: ran", False, str(exc))], {}
        if done.returncode != 0:
            return [_failure(name, done)], {}
        rows = json.loads(out.read_text())
        checks = batching_checks(name, rows)
        return checks, {"rows": rows}
    return run


def batching_checks(name: str, rows: list[dict]) -> list[Check]:
    """A stream alone in a batching engine (the scheduler stepped it) equals the unbatched
    stream; the batch's rows are reported."""
    lone = [r for r in rows if r["batch"] == 1]
    batch = [r for r in rows if r["batch"] > 1]
    checks = [Check(f"{name}: a stream alone in a batching engine equals the unbatched stream",
                    bool(lone) and all(r["identical"] and r["steps"] > 0 for r in lone),
                    f"{len(lone)} row(s), steps {[r['steps'] for r in lone]}")]
    if batch and lone:
        size = batch[0]["batch"]
        speedup = size * lone[0]["seconds"] / batch[0]["seconds"]
        snr = sorted(r["snr_db"] for r in batch)
        moved = sum(r["patches_alone"] != r["patches_batched"] for r in batch)
        checks.append(Check(f"{name}: {size} streams stepped together", all(
            r["batched_rows"] > 0 for r in batch),
            f"{speedup:.1f}x the throughput of one, SNR vs alone {snr[0]:.1f}-"
            f"{snr[-1]:.1f} dB, {sum(r['identical'] for r in batch)}/{len(batch)} "
            f"identical, {moved} stops moved"))
    return checks


# -- the serving runner's checks (benchmarks/gpu/runner_checks.py, another module's) -------

def runner_checks(ctx: Context, limit: float) -> tuple[list[Check], dict]:
    """``runner_checks.main()`` beside this file, in a child process: its own argument
    parsing reads no arguments from here; ``OUT`` is a folder of its own and
    ``MIZUOTO_GPU_CHECK_DEVICE`` says ``cuda`` or ``cpu`` (rehearsing). It passes when it
    exits 0 and its output closes on ``N passed, 0 failed`` with N above 0."""
    script = HERE / "runner_checks.py"
    if not script.is_file():
        return [Check("runner checks", False, "runner checks missing "
                      "(benchmarks/gpu/runner_checks.py)")], {}
    out = ctx.work / "runner-checks"
    out.mkdir(parents=True, exist_ok=True)
    command = [ctx.python, "-c", "import sys; sys.argv[1:] = []; sys.path.insert(0, "
               f"{str(HERE)!r}); import runner_checks; sys.exit(runner_checks.main())"]
    try:
        done = run_child(command, ctx, limit, {"OUT": str(out),
                                               "MIZUOTO_GPU_CHECK_DEVICE": ctx.device})
    except TimedOut as exc:
        return [Check("runner checks: ran", False, str(exc))], {}
    lines = [line for line in (done.stdout + done.stderr).strip().splitlines() if line.strip()]
    counted = [m for m in map(_SUMMARY.search, lines) if m]
    passed = done.returncode == 0 and bool(counted) and int(counted[-1].group(1)) > 0 and \
        counted[-1].group(2) == "0"
    return [Check("runner checks", passed, lines[-1] if lines else "no output")], \
        {"returncode": done.returncode, "output": "\n".join(lines[-40:])}


_SUMMARY = re.compile(r"(\d+) passed, (\d+) failed")


#: In order of value. The GPU limits add up to more than the budget (540 s) on purpose: they
#: are caps, and when the steps before run long the last ones are skipped, as failures.
STEPS = (
    Step("parity voxcpm tiny-0.5b (bf16, graphs, fast)", 90, 150, bench_step(
        "voxcpm tiny-0.5b", BenchCase("voxcpm/tiny-0.5b", VOXCPM_DTYPE, GRAPHS_AND_FAST))),
    Step("parity voxcpm tiny-2 (bf16, graphs, fast)", 75, 120, bench_step(
        "voxcpm tiny-2", BenchCase("voxcpm/tiny-2", VOXCPM_DTYPE, GRAPHS_AND_FAST))),
    Step("parity f5tts tiny-v1-base (fp16)", 60, 90, bench_step(
        "f5tts tiny-v1-base", BenchCase("f5tts/tiny-v1-base", F5_DTYPE, F5_AUTOCAST,
                                        F5_AUTOCAST_REHEARSAL, requests=1))),
    Step("training parity (deterministic)", 150, 240, training_parity),
    Step("training memory levels", 60, 90, memory_levels),
    Step("real size voxcpm 0.5b (speed, parity)", 150, 120, bench_step(
        "voxcpm realsize-0.5b",
        BenchCase("voxcpm/realsize-0.5b", VOXCPM_DTYPE, GRAPHS_AND_FAST,
                  rehearse_fixture="voxcpm/tiny-0.5b"),
        BenchCase("voxcpm/realsize-0.5b", VOXCPM_DTYPE, stream=True,
                  rehearse_fixture="voxcpm/tiny-0.5b"))),
    Step("real size f5tts v1 base (speed, parity)", 120, 90, bench_step(
        "f5tts realsize-v1-base", BenchCase("f5tts/realsize-v1-base", F5_DTYPE, F5_AUTOCAST,
                                            requests=2,
                                            rehearse_fixture="f5tts/tiny-v1-base"))),
    Step("batching voxcpm tiny-2", 45, 60, batching_step("voxcpm/tiny-2", "voxcpm/tiny-2")),
    Step("batching voxcpm real size 0.5b", 75, 60,
         batching_step("voxcpm/realsize-0.5b", "voxcpm/tiny-0.5b")),
    Step("runner checks", 45, 60, runner_checks),
)

if __name__ == "__main__":
    sys.exit("run benchmarks/gpu/checks.py")
