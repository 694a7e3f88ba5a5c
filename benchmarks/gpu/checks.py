"""The GPU check: one prepared command for a lent GPU machine that reaches no registry
(docs/gpu-check.md).

    benchmarks/gpu/wheels.sh                      # here: the wheel folder, .whl/ (32 MB)
    python3 benchmarks/gpu/checks.py              # there, carrying .whl: at most 9 minutes
    python3 benchmarks/gpu/checks.py --rehearse   # here: the same steps on the CPU

It checks the machine (GPU, driver, torch and torchaudio, free memory), installs only from the
wheel folder (``pip --no-index`` into a folder of its own, first on PYTHONPATH), proves that
every module imports, then runs :data:`steps.STEPS` in order of value, each under its own time
limit and all under ``--budget``: a step that no longer fits is skipped, and a skip counts as a
failure. Each step's checks compare something (parity with upstream, graphs with eager, a
stream in the batcher with one alone, memory levels with the default) and check that each
configuration ran on the device and dtype it claims. Prints one line per check, a timing table
and ``N passed, N failed``; writes all of it to ``--out``/gpu-checks.json (default ``$OUT``).

``--rehearse`` makes a fresh Python 3.12 virtual environment holding the device's torch and
torchaudio (and the device packages the check uses, at the device's versions where known),
installs the same wheel folder into it the same way and runs every step on tiny models on the
CPU (``nox -s gpu_rehearsal``, in CI).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import steps
from import_check import DEVICE, read_pins
from steps import ROOT, Check, Context

HERE = Path(__file__).resolve().parent
STUBS = ROOT / "packages" / "mizuoto-f5tts" / "tests" / "parity" / "oracle_stubs"
#: One device command runs at most 10 minutes; the check keeps a minute for the lease.
BUDGET_S = 540
#: A step starts only with at least this share of its limit left (then it gets what is left).
MIN_SHARE = 1 / 3
#: The device packages the rehearsal installs besides torch (the device has them; the carried
#: wheels need them): their device versions where device-packages.txt gives one.
REHEARSAL_BASE = ("numpy", "scipy", "numba", "scikit-learn", "joblib", "lazy-loader",
                  "msgpack", "huggingface-hub", "safetensors", "pyyaml", "regex", "tqdm",
                  "attrs", "click", "typer", "packaging", "psutil", "requests", "pandas",
                  "pyarrow", "xxhash", "aiohttp", "filelock", "sympy", "matplotlib", "protobuf",
                  "hypothesis", "sortedcontainers", "torchdiffeq", "typing-extensions",
                  "pygments", "setuptools")


def _versions_pinned(names) -> list[str]:
    device = read_pins(DEVICE)
    return [f"{name}=={device[name]}" if device.get(name) else name for name in names]


def preflight(rehearse: bool, python: str) -> tuple[list[Check], dict]:
    """The machine as found: GPU, driver, torch and torchaudio, free memory."""
    probe = ("import json, platform, torch, torchaudio; c = torch.cuda.is_available(); "
             "free, total = torch.cuda.mem_get_info() if c else (0, 0); "
             "print(json.dumps({'torch': torch.__version__, 'torchaudio': "
             "torchaudio.__version__, 'cuda': c, 'gpu': torch.cuda.get_device_name() if c "
             "else None, 'cuda_runtime': torch.version.cuda, 'free_gb': free / 1e9, "
             "'total_gb': total / 1e9, 'python': platform.python_version()}))")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return [Check("preflight: torch imports", False, done.stderr.strip()[-300:])], {}
    found = json.loads(done.stdout)
    smi = shutil.which("nvidia-smi")
    if smi:
        query = subprocess.run([smi, "--query-gpu=name,driver_version,memory.free",
                                "--format=csv,noheader"], capture_output=True, text=True,
                               check=False)
        found["nvidia_smi"] = query.stdout.strip()
    device = read_pins(DEVICE)
    checks = [Check(f"preflight: torch {device['torch']} (the device's)",
                    found["torch"].split("+")[0] == device["torch"], found["torch"]),
              Check(f"preflight: torchaudio {device['torchaudio']}",
                    found["torchaudio"].split("+")[0] == device["torchaudio"],
                    found["torchaudio"]),
              Check("preflight: Python 3.12", found["python"].startswith("3.12."),
                    found["python"])]
    if not rehearse:
        checks.append(Check("preflight: a CUDA GPU with 20 GB free", found["cuda"] and
                            found["free_gb"] >= 20, f"{found['gpu']}, {found['free_gb']:.0f} "
                            f"GB free, driver: {found.get('nvidia_smi')}"))
    return checks, found


def install(wheels: Path, python: str, site: Path) -> list[Check]:
    """Only from the wheel folder: no index, no dependencies resolved, a folder of its own."""
    found = sorted(wheels.glob("*.whl"))
    if not found:
        return [Check("install from the wheel folder", False, f"no wheels in {wheels}: run "
                      "benchmarks/gpu/wheels.sh here and carry .whl")]
    shutil.rmtree(site, ignore_errors=True)
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                           "--no-compile", "--no-cache-dir", "--disable-pip-version-check",
                           "--target", str(site), *map(str, found)],
                          capture_output=True, text=True, check=False)
    return [Check(f"install {len(found)} wheels from {wheels.name}/ (no index)",
                  done.returncode == 0, done.stderr.strip()[-300:])]


def child_env(site: Path, rehearse: bool) -> dict:
    """The children's environment: the installed wheels first, then the WAV stand-ins
    (wav_shim: no FFmpeg there), then the parity tests' stand-ins for wandb and cached_path;
    deterministic cuBLAS and algorithms for the training comparisons (both sides)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(HERE / "wav_shim"), str(STUBS)])
    env["PATH"] = os.pathsep.join([str(HERE / "wav_shim" / "bin"), str(site / "bin"),
                                   env.get("PATH", "")])
    env.update({"PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
                "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                "MIZUOTO_HOME": str(site.parent / "home"), "HF_HUB_OFFLINE": "1"})
    if rehearse:
        env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    return env


def import_step(ctx: Context, wheels: Path, limit: float) -> list[Check]:
    try:
        done = steps.run_child([ctx.python, str(HERE / "import_check.py"), str(wheels),
                                "--imports", "--stubs", str(STUBS)], ctx, limit)
    except steps.TimedOut as exc:
        return [Check("every module imports; carried pins are what Python finds", False,
                      str(exc))]
    lines = done.stdout.strip().splitlines()
    return [Check("every module imports; carried pins are what Python finds",
                  done.returncode == 0, " | ".join(lines[-4:]) or done.stderr[-300:])]


def fits(left: float, limit: float) -> bool:
    """Whether a step of ``limit`` seconds may start with ``left`` seconds of the budget."""
    return left >= limit * MIN_SHARE


def run_checks(args, python: str) -> int:
    started = time.monotonic()
    deadline = started + args.budget
    rehearse = args.rehearse
    work = Path(args.work or tempfile.mkdtemp(prefix="mizuoto-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    results: list[Check] = []
    record: dict = {"rehearse": rehearse, "budget_s": args.budget, "steps": {}}

    def report(new: list[Check]) -> None:
        for check in new:
            results.append(check)
            detail = f" ({check.detail})" if check.detail and (not check.passed or args.verbose) \
                else ""
            print(f"{'PASS' if check.passed else 'FAIL'}: {check.name}{detail}", flush=True)

    checks, found = preflight(rehearse, python)
    record["machine"] = found
    print(f"machine: {json.dumps(found)}", flush=True)
    report(checks)
    site = work / "site"
    report(install(args.wheels, python, site))
    env = child_env(site, rehearse)
    ctx = Context(device="cpu" if rehearse else "cuda", rehearse=rehearse, python=python,
                  env=env, work=work)
    report(import_step(ctx, args.wheels, 120))
    timings = []
    for step in steps.STEPS:
        if args.only and not any(part in step.name for part in args.only):
            continue
        limit = step.rehearse_limit_s if rehearse else step.limit_s
        left = deadline - time.monotonic()
        if not fits(left, limit):
            report([Check(f"{step.name}: skipped", False, f"{left:.0f} s left of the "
                          f"budget, the step needs up to {limit} s")])
            record["steps"][step.name] = {"skipped": True, "left_s": left}
            continue
        print(f"-- {step.name} (limit {min(limit, left):.0f} s)", flush=True)
        began = time.monotonic()
        try:
            checks, detail = step.run(ctx, min(limit, left))
        except Exception as exc:  # a broken step fails, the others still run
            checks, detail = [Check(f"{step.name}: ran", False,
                                    f"{type(exc).__name__}: {exc}")], {}
        seconds = time.monotonic() - began
        if not checks:
            checks = [Check(f"{step.name}: compared something", False, "no checks")]
        report(checks)
        record["steps"][step.name] = {"seconds": seconds, "checks": [_as_dict(c) for c in checks],
                                        "detail": detail}
        timings.append((step.name, seconds, detail))
        print(f"   ({seconds:.0f} s)", flush=True)
    _print_timings(timings)
    failed = [c for c in results if not c.passed]
    record.update(total_s=time.monotonic() - started,
                  checks=[_as_dict(c) for c in results],
                  passed=len(results) - len(failed), failed=len(failed))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ("gpu-rehearsal.json" if rehearse else "gpu-checks.json")).write_text(
        json.dumps(record, indent=1, default=str))
    print(f"step times: {', '.join(f'{n} {s:.0f} s' for n, s, _ in timings)}; "
          f"total {time.monotonic() - started:.0f} s", flush=True)
    if not args.work:  # its own temporary folder: the random models, the installed wheels
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


def _as_dict(check: Check) -> dict:
    return {"name": check.name, "passed": check.passed, "detail": check.detail}


def _print_timings(timings) -> None:
    print(f"{'configuration':44} {'request s':>9} {'warm s':>7} {'RTF':>6} {'first s':>7} "
          f"{'peak GPU MB':>11}", flush=True)
    for _, _, detail in timings:
        for label, entry in detail.items():
            for row in entry.get("timings", []) if isinstance(entry, dict) else []:
                cells = [row[k] for k in ("request_s", "warm_request_s", "rtf",
                                          "first_audio_s", "peak_gpu_mb")]
                text = " ".join(f"{'-' if v is None else f'{v:.3f}':>{w}}"
                                for v, w in zip(cells, (9, 7, 6, 7, 11), strict=True))
                print(f"{label + ' ' + row['configuration']:44} {text}", flush=True)


def rehearsal_python(venv: Path) -> str:
    """A fresh Python 3.12 environment with the device's torch and torchaudio (PyPI's build
    for Linux, which is CUDA's and runs on the CPU) and the device packages the check uses."""
    python = venv / "bin" / "python"
    marker = venv / ".mizuoto-gpu-rehearsal"
    if marker.is_file():
        return str(python)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([_python312(), "-m", "venv", str(venv)], check=True)
    device = read_pins(DEVICE)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"torch=={device['torch']}", f"torchaudio=={device['torchaudio']}",
                    *_versions_pinned(REHEARSAL_BASE)], check=True)
    marker.write_text("torch " + device["torch"] + "\n")
    return str(python)


def _python312() -> str:
    for candidate in ("python3.12", *sorted(
            str(p) for p in Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser().glob(
                "versions/3.12.*/bin/python3.12"))):
        path = shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
        if path and subprocess.run([path, "--version"], capture_output=True).returncode == 0:
            return path
    sys.exit("--rehearse needs Python 3.12 (the device's): install it (pyenv install 3.12)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl",
                        help="the wheel folder benchmarks/gpu/wheels.sh built (default .whl)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")),
                        help="where gpu-checks.json goes (default $OUT, else here)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for the whole run (default {BUDGET_S} on the GPU, 600 "
                             "rehearsing)")
    parser.add_argument("--work", help="scratch folder, kept (default a temporary one, removed "
                        "at the end)")
    parser.add_argument("--only", action="append", default=[],
                        help="run only the steps whose name contains this (repeatable)")
    parser.add_argument("--rehearse", action="store_true",
                        help="on this CPU, in a fresh Python 3.12 environment with the device's "
                             "torch: every step on tiny models")
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) /
                        "mizuoto-gpu-rehearsal", help="the rehearsal's environment (kept)")
    parser.add_argument("--python", help="the interpreter the steps run under (default: this "
                        "one on the GPU, the rehearsal's environment rehearsing)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print the detail of passing checks too")
    args = parser.parse_args(argv)
    args.wheels, args.out, args.venv = (p.resolve() for p in (args.wheels, args.out, args.venv))
    if args.budget is None:
        args.budget = 600 if args.rehearse else BUDGET_S
    python = args.python or (rehearsal_python(args.venv) if args.rehearse else sys.executable)
    return run_checks(args, python)


if __name__ == "__main__":
    sys.exit(main())
