"""F5Trainer on a tiny random model: data checks, train/export/load, resume after SIGKILL,
run-directory checks. (Equality with upstream's trainer is in parity/test_training_parity.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import soundfile
import torch

import mizuoto
from mizuoto import Reference, SynthesisRequest, TrainingConfig
from mizuoto.errors import InvalidRequest
from mizuoto.training.loader_order import SampleBatches
from mizuoto.training.state import load_state_file
from mizuoto.training.synthetic_data import write_synthetic_dataset
from mizuoto.training.trainer import CHECKPOINT
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.text import read_vocab
from mizuoto_f5tts.training import F5Trainer
from mizuoto_f5tts.training.batching import epoch_order, frame_batches
from mizuoto_f5tts.training.data import prepare_dataset, read_prepared

PARAMS = {"epochs": 3, "warmup_updates": 1, "batch_frames": 300}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_model_dir(tmp_path_factory.mktemp("f5") / "v1", "v1_base", size="tiny")


@pytest.fixture(scope="module")
def metadata(tmp_path_factory):
    return write_synthetic_dataset(tmp_path_factory.mktemp("data"), count=6, seed=3)


def _config(model_dir, metadata, output, **fields):
    fields.setdefault("params", PARAMS)
    return TrainingConfig(method="full", model=str(model_dir), dataset=metadata,
                          output_dir=output, steps=fields.pop("steps", 100),
                          learning_rate=1e-4, seed=5, save_every=fields.pop("save_every", 2),
                          **fields)


def test_bad_rows_are_reported_and_skipped(tmp_path, model_dir, metadata):
    wavs = metadata.parent / "wavs"
    silent = tmp_path / "silent.wav"
    soundfile.write(silent, np.zeros(24000, dtype=np.float32), 24000, subtype="PCM_16")
    short = tmp_path / "short.wav"
    soundfile.write(short, 0.1 * np.ones(2400, dtype=np.float32), 24000, subtype="PCM_16")
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF, but not really")
    good = wavs / "clip_000.wav"
    manifest = tmp_path / "data.jsonl"
    rows = [{"audio": str(good), "text": "Fine."},
            {"audio": "missing.wav", "text": "Where?"},
            {"audio": str(silent), "text": "Quiet."},
            {"audio": str(short), "text": "Too short."},
            {"audio": str(broken), "text": "Broken."},
            {"audio": str(good), "text": "  "},
            {"audio": str(good), "text": "snow \u2603"}]
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    vocab = read_vocab(model_dir / "vocab.txt")
    prepared = prepare_dataset(manifest, vocab, tmp_path / "prepared")
    assert [c.text for c in prepared.clips] == ["Fine."]
    reasons = {b.row: b.reason for b in prepared.bad_rows}
    assert set(reasons) == {2, 3, 4, 5, 6, 7, 8}
    assert "not found" in reasons[2] and reasons[3] == "silent"
    assert "outside [0.3, 30.0] s" in reasons[4] and "unreadable" in reasons[5]
    assert reasons[6] == "empty text" and "vocabulary" in reasons[7] and "JSON" in reasons[8]
    assert read_prepared(tmp_path / "prepared") == prepared


def test_metadata_csv_relative_paths(model_dir, metadata):
    prepared = prepare_dataset(metadata, read_vocab(model_dir / "vocab.txt"))
    assert len(prepared.clips) == 6 and not prepared.bad_rows
    assert prepared.clips[0].tokens[:5] == ("H", "e", "l", "l", "o")
    assert all(0.5 <= c.duration <= 1.6 for c in prepared.clips)


def test_no_usable_row_is_an_error(tmp_path, model_dir):
    (tmp_path / "metadata.csv").write_text("audio_file|text\nnope.wav|Hello.\n")
    with pytest.raises(InvalidRequest, match="no usable rows"):
        prepare_dataset(tmp_path, read_vocab(model_dir / "vocab.txt"))


def test_frame_batches_pack_sorted_clips():
    durations = [1.0, 0.5, 2.0, 40.0, 0.7]  # 93.75, 46.9, 187.5, 3750 (dropped), 65.6 frames
    assert frame_batches(durations, frames=210) == [[1, 4, 0], [2]]
    assert frame_batches(durations, frames=210, max_samples=2) == [[1, 4], [0], [2]]
    order = epoch_order([[0], [1], [2]], seed=666)
    assert sorted(map(tuple, order)) == [(0,), (1,), (2,)]
    batches = SampleBatches(5, 2, seed=666)
    assert len(batches) == 3 and sorted(sum(batches.epoch(), [])) == list(range(5))


def test_train_export_and_speak(tmp_path, model_dir, metadata):
    trainer = F5Trainer()
    run = trainer.prepare(_config(model_dir, metadata, tmp_path / "run", steps=4))
    seen = []
    result = trainer.train(run, progress=seen.append)
    assert result.steps_done == 4 and result.resumed_from is None
    assert [p.done for p in seen if p.stage == "train"] == [1, 2, 3, 4]
    assert np.isfinite(result.metrics["loss"])
    log = (tmp_path / "run" / "training_log.jsonl").read_text().splitlines()
    assert len(log) == 4 and json.loads(log[-1])["update"] == 4
    exported = trainer.export(run, tmp_path / "export")
    assert (exported / "model_4.safetensors").is_file()
    assert "CC-BY-NC-4.0" in (exported / "LICENSE.txt").read_text()
    tts = mizuoto.load(exported, options=mizuoto.Options.from_mapping(
        {"compute.device": "cpu", "compute.cpu_threads": 1}))
    ref = Reference(metadata.parent / "wavs" / "clip_001.wav", text="The quick brown fox jumps.")
    audio = tts.synthesize(SynthesisRequest("Hello.", reference=ref, seed=1, steps=2)).audio
    assert audio.samples.numel() > 0


def test_unknown_param_and_unwritable_output(tmp_path, model_dir, metadata):
    trainer = F5Trainer()
    with pytest.raises(InvalidRequest, match="no_such"):
        trainer.prepare(_config(model_dir, metadata, tmp_path / "a", params={"no_such": 1}))
    vocab = read_vocab(model_dir / "vocab.txt")
    updates = len(frame_batches(prepare_dataset(metadata, vocab).durations, 300))
    with pytest.raises(InvalidRequest, match="warmup"):  # upstream divides by zero
        trainer.prepare(_config(model_dir, metadata, tmp_path / "b",
                                params={"epochs": 1, "warmup_updates": updates,
                                        "batch_frames": 300}))
    # longer than the run: upstream's CLI default on small data sets; it runs there
    trainer.prepare(_config(model_dir, metadata, tmp_path / "b",
                            params={"epochs": 1, "warmup_updates": 50}))
    bad = [({"vocab_file": str(tmp_path / "none.txt")}, "params.vocab_file"),
           ({"vocab_file": 3}, "params.vocab_file"),
           ({"finetune": "yes"}, "params.finetune"),
           ({"keep_last_n_checkpoints": -2}, "params.keep_last_n_checkpoints"),
           ({"checkpoint_every": 0}, "params.checkpoint_every")]
    for params, field in bad:
        with pytest.raises(InvalidRequest) as caught:
            trainer.prepare(_config(model_dir, metadata, tmp_path / "c",
                                    params={**PARAMS, **params}))
        assert caught.value.field == field, params
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(InvalidRequest, match="output_dir"):
        trainer.prepare(_config(model_dir, metadata, blocked / "run"))


_SIGNALLED_RUN = """
import os, signal, sys
# as in a terminal: a runner started as a background job passes SIGINT on ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
from mizuoto import TrainingConfig
from mizuoto_f5tts.training import F5Trainer
model_dir, metadata, output, kill_at, name = sys.argv[1:6]
config = TrainingConfig(method="full", model=model_dir, dataset=metadata, output_dir=output,
                        steps=100, learning_rate=1e-4, seed=5, save_every=2,
                        params={params!r})
