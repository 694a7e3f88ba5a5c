"""Time F5-TTS fine-tuning in Mizuoto and in upstream's trainer; peak memory per memory level.

    python benchmarks/bench_training.py --size tiny --epochs 2 --threads 1
    python benchmarks/bench_training.py --size real --epochs 1 --clips 2   # minutes, GBs

Writes a random-init v1 Base model directory (``--size real``: the released architecture)
and synthetic clips, then runs, each in its own subprocess with the same thread count:
upstream's ``prepare_csv_wavs`` + ``Trainer`` (``tests/parity/f5_train_oracle.py``) and
Mizuoto's `F5Trainer` at each ``training.memory`` level. Prints seconds per update: upstream's
``Trainer.train`` call (loader start-up, loading the base weights, the updates, the last
checkpoint) and Mizuoto's ``train`` call without building the model and loading its weights
(upstream builds its model before), the ratio Mizuoto / upstream, the peak resident memory of each process, and checks that every run logged the same
losses and learning rates. Never run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARITY = HERE.parent / "tests" / "parity"
SEED = 1234


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _child_upstream(config_path: str) -> dict:
    sys.path.insert(0, str(PARITY))
    import f5_train_oracle

    f5_train_oracle.main(config_path)
    cfg = json.loads(Path(config_path).read_text())
    log = json.loads((Path(cfg["work_dir"]) / "log.json").read_text())
    records = [(r["update"], r["loss"], r["lr"]) for r in log["records"]]
    return {"seconds": log["seconds"], "records": records, "peak_mb": _peak_rss_mb()}


def _child_ours(config_path: str, memory: str) -> dict:
    import torch

    from mizuoto import TrainingConfig
    from mizuoto.training.state import load_state_file
    from mizuoto.training.trainer import CHECKPOINT
    from mizuoto_f5tts.training import F5Trainer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = json.loads(Path(config_path).read_text())
    output = Path(cfg["work_dir"]) / f"ours-{memory}"
    config = TrainingConfig(
        method="full", model=cfg["model_dir"], dataset=cfg["metadata_relative"],
        output_dir=output, steps=10_000, learning_rate=cfg["learning_rate"], seed=SEED,
        save_every=cfg["save_every"], memory=memory,
        params={"epochs": cfg["epochs"], "warmup_updates": cfg["warmup"],
                "batch_frames": cfg["batch_size"], "max_samples": cfg["max_samples"]})
    trainer = F5Trainer()
    run = trainer.prepare(config)
    build = trainer.build
    built = []

    def timed_build(*args, **kwargs):  # model construction: before upstream's Trainer.train
        begin = time.perf_counter()
        result = build(*args, **kwargs)
        built.append(time.perf_counter() - begin)
        return result

    trainer.build = timed_build
    start = time.perf_counter()
    trainer.train(run)
    seconds = time.perf_counter() - start - sum(built)
    records = [tuple(r) for r in load_state_file(output / CHECKPOINT)["records"]]
    return {"seconds": seconds, "records": records, "peak_mb": _peak_rss_mb()}


def _spawn(args: list[str], threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{args[:2]} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--clips", type=int, default=6)
    parser.add_argument("--batch-frames", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory", nargs="+", default=["default", "low", "lowest"])
    parser.add_argument("--work", type=Path, default=None, help="work directory (default: temp)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, config_path, *rest = args.child
        result = (_child_upstream(config_path) if kind == "upstream"
                  else _child_ours(config_path, rest[0]))
        print(json.dumps(result))
        return

    import tempfile

    from mizuoto.training.synthetic_data import write_synthetic_dataset
    from mizuoto_f5tts.checkpoint import find_checkpoint
    from mizuoto_f5tts.fixtures import write_random_model_dir
    from mizuoto_f5tts.variants import get_variant

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-f5-training-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = write_random_model_dir(work / "model", "v1_base", size=args.size, seed=7)
    metadata = write_synthetic_dataset(work / "data", count=args.clips, seed=3)
    absolute = work / "metadata-absolute.csv"
    lines = metadata.read_text(encoding="utf-8").splitlines()
    absolute.write_text("\n".join([lines[0]] + [
        f"{(metadata.parent / a).resolve()}|{t}" for a, t in (x.split("|", 1) for x in lines[1:])
    ]) + "\n", encoding="utf-8")
    variant = get_variant("v1_base", args.size)
    upstream_work = work / "upstream"
    upstream_work.mkdir(exist_ok=True)
    config = dict(
        work_dir=str(upstream_work), metadata=str(absolute), metadata_relative=str(metadata),
        model_dir=str(model_dir), vocab=str(model_dir / "vocab.txt"),
        checkpoint=str(find_checkpoint(model_dir)), backbone=variant.backbone,
        arch=variant.upstream_config(), seed=SEED, epochs=args.epochs, learning_rate=1e-4,
        warmup=0, save_every=10_000, batch_size_type="frame", batch_size=args.batch_frames,
        max_samples=64, grad_accumulation=1, max_grad_norm=1.0)
    config_path = work / "config.json"
    config_path.write_text(json.dumps(config))

    upstream = _spawn(["--child", "upstream", str(config_path)], args.threads)
    updates = upstream["records"][-1][0]
    print(f"{args.size} v1 Base, {updates} updates, {args.threads} thread(s)")
    print(f"  upstream          {upstream['seconds'] / updates:8.3f} s/update  "
          f"peak {upstream['peak_mb']:8.0f} MB")
    for memory in args.memory:
        ours = _spawn(["--child", "ours", str(config_path), memory], args.threads)
        same = [tuple(r) for r in ours["records"]] == [tuple(r) for r in upstream["records"]]
        print(f"  mizuoto {memory:<9} {ours['seconds'] / updates:8.3f} s/update  "
              f"peak {ours['peak_mb']:8.0f} MB  ratio {ours['seconds'] / upstream['seconds']:.2f}"
              f"  {'same losses and LRs' if same else 'DIFFERENT losses/LRs'}")


if __name__ == "__main__":
    main()
