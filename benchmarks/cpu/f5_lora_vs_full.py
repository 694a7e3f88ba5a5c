"""Peak memory and seconds per update of an F5-TTS ``lora`` run against a ``full`` one, on the
CPU, at the model's own size (e.g. a random-init F5 v1 Base: ``mizuoto random-model
f5tts/realsize-v1-base DIR``). Runs each method in its own process, one after the other, and
prints each one's peak resident memory (``ru_maxrss`` of the child) and mean seconds per update
(updates after the first), then the ratios.

    python benchmarks/cpu/f5_lora_vs_full.py MODEL_DIR [--updates 4] [--batch-frames 600]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

_CHILD = """
import json, resource, sys, time
from mizuoto import TrainingConfig
from mizuoto_f5tts.training import F5Trainer
model_dir, metadata, output, method, updates, frames = sys.argv[1:7]
params = {"warmup_updates": 1, "batch_frames": int(frames), "epochs": 1000}
if method == "lora":
    params.update(lora_r=8, lora_alpha=16)
config = TrainingConfig(method=method, model=model_dir, dataset=metadata, output_dir=output,
                        steps=int(updates), learning_rate=1e-5, seed=0, save_every=10**6,
                        params=params)
stamps = []
def progress(p):
    if p.stage == "train":
        stamps.append(time.perf_counter())
trainer = F5Trainer()
run = trainer.prepare(config)
start = time.perf_counter()
trainer.train(run, progress=progress)
steps = [b - a for a, b in zip(stamps, stamps[1:])]
print(json.dumps({"method": method, "peak_rss_mib": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1024, "seconds_per_update": sum(steps) / len(steps),
    "first_update_s": stamps[0] - start}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--batch-frames", type=int, default=600)
    args = parser.parse_args()
    from mizuoto.training.synthetic_data import write_synthetic_dataset

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        metadata = write_synthetic_dataset(os.path.join(tmp, "data"), count=4, seed=0)
        for method in ("full", "lora"):
            out = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(_CHILD), args.model_dir, str(metadata),
                 os.path.join(tmp, method), method, str(args.updates), str(args.batch_frames)],
                capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{method} run failed:\n{out.stderr[-3000:]}")
            results[method] = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(results[method]), flush=True)
    full, lora = results["full"], results["lora"]
    print(f"lora / full: peak memory {lora['peak_rss_mib'] / full['peak_rss_mib']:.2f}, "
          f"seconds per update {lora['seconds_per_update'] / full['seconds_per_update']:.2f}; "
          f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