def progress(p):
    if p.stage == "train" and p.done == int(kill_at):
        os.kill(os.getpid(), getattr(signal, name))
trainer = F5Trainer()
result = trainer.train(trainer.prepare(config), progress=progress)
print(result.interrupted, result.steps_done)
"""


def _signalled_run(output, model_dir, metadata, params, kill_at, name):
    script = textwrap.dedent(_SIGNALLED_RUN).format(params=params)
    return subprocess.run([sys.executable, "-c", script, str(model_dir), str(metadata),
                           str(output), str(kill_at), name],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)


@pytest.mark.parametrize("kill_at", [3, 5])
def test_resume_after_sigkill_gives_the_same_bytes(tmp_path, model_dir, metadata, kill_at):
    params = {**PARAMS, "grad_accumulation": 2, "batch_frames": 250}
    killed = _signalled_run(tmp_path / "run", model_dir, metadata, params, kill_at, "SIGKILL")
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    saved = load_state_file(tmp_path / "run" / CHECKPOINT)
    assert saved["position"]["update"] == kill_at - 1
    _assert_resumes_to_the_straight_run(tmp_path, model_dir, metadata, params, kill_at - 1)


@pytest.mark.parametrize(("name", "stop_at"), [("SIGTERM", 3), ("SIGINT", 5)])
def test_a_signal_saves_the_checkpoint_and_resumes_to_the_same_bytes(tmp_path, model_dir,
                                                                    metadata, name, stop_at):
    """SIGTERM / SIGINT at an update that is not a multiple of save_every (2): the run stops
    after that update (with accumulation: never between micro-batches), saves it and returns."""
    params = {**PARAMS, "grad_accumulation": 2, "batch_frames": 250}
    stopped = _signalled_run(tmp_path / "run", model_dir, metadata, params, stop_at, name)
    assert stopped.returncode == 0, stopped.stderr.decode()[-2000:]
    assert stopped.stdout.decode().split() == [name, str(stop_at)]
    saved = load_state_file(tmp_path / "run" / CHECKPOINT)
    assert saved["position"]["update"] == stop_at
    assert saved["records"][-1][0] == stop_at  # the log ends at the update
    log = (tmp_path / "run" / "training_log.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["update"] == stop_at
    _assert_resumes_to_the_straight_run(tmp_path, model_dir, metadata, params, stop_at)


def _assert_resumes_to_the_straight_run(tmp_path, model_dir, metadata, params, resumed_from):
    trainer = F5Trainer()
    resumed = trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / "run",
                                                    params=params)))
    assert resumed.resumed_from == resumed_from and resumed.interrupted is None
    straight = trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / "straight",
                                                     params=params)))
    assert resumed.steps_done == straight.steps_done > resumed_from
    a = load_state_file(tmp_path / "run" / CHECKPOINT)
    b = load_state_file(tmp_path / "straight" / CHECKPOINT)
    assert a["records"] == b["records"]
    for part in ("model", "ema"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in b[part]), part


def test_mizuoto_train_command(tmp_path, model_dir, metadata):
    from click.testing import CliRunner

    from mizuoto.cli import cli

    args = ["--quiet", "train", "-e", "f5tts", "-m", str(model_dir), "--data", str(metadata),
            "--output", str(tmp_path / "run"), "--steps", "2", "--learning-rate", "1e-4"]
    result = CliRunner().invoke(cli, args, obj={}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "export" / "model_2.safetensors").is_file()
    again = CliRunner().invoke(cli, args, obj={}, catch_exceptions=False)
    assert result.exit_code == 0 and "Trained 2 steps" in result.output
    # the rerun trains nothing: it says so, rather than "Trained 2 steps"
    assert again.exit_code == 0 and "Trained" not in again.output
    assert "Nothing to train" in again.output and "its 2 steps" in again.output


@pytest.mark.parametrize("variant", ["base", "e2_base"])
def test_memory_levels_give_the_same_bytes(tmp_path, metadata, variant):
    model_dir = write_random_model_dir(tmp_path / "model", variant, size="tiny")
    trainer = F5Trainer()
    states = {}
    for memory in ("default", "low", "lowest"):
        run = trainer.prepare(_config(model_dir, metadata, tmp_path / memory, steps=3,
                                      memory=memory))
        trainer.train(run)
        states[memory] = load_state_file(tmp_path / memory / CHECKPOINT)
    for memory in ("low", "lowest"):
        assert states[memory]["records"] == states["default"]["records"]
        for part in ("model", "ema"):
            assert all(torch.equal(states[memory][part][k], v)
                       for k, v in states["default"][part].items()), (memory, part)


_DDP_DRIVER = """
import json, sys
import torch
import torch.distributed as dist
from mizuoto import TrainingConfig
from mizuoto_f5tts.training import F5Trainer, loop
model_dir, metadata, root = sys.argv[1:4]
checked = []
next_update = loop.FineTuning.update
def checked_update(self):
    values = next_update(self)
    # after every update: the same parameters on every rank
    flat = torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])
    every = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    assert all(torch.equal(x, every[0]) for x in every), self.position.update
    checked.append(self.position.update)
    return values
