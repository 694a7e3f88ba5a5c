"""The training runner's CUDA checks (`mizuoto.training.TrainingRunner`), as one short script:
benchmarks/gpu/checks.py runs it when it exists; by hand: ``python benchmarks/gpu/runner_checks.py``.

- bf16 autocast with a gradient scaler (VoxCPM's recipe on CUDA) and fp16 autocast with
  accelerate's scaler (F5's): two accumulated micro-batches, clipping, AdamW and a schedule,
  equal (``torch.equal``) to the same update written out with torch's own autocast,
  ``GradScaler``, ``clip_grad_norm_`` and ``AdamW``; the forward really runs in the half dtype.
- fp16 with infinite gradients: the scaler skips the step, the schedule does not advance
  (accelerate's rule) unless the recipe declares that it does (VoxCPM's quirk).
- an NCCL process group of one process: the runner wraps the model once in
  DistributedDataParallel, skips the all-reduce on the first micro-batch (``no_sync``), and the
  update equals the unwrapped one's.

Prints one PASS/FAIL line per check; exits 1 when one fails (2: no CUDA, unless ``--device
cpu``, which runs the same checks on the CPU with gloo: a dry run of the script itself).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch

from mizuoto.training import ProcessWorld, RecipeQuirks, TrainingRunner, build_schedule
from mizuoto.training.world import backend_for, join


class _WorldOfOne(ProcessWorld):
    """One process that still joins a process group (DDP over one rank)."""

    @property
    def distributed(self) -> bool:
        return True


def _model(device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                               torch.nn.Linear(128, 8)).to(device)


def _batches(device, count=2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(16, 64, generator=generator).to(device) for _ in range(count)]


def _ours(device, mode, *, world=None, quirks=RecipeQuirks(), scaler=None, poison=False):
    model = _model(device)
    runner = TrainingRunner(device=device, world=world, mixed_precision=mode, scaler=scaler,
                            grad_accumulation=2, max_grad_norm=0.5, quirks=quirks)
    forward = runner.wrap(model)
    runner.optimize(model, learning_rate=1e-3, schedule="cosine", warmup=1, total=4)
    feed, dtypes = iter(_batches(device)), []

    def loss(batch):
        out = forward(batch)
        dtypes.append(out.dtype)
        value = out.float().pow(2).mean()
        return {"loss": value * float("inf") if poison else value}

    values = runner.update(lambda: next(feed), loss)
    return model, runner, values, dtypes


def _by_hand(device, mode, scaler_on):
    model = _model(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = build_schedule("cosine", optimizer, warmup=1, total=4)
    scaler = torch.amp.GradScaler(device.type) if scaler_on else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[mode]
    for batch in _batches(device):
        with torch.autocast(device.type, dtype=dtype):
            value = model(batch).float().pow(2).mean()
        loss = value / 2
        (scaler.scale(loss) if scaler else loss).backward()
    if scaler:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    scheduler.step()
    return model, float(norm)


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def check_autocast(device, mode: str, scaler: bool | None) -> str:
    model, runner, values, dtypes = _ours(device, mode, scaler=scaler)
    scaler_on = runner.precision.scaler is not None
    theirs, norm = _by_hand(device, mode, scaler_on)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}[mode]
    assert scaler_on == (scaler if scaler is not None else mode == "fp16"), "scaler choice"
    assert set(dtypes) == {half}, f"forward ran in {set(dtypes)}, not {half}"
    assert values["grad_norm"] == norm, f"grad norm {values['grad_norm']} != {norm}"
    assert _same(model, theirs), "weights differ from torch's own autocast + GradScaler step"
    return f"{mode} autocast, scaler {'on' if scaler_on else 'off'}: equal to torch's own"


def check_skipped_update(device) -> str:
    _, runner, _, _ = _ours(device, "fp16", poison=True)
    assert runner.scheduler.last_epoch == 0, "schedule advanced on a skipped update"
    assert runner.precision.scaler.get_scale() < 65536.0, "scale not reduced"
    _, runner, _, _ = _ours(device, "fp16", poison=True,
                            quirks=RecipeQuirks(schedule_steps_on_skipped_update=True))
    assert runner.scheduler.last_epoch == 1, "the declared quirk did not step the schedule"
    return "fp16 inf gradients: step skipped, schedule held (stepped under the quirk)"


def check_world_of_one(device) -> str:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="1",
                      RANK="0", LOCAL_RANK="0")
    world = join(_WorldOfOne(1, 0, device.index or 0), device.type)
    import torch.distributed as dist

    try:
        backend = dist.get_backend()
        assert backend == backend_for(device.type), backend
        wrapped, runner, _, _ = _ours(device, "bf16", world=world, scaler=True)
        assert runner.no_sync is not None, "not wrapped in DDP"
        plain, _, _, _ = _ours(device, "bf16", scaler=True)
        assert _same(wrapped, plain), "DDP over one rank changed the update"
    finally:
        dist.destroy_process_group()
    return f"{backend} world of one: wrapped once, no_sync, equal to one process"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # checks.py names the device through the environment (cpu when it rehearses)
    parser.add_argument("--device", default=os.environ.get("MIZUOTO_GPU_CHECK_DEVICE", "cuda"),
                        help="cuda (default) or cpu (a dry run)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("runner checks: no CUDA device here (--device cpu for a dry run)")
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    checks = [("bf16+scaler", lambda: check_autocast(device, "bf16", True)),
              ("fp16+scaler", lambda: check_autocast(device, "fp16", None)),
              ("fp16 skipped update", lambda: check_skipped_update(device)),
              ("world of one", lambda: check_world_of_one(device))]
    failed = 0
    for name, check in checks:
        try:
            print(f"PASS runner {name}: {check()}", flush=True)
        except Exception as exc:  # every check reports; the run goes on
            failed += 1
            print(f"FAIL runner {name}: {type(exc).__name__}: {exc}", flush=True)
    # the closing line checks.py reads: "N passed, N failed"
    print(f"runner checks on {device}: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
