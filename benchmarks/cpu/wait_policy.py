"""OpenMP's wait policy on a busy machine: a decode-like torch loop (many short parallel
regions, as an LM's per-token steps) timed alone and beside CPU-bound processes, with
libgomp's default policy and with ``OMP_WAIT_POLICY=PASSIVE`` (what ``mizuoto`` sets).

    python benchmarks/cpu/wait_policy.py --busy 2 --repeats 3

Each timing is a fresh process (OpenMP reads its policy once, when torch is imported); the
busy processes are pure-Python loops, one core each, stopped when the run ends. Prints each
configuration's median time and its ratio to the same policy's quiet time. Not a test: the
figures depend on the machine and on whatever else runs on it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

_WORK = """
import time, torch
torch.manual_seed(0)
layers = [torch.randn(1024, 1024) for _ in range(24)]
x = torch.randn(1, 1024)
for _ in range(20):  # warm-up
    x = torch.tanh(x @ layers[0])
start = time.perf_counter()
for _ in range({steps}):
    for w in layers:
        x = torch.tanh(x @ w)
print(time.perf_counter() - start, flush=True)
"""


def _time(policy: str | None, steps: int) -> float:
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        environment["OMP_WAIT_POLICY"] = policy
    done = subprocess.run([sys.executable, "-c", _WORK.format(steps=steps)], env=environment,
                          capture_output=True, text=True, check=True, timeout=600)
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside it")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="decode-like steps a run")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}; torch threads: default "
          f"({os.cpu_count()} CPUs)", flush=True)
    rows = {}
    for busy in (0, args.busy):
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(busy)]
        try:
            time.sleep(0.5 if busy else 0)
            for policy in (None, "PASSIVE"):
                runs = [_time(policy, args.steps) for _ in range(args.repeats)]
                print(f"busy={busy} OMP_WAIT_POLICY={policy}: {runs}", file=sys.stderr,
                      flush=True)
                rows[busy, policy] = statistics.median(runs)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
    for policy in (None, "PASSIVE"):
        quiet, loaded = rows[0, policy], rows[args.busy, policy]
        print(f"OMP_WAIT_POLICY={policy or 'unset (libgomp default)':<28} alone {quiet:7.2f} s"
              f"   beside {args.busy} busy {loaded:7.2f} s   x{loaded / quiet:5.2f}",
              flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
