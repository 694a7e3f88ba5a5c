"""Fine-tuning against upstream f5-tts 1.1.22's trainer, update for update.

Upstream runs as a subprocess (`f5_train_oracle.py`: ``prepare_csv_wavs`` + ``Trainer`` as
``finetune_cli.py`` sets them up, one thread) on deterministic synthetic clips and a random
tiny model directory; Mizuoto's `F5Trainer` trains the same model on the same clips with the
same seed. Compared exactly: every logged loss and learning rate (``==`` on the Python floats
upstream logs), and the final model and EMA tensors (``torch.equal``; upstream's
``model_last.pt`` vs Mizuoto's run checkpoint and export), and the speech of each side's
fine-tuned model synthesized by the other side. A resumed case stops Mizuoto's run
early and resumes it from its checkpoint: it still ends on upstream's uninterrupted bytes.
Upstream's other result-affecting options each have a case: a custom vocabulary
(``--tokenizer custom``), training from the random initialisation (no ``--finetune``), a
warm-up longer than the run (its CLI default on small data), and numbered checkpoints with
rotation (``--save_per_updates``, ``--keep_last_n_checkpoints``, ``--last_per_updates``:
the same files kept, holding the same model, EMA and optimiser tensors).
Mixed precision: upstream under accelerate's ``mixed_precision="bf16"`` (its forward under
CPU autocast) against Mizuoto's ``mixed_precision="bf16"``; fp16 needs CUDA (the GPU check).
Cases marked ``realsize`` repeat covered paths and stay out of CI's time budget.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import torch

from mizuoto import TrainingConfig
from mizuoto.training.state import load_state_file
from mizuoto.training.synthetic_data import write_synthetic_dataset
from mizuoto.training.trainer import CHECKPOINT
from mizuoto_f5tts.checkpoint import find_checkpoint
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.training import F5Trainer
from mizuoto_f5tts.variants import get_variant

pytestmark = pytest.mark.parity

ORACLE = Path(__file__).parent / "f5_train_oracle.py"
SEED = 1234


def _absolute_csv(metadata: Path, destination: Path) -> Path:
    """Upstream's prepare_csv_wavs wants absolute paths."""
    lines = metadata.read_text(encoding="utf-8").splitlines()
    rows = [lines[0]] + [f"{(metadata.parent / a).resolve()}|{t}"
                         for a, t in (line.split("|", 1) for line in lines[1:])]
    destination.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return destination


def _arch(variant: str, size: str = "tiny"):
    """A released family at ``size``, or one of test_pipeline_parity's other widths."""
    from test_pipeline_parity import WIDE

    return WIDE[variant] if variant in WIDE else get_variant(variant, size)


def upstream_config(work: Path, model_dir: Path, metadata: Path, variant: str,
                    size: str = "tiny", seed: int = SEED, **settings) -> dict:
    v = _arch(variant, size)
    work.mkdir(parents=True)
    return dict(
        work_dir=str(work), metadata=str(_absolute_csv(metadata, work / "metadata.csv")),
        vocab=str(model_dir / "vocab.txt"), checkpoint=str(find_checkpoint(model_dir)),
        backbone=v.backbone, arch=v.upstream_config(), seed=seed, **settings)


