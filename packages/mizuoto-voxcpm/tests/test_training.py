"""VoxCPMTrainer without the oracle: bad rows, resuming after SIGKILL, exports that load."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import mizuoto
from mizuoto.contracts import TrainingConfig
from mizuoto.errors import InvalidRequest
from mizuoto.registry import get_trainer
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import with_dtype, write_random_model
from mizuoto_voxcpm.training import VoxCPMTrainer

RATE = 16000


def _tone(path: Path, seconds: float, freq: float, rate: int = RATE) -> str:
    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate)
    return path.name


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    model = with_dtype(write_random_model(root / "base", "voxcpm-0.5b", seed=6),
                       root / "model", "float32")
    rows = [{"audio": _tone(root / f"{i}.wav", 0.4 + 0.1 * i, 150 + 60 * i),
             "text": f"Line number {i}."} for i in range(4)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                      encoding="utf-8")
    return root, model


def _config(root: Path, model: Path, out: str, **kw) -> TrainingConfig:
    values = dict(method="full", model=str(model), dataset=root / "train.jsonl",
                  output_dir=root / out, steps=6, learning_rate=1e-4, batch_size=2, seed=42,
                  save_every=1, params={"warmup_steps": 1})
    values.update(kw)
    return TrainingConfig(**values)


def test_registered_through_the_plugin():
    assert get_trainer("voxcpm") is VoxCPMTrainer


def test_bad_rows_are_reported_and_skipped(workspace, tmp_path):
    root, model = workspace
    sf.write(tmp_path / "silent.wav", np.zeros(RATE, dtype=np.float32), RATE)
    (tmp_path / "broken.wav").write_bytes(b"RIFF nonsense")
    long_audio = _tone(tmp_path / "long.wav", 40.0, 200)  # 500 patches > max_length 512 - text
    good = [json.dumps({"audio": str(root / f"{i}.wav"), "text": "fine"}) for i in range(2)]
    lines = good + [
        json.dumps({"audio": "silent.wav", "text": "silence"}),
        json.dumps({"audio": "broken.wav", "text": "broken"}),
        json.dumps({"audio": "missing.wav", "text": "missing"}),
        json.dumps({"audio": str(root / "0.wav"), "text": "   "}),
        json.dumps({"audio": long_audio, "text": "too long " * 40}),
        "{not json",
    ]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = VoxCPMTrainer().prepare(_config(root, model, "bad", dataset=tmp_path / "m.jsonl",
                                          output_dir=tmp_path / "run"))
    assert len(run.samples) == 2
    reasons = dict(run.rejected)
    assert sorted(reasons) == [3, 4, 5, 6, 7, 8]
    # a missing file is core's rejection (before any header is read): "no audio file ... (not
    # found)", no longer soundfile's "unreadable audio: ... No such file"
    assert "silent" in reasons[3] and "unreadable" in reasons[4] and "not found" in reasons[5]
    assert reasons[6] == "empty text" and "context" in reasons[7] and "JSON" in reasons[8]
    prepared = json.loads((tmp_path / "run" / "prepared.json").read_text(encoding="utf-8"))
    assert [r["line"] for r in prepared["rejected"]] == [3, 4, 5, 6, 7, 8]



def test_a_warmup_longer_than_the_run_is_warned_of_in_core_s_words(workspace, caplog):
    root, model = workspace
    with caplog.at_level("WARNING", logger="mizuoto.training.steps"):
        VoxCPMTrainer().prepare(_config(root, model, "warm", steps=4,
                                        params={"warmup_steps": 100}))
    # upstream's warmup_steps is the shared warmup_updates: F5's words
    assert any("warmup_updates 100 exceeds the 4 updates this run makes (--steps 4)" in m
               for m in caplog.messages)


def test_a_metadata_csv_folder_is_read_as_its_rows(workspace, tmp_path):
    root, model = workspace
    rows = [json.loads(line) for line in (root / "train.jsonl").read_text().splitlines()]
    data = tmp_path / "my-voice"
    data.mkdir()
    (data / "metadata.csv").write_text("audio_file|text\n" + "".join(
        f"{row['audio'] if Path(row['audio']).is_absolute() else root / row['audio']}|"
        f"{row['text']}\n" for row in rows), encoding="utf-8")
    run = VoxCPMTrainer().prepare(_config(root, model, "csv", dataset=data))
    assert [s.text for s in run.samples] == [row["text"] for row in rows]

def test_unsupported_settings_are_refused(workspace):
    root, model = workspace
    trainer = VoxCPMTrainer()
    with pytest.raises(InvalidRequest):
        trainer.prepare(_config(root, model, "x", method="dpo"))
    with pytest.raises(InvalidRequest):
        trainer.prepare(_config(root, model, "x", params={"no_such": 1}))
    with pytest.raises(InvalidRequest):
        trainer.prepare(_config(root, model, "x", params={"lora_r": 4}))  # full: no LoRA
    with pytest.raises(InvalidRequest, match="4 usable rows.*--batch-size 4 or less"):
        trainer.prepare(_config(root, model, "x", batch_size=8))  # four rows


@pytest.mark.parametrize("params, field", [
    ({"lora_target_modules_lm": ["gate_proj", "mlp"]}, "params.lora_target_modules_lm"),
    ({"lora_target_modules_lm": []}, "params.lora_target_modules_lm"),
    ({"lora_target_modules_dit": "q_proj"}, "params.lora_target_modules_dit"),
    ({"lora_target_modules_dit": ["q_proj", "q_proj"]}, "params.lora_target_modules_dit"),
    # VoxCPM2's fusion projection is not in a VoxCPM-0.5B
    ({"lora_enable_proj": True, "lora_target_proj_modules": ["fusion_concat_proj"]},
     "params.lora_target_proj_modules"),
    ({"lora_target_proj_modules": ["stop_head"]}, "params.lora_target_proj_modules"),  # proj off
    ({"max_steps": -1}, "params.max_steps"),
    ({"max_steps": 2.5}, "params.max_steps"),
])
def test_bad_lora_targets_and_schedule_lengths_are_named(workspace, params, field):
    root, model = workspace
    with pytest.raises(InvalidRequest) as caught:
        VoxCPMTrainer().prepare(_config(root, model, "x", method="lora",
                                        params={"warmup_steps": 1, **params}))
    assert caught.value.field == field
    if "lora_target_modules_lm" in params and params["lora_target_modules_lm"]:
        assert "down_proj" in str(caught.value)  # the allowed names are listed


def test_chosen_lora_targets_reach_the_export_and_inference(workspace):
    """The targets a run trains are the ones its export names and loading it applies; the
    schedule's length travels in the checkpoint."""
    from mizuoto_voxcpm.lora import LoRALinear

    root, model = workspace
    params = {"warmup_steps": 1, "max_steps": 9, "lora_enable_proj": True,
              "lora_target_modules_lm": ["up_proj"], "lora_target_modules_dit": ["in_proj"],
              "lora_target_proj_modules": ["stop_proj"]}
    trainer = VoxCPMTrainer()
    run = trainer.prepare(_config(root, model, "targets", method="lora", steps=1,
                                  params=params))
    trainer.train(run)
    exported = trainer.export(run, root / "targets" / "export")

    def wrapped(module):
        return sorted(n for n, m in module.named_modules() if isinstance(m, LoRALinear))

    trained = wrapped(trainer.build_session(run).model)
    assert trained and all(n.endswith(("up_proj", "estimator.in_proj", "stop_proj"))
                           for n in trained)
    assert wrapped(VoxCPMEngine.load(exported).model) == trained
    saved = json.loads((exported / "lora_config.json").read_text(encoding="utf-8"))
    assert saved["lora_config"]["target_modules_lm"] == ["up_proj"]
    assert saved["lora_config"]["target_proj_modules"] == ["stop_proj"]
    state = torch.load(root / "targets" / VoxCPMTrainer.checkpoint / "state.pt",
                       weights_only=True)
    assert state["scheduler"]["lr_lambdas"] == [{"warmup": 1, "total": 9}]


