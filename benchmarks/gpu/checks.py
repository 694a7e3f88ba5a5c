"""The GPU checks of the speed options, as one prepared run (``nox -s gpu``, or by hand on a
machine with CUDA; see docs/performance.md, "GPU checks").

For each case, one ``mizuoto bench --json`` on CUDA, each configuration in its own process:

- VoxCPM (bfloat16, the config's dtype) against upstream ``voxcpm`` with ``optimize=False``
  (its eager path; ``optimize`` would wrap it in torch.compile): the base must equal upstream
  bit for bit, ``compute.cuda_graphs=true`` must equal the base, ``compute.attention=fast`` must
  say so in ``applied.compute``; request times of each.
- F5-TTS v1 Base (float16 on CUDA, as upstream picks) against upstream ``f5-tts``: identical.
- VoxCPM continuous batching on CUDA (``batch_exactness.py --device cuda``, bfloat16, streams
  on threads): a stream alone in the batcher must equal the unbatched stream bit for bit;
  8 streams stepped together are reported (SNR against alone, patches moved) with their
  throughput against 8 times one stream.
- Training on CUDA against upstream's trainers, per step (the parity tests' own cases, run
  where both sides pick CUDA): F5 (tiny v1 Base under accelerate's ``mixed_precision`` fp16,
  its GradScaler, and bf16) and VoxCPM LoRA (tiny 0.5B, upstream's bf16 autocast + GradScaler).

Prints one line per check (PASS/FAIL) and a table of timings, writes everything as JSON to
``--out``; exits 1 when a check fails. Sized for under 8 minutes on one H200: tiny models prove
the bits quickly, the released sizes give the timings (the VoxCPM2 case also proves its
real-size parity on the GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

#: (name, model, compares, against upstream, requests per run)
CASES = [
    ("voxcpm tiny-0.5b", "random:voxcpm/tiny-0.5b",
     ["graphs:compute.cuda_graphs=true", "fast:compute.attention=fast",
      "plain:compute.prepack=off"], True, 2),
    ("voxcpm tiny-2", "random:voxcpm/tiny-2",
     ["graphs:compute.cuda_graphs=true", "fast:compute.attention=fast"], True, 2),
    ("f5tts tiny-v1-base", "random:f5tts/tiny-v1-base",
     ["autocast:engines.f5tts.fast=autocast", "fastauto:engines.f5tts.fast=auto"], True, 1),
    ("voxcpm realsize-0.5b", "random:voxcpm/realsize-0.5b",
     ["graphs:compute.cuda_graphs=true", "fast:compute.attention=fast"], True, 2),
    ("voxcpm realsize-2", "random:voxcpm/realsize-2",
     ["graphs:compute.cuda_graphs=true", "fast:compute.attention=fast"], True, 2),
    ("f5tts realsize-v1-base", "random:f5tts/realsize-v1-base",
     ["autocast:engines.f5tts.fast=autocast"], True, 2),
]


#: (name, fixture, batch sizes): continuous batching on CUDA (batch_exactness.py)
BATCHING = [
    ("voxcpm batching tiny-2", "voxcpm/tiny-2", "1,8"),
    ("voxcpm batching realsize-0.5b", "voxcpm/realsize-0.5b", "1,8"),
]

#: (name, pytest node ids): training parity cases; on CUDA both sides train there
TRAINING = [
    ("f5tts training fp16+bf16 (tiny v1)", [
        "packages/mizuoto-f5tts/tests/parity/test_training_parity.py::"
        "test_training_matches_upstream[v1-frame-accum-fp16-cuda]",
        "packages/mizuoto-f5tts/tests/parity/test_training_parity.py::"
        "test_training_matches_upstream[v1-frame-accum-bf16]"]),
    ("voxcpm lora training bf16 (tiny 0.5b)", [
        "packages/mizuoto-voxcpm/tests/parity/test_training_parity.py::"
        "test_every_step_matches_upstream[0.5b-lora]"]),
]


def run_training(nodes: list[str], basetemp: Path) -> dict:
    command = [sys.executable, "-m", "pytest", *nodes, "-q", "-p", "no:cacheprovider",
               "-m", "parity", "--basetemp", str(basetemp)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return {"returncode": done.returncode, "output": done.stdout[-4000:] + done.stderr[-2000:],
            "seconds": time.perf_counter() - started}


def run_batching(fixture: str, sizes: str, root: Path) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    model = root / fixture.replace("/", "_")
    if not model.is_dir():
        subprocess.run([sys.executable, "-m", "mizuoto", "-q", "random-model", fixture,
                        str(model)], check=True)
    out = root / f"{fixture.replace('/', '_')}-batching.json"
    command = [sys.executable, "packages/mizuoto-voxcpm/benchmarks/batch_exactness.py",
               str(model), "--device", "cuda", "--dtype", "bfloat16", "--sizes", sizes,
               "--threads", "--max-len", "16", "--json", str(out)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-4000:] or done.stdout[-4000:],
                "seconds": time.perf_counter() - started}
    return {"rows": json.loads(out.read_text()), "seconds": time.perf_counter() - started}


def batching_checks(name: str, report: dict) -> list[tuple[str, bool, str]]:
    """(check, passed, detail): the lone stream is exact; the batch's rows are reported."""
    if "error" in report:
        return [(f"{name}: ran", False, report["error"].strip().splitlines()[-1]
                 if report["error"].strip() else "no output")]
    rows = report["rows"]
    lone = [r for r in rows if r["batch"] == 1]
    batch = [r for r in rows if r["batch"] > 1]
    results = [(f"{name}: a stream alone in the batcher equals the unbatched stream",
                bool(lone) and all(r["identical"] for r in lone), "")]
    if batch and lone:
        size = batch[0]["batch"]
        speedup = size * lone[0]["seconds"] / batch[0]["seconds"]
        snr = sorted(r["snr_db"] for r in batch)
        moved = sum(r["patches_alone"] != r["patches_batched"] for r in batch)
        detail = (f"{size} streams: {speedup:.1f}x the throughput of one, SNR vs alone "
                  f"{snr[0]:.1f}-{snr[-1]:.1f} dB, {sum(r['identical'] for r in batch)}/"
                  f"{len(batch)} identical, {moved} stops moved")
        results.append((f"{name}: {size} streams stepped together", True, detail))
    return results