loop.FineTuning.update = checked_update
report = {{}}
for name, shard in (("sharded", True), ("replicated", False)):
    output = f"{{root}}/{{name}}"
    config = TrainingConfig(method="full", model=model_dir, dataset=metadata, output_dir=output,
                            steps=100, learning_rate=1e-4, seed=5, save_every=2,
                            params={{**{params!r}, "shard_batches": shard}})
    checked.clear()
    trainer = F5Trainer()
    run = trainer.prepare(config)
    result = trainer.train(run)
    trainer.export(run, output + "/export")
    report[name] = {{"checked": list(checked), "steps": result.steps_done}}
if dist.get_rank() == 0:
    with open(root + "/checked.json", "w") as f:
        json.dump(report, f)
"""


def test_two_processes_stay_identical_and_match_one_when_not_sharded(tmp_path, model_dir,
                                                                      metadata):
    params = {**PARAMS, "grad_accumulation": 2, "batch_frames": 250}
    script = tmp_path / "ddp_driver.py"
    script.write_text(textwrap.dedent(_DDP_DRIVER).format(params=params))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), str(model_dir), str(metadata), str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    report = json.loads((tmp_path / "checked.json").read_text())
    sharded, replicated = report["sharded"], report["replicated"]
    assert sharded["checked"] == list(range(1, sharded["steps"] + 1))
    assert (tmp_path / "sharded" / "export").is_dir()

    trainer = F5Trainer()
    single = trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / "single",
                                                   params=params)))
    assert replicated["checked"] == list(range(1, single.steps_done + 1))
    a = load_state_file(tmp_path / "replicated" / CHECKPOINT)
    b = load_state_file(tmp_path / "single" / CHECKPOINT)
    assert a["records"] == b["records"]
    for part in ("model", "ema"):
        assert all(torch.equal(a[part][k], v) for k, v in b[part].items()), part


def test_extend_vocab_grows_the_embedding_as_upstream(tmp_path, metadata):
    from safetensors.torch import load_file

    from mizuoto_f5tts.checkpoint import find_checkpoint, read_checkpoint

    model_dir = write_random_model_dir(tmp_path / "model", "v1_base", size="tiny",
                                       vocab=[" ", "a", "b"])
    new_csv = metadata.parent / "small.csv"
    new_csv.write_text("audio_file|text\nwavs/clip_000.wav|abc!\nwavs/clip_001.wav|bad\n")
    trainer = F5Trainer()
    with pytest.raises(InvalidRequest, match="no usable rows"):
        trainer.prepare(_config(model_dir, new_csv, tmp_path / "refused", steps=1,
                                params={"epochs": 1}))
    run = trainer.prepare(_config(model_dir, new_csv, tmp_path / "run", steps=1,
                                  params={"epochs": 1, "extend_vocab": True}))
    assert run.new_tokens == 3 and list(run.vocab) == [" ", "a", "b", "c", "!", "d"]
    trainer.train(run)
    exported = trainer.export(run, tmp_path / "export")
    assert (exported / "vocab.txt").read_text() == " \na\nb\nc\n!\nd\n"
    base = read_checkpoint(find_checkpoint(model_dir))["transformer.text_embed.text_embed.weight"]
    torch.manual_seed(666)  # upstream's expand_model_embeddings
    expected = torch.cat([base, torch.randn((3, base.shape[1]))])
    state = load_state_file(tmp_path / "run" / CHECKPOINT)
    assert state["model"]["transformer.text_embed.text_embed.weight"].shape == expected.shape
    ema = load_file(str(find_checkpoint(exported)))
    assert ema["ema_model.transformer.text_embed.text_embed.weight"].shape == (7, base.shape[1])
    assert mizuoto.load(exported) is not None
    from mizuoto_f5tts.training.trainer import expand_text_embedding

    assert torch.equal(expand_text_embedding(base, 3), expected)


def test_vocab_file_and_training_from_scratch(tmp_path, model_dir, metadata):
    trainer = F5Trainer()
    short = tmp_path / "short_vocab.txt"
    tokens = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    short.write_text("".join(f"{t}\n" for t in tokens[:-1]), encoding="utf-8")
    with pytest.raises(InvalidRequest, match="text embedding") as caught:
        trainer.prepare(_config(model_dir, metadata, tmp_path / "a",
                                params={**PARAMS, "vocab_file": str(short)}))
    assert caught.value.field == "params.vocab_file"
    # from scratch the vocabulary sets the embedding's size; no base weights are loaded
    run = trainer.prepare(_config(model_dir, metadata, tmp_path / "b", steps=1,
                                  params={**PARAMS, "vocab_file": str(short),
                                          "finetune": False}))
    trainer.train(run)
    state = load_state_file(tmp_path / "b" / CHECKPOINT)
    assert state["model"]["transformer.text_embed.text_embed.weight"].shape[0] == len(tokens)
    assert state["ema"]["step"].item() == 1  # a fresh EMA, not the base file's counter
    exported = trainer.export(run, tmp_path / "export")
    assert (exported / "vocab.txt").read_bytes() == short.read_bytes()
    assert "random initialisation" in (exported / "LICENSE.txt").read_text()
    assert json.loads((exported / "training.json").read_text())["initialisation"] == "random"


def test_numbered_checkpoints_rotate_across_a_resume(tmp_path, model_dir, metadata):
    trainer = F5Trainer()
    params = {**PARAMS, "keep_last_n_checkpoints": 2, "checkpoint_every": 1}
    folder = tmp_path / "run" / "checkpoints"
    trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / "run", steps=4,
                                          save_every=3, params=params)))
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt", "model_3.pt", "model_4.pt"]
    assert load_state_file(folder / "model_3.pt")["position"]["update"] == 3
    trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / "run", steps=6,
                                          save_every=3, params={**params,
                                                                "checkpoint_every": 5})))
    assert sorted(p.name for p in folder.iterdir()) == ["last.pt", "model_4.pt", "model_5.pt"]
    # a numbered copy is a whole run checkpoint: put back as last.pt it resumes from there
    last = load_state_file(folder / "last.pt")
    assert last["position"]["update"] == 6
    five = load_state_file(folder / "model_5.pt")
    assert five["position"]["update"] == 5 and len(five["records"]) < len(last["records"])


def test_a_full_disk_is_refused_before_training(tmp_path, model_dir, metadata, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(InvalidRequest, match="MiB free"):
        F5Trainer().prepare(_config(model_dir, metadata, tmp_path / "run"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_resuming_with_other_settings_is_refused(tmp_path, model_dir, metadata):
    trainer = F5Trainer()
    trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / "run", steps=2)))
    longer = trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / "run",
                                                   steps=3)))
    assert longer.resumed_from == 2 and longer.steps_done == 3
    other = trainer.prepare(_config(model_dir, metadata, tmp_path / "run", steps=4,
                                    params={**PARAMS, "grad_accumulation": 2}))
    with pytest.raises(InvalidRequest, match="other settings"):
        trainer.train(other)


_DDP_KILLED = """
import os, signal, sys
from mizuoto import TrainingConfig
from mizuoto_f5tts.training import F5Trainer
model_dir, metadata, output, kill_at, name = sys.argv[1:6]
config = TrainingConfig(method="full", model=model_dir, dataset=metadata, output_dir=output,
                        steps=100, learning_rate=1e-4, seed=5, save_every=2,
                        params={params!r})