def test_a_resumed_schedule_keeps_its_length():
    """The cosine schedule's length (max_steps; upstream's 0: num_iters) is in its state."""
    from mizuoto.training import build_schedule

    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    saved = build_schedule("cosine", optimizer, warmup=0, total=4)
    restored = build_schedule("cosine", optimizer, warmup=0, total=2)
    assert restored.lr_lambdas[0].total == 2
    restored.load_state_dict(saved.state_dict())
    assert restored.lr_lambdas[0].total == 4


_CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from mizuoto.contracts import TrainingConfig
from mizuoto_voxcpm.training import VoxCPMTrainer
config = TrainingConfig(**json.loads(sys.argv[1]))
trainer = VoxCPMTrainer()
trainer.train(trainer.prepare(config))
"""


@pytest.mark.parametrize("method", ["full"])  # LoRA: the contract suite's resume test
def test_resume_after_sigkill_reaches_the_same_bytes(workspace, method):
    root, model = workspace
    trainer = VoxCPMTrainer()
    whole = _config(root, model, f"whole-{method}", method=method)
    run = trainer.prepare(whole)
    result = trainer.train(run)
    assert result.steps_done == 6 and result.resumed_from is None
    reference = trainer.export(run, root / f"whole-{method}" / "export")

    killed = _config(root, model, f"killed-{method}", method=method)
    metrics = killed.output_dir / "metrics.jsonl"
    arguments = json.dumps({"method": method, "model": killed.model,
                            "dataset": str(killed.dataset), "output_dir": str(killed.output_dir),
                            "steps": 6, "learning_rate": 1e-4, "batch_size": 2, "seed": 42,
                            "save_every": 1, "params": {"warmup_steps": 1}})
    child = subprocess.Popen([sys.executable, "-c", _CHILD, arguments],
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if metrics.is_file() and len(metrics.read_text(encoding="utf-8").splitlines()) >= 2:
            break
        time.sleep(0.01)
    assert child.poll() is None, "the run ended before it could be killed"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    run = trainer.prepare(killed)
    resumed = trainer.train(run)
    assert resumed.resumed_from is not None and 1 <= resumed.resumed_from < 6
    exported = trainer.export(run, killed.output_dir / "export")
    name = "model.safetensors" if method == "full" else "lora_weights.safetensors"
    assert (exported / name).read_bytes() == (reference / name).read_bytes()
    rows = [json.loads(x) for x in metrics.read_text(encoding="utf-8").splitlines()]
    whole_rows = [json.loads(x) for x in (whole.output_dir / "metrics.jsonl")
                  .read_text(encoding="utf-8").splitlines()]
    assert rows == whole_rows


_SIGNALLED = """
import json, os, signal, sys, torch
# as in a terminal: a runner started as a background job passes SIGINT on ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
torch.set_num_threads(1)
from mizuoto.contracts import TrainingConfig
from mizuoto_voxcpm.training import VoxCPMTrainer
config = TrainingConfig(**json.loads(sys.argv[1]))
stop_at, name = int(sys.argv[2]), sys.argv[3]
def progress(p):
    if p.stage == "train" and p.done == stop_at:
        os.kill(os.getpid(), getattr(signal, name))