def run_case(model: str, compares: list[str], upstream: bool, requests: int,
             random_root: Path) -> dict:
    command = [sys.executable, "-m", "mizuoto", "bench", model, "--json", "--runs", "1",
               "--requests", str(requests), "--option", "compute.device=cuda",
               "--random-dir", str(random_root / model.replace("/", "_").replace(":", "_"))]
    for compare in compares:
        command += ["--compare", compare]
    if upstream:
        command.append("--against-upstream")
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-4000:] or done.stdout[-4000:],
                "seconds": time.perf_counter() - started}
    report = json.loads(done.stdout)
    report["seconds"] = time.perf_counter() - started
    return report


def _entries(report: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in report.get("configurations", [])}


def checks(name: str, report: dict) -> list[tuple[str, bool, str]]:
    """(check, passed, detail) for one case's report."""
    if "error" in report:
        return [(f"{name}: ran", False, report["error"].strip().splitlines()[-1]
                 if report["error"].strip() else "no output")]
    entries = _entries(report)
    base = entries.get("base", {})
    results = [(f"{name}: deterministic", bool(base.get("deterministic")), "")]
    if "upstream" in entries:
        results.append((f"{name}: identical to upstream", base.get("identical_to_upstream")
                        is True, ""))
    if "graphs" in entries:
        graphs = entries["graphs"]
        results.append((f"{name}: cuda_graphs identical to eager",
                        graphs.get("identical_to_base") is True, ""))
        ran = graphs["runs"][0].get("compute", {}) if graphs.get("runs") else {}
        results.append((f"{name}: cuda_graphs reported", ran.get("cuda_graphs") is True,
                        str(ran)))
    if "fast" in entries:
        fast = entries["fast"]
        ran = fast["runs"][0].get("compute", {}) if fast.get("runs") else {}
        results.append((f"{name}: fast attention flagged in applied.compute",
                        ran.get("attention") == "fast", str(ran)))
    if "plain" in entries:  # compute.prepack: CPU kernels only; on CUDA nothing may change
        plain = entries["plain"]
        results.append((f"{name}: prepack=off identical to the default",
                        plain.get("identical_to_base") is True, ""))
        ran = base["runs"][0].get("compute", {}) if base.get("runs") else {}
        packed = {kernel for group in ran.get("prepack", {}).get("modules", {}).values()
                  for kernel in group if kernel != "plain"}
        results.append((f"{name}: no layer prepacked on CUDA", not packed, str(packed)))
    if "autocast" in entries:  # F5's fast profile: float16 autocast on CUDA, as upstream
        ran = entries["autocast"]["runs"][0].get("compute", {}) \
            if entries["autocast"].get("runs") else {}
        results.append((f"{name}: autocast reported (float16)",
                        ran.get("fast") == "autocast" and ran.get("fast_dtype") == "float16",
                        str(ran)))
        results.append((f"{name}: autocast is not called identical",
                        entries["autocast"].get("identical_to_base") is not True, ""))
    if "fastauto" in entries:  # fast=auto picks float16 autocast on CUDA (int8 is CPU-only)
        ran = entries["fastauto"]["runs"][0].get("compute", {}) \
            if entries["fastauto"].get("runs") else {}
        results.append((f"{name}: fast=auto chose autocast (float16)",
                        ran.get("fast") == "autocast" and ran.get("fast_dtype") == "float16",
                        str(ran)))
    return results


