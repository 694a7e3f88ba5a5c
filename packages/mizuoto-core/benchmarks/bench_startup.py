"""How long the ``mizuoto`` command takes to answer, and how long to the first synthesized sample.

    python packages/mizuoto-core/benchmarks/bench_startup.py --runs 5
    PYTHONPATH=/path/to/other/checkout/packages/mizuoto-core/src:... python bench_startup.py

Each measurement is a fresh interpreter (``python -m mizuoto ...``, as the ``mizuoto`` script
runs it), started ``--runs`` times; the script prints the median wall time and the median peak
resident memory of the child (``os.wait4``'s ``ru_maxrss``). "First sample" writes a tiny
random-init model once per fixture, then times a child that imports Mizuoto, loads the model
and streams (or synthesizes, for engines without streaming) one short sentence: the time from
starting the child to the moment it holds its first samples. The children inherit the
environment, so ``PYTHONPATH`` pointing at another checkout measures that checkout with the
same installed packages. Never run in CI: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "import mizuoto": ["-c", "import mizuoto"],
    "mizuoto --help": ["-m", "mizuoto", "--help"],
    "mizuoto plugins": ["-m", "mizuoto", "plugins"],
    "mizuoto models": ["-m", "mizuoto", "models"],
    "mizuoto random-model --help": ["-m", "mizuoto", "random-model", "--help"],
}
FIXTURES = ["toy/tiny", "f5tts/tiny-v1-base", "voxcpm/tiny-2"]
TEXT = "Hello from Mizuoto."

_FIRST_SAMPLE = """
import sys
import mizuoto
from mizuoto import Capability, SynthesisRequest

options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1})
tts = mizuoto.load(sys.argv[1], options=options)
request = SynthesisRequest(sys.argv[2], seed=1, params=dict(tts_params), steps=steps)
if tts.supports(Capability.STREAM):
    audio = next(iter(tts.stream(request))).audio
else:
    audio = tts.synthesize(request).audio
print("first", audio.num_samples, flush=True)
"""


def _child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "MIZUOTO_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def _measure(args: list[str], runs: int, marker: str | None = None) -> dict:
    walls, peaks = [], []
    for _ in range(runs):
        wall, peak = _run_collected(args, marker)
        walls.append(wall)
        peaks.append(peak)
    return {"wall_s": statistics.median(walls), "peak_mb": statistics.median(peaks),
            "walls": walls, "peaks": peaks}


def _run_collected(args: list[str], marker: str | None) -> tuple[float, float]:
    """Wall seconds (to the ``marker`` line on stdout if given, else to exit) and the child's
    own peak RSS in MB: it is reaped with ``os.wait4``, which reports that child alone."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_child_env(), text=True)
    elapsed = None
    if marker is not None:
        for line in proc.stdout:
            if line.startswith(marker):
                elapsed = time.perf_counter() - start
                break
    proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if elapsed is None:
        elapsed = time.perf_counter() - start
        if marker is not None:
            raise SystemExit(f"{' '.join(args)} gave no {marker!r} line:\n{err}")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {proc.returncode}:\n{err}")
    return elapsed, usage.ru_maxrss / 1024  # KiB on Linux


def _fixture_args(fixture: str, directory: Path) -> list[str]:
    """Write the fixture's model directory; return the child's arguments for a first sample,
    with the fixture's fast request settings (as the contract suite sends them)."""
    subprocess.run([sys.executable, "-m", "mizuoto", "random-model", fixture, str(directory)],
                   check=True, env=_child_env(), capture_output=True)
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys\nfrom mizuoto.registry import contract_fixtures\n"
         "f = contract_fixtures()[sys.argv[1]]\n"
         "print(json.dumps({'params': dict(f.request_params), 'steps': f.steps}))", fixture],
        check=True, env=_child_env(), capture_output=True, text=True).stdout
    fast = json.loads(out.strip().splitlines()[-1])
    script = _FIRST_SAMPLE.replace("dict(tts_params)", repr(fast["params"])) \
        .replace("steps=steps", f"steps={fast['steps']!r}")
    return ["-c", script, str(directory), TEXT]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fixtures", nargs="*", default=FIXTURES,
                        help="contract fixtures to time the first sample on (none: skip)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    results = {}
    for label, command in COMMANDS.items():
        results[label] = _measure(command, args.runs)
        print(f"{label:<32} {results[label]['wall_s']:6.2f} s  "
              f"{results[label]['peak_mb']:7.0f} MB", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for fixture in args.fixtures:
            child = _fixture_args(fixture, Path(tmp) / fixture.replace("/", "--"))
            label = f"first sample {fixture}"
            results[label] = _measure(child, args.runs, marker="first")
            print(f"{label:<32} {results[label]['wall_s']:6.2f} s  "
                  f"{results[label]['peak_mb']:7.0f} MB", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