trainer = VoxCPMTrainer()
result = trainer.train(trainer.prepare(config), progress=progress)
print(result.interrupted, result.steps_done)
"""


@pytest.mark.parametrize(("name", "method", "stop_at"), [("SIGTERM", "full", 2),
                                                         ("SIGINT", "lora", 1)])
def test_a_signal_saves_the_checkpoint_and_resumes_to_the_same_bytes(workspace, name, method,
                                                                    stop_at):
    """SIGTERM / SIGINT at a step that is not a multiple of save_every (3): the run stops after
    that step, saves it and returns; resumed, it ends as an uninterrupted run does."""
    root, model = workspace
    fields = dict(method=method, steps=4, save_every=3)
    stopped = _config(root, model, f"stopped-{name}", **fields)
    arguments = json.dumps({"method": method, "model": stopped.model,
                            "dataset": str(stopped.dataset),
                            "output_dir": str(stopped.output_dir), "steps": 4,
                            "learning_rate": 1e-4, "batch_size": 2, "seed": 42,
                            "save_every": 3, "params": {"warmup_steps": 1}})
    child = subprocess.run([sys.executable, "-c", _SIGNALLED, arguments, str(stop_at), name],
                           env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr.decode(errors="replace")[-3000:]
    assert child.stdout.decode().split() == [name, str(stop_at)]
    latest = stopped.output_dir / "checkpoints" / "latest"
    assert json.loads((latest / "training_state.json").read_text())["step"] == stop_at

    trainer = VoxCPMTrainer()
    resumed = trainer.train(trainer.prepare(stopped))
    assert resumed.resumed_from == stop_at and resumed.steps_done == 4
    assert resumed.interrupted is None
    whole = _config(root, model, f"unstopped-{name}", **fields)
    trainer.train(trainer.prepare(whole))
    for config in (stopped, whole):
        assert json.loads((config.output_dir / "checkpoints" / "latest" /
                           "training_state.json").read_text())["step"] == 4
    weights = "checkpoints/latest/trainable.safetensors"
    assert (stopped.output_dir / weights).read_bytes() == (whole.output_dir / weights).read_bytes()
    assert ((stopped.output_dir / "metrics.jsonl").read_text(encoding="utf-8")
            == (whole.output_dir / "metrics.jsonl").read_text(encoding="utf-8"))


def test_full_export_loads_and_differs_from_the_base(workspace):
    root, model = workspace
    trainer = VoxCPMTrainer()
    run = trainer.prepare(_config(root, model, "export-full", steps=2))
    trainer.train(run)
    exported = trainer.export(run, root / "export-full" / "out")
    request = mizuoto.SynthesisRequest("Hello.", seed=1, params={"max_len": 3,
                                                                 "retry_badcase": False})
    tuned = VoxCPMEngine.load(exported).synthesize(request).audio.samples
    base = VoxCPMEngine.load(model).synthesize(request).audio.samples
    assert tuned.shape != base.shape or not torch.equal(tuned, base)
    assert sorted(p.name for p in exported.iterdir()) == sorted(
        ["audiovae.pth", "config.json", "model.safetensors", "special_tokens_map.json",
         "tokenizer.json", "tokenizer_config.json"])


@pytest.mark.parametrize("method", ["full", "lora"])
def test_low_memory_gives_the_same_bits(workspace, method):
    """Gradient checkpointing recomputes the blocks in the backward pass; LoRA dropout masks are
    replayed from the run's generator, so every step and the weights are the same."""
    root, model = workspace
    trainer = VoxCPMTrainer()
    outputs = {}
    levels = ("default", "low", "lowest") if method == "lora" else ("default", "low")
    for memory in levels:
        params = {"warmup_steps": 1, **({"lora_dropout": 0.3} if method == "lora" else {})}
        config = _config(root, model, f"memory-{method}-{memory}", method=method, steps=2,
                         memory=memory, save_every=100, params=params)
        run = trainer.prepare(config)
        trainer.train(run)
        exported = trainer.export(run, config.output_dir / "export")
        name = "model.safetensors" if method == "full" else "lora_weights.safetensors"
        outputs[memory] = ((config.output_dir / "metrics.jsonl").read_text(encoding="utf-8"),
                           (exported / name).read_bytes())
    assert outputs["low"] == outputs["default"]
    if method == "lora":  # on the CPU, lowest streams nothing: low's bits
        assert outputs["lowest"] == outputs["default"]
    else:
        with pytest.raises(InvalidRequest, match="training.memory"):
            trainer.prepare(_config(root, model, "lowest-full", memory="lowest"))