def _median(entry: dict, metric: str) -> str:
    value = (entry.get("summary") or {}).get(metric)
    return "-" if not value else f"{value['median']:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) /
                        "gpu-checks.json")
    parser.add_argument("--random-root", type=Path, default=Path("/tmp/mizuoto-gpu-models"))
    parser.add_argument("--only", action="append", default=[],
                        help="run only the cases whose name contains this (repeatable)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("FAIL: no CUDA device", flush=True)
        return 1
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    results, reports = [], {}
    for name, model, compares, upstream, requests in CASES:
        if args.only and not any(part in name for part in args.only):
            continue
        report = run_case(model, compares, upstream, requests, args.random_root)
        reports[name] = report
        for check, passed, detail in checks(name, report):
            results.append((check, passed))
            print(f"{'PASS' if passed else 'FAIL'}: {check} {detail if not passed else ''}",
                  flush=True)
        for entry in _entries(report).values():
            print(f"    {name:24} {entry['name']:9} request {_median(entry, 'request_s')} s"
                  f"  warm {_median(entry, 'warm_request_s')} s"
                  f"  peak GPU {_median(entry, 'peak_gpu_mb')} MB", flush=True)
        print(f"    ({report.get('seconds', 0):.0f} s)", flush=True)
    for name, fixture, sizes in BATCHING:
        if args.only and not any(part in name for part in args.only):
            continue
        report = run_batching(fixture, sizes, args.random_root / "batching")
        reports[name] = report
        for check, passed, detail in batching_checks(name, report):
            results.append((check, passed))
            print(f"{'PASS' if passed else 'FAIL'}: {check} {detail}", flush=True)
        print(f"    ({report.get('seconds', 0):.0f} s)", flush=True)
    for name, nodes in TRAINING:
        if args.only and not any(part in name for part in args.only):
            continue
        report = run_training(nodes, args.random_root / "training")
        reports[name] = report
        summary = report["output"].strip().splitlines()[-1:] or ["no output"]
        passed = report["returncode"] == 0
        results.append((f"{name}: identical to upstream per step", passed))
        print(f"{'PASS' if passed else 'FAIL'}: {name}: identical to upstream per step "
              f"({summary[0]}, {report['seconds']:.0f} s)", flush=True)
        if not passed:
            print(report["output"][-3000:], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"checks": results, "reports": reports}, indent=1))
    failed = [check for check, passed in results if not passed]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