def progress(p):  # only rank 0 reports progress
    if p.stage == "train" and p.done == int(kill_at):
        os.kill(os.getpid(), getattr(signal, name))
trainer = F5Trainer()
result = trainer.train(trainer.prepare(config), progress=progress)
os.write(1, f"{{os.environ['RANK']}} {{result.interrupted}} {{result.steps_done}}\\n".encode())
"""


def _torchrun(script, model_dir, metadata, output, kill_at, name="SIGKILL"):
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", str(script), str(model_dir), str(metadata), str(output), str(kill_at), name],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600)


@pytest.mark.realsize  # three two-process runs: out of CI's time budget
def test_two_processes_resume_after_sigkill(tmp_path, model_dir, metadata):
    params = {**PARAMS, "grad_accumulation": 2, "batch_frames": 250}
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(_DDP_KILLED).format(params=params))
    # killed in update 2's progress report, after its save (save_every 2): resumes from 2
    assert _torchrun(script, model_dir, metadata, tmp_path / "run", 2).returncode != 0
    assert load_state_file(tmp_path / "run" / CHECKPOINT)["position"]["update"] == 2
    _assert_two_processes_resume_to_the_straight_run(tmp_path, script, model_dir, metadata)


@pytest.mark.realsize  # three two-process runs: out of CI's time budget
def test_two_processes_stop_together_on_a_signal_to_one(tmp_path, model_dir, metadata):
    """SIGTERM reaches rank 0 only, at update 1 (of 3): both ranks agree (all-reduce) to stop
    after it, the checkpoint holds update 1 and every rank's RNG state, and resuming gives the
    bytes of an uninterrupted run."""
    params = {**PARAMS, "grad_accumulation": 2, "batch_frames": 250}
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(_DDP_KILLED).format(params=params))
    stopped = _torchrun(script, model_dir, metadata, tmp_path / "run", 1, "SIGTERM")
    assert stopped.returncode == 0, stopped.stderr.decode(errors="replace")[-3000:]
    assert sorted(stopped.stdout.decode().splitlines()) == ["0 SIGTERM 1", "1 SIGTERM 1"]
    saved = load_state_file(tmp_path / "run" / CHECKPOINT)
    assert saved["position"]["update"] == 1 and len(saved["rng"]) == 2
    _assert_two_processes_resume_to_the_straight_run(tmp_path, script, model_dir, metadata)


def _assert_two_processes_resume_to_the_straight_run(tmp_path, script, model_dir, metadata):
    for output in (tmp_path / "run", tmp_path / "straight"):
        done = _torchrun(script, model_dir, metadata, output, 0)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    a = load_state_file(tmp_path / "run" / CHECKPOINT)
    b = load_state_file(tmp_path / "straight" / CHECKPOINT)
    assert a["position"] == b["position"] and a["records"] == b["records"]
    assert a["rng"][1]["torch_rng"].equal(b["rng"][1]["torch_rng"])
    for part in ("model", "ema"):
        assert all(torch.equal(a[part][k], v) for k, v in b[part].items()), part


def test_malformed_csv_rows_are_skipped_and_named(tmp_path, model_dir, metadata):
    """A field over csv's 131072-character limit and a quote left open (which would swallow
    the rows after it) are bad rows of their own; the rows around them still train."""
    good = (metadata.parent / "wavs" / "clip_000.wav").resolve()
    csv_path = tmp_path / "metadata.csv"
    csv_path.write_text(f"audio_file|text\n{good}|{'x' * 140_000}\n{good}|Fine.\n"
                        f'{good}|"open quote\n{good}|swallowed"\n{good}|Also fine.\n'
                        f"wavs/a\0b.wav|A NUL in the path.\n", encoding="utf-8")
    prepared = prepare_dataset(csv_path, read_vocab(model_dir / "vocab.txt"))
    assert [c.text for c in prepared.clips] == ["Fine.", "Also fine."]
    reasons = {b.row: b.reason for b in prepared.bad_rows}
    assert set(reasons) == {2, 4, 7} and "unusable audio path" in reasons[7]
    assert "field larger than field limit" in reasons[2]
    assert "lines 4-5" in reasons[4] and "quote" in reasons[4]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_manifest_not_in_utf8_is_a_named_error(tmp_path, model_dir, metadata, suffix):
    good = (metadata.parent / "wavs" / "clip_000.wav").resolve()
    manifest = tmp_path / f"data{suffix}"
    text = (f"audio_file|text\n{good}|Caf\xe9 au lait.\n" if suffix == ".csv"
            else json.dumps({"audio": str(good), "text": "Caf\xe9"}, ensure_ascii=False) + "\n")
    manifest.write_bytes(text.encode("latin-1"))
    with pytest.raises(InvalidRequest, match="not UTF-8") as caught:
        F5Trainer().prepare(_config(model_dir, manifest, tmp_path / "run"))
    assert caught.value.field == "dataset" and str(manifest) in str(caught.value)


def test_a_resume_onto_another_base_model_or_data_set_is_refused(tmp_path, model_dir, metadata):
    trainer = F5Trainer()
    run_dir = tmp_path / "run"
    trainer.train(trainer.prepare(_config(model_dir, metadata, run_dir, steps=1)))
    other_model = write_random_model_dir(tmp_path / "other", "v1_base", size="tiny", seed=9)
    with pytest.raises(InvalidRequest, match="another base model or data set") as caught:
        trainer.prepare(_config(other_model, metadata, run_dir, steps=2))
    assert f"base model {model_dir}" in str(caught.value)
    assert f"-> {other_model}" in str(caught.value) and "(rows " not in str(caught.value)
    other_data = write_synthetic_dataset(tmp_path / "data2", count=6, seed=4)
    with pytest.raises(InvalidRequest, match=r"data set .* -> .*data2"):
        trainer.prepare(_config(model_dir, other_data, run_dir, steps=2))
    with pytest.raises(InvalidRequest) as both:
        trainer.prepare(_config(other_model, other_data, run_dir, steps=2))
    assert "(weights " in str(both.value) and "(rows " in str(both.value)
    # the same data moved elsewhere is the same data set: the run resumes
    moved = tmp_path / "moved"
    import shutil

    shutil.copytree(metadata.parent, moved)
    resumed = trainer.train(trainer.prepare(_config(model_dir, moved / "metadata.csv", run_dir,
                                                    steps=2)))
    assert resumed.resumed_from == 1 and resumed.steps_done == 2


def test_a_tiny_run_writes_metrics_tensorboard_and_progress(tmp_path, model_dir, metadata):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    seen = []
    trainer = F5Trainer()
    trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / "run", steps=3)),
                  progress=seen.append)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # the update number, as every trainer logs it
    assert all(set(r) == {"step", "loss", "lr", "grad_norm"} for r in rows)
    records = load_state_file(tmp_path / "run" / CHECKPOINT)["records"]
    assert rows[-1]["loss"] == records[-1][1] and rows[-1]["lr"] == records[-1][2]
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3]
    train = [p for p in seen if p.stage == "train"]
    assert [p.done for p in train] == [1, 2, 3] and train[-1].total == 3
    assert train[-1].detail.startswith("loss ") and "ETA 0:00:00" in train[-1].detail
    recipe = json.loads((tmp_path / "run" / "recipe.json").read_text())
    assert recipe["warmup_updates"] == 1 and recipe["batch_frames"] == 300
    assert "batch_size" not in recipe and "batch_frames" not in recipe["params"]
    assert recipe["logger"] == "tensorboard"


def test_train_cli_takes_upstream_flags_and_refuses_what_does_not_apply(tmp_path, model_dir,
                                                                         metadata):
    """``--config`` with f5-tts_finetune-cli's flag names trains what the same settings under
    our names train through the API (the same checkpoint bytes); a batch size under frame
    batching, an unknown key and another engine's model are refused by name."""
    from click.testing import CliRunner

    from mizuoto.cli import cli

    def run(*args):
        return CliRunner().invoke(cli, ["train", *map(str, args)], obj={},
                                  catch_exceptions=False)

    config = tmp_path / "upstream.toml"
    config.write_text("exp_name = \"F5TTS_v1_Base\"\nlearning_rate = 1e-4\n"
                      "batch_size_per_gpu = 300\nbatch_size_type = \"frame\"\n"
                      "num_warmup_updates = 1\nepochs = 3\nlast_per_updates = 2\n"
                      "save_per_updates = 2\nkeep_last_n_checkpoints = 1\n"
                      "grad_accumulation_steps = 1\nmax_grad_norm = 1.0\n")
    done = run("-e", "f5tts", "-m", model_dir, "--data", metadata, "--output", tmp_path / "cli",
               "--config", config, "--steps", 3, "--seed", 5)
    assert done.exit_code == 0, done.output
    assert "Recipe (" in done.output and "warmup_updates = 1" in done.output
    trainer = F5Trainer()
    api = _config(model_dir, metadata, tmp_path / "api", steps=3,
                  params={**PARAMS, "variant": "v1_base", "keep_last_n_checkpoints": 1,
                          "checkpoint_every": 2, "max_samples": 64})
    trainer.train(trainer.prepare(api))
    a = load_state_file(tmp_path / "cli" / CHECKPOINT)
    b = load_state_file(tmp_path / "api" / CHECKPOINT)
    assert a["records"] == b["records"]
    assert all(torch.equal(a["ema"][k], v) for k, v in b["ema"].items())
    assert sorted(p.name for p in (tmp_path / "cli" / "checkpoints").glob("model_*")) == \
        ["model_2.pt"]

    refused = run("-e", "f5tts", "-m", model_dir, "--data", metadata, "--output",
                  tmp_path / "r1", "--batch-size", 8)
    assert refused.exit_code == 2 and "frame batching" in refused.output
    unknown = run("-e", "f5tts", "-m", model_dir, "--data", metadata, "--output",
                  tmp_path / "r2", "--param", "warmup_update=3")
    assert unknown.exit_code == 2 and "warmup_update" in unknown.output
    mismatch = run("-e", "voxcpm", "-m", model_dir, "--data", metadata, "--output",
                   tmp_path / "r3")
    assert mismatch.exit_code == 3 and "f5tts model, not a voxcpm one" in mismatch.output
    assert not (tmp_path / "r3" / "checkpoints").exists()