_DDP_CHILD = """
import hashlib, json, os, sys, torch
torch.set_num_threads(1)
from mizuoto.contracts import TrainingConfig
from mizuoto_voxcpm.training import VoxCPMTrainer
class Keeping(VoxCPMTrainer):
    def start(self, run, world):
        self.session = super().start(run, world)
        return self.session
config = TrainingConfig(**json.loads(sys.argv[1]))
trainer = Keeping()
run = trainer.prepare(config)
trainer.train(run)
digest = hashlib.sha256()
for name, p in trainer.session.model.named_parameters():
    if p.requires_grad:
        digest.update(p.detach().numpy().tobytes())
rank = os.environ["RANK"]
(config.output_dir / f"rank{rank}.sha256").write_text(digest.hexdigest())
trainer.export(run, config.output_dir / "export")
"""


def test_torchrun_two_processes_on_gloo(workspace):
    """Two CPU processes (gloo): they stay in step (same weights on both, from different
    data), accumulating without syncing but on the last micro-batch."""
    root, model = workspace
    out = root / "ddp"
    _two_process_lora_run(_child_script(root), model, root / "train.jsonl", out)
    hashes = {(out / f"rank{r}.sha256").read_text() for r in (0, 1)}
    assert len(hashes) == 1
    rows = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1, 2, 3]  # updates made, as F5
    assert json.loads(rows[1])["epoch"] == 1 * 2 * 1 * 2 / 4
    assert (out / "export" / "lora_weights.safetensors").is_file()


