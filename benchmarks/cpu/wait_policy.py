"""OpenMP's wait policy on a busy machine: a decode-like torch loop (many short parallel
regions, as an LM's per-token steps), or a real request with ``--model``, timed alone and
beside CPU-bound processes, with libgomp's default policy, with ``OMP_WAIT_POLICY=PASSIVE``
(what ``mizuoto`` sets on a busy machine), with ``ACTIVE`` (``--active``: what it sets on a
quiet one) and with the ``GOMP_SPINCOUNT`` values of ``--spincounts``.

    python benchmarks/cpu/wait_policy.py --busy 2 --repeats 3
    python benchmarks/cpu/wait_policy.py --model /tmp/vox-random --busy 2   # a real request
    python benchmarks/cpu/wait_policy.py --model /tmp/vox-rs --params '{"max_len": 16}'
    python benchmarks/cpu/wait_policy.py --model /tmp/vox-rs --busy 1,2 --active

With ``--model`` each run loads that model directory (untimed), speaks one warm-up request and
times a second one (``mizuoto.load`` + ``synthesize``, seed 0, ``--params``; a random model
at real size has no length defaults: give ``max_len``). Each timing is a fresh process (OpenMP
reads its policy once, when torch is imported); the busy processes are pure-Python loops, one
core each, stopped when the run ends. Prints each configuration's median time and its ratio to
the same policy's quiet time. Not a test: the figures depend on the machine and on whatever
else runs on it.
"""

from __future__ import annotations

import argparse
import json
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


_REQUEST = """
import time, mizuoto
tts = mizuoto.load({model!r})
request = mizuoto.SynthesisRequest({text!r}, seed=0, params={params!r})
tts.synthesize(request)  # warm-up: caches, first-use proofs
start = time.perf_counter()
tts.synthesize(request)
print(time.perf_counter() - start, flush=True)
"""


def _time(policy: str | None, steps: int, model: str | None = None,
          text: str = "Hello from Mizuoto.", params: dict | None = None) -> float:
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    # (mizuoto.load from Python leaves the policy to the environment; the command sets it)
    environment.pop("GOMP_SPINCOUNT", None)
    if policy and policy.startswith("spin="):  # libgomp's spin before sleeping, policy unset
        environment["GOMP_SPINCOUNT"] = policy.removeprefix("spin=")
    elif policy:
        environment["OMP_WAIT_POLICY"] = policy
    work = (_REQUEST.format(model=model, text=text, params=params or {}) if model
            else _WORK.format(steps=steps))
    done = subprocess.run([sys.executable, "-c", work], env=environment,
                          capture_output=True, text=True, check=True, timeout=600)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", default="2",
                        help="CPU-bound processes beside it (comma-separated: one case each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="decode-like steps a run")
    parser.add_argument("--model", help="a model directory: time a request to it instead")
    parser.add_argument("--text", default="Hello from Mizuoto.")
    parser.add_argument("--params", type=json.loads, default={},
                        help="the request's params, as JSON (e.g. a random model's length cap)")
    parser.add_argument("--spincounts", default="",
                        help="also these GOMP_SPINCOUNT values (comma-separated), policy unset")
    parser.add_argument("--active", action="store_true", help="also OMP_WAIT_POLICY=ACTIVE")
    args = parser.parse_args()
    busy_counts = [int(n) for n in args.busy.split(",") if n]
    policies = ([None, "PASSIVE"] + (["ACTIVE"] if args.active else [])
                + [f"spin={n}" for n in args.spincounts.split(",") if n])
    print(f"load average before: {os.getloadavg()[0]:.2f}; torch threads: default "
          f"({os.cpu_count()} CPUs)", flush=True)
    rows = {}
    for busy in (0, *busy_counts):
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(busy)]
        try:
            time.sleep(0.5 if busy else 0)
            for policy in policies:
                runs = [_time(policy, args.steps, args.model, args.text, args.params)
                        for _ in range(args.repeats)]
                print(f"busy={busy} OMP_WAIT_POLICY={policy}: {runs}", file=sys.stderr,
                      flush=True)
                rows[busy, policy] = statistics.median(runs)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
    for policy in policies:
        quiet = rows[0, policy]
        name = policy if policy and policy.startswith("spin=") else \
            f"OMP_WAIT_POLICY={policy or 'unset (libgomp default)'}"
        beside = "".join(f"   beside {busy} busy {rows[busy, policy]:7.2f} s "
                         f"x{rows[busy, policy] / quiet:5.2f}" for busy in busy_counts)
        print(f"{name:<44} alone {quiet:7.2f} s{beside}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
