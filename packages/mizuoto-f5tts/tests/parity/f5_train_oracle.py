"""Upstream f5-tts 1.1.22's fine-tuning recipe, driven offline as the training oracle.

Run as a script in the parity environment: ``python f5_train_oracle.py CONFIG.json``. It does
what ``f5-tts_finetune-cli`` does after its hub download, with local files:

- ``prepare_csv_wavs.prepare_and_save_set(metadata.csv, prepared/)`` (raw.arrow, duration.json);
- seeds Python's ``random`` and torch with ``seed`` (upstream seeds neither; its conditional
  dropout draws from the unseeded ``random``), then builds ``CFM(DiT|UNetT(...))`` with the
  model directory's vocab as ``finetune_cli.py`` does;
- copies the model's checkpoint to ``ckpts/pretrained_<name>`` (``--finetune``; with
  ``"finetune": false`` it does not, and the model keeps its random initialisation: upstream's
  default) and runs ``Trainer.train`` on
  ``CustomDataset(Dataset.from_file(raw.arrow), durations)`` (what ``load_dataset`` builds; its
  ``CustomDatasetPath`` branch has a NameError) with ``resumable_with_seed=666`` and one
  loader worker (``persistent_workers=True`` is hard-coded, so 0 workers crash).

Optional keys: ``mixed_precision`` (``accelerate launch --mixed_precision``: the Trainer's
``accelerate_kwargs``; bf16 runs on the CPU), ``vocab_file`` (``--tokenizer custom --tokenizer_path``; default the model's
vocab), ``keep_last_n`` (``--keep_last_n_checkpoints``, default -1) and ``last_every``
(``--last_per_updates``, default ``save_every``, which is ``--save_per_updates``).

Writes ``log.json``: every ``accelerator.log`` call (``loss``, ``lr``, ``update``) in order,
and the seconds the training loop took. Checkpoints land in ``ckpts/`` as upstream writes them.
CONFIG.json may hold a list of configurations: they run one after the other in this process
(accelerate's shared state reset in between), which saves the imports.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "oracle_stubs"))

import torch

# the test process's thread count (MIZUOTO_TEST_THREADS, one by default): the same kernels
torch.set_num_threads(int(os.environ.get("MIZUOTO_TEST_THREADS", "1")))


def main(config_path: str) -> None:
    from accelerate.state import AcceleratorState, GradientState

    configs = json.loads(Path(config_path).read_text())
    for cfg in configs if isinstance(configs, list) else [configs]:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        run(cfg)


def run(cfg: dict) -> None:
    from datasets import Dataset as HFDataset
    from f5_tts.model import CFM, DiT, Trainer, UNetT
    from f5_tts.model.dataset import CustomDataset
    from f5_tts.model.utils import get_tokenizer
    from f5_tts.train.datasets.prepare_csv_wavs import prepare_and_save_set

    work = Path(cfg["work_dir"])
    prepared = work / "prepared"
    prepare_and_save_set(cfg["metadata"], str(prepared), is_finetune=False, num_workers=1)
    durations = json.loads((prepared / "duration.json").read_text())["duration"]

    random.seed(cfg["seed"])
    torch.manual_seed(cfg["seed"])
    vocab_char_map, vocab_size = get_tokenizer(cfg.get("vocab_file", cfg["vocab"]), "custom")
    mel_spec_kwargs = dict(n_fft=1024, hop_length=256, win_length=1024, n_mel_channels=100,
                           target_sample_rate=24000, mel_spec_type="vocos")
    backbone = DiT if cfg["backbone"] == "dit" else UNetT
    model = CFM(transformer=backbone(**cfg["arch"], text_num_embeds=vocab_size, mel_dim=100),
                mel_spec_kwargs=mel_spec_kwargs, vocab_char_map=vocab_char_map)

    ckpts = work / "ckpts"
    ckpts.mkdir(parents=True, exist_ok=True)
    if cfg.get("finetune", True):
        pretrained = Path(cfg["checkpoint"])
        shutil.copy2(pretrained, ckpts / f"pretrained_{pretrained.name}")

    trainer = Trainer(
        model, cfg["epochs"], cfg["learning_rate"],
        num_warmup_updates=cfg["warmup"], save_per_updates=cfg["save_every"],
        keep_last_n_checkpoints=cfg.get("keep_last_n", -1), checkpoint_path=str(ckpts),
        batch_size_per_gpu=cfg["batch_size"], batch_size_type=cfg["batch_size_type"],
        max_samples=cfg["max_samples"], grad_accumulation_steps=cfg["grad_accumulation"],
        max_grad_norm=cfg["max_grad_norm"], logger=None,
        last_per_updates=cfg.get("last_every", cfg["save_every"]),
        accelerate_kwargs={"mixed_precision": cfg["mixed_precision"]}
        if cfg.get("mixed_precision") else {},
    )
    if cfg.get("mixed_precision"):  # the setting took: the prepared forward autocasts
        assert trainer.accelerator.native_amp, "accelerate did not enable mixed precision"
    records = []

    def log(values, step=None):
        records.append({"update": step, "loss": values["loss"], "lr": values["lr"]})

    trainer.accelerator.log = log
    dataset = CustomDataset(HFDataset.from_file(str(prepared / "raw.arrow")), durations=durations,
                            **mel_spec_kwargs)
    start = time.perf_counter()
    trainer.train(dataset, num_workers=1, resumable_with_seed=666)
    seconds = time.perf_counter() - start
    (work / "log.json").write_text(json.dumps({"records": records, "seconds": seconds}))


if __name__ == "__main__":
    main(sys.argv[1])