def test_train_help_describes_every_option():
    from click.testing import CliRunner

    from mizuoto.cli import cli
    from mizuoto.commands.train import train

    assert all(option.help for option in train.params if option.param_type_name == "option")
    text = CliRunner().invoke(cli, ["train", "--help"], obj={}).output
    assert "metadata.csv" in text and "JSONL" in text and "--config" in text


def test_samples_while_training_leave_the_training_bytes_alone(tmp_path, model_dir, metadata):
    """log_samples: samples/update_<N>_{gen,ref}.wav every checkpoint_every updates (and
    TensorBoard audio); the checkpoint holds the same tensors, RNG states and log as the run's
    without samples (its file's bytes differ only by the archive's inner name)."""
    import soundfile as sf

    trainer = F5Trainer()
    results = {}
    for name, extra in (("plain", {}), ("samples", {"log_samples": True})):
        params = {**PARAMS, "checkpoint_every": 2, **extra}
        trainer.train(trainer.prepare(_config(model_dir, metadata, tmp_path / name, steps=3,
                                              params=params)))
        results[name] = load_state_file(tmp_path / name / CHECKPOINT)
    plain, sampled = results["plain"], results["samples"]
    assert plain["records"] == sampled["records"] and plain["position"] == sampled["position"]
    assert plain["rng"][0]["torch_rng"].equal(sampled["rng"][0]["torch_rng"])
    assert plain["rng"][0]["python_rng"] == sampled["rng"][0]["python_rng"]
    for part in ("model", "ema"):
        assert all(torch.equal(plain[part][k], v) for k, v in sampled[part].items()), part
    moments = [(a["exp_avg"], b["exp_avg"]) for a, b in zip(
        plain["optimizer"]["state"].values(), sampled["optimizer"]["state"].values(),
        strict=True)]
    assert all(torch.equal(a, b) for a, b in moments)
    written = sorted(p.name for p in (tmp_path / "samples" / "samples").iterdir())
    assert written == ["update_2_gen.wav", "update_2_ref.wav"]
    gen, rate = sf.read(tmp_path / "samples" / "samples" / "update_2_gen.wav")
    ref, _ = sf.read(tmp_path / "samples" / "samples" / "update_2_ref.wav")
    assert rate == 24000 and gen.size > 0 and abs(gen.size - ref.size) <= 256
    assert not (tmp_path / "plain" / "samples").exists()
    if (tmp_path / "samples" / "tensorboard").is_dir():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(tmp_path / "samples" / "tensorboard"),
                                  size_guidance={"audio": 0})
        events.Reload()
        assert [e.step for e in events.Audio("samples/gen")] == [2]