def _two_process_lora_run(script: Path, model: Path, dataset: Path, out: Path, *extra: str):
    """``script`` under torchrun, 2 processes on gloo: LoRA, 3 steps of 2 micro-batches."""
    arguments = json.dumps({"method": "lora", "model": str(model), "dataset": str(dataset),
                            "output_dir": str(out), "steps": 3, "learning_rate": 1e-3,
                            "batch_size": 1, "seed": 42, "save_every": 2,
                            "params": {"warmup_steps": 1, "grad_accum_steps": 2}})
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(29500 + os.getpid() % 1000), str(script), arguments, *extra],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]


def _child_script(root: Path) -> Path:
    path = root / "ddp_child.py"
    path.write_text(_DDP_CHILD, encoding="utf-8")
    return path


def test_preview_clones_a_long_clip_or_reads_zero_shot(workspace, tmp_path, caplog):
    import logging

    root, model = workspace
    trainer = VoxCPMTrainer()
    for name, seconds, mode in (("short", 0.5, "zero-shot"), ("long", 3.2, "cloned")):
        rows = [{"audio": _tone(tmp_path / f"{name}{i}.wav", seconds, 200 + 50 * i),
                 "text": f"Preview line {i}."} for i in range(2)]
        manifest = tmp_path / f"{name}.jsonl"
        manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        config = _config(root, model, "x", dataset=manifest, output_dir=tmp_path / name,
                         steps=1, batch_size=1, params={"warmup_steps": 1})
        run = trainer.prepare(config)
        trainer.train(run)
        with caplog.at_level(logging.INFO, logger="mizuoto.training.preview"):
            trainer.export(run, tmp_path / name / "export")
        assert (tmp_path / name / "preview.wav").is_file()
        assert any(f"preview ({mode})" in r.getMessage() for r in caplog.records)
        assert any("--param preview=false turns it off" in r.getMessage() for r in caplog.records)
        caplog.clear()


_DDP_SIGNALLED = """
import json, os, signal, sys, torch
torch.set_num_threads(1)
from mizuoto.contracts import TrainingConfig
from mizuoto_voxcpm.training import VoxCPMTrainer
config = TrainingConfig(**json.loads(sys.argv[1]))
stop_at = int(sys.argv[2])
def progress(p):  # process 0 alone reports progress, so it alone gets the signal
    if p.stage == "train" and p.done == stop_at:
        os.kill(os.getpid(), signal.SIGTERM)
trainer = VoxCPMTrainer()
result = trainer.train(trainer.prepare(config), progress=progress)
(config.output_dir / f"result{os.environ['RANK']}").write_text(
    f"{result.interrupted} {result.steps_done}")
"""


@pytest.mark.realsize  # three two-process runs: out of CI's time budget
def test_torchrun_two_processes_stop_together_on_a_signal_to_one(workspace):
    """SIGTERM reaches process 0 only, after step 1 (of 3): both processes agree (all-reduce)
    to stop there, the checkpoint holds both processes' generators and data positions, and
    the resumed run ends with the weights and metrics of an uninterrupted one."""
    root, model = workspace
    script = root / "ddp_signalled.py"
    script.write_text(_DDP_SIGNALLED, encoding="utf-8")

    def torchrun(out, stop_at):
        _two_process_lora_run(script, model, root / "train.jsonl", out, str(stop_at))
        return [(out / f"result{r}").read_text() for r in (0, 1)]

    stopped, whole = root / "ddp-stopped", root / "ddp-whole"
    assert torchrun(stopped, 1) == ["SIGTERM 1", "SIGTERM 1"]
    latest = stopped / "checkpoints" / "latest"
    assert json.loads((latest / "training_state.json").read_text())["step"] == 1
    assert (latest / "rank0.pt").is_file() and (latest / "rank1.pt").is_file()
    assert torchrun(stopped, 0) == ["None 3", "None 3"]
    assert torchrun(whole, 0) == ["None 3", "None 3"]
    weights = "checkpoints/latest/trainable.safetensors"
    assert (stopped / weights).read_bytes() == (whole / weights).read_bytes()
    assert ((stopped / "metrics.jsonl").read_text(encoding="utf-8")
            == (whole / "metrics.jsonl").read_text(encoding="utf-8"))