def run_oracle(configs: list[dict], config_path: Path) -> None:
    config_path.write_text(json.dumps(configs))
    done = subprocess.run([sys.executable, str(ORACLE), str(config_path)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]


def upstream_result(work: Path) -> dict:
    log = json.loads((work / "log.json").read_text())
    last = torch.load(work / "ckpts" / "model_last.pt", map_location="cpu", weights_only=True)
    return {"log": log, "last": last}


def run_ours(tmp: Path, model_dir: Path, metadata: Path, settings: dict,
             stop_at: int | None = None, seed: int = SEED) -> dict:
    params = {"epochs": settings["epochs"], "warmup_updates": settings["warmup"],
              "batch_size_type": settings["batch_size_type"],
              "max_samples": settings["max_samples"],
              "grad_accumulation": settings["grad_accumulation"],
              "max_grad_norm": settings["max_grad_norm"]}
    if settings["batch_size_type"] == "frame":
        params["batch_frames"] = settings["batch_size"]
    save_every = settings["save_every"]
    for key in ("vocab_file", "finetune"):
        if key in settings:
            params[key] = settings[key]
    if "keep_last_n" in settings:  # upstream's save_per_updates / last_per_updates
        params.update(keep_last_n_checkpoints=settings["keep_last_n"],
                      checkpoint_every=settings["save_every"])
        save_every = settings.get("last_every", save_every)
    config = TrainingConfig(
        method="full", model=str(model_dir), dataset=metadata, output_dir=tmp / "ours",
        steps=10_000, learning_rate=settings["learning_rate"],
        batch_size=settings["batch_size"] if settings["batch_size_type"] == "sample" else 1,
        seed=seed, save_every=save_every, params=params,
        mixed_precision=settings.get("mixed_precision", "auto"))
    trainer = F5Trainer()
    start = time.perf_counter()
    if stop_at is not None:  # a first run that stops early; the second resumes it
        first = trainer.prepare(attrs.evolve(config, steps=stop_at))
        assert trainer.train(first).steps_done == stop_at
    run = trainer.prepare(config)
    result = trainer.train(run)
    assert result.resumed_from == stop_at
    seconds = time.perf_counter() - start
    exported = trainer.export(run, tmp / "export")
    state = load_state_file(tmp / "ours" / CHECKPOINT)
    return {"result": result, "state": state, "seconds": seconds, "export": exported}


def assert_same_training(upstream: dict, ours: dict) -> None:
    theirs = [(r["update"], r["loss"], r["lr"]) for r in upstream["log"]["records"]]
    mine = [tuple(r) for r in ours["state"]["records"]]
    assert len(mine) == len(theirs)
    for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        assert a == b, f"record {index}: ours {a}, upstream {b}"
    last = upstream["last"]
    assert last["update"] == ours["state"]["position"]["update"]
    for name, key in (("model", "model_state_dict"), ("ema", "ema_model_state_dict")):
        mine_state, their_state = ours["state"][name], last[key]
        assert list(mine_state) == list(their_state), name
        for k in their_state:
            assert torch.equal(mine_state[k], their_state[k]), f"{name}: {k}"
    from safetensors.torch import load_file

    exported = load_file(str(find_checkpoint(ours["export"])))
    assert set(exported) == set(last["ema_model_state_dict"])
    for k, v in last["ema_model_state_dict"].items():
        assert torch.equal(exported[k], v), k


def assert_same_numbered(upstream_ckpts: Path, ours: Path) -> None:
    """Upstream's kept ``model_<update>.pt`` files and ours: same names, same tensors."""
    def numbered(folder):
        return sorted(p.name for p in folder.glob("model_*.pt") if p.name != "model_last.pt")

    names = numbered(upstream_ckpts)
    assert names and numbered(ours) == names
    for name in names:
        theirs = torch.load(upstream_ckpts / name, map_location="cpu", weights_only=True)
        mine = load_state_file(ours / name)
        assert mine["position"]["update"] == theirs["update"], name
        for part, key in (("model", "model_state_dict"), ("ema", "ema_model_state_dict")):
            assert all(torch.equal(mine[part][k], v) for k, v in theirs[key].items()), name
        their_moments, my_moments = theirs["optimizer_state_dict"], mine["optimizer"]
        for index, moments in their_moments["state"].items():
            for k in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(my_moments["state"][index][k], moments[k]), (name, index, k)


def assert_cross_loads(tmp: Path, upstream_ckpts: Path, export: Path, variant: str,
                       monkeypatch) -> None:
    """A model fine-tuned by either side speaks identically through the other: upstream's
    inference (``load_model`` on Mizuoto's export) and Mizuoto's engine (on upstream's
    ``model_last.pt``) give the same mel and audio (test_pipeline_parity.py's drivers)."""
    import shutil

    from f5_tts.infer import utils_infer
    from f5_tts.model import DiT, UNetT
    from test_pipeline_parity import (
        EN_GEN,
        EN_TEXT,
        EN_WAV,
        _assert_same,
        _ours_synthesize,
        _upstream_synthesize,
    )

    import mizuoto
    from mizuoto_f5tts.engine import F5Engine

    v = _arch(variant)
    model = utils_infer.load_model(
        DiT if v.backbone == "dit" else UNetT, v.upstream_config(), str(find_checkpoint(export)),
        mel_spec_type="vocos", vocab_file=str(export / "vocab.txt"), device="cpu")
    vocoder = utils_infer.load_vocoder("vocos", is_local=True, local_path=str(export / "vocos"),
                                       device="cpu")
    wave, their_mels = _upstream_synthesize(utils_infer, model, vocoder, EN_WAV, EN_TEXT, EN_GEN,
                                            steps=4, monkeypatch=monkeypatch)

    their_dir = tmp / "upstream-model"
    their_dir.mkdir()
    shutil.copy(upstream_ckpts / "model_last.pt", their_dir / "model_last.pt")
    shutil.copy(export / "vocab.txt", their_dir / "vocab.txt")
    shutil.copytree(export / "vocos", their_dir / "vocos")
    options = mizuoto.Options.from_mapping({"compute.device": "cpu",
                                            "engines.f5tts.variant": v.name})
    engine = F5Engine.load(their_dir, options=options)
    result, mels = _ours_synthesize(engine, EN_WAV, EN_TEXT, EN_GEN, steps=4)
    _assert_same(result, mels, wave, their_mels, several=False)


BASE = dict(epochs=2, learning_rate=1e-4, warmup=2, save_every=100, batch_size_type="frame",
            batch_size=300, max_samples=64, grad_accumulation=1, max_grad_norm=1.0)


SLOW = pytest.mark.realsize  # more of the same paths: kept out of CI's time budget


CASES = [
    pytest.param("v1_base", {}, id="v1-frame", marks=SLOW),
    pytest.param("v1_base", {"epochs": 3, "grad_accumulation": 2, "batch_size": 250},
                 id="v1-frame-accum"),
    pytest.param("v1_base", {"batch_size_type": "sample", "batch_size": 2, "epochs": 3},
                 id="v1-sample"),
    pytest.param("v1_base", {"epochs": 3, "grad_accumulation": 2, "batch_size": 250,
                             "stop_at": 2}, id="v1-frame-accum-resumed"),
    pytest.param("base", {"epochs": 3}, id="v0-frame", marks=SLOW),
    pytest.param("base", {"checkpoint_format": "pt"}, id="v0-frame-pt-checkpoint", marks=SLOW),
    pytest.param("base", {"batch_size_type": "sample", "batch_size": 4, "grad_accumulation": 2,
                          "epochs": 3}, id="v0-sample-accum"),
    pytest.param("e2_base", {}, id="e2-frame", marks=SLOW),
    pytest.param("v1_base", {"size": "real", "clips": 2, "epochs": 1, "warmup": 0,
                             "batch_size": 3200}, id="v1-real-one-update", marks=SLOW),
    pytest.param("e2_base", {"batch_size_type": "sample", "batch_size": 3,
                             "grad_accumulation": 3, "epochs": 3}, id="e2-sample-accum"),
    # other widths (auto-detected by Mizuoto), seeds, rates, clipping and schedules
    pytest.param("wide_v1", {"seed": 0, "batch_size_type": "sample", "batch_size": 2,
                             "learning_rate": 1e-3, "warmup": 1, "max_grad_norm": 0.05},
                 id="wide-v1-sample-seed0"),
    pytest.param("wide_e2", {"seed": 2**31 - 1, "grad_accumulation": 3, "batch_size": 350,
                             "epochs": 3, "warmup": 0, "max_grad_norm": 0.0},
                 id="wide-e2-frame-accum3-no-clip"),
    # upstream's other options that change the bytes
    pytest.param("v1_base", {"vocab_file": "swapped"}, id="v1-custom-vocab"),
    pytest.param("v1_base", {"finetune": False}, id="v1-from-scratch"),
    pytest.param("e2_base", {"finetune": False, "batch_size_type": "sample", "batch_size": 3},
                 id="e2-sample-from-scratch"),
    pytest.param("v1_base", {"warmup": 50}, id="v1-warmup-past-the-end"),
    pytest.param("v1_base", {"epochs": 3, "save_every": 2, "last_every": 3, "keep_last_n": 2},
                 id="v1-numbered-checkpoints"),
    # accelerate's bf16 mixed precision (autocast of the forward), on the CPU
    pytest.param("v1_base", {"mixed_precision": "bf16", "epochs": 3, "grad_accumulation": 2,
                             "batch_size": 250}, id="v1-frame-accum-bf16"),
    pytest.param("e2_base", {"mixed_precision": "bf16", "batch_size_type": "sample",
                             "batch_size": 3, "epochs": 2}, id="e2-sample-bf16"),
    pytest.param("base", {"mixed_precision": "bf16", "epochs": 3, "stop_at": 2},
                 id="v0-frame-bf16-resumed"),
    # Mizuoto reads the folder upstream's prepare_csv_wavs wrote (raw.arrow + duration.json)
    pytest.param("base", {"data": "upstream-prepared", "grad_accumulation": 2,
                          "batch_size": 250, "epochs": 3}, id="v0-upstream-prepared-folder"),
]
if torch.cuda.is_available():
    # on a CUDA machine every case trains there (accelerate's device, the trainer's "auto");
    # fp16 (accelerate's GradScaler) exists only there. Run by benchmarks/gpu/checks.py.
    CASES.append(pytest.param("v1_base", {"mixed_precision": "fp16", "epochs": 3,
                                          "grad_accumulation": 2, "batch_size": 250},
                              id="v1-frame-accum-fp16-cuda"))


def _swapped_vocab(model_dir: Path, destination: Path) -> str:
    """The model's vocabulary with two tokens the data uses trading places (same size)."""
    lines = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    a, b = lines.index("e"), lines.index("o")
    lines[a], lines[b] = lines[b], lines[a]
    destination.write_text("".join(f"{t}\n" for t in lines), encoding="utf-8")
    return str(destination)

def _case(root: Path, variant: str, overrides: dict) -> dict:
    settings = {**BASE, **overrides}
    case = {"variant": variant, "stop_at": settings.pop("stop_at", None),
            "upstream_prepared": settings.pop("data", None) == "upstream-prepared",
            "size": settings.pop("size", "tiny"), "seed": settings.pop("seed", SEED),
            "root": root}
    case["model_dir"] = write_random_model_dir(
        root / "model", _arch(variant, case["size"]), seed=7,
        checkpoint_format=settings.pop("checkpoint_format", "safetensors"))
    case["metadata"] = write_synthetic_dataset(root / "data", count=settings.pop("clips", 6),
                                               seed=3)
    if settings.get("vocab_file") == "swapped":
        settings["vocab_file"] = _swapped_vocab(case["model_dir"], root / "custom_vocab.txt")
    case["settings"] = settings
    case["upstream"] = upstream_config(root / "upstream", case["model_dir"], case["metadata"],
                                       variant, size=case["size"], seed=case["seed"],
                                       **settings)
    return case


@pytest.fixture(scope="module")
def cases(request, tmp_path_factory):
    """Every selected case's inputs, and upstream's runs of all of them in one process."""
    chosen = {}
    for item in request.session.items:
        if item.module is request.module and getattr(item, "originalname", "") == \
                "test_training_matches_upstream":
            chosen[item.callspec.id] = (item.callspec.params["variant"],
                                        item.callspec.params["overrides"])
    root = tmp_path_factory.mktemp("training-parity")
    prepared = {name: _case(root / name, *args) for name, args in chosen.items()}
    run_oracle([c["upstream"] for c in prepared.values()], root / "oracle.json")
    return prepared


@pytest.mark.parametrize("variant,overrides", CASES)
def test_training_matches_upstream(request, cases, variant, overrides, monkeypatch):
    case = cases[request.node.callspec.id]
    root, settings = case["root"], case["settings"]
    upstream = upstream_result(root / "upstream")
    # the folder the oracle's prepare_csv_wavs wrote, or the metadata.csv it read
    data = root / "upstream" / "prepared" if case["upstream_prepared"] else case["metadata"]
    ours = run_ours(root, case["model_dir"], data, settings,
                    stop_at=case["stop_at"], seed=case["seed"])
    print(f"{request.node.callspec.id}: {len(ours['state']['records'])} batches, "
          f"ours {ours['seconds']:.2f} s, upstream {upstream['log']['seconds']:.2f} s")
    assert_same_training(upstream, ours)
    if "keep_last_n" in settings:
        assert_same_numbered(root / "upstream" / "ckpts", root / "ours" / "checkpoints")
    if case["size"] == "tiny":
        assert_cross_loads(root, root / "upstream" / "ckpts", ours["export"], variant,
                           monkeypatch)


def test_ema_matches_ema_pytorch():
    """Past ema_pytorch's copy phase (step 100): the decayed lerp every 10 updates."""
    from ema_pytorch import EMA as UpstreamEMA

    from mizuoto.training.ema import EMA

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    theirs = UpstreamEMA(model, include_online_model=False)
    ours = EMA(model)
    for _ in range(135):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        theirs.update()
        ours.update(model)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(reference)
    for key, value in reference.items():
        assert torch.equal(mine[key], value), key


def test_upstream_prepared_folder_batches_as_its_loader(tmp_path):
    """A folder written by upstream's ``prepare_csv_wavs``: upstream's ``CustomDataset`` +
    ``DynamicBatchSampler`` (epochs 0 and 1 of ``resumable_with_seed=666``) and Mizuoto's
    reader + batching give the same batches: indices, mels (``torch.equal``), lengths and
    tokens."""
    from datasets import Dataset as HFDataset
    from f5_tts.model.dataset import CustomDataset, DynamicBatchSampler, collate_fn
    from f5_tts.train.datasets.prepare_csv_wavs import prepare_and_save_set
    from torch.utils.data import SequentialSampler

    from mizuoto.runtime.threads import torch_threads
    from mizuoto_f5tts.training.batching import MelDataset, collate, epoch_order, frame_batches
    from mizuoto_f5tts.training.data import prepare_dataset

    metadata = write_synthetic_dataset(tmp_path / "data", count=11, seed=5)
    prepared = tmp_path / "prepared"
    prepare_and_save_set(str(_absolute_csv(metadata, tmp_path / "metadata.csv")), str(prepared),
                         is_finetune=False, num_workers=1)
    durations = json.loads((prepared / "duration.json").read_text())["duration"]
    theirs = CustomDataset(HFDataset.from_file(str(prepared / "raw.arrow")), durations=durations,
                           n_fft=1024, hop_length=256, win_length=1024, n_mel_channels=100,
                           target_sample_rate=24000, mel_spec_type="vocos")
    sampler = DynamicBatchSampler(SequentialSampler(theirs), 260, max_samples=3,
                                  random_seed=666, drop_residual=False)
    data = prepare_dataset(prepared, None)
    assert not data.bad_rows and len(data.clips) == 11
    ours = MelDataset(data.clips)
    batches = frame_batches(data.durations, 260, 3)
    assert batches == sampler.batches and len(batches) > 3
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        their_order = list(sampler)
        assert epoch_order(batches, 666 + epoch) == their_order
        for batch in their_order:
            mine = collate([ours[i] for i in batch])
            # upstream's items are made in a data-loader worker, which torch runs on one
            # thread (its trainer has num_workers >= 1): the oracle's too, at any test thread
            # count (at 4 threads, in the main process, its filter bank sums in another order)
            with torch_threads(1):
                reference = collate_fn([theirs[i] for i in batch])
            assert torch.equal(mine["mel"], reference["mel"])
            assert torch.equal(mine["mel_lengths"], reference["mel_lengths"])
            assert mine["text"] == reference["text"]
