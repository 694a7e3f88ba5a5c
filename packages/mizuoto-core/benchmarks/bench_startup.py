"""How long the ``mizuoto`` command takes to answer, and how long to the first synthesized sample.

    python packages/mizuoto-core/benchmarks/bench_startup.py --runs 5
    git worktree add /tmp/base <rev>
    python packages/mizuoto-core/benchmarks/bench_startup.py --runs 5 --before /tmp/base

Each measurement is a fresh interpreter (``python -m mizuoto ...``, as the ``mizuoto`` script
runs it), started ``--runs`` times; the script prints the median wall time and the median peak
resident memory of the child (reaped with ``os.wait4``, whose ``ru_maxrss`` is that child's
alone). "First sample" writes each tiny random-init contract fixture once, then times a child
that imports Mizuoto, loads the model and streams (or synthesizes, for engines without
streaming) one short sentence with the fixture's fast settings: the time from starting the
child to the moment it holds its first samples.

``--before CHECKOUT`` also measures another checkout of this repository (its ``src`` folders
put first on ``PYTHONPATH``, with the same installed dependencies and entry points), run for
run alternating with this one so that both see the same machine load, and prints the ratios.
Never run in CI: the numbers depend on the machine and its load.
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
SOURCES = ["packages/mizuoto-core/src", "packages/mizuoto-f5tts/src",
           "packages/mizuoto-voxcpm/src", "contract-tests/src",
           "docs/examples/mizuoto-example/src"]

_FIRST_SAMPLE = """
import sys
import mizuoto
from mizuoto import Capability, SynthesisRequest

options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1})
tts = mizuoto.load(sys.argv[1], options=options)
request = SynthesisRequest(sys.argv[2], seed=1, params=PARAMS, steps=STEPS)
if tts.supports(Capability.STREAM):
    audio = next(iter(tts.stream(request))).audio
else:
    audio = tts.synthesize(request).audio
print("first", audio.num_samples, flush=True)
"""


def _env(checkout: Path | None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "MIZUOTO_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(checkout / s) for s in SOURCES)
    return env


def _run_once(args: list[str], env: dict[str, str], marker: str | None) -> tuple[float, float]:
    """Wall seconds (to the ``marker`` line on stdout if given, else to exit) and the child's
    peak RSS in MB."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
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


def _fixture_args(fixture: str, directory: Path, env: dict[str, str]) -> list[str]:
    """Write the fixture's model directory; return the child's arguments for a first sample,
    with the fixture's fast request settings (as the contract suite sends them)."""
    subprocess.run([sys.executable, "-m", "mizuoto", "random-model", fixture, str(directory)],
                   check=True, env=env, capture_output=True)
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys\nfrom mizuoto.registry import contract_fixtures\n"
         "f = contract_fixtures()[sys.argv[1]]\n"
         "print(json.dumps({'params': dict(f.request_params), 'steps': f.steps}))", fixture],
        check=True, env=env, capture_output=True, text=True).stdout
    fast = json.loads(out.strip().splitlines()[-1])
    script = _FIRST_SAMPLE.replace("PARAMS", repr(fast["params"])) \
        .replace("STEPS", repr(fast["steps"]))
    return ["-c", script, str(directory), TEXT]


def _summary(samples: list[tuple[float, float]]) -> dict:
    walls = [wall for wall, _ in samples]
    peaks = [peak for _, peak in samples]
    return {"wall_s": statistics.median(walls), "peak_mb": statistics.median(peaks),
            "walls": walls, "peaks": peaks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fixtures", nargs="*", default=FIXTURES,
                        help="contract fixtures to time the first sample on (none: skip)")
    parser.add_argument("--before", type=Path,
                        help="another checkout to measure alternately, e.g. a worktree of main")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    sides = {"now": _env(None)}
    if args.before is not None:
        sides = {"before": _env(args.before.resolve()), **sides}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(label, {side: command for side in sides}, None)
                for label, command in COMMANDS.items()]
        for fixture in args.fixtures:
            name = fixture.replace("/", "--")
            jobs.append((f"first sample {fixture}",
                         {side: _fixture_args(fixture, Path(tmp) / side / name, env)
                          for side, env in sides.items()}, "first"))
        header = "  ".join(f"{side + ' wall':>11} {side + ' peak':>11}" for side in sides)
        print(f"{'':<34}{header}", flush=True)
        for label, commands, marker in jobs:
            samples: dict[str, list] = {side: [] for side in sides}
            for _ in range(args.runs):  # alternating, so both sides see the same load
                for side, env in sides.items():
                    samples[side].append(_run_once(commands[side], env, marker))
            results[label] = {side: _summary(s) for side, s in samples.items()}
            row = "  ".join(f"{r['wall_s']:9.2f} s {r['peak_mb']:8.0f} MB"
                            for r in results[label].values())
            print(f"{label:<34}{row}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