def test_validation_is_logged_and_a_resumed_run_replays_it(workspace):
    """Validation after steps 0, 2 and 4 (the last): its losses in metrics.jsonl and the
    result. Stopped after step 3 (checkpoint at 3, after step 2's validation), the resumed
    run ends with the uninterrupted run's metrics and weights."""
    root, model = workspace
    params = {"warmup_steps": 1, "preview": False, "val_manifest": str(root / "train.jsonl"),
              "valid_interval": 2}
    fields = dict(steps=5, save_every=3, params=params)
    whole = _config(root, model, "validated-whole", **fields)
    trainer = VoxCPMTrainer()
    result = trainer.train(trainer.prepare(whole))
    rows = [json.loads(x) for x in (whole.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/loss/total" in r] == [1, 3, 5]  # after updates
    assert result.metrics["val/loss/total"] == rows[-1]["val/loss/total"]

    stopped = _config(root, model, "validated-stopped", **fields)

    def stop(progress):
        if progress.stage == "train" and progress.done == 4:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        trainer.train(trainer.prepare(stopped), progress=stop)
    resumed = trainer.train(trainer.prepare(stopped))
    assert resumed.resumed_from == 3 and resumed.metrics == result.metrics
    for name in ("metrics.jsonl", "checkpoints/latest/trainable.safetensors"):
        assert (stopped.output_dir / name).read_bytes() == (whole.output_dir / name).read_bytes()


# upstream's step_<N> folder: the weights it saves (full: with the base model's files), then
# the training state
UPSTREAM_STATE = ["optimizer.pth", "scheduler.pth", "training_state.json"]


def _numbered(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("step_"))


def test_numbered_checkpoints_rotate_across_a_resume(workspace):
    """keep 2 of one every step; stopped after step 4 (latest at 4) and resumed with one every
    5 steps: the rotation counts the first run's folders (by step number)."""
    root, model = workspace
    params = {"warmup_steps": 1, "preview": False, "keep_last_n_checkpoints": 2,
              "checkpoint_every": 1}
    config = _config(root, model, "numbered", save_every=3, params=params)
    folder = config.output_dir / "checkpoints"
    trainer = VoxCPMTrainer()

    def stop(progress):
        if progress.stage == "train" and progress.done == 4:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        trainer.train(trainer.prepare(config), progress=stop)
    assert _numbered(folder) == ["step_0000003", "step_0000004"]
    resumed = _config(root, model, "numbered", save_every=3,
                      params={**params, "checkpoint_every": 5})
    run = trainer.prepare(resumed)
    # a numbered checkpoint is the resumable one's state: latest was saved with step_4
    assert trainer.train(run).resumed_from == 4
    assert _numbered(folder) == ["step_0000004", "step_0000005"]
    five = folder / "step_0000005"
    base = [p.name for p in model.iterdir() if p.name in
            ("config.json", "audiovae.pth", "audiovae.safetensors", "tokenizer.json",
             "special_tokens_map.json", "tokenizer_config.json")]
    assert sorted(p.name for p in five.iterdir()) == sorted(
        ["model.safetensors", *base, *UPSTREAM_STATE])
    for name in base:
        assert (five / name).read_bytes() == (model / name).read_bytes(), name
    assert (five / "training_state.json").read_text() == '{"step": 5}'
    moments = torch.load(five / "optimizer.pth", weights_only=True)["state"]
    assert {int(s["step"]) for s in moments.values()} == {5}
    assert torch.load(five / "scheduler.pth", weights_only=True)["last_epoch"] == 5
    # the last step is no multiple of 5: no folder for it; latest and the export hold step 6
    exported = trainer.export(run, config.output_dir / "export")
    assert (exported / "model.safetensors").read_bytes() != (
        five / "model.safetensors").read_bytes()


def test_numbered_lora_checkpoints_default_to_save_every_and_keep_all(workspace):
    root, model = workspace
    config = _config(root, model, "numbered-lora", method="lora", steps=4, save_every=2,
                     params={"warmup_steps": 1, "preview": False,
                             "keep_last_n_checkpoints": -1})
    trainer = VoxCPMTrainer()
    run = trainer.prepare(config)
    trainer.train(run)
    folder = config.output_dir / "checkpoints"
    assert _numbered(folder) == ["step_0000002", "step_0000004"]
    last = folder / "step_0000004"
    assert sorted(p.name for p in last.iterdir()) == sorted(
        ["lora_config.json", "lora_weights.safetensors", *UPSTREAM_STATE])
    exported = trainer.export(run, config.output_dir / "export")
    for name in ("lora_config.json", "lora_weights.safetensors"):
        assert (last / name).read_bytes() == (exported / name).read_bytes(), name


@pytest.mark.parametrize("params, message", [
    ({"keep_last_n_checkpoints": -2}, "must be an integer in [-1, 10000000], got -2"),
    ({"keep_last_n_checkpoints": True}, "must be an integer in [-1, 10000000], got True"),
    ({"keep_last_n_checkpoints": "3"}, "must be an integer in [-1, 10000000], got '3'"),
    ({"checkpoint_every": 0}, "must be an integer in [1, 10000000], got 0"),
    ({"checkpoint_every": 1.5}, "must be an integer in [1, 10000000], got 1.5"),
    ({"grad_accum_steps": 0}, "must be an integer in [1, 65536], got 0"),
])
def test_bad_numbered_checkpoint_settings_are_named(workspace, params, message):
    root, model = workspace
    with pytest.raises(InvalidRequest) as caught:
        VoxCPMTrainer().prepare(_config(root, model, "x", params={"warmup_steps": 1, **params}))
    assert caught.value.field == f"params.{next(iter(params))}"  # as given (upstream's name)
    assert message in str(caught.value)


def test_command_line_defaults_are_upstreams_recipe(workspace):
    """LoRA on a VoxCPM 0.5B: the yaml's lr 1e-4, batch 16, 2000 iterations, save and
    validation every 1000, every step folder kept, and upstream's seed 42; full: lr 1e-5."""
    root, model = workspace
    trainer = VoxCPMTrainer()
    lora = trainer.defaults("lora", str(model))
    assert {k: lora[k] for k in ("steps", "learning_rate", "batch_size", "seed", "save_every")} \
        == {"steps": 2000, "learning_rate": 1e-4, "batch_size": 16, "seed": 42,
            "save_every": 1000}
    assert lora["params"] == {"valid_interval": 1000, "keep_last_n_checkpoints": -1,
                              "checkpoint_every": 1000}
    assert trainer.defaults("full", str(model))["learning_rate"] == 1e-5
    v2 = write_random_model(root / "v2-defaults", "voxcpm2", seed=1)
    assert trainer.defaults("lora", str(v2))["batch_size"] == 2


def test_a_resume_onto_another_base_model_or_data_set_is_refused(workspace, tmp_path):
    root, model = workspace
    trainer = VoxCPMTrainer()
    config = _config(root, model, "x", output_dir=tmp_path / "run", steps=1,
                     params={"warmup_steps": 1, "preview": False})
    trainer.train(trainer.prepare(config))
    other = with_dtype(write_random_model(tmp_path / "b", "voxcpm-0.5b", seed=7),
                       tmp_path / "other", "float32")
    import attrs

    with pytest.raises(InvalidRequest, match=r"base model .*\(weights .* -> .*other"):
        trainer.prepare(attrs.evolve(config, model=str(other), steps=2))
    rows = [json.loads(x) for x in (root / "train.jsonl").read_text().splitlines()]
    rows[0]["text"] = "Another text."
    (tmp_path / "changed.jsonl").write_text(
        "".join(json.dumps(dict(r, audio=str(root / r["audio"]))) + "\n" for r in rows))
    with pytest.raises(InvalidRequest, match=r"data set .*\(rows .* -> .*changed.jsonl"):
        trainer.prepare(attrs.evolve(config, dataset=tmp_path / "changed.jsonl", steps=2))


def test_manifest_encoding_and_engine_mismatch_are_named(workspace, tmp_path):
    from mizuoto.errors import EngineMismatch
    from mizuoto_f5tts.fixtures import write_random_model_dir

    root, model = workspace
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps({"audio": str(root / "0.wav"), "text": "caf\xe9"},
                                 ensure_ascii=False).encode("latin-1") + b"\n")
    with pytest.raises(InvalidRequest, match="not UTF-8") as caught:
        VoxCPMTrainer().prepare(_config(root, model, "enc", dataset=latin,
                                        output_dir=tmp_path / "run"))
    assert caught.value.field == "dataset"
    bom = tmp_path / "bom.jsonl"  # a BOM (Windows editors) is not a bad first row
    bom.write_bytes(b"\xef\xbb\xbf" + (root / "train.jsonl").read_bytes().replace(
        b'"audio": "', f'"audio": "{root}/'.encode()))
    run = VoxCPMTrainer().prepare(_config(root, model, "bom", dataset=bom,
                                          output_dir=tmp_path / "bom-run"))
    assert len(run.samples) == 4 and not run.rejected
    f5 = write_random_model_dir(tmp_path / "f5", "v1_base", size="tiny")
    with pytest.raises(EngineMismatch, match="is a f5tts model, not a voxcpm one"):
        VoxCPMTrainer().prepare(_config(root, f5, "mismatch", output_dir=tmp_path / "mm"))
    # the class: loading for synthesis, either way round, and the F5 trainer
    with pytest.raises(EngineMismatch, match="not a voxcpm one"):
        mizuoto.load(f5, engine="voxcpm")
    with pytest.raises(EngineMismatch, match="is a voxcpm model, not a f5tts one"):
        mizuoto.load(model, engine="f5tts")
    with pytest.raises(EngineMismatch, match="is a voxcpm model"):
        get_trainer("f5tts")().prepare(_config(root, model, "mm2", output_dir=tmp_path / "mm2"))


def test_a_folder_with_train_and_validation_manifests(workspace, tmp_path):
    root, model = workspace
    rows = [json.loads(x) for x in (root / "train.jsonl").read_text().splitlines()]
    lines = "".join(json.dumps(dict(r, audio=str(root / r["audio"]))) + "\n" for r in rows)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(lines)
    (tmp_path / "data" / "val.jsonl").write_text(lines[:lines.index("\n") + 1])
    run = VoxCPMTrainer().prepare(_config(root, model, "folder", dataset=tmp_path / "data",
                                          output_dir=tmp_path / "run"))
    assert run.recipe.val_manifest == str(tmp_path / "data" / "val.jsonl")
    assert len(run.val_samples) == 1 and len(run.samples) == 4
    (tmp_path / "data" / "extra.jsonl").write_text(lines)
    with pytest.raises(InvalidRequest, match="train\\*.jsonl and a val\\*.jsonl"):
        VoxCPMTrainer().prepare(_config(root, model, "folder2", dataset=tmp_path / "data",
                                        output_dir=tmp_path / "run2"))


def test_validation_audio_samples_leave_the_training_bytes_alone(workspace):
    """Validation speaks two texts as upstream does; they are written as samples (and
    TensorBoard audio) by default and left out with samples=false: the steps, metrics and
    weights are the same bytes either way."""
    root, model = workspace
    params = {"warmup_steps": 1, "preview": False, "val_manifest": str(root / "train.jsonl"),
              "valid_interval": 2}
    trainer = VoxCPMTrainer()
    runs = {}
    for name, extra in (("with", {}), ("without", {"samples": False})):
        config = _config(root, model, f"samples-{name}", steps=3,
                         params={**params, **extra})
        trainer.train(trainer.prepare(config))
        runs[name] = config.output_dir
    for name in ("metrics.jsonl", "checkpoints/latest/trainable.safetensors"):
        assert (runs["with"] / name).read_bytes() == (runs["without"] / name).read_bytes()
    written = sorted(p.name for p in (runs["with"] / "samples").iterdir())
    assert written == ["step_0_0.wav", "step_0_1.wav", "step_2_0.wav", "step_2_1.wav"]
    audio, rate = sf.read(runs["with"] / "samples" / "step_2_1.wav")
    assert rate == 16000 and audio.size > 0 and np.isfinite(audio).all()
    assert not (runs["without"] / "samples").exists()
    with pytest.raises(InvalidRequest, match="params.samples"):
        trainer.prepare(_config(root, model, "bad-samples", params={"samples": "yes"}))