def test_settings_of_the_other_batching_mode_are_refused(tmp_path, model_dir, metadata):
    trainer = F5Trainer()
    with pytest.raises(InvalidRequest, match="frame batching") as frame:
        trainer.prepare(_config(model_dir, metadata, tmp_path / "a", batch_size=4))
    assert frame.value.field == "batch_size"
    for key, value in (("batch_frames", 500), ("max_samples", 8)):
        with pytest.raises(InvalidRequest, match="frame batching only") as sample:
            trainer.prepare(_config(model_dir, metadata, tmp_path / key, batch_size=2,
                                    params={**PARAMS, "batch_size_type": "sample",
                                            "batch_frames": 3200, key: value}))
        assert sample.value.field == f"params.{key}"
    # upstream's defaults of the other mode change nothing: accepted
    trainer.prepare(_config(model_dir, metadata, tmp_path / "ok", batch_size=2,
                            params={"batch_size_type": "sample", "batch_frames": 3200,
                                    "max_samples": 64, "epochs": 1}))


def test_training_audio_is_refused_by_its_header_before_it_is_decoded(tmp_path, monkeypatch):
    """Upstream's length filter reads the header core's reader gave the row (a file that is
    not a regular one is core's rejection: mizuoto-core's test_training_manifest_rows)."""
    import numpy as np
    import soundfile

    from mizuoto.training.manifest import manifest_row
    from mizuoto_f5tts.training.data import _check_audio

    long_clip = tmp_path / "long.flac"  # 9 minutes at 16 kHz stereo
    soundfile.write(long_clip, np.full((16_000 * 540, 2), 0.2, np.float32), 16_000)
    decoded = []

    def read(file, *args, **kwargs):  # a decode here is what the test refuses
        decoded.append(file)
        raise OSError("decoded")

    monkeypatch.setattr(soundfile, "read", read)
    row = manifest_row(1, {"audio": "long.flac", "text": "x"}, tmp_path, headers=True)
    assert _check_audio(row) == (None, "duration 540.00 s outside [0.3, 30.0] s")
    kept, reason = _check_audio(row, duration=4.0)  # a declared length it belies
    assert kept is None and "540 s of audio by its header" in reason
    assert decoded == []
