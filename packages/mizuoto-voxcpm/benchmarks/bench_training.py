"""Benchmark: seconds per fine-tuning step, Mizuoto's VoxCPMTrainer against upstream's
``scripts/train_voxcpm_finetune.py`` (2.0.3, vendored in tests/parity/upstream), on the same
random-init model (float32 config), data, seed and thread count, each side in its own
subprocess. Reports the median seconds per step (steps after the first), each side's peak RSS,
and checks the losses are identical.

    python packages/mizuoto-voxcpm/benchmarks/bench_training.py                    # tiny
    python packages/mizuoto-voxcpm/benchmarks/bench_training.py --size realsize --method lora --steps 3

Needs the parity environment (upstream voxcpm, argbind, datasets, tensorboardX). Never in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ORACLE = Path(__file__).parents[1] / "tests" / "parity" / "voxcpm_train_oracle.py"

_OURS = """
import json, resource, sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
from mizuoto.contracts import TrainingConfig
from mizuoto_voxcpm.training import VoxCPMTrainer
args = json.loads(sys.argv[1])
times = []
config = TrainingConfig(**args)
trainer = VoxCPMTrainer()
run = trainer.prepare(config)
trainer.train(run, progress=lambda p: times.append(time.perf_counter()) if p.stage == "train" else None)
rows = [json.loads(x) for x in open(config.output_dir / "metrics.jsonl")]
print(json.dumps({"times": times, "rows": rows,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _data(root: Path) -> Path:
    import numpy as np
    import soundfile as sf

    rows = []
    for i in range(8):
        t = np.arange(int(16000 * (1.0 + 0.25 * i))) / 16000
        sf.write(root / f"{i}.wav", (0.3 * np.sin(2 * np.pi * (150 + 30 * i) * t))
                 .astype(np.float32), 16000)
        rows.append(json.dumps({"audio": str(root / f"{i}.wav"),
                                "text": f"This is sentence number {i} of the benchmark."}))
    manifest = root / "train.jsonl"
    manifest.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generation", default="voxcpm-0.5b")
    parser.add_argument("--size", default="tiny", choices=["tiny", "wide", "realsize"])
    parser.add_argument("--method", default="full", choices=["full", "lora"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from mizuoto_voxcpm.fixtures import with_dtype, write_random_model

    root = Path(tempfile.mkdtemp(prefix="bench-train-"))
    model = with_dtype(write_random_model(root / "base", args.generation, size=args.size),
                       root / "model", "float32")
    manifest = _data(root)
    lr = 1e-4 if args.method == "lora" else 1e-5
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_DATASETS_OFFLINE": "1"}

    config = {"pretrained_path": str(model), "train_manifest": str(manifest), "val_manifest": "",
              "sample_rate": 16000, "batch_size": args.batch_size, "num_workers": 0,
              "num_iters": args.steps, "max_steps": args.steps, "log_interval": 1,
              "valid_interval": 10**6, "save_interval": 10**6, "learning_rate": lr,
              "warmup_steps": 1, "max_batch_tokens": 8192, "save_path": str(root / "up"),
              "log": str(root / "up.json")}
    if args.method == "lora":
        config["lora"] = {"enable_lm": True, "enable_dit": True, "r": 8, "alpha": 16}
    (root / "up.config.json").write_text(json.dumps(config), encoding="utf-8")
    start = time.perf_counter()
    up = subprocess.run([sys.executable, str(ORACLE), str(root / "up.config.json")], env=env,
                        capture_output=True, text=True)
    if up.returncode:
        sys.exit(up.stderr[-3000:])
    up_wall = time.perf_counter() - start
    up_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    upstream = json.loads((root / "up.json").read_text(encoding="utf-8"))

    ours_args = {"method": args.method, "model": str(model), "dataset": str(manifest),
                 "output_dir": str(root / "ours"), "steps": args.steps, "learning_rate": lr,
                 "batch_size": args.batch_size, "seed": 42, "save_every": 10**6,
                 "params": {"warmup_steps": 1, "max_grad_norm": 0.0, "grad_accum_steps": 1,
                            "preview": False,
                            **({"lora_r": 8, "lora_alpha": 16} if args.method == "lora" else {})}}
    start = time.perf_counter()
    ours = subprocess.run([sys.executable, "-c", _OURS, json.dumps(ours_args), str(args.threads)],
                          env=env, capture_output=True, text=True)
    if ours.returncode:
        sys.exit(ours.stderr[-3000:])
    ours_wall = time.perf_counter() - start
    result = json.loads(ours.stdout.strip().splitlines()[-1])

    def per_step(times: list[float]) -> float:
        return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))

    up_step = per_step([row["time"] for row in upstream["steps"]])
    our_step = per_step(result["times"])
    same = all(a[k] == b[k] for a, b in zip(upstream["steps"], result["rows"], strict=True)
               for k in ("loss/diff", "loss/stop", "lr", "grad_norm"))
    print(f"{args.generation} {args.size} {args.method}, batch {args.batch_size}, "
          f"{args.steps} steps, {args.threads} thread(s)")
    print(f"  seconds per step: upstream {up_step:.3f}  mizuoto {our_step:.3f}  "
          f"ratio {our_step / up_step:.2f}")
    print(f"  whole run (load + data + steps): upstream {up_wall:.1f} s  mizuoto {ours_wall:.1f} s")
    print(f"  peak RSS: upstream {up_rss / 1024:.0f} MiB  mizuoto {result['rss'] / 1024:.0f} MiB")
    print(f"  identical losses, lr and grad norms: {same}")


if __name__ == "__main__":
    main()
