"""Training parity with upstream voxcpm 2.0.3's ``scripts/train_voxcpm_finetune.py``.

The same tiny random-init model (``config.json`` dtype float32: upstream's only CPU recipe)
and the same JSONL manifest are trained by upstream's script (``voxcpm_train_oracle.py``, a
subprocess) and by ``VoxCPMTrainer`` with seed 42 (upstream's accelerator seeds 42). Every
step's ``loss/diff``, ``loss/stop``, ``lr`` (the next step's, as logged), ``epoch`` and
``grad_norm`` must be equal, and so must the saved weights' bytes (``model.safetensors`` for
full fine-tuning, ``lora_weights.safetensors`` and ``lora_config.json`` for LoRA). The data
crosses an epoch boundary (new base and sampler seeds) and includes a stereo 22.05 kHz clip
(resampled with soxr as ``datasets`` does). Manifests declaring ``duration``/``ref_duration``
other than the clips' lengths make upstream's ``max_batch_tokens`` filter keep other rows than
measuring would; both must keep the same ones. With a validation manifest, upstream's
validation losses must be equal at the steps it validates, and so must every later step (the
validation's loader and forward draws, and the generation upstream speaks into TensorBoard).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from mizuoto.contracts import TrainingConfig
from mizuoto_voxcpm.fixtures import with_dtype, write_random_model
from mizuoto_voxcpm.training import VoxCPMTrainer

pytestmark = pytest.mark.parity

pytest.importorskip("voxcpm.training")
pytest.importorskip("argbind")

ORACLE = Path(__file__).parent / "voxcpm_train_oracle.py"
TEXTS = ["Hello world.", "This is a test of training.", "Short one.",
         "Another sentence here, a bit longer.", "你好世界。"]
STEPS = 3

# name: (generation, method, batch size, upstream recipe overrides)
CASES = {
    "0.5b-full": ("voxcpm-0.5b", "full", 2, {}),
    "0.5b-full-accumulated-clipped": ("voxcpm-0.5b", "full", 2,
                                      {"grad_accum_steps": 2, "max_grad_norm": 1.0}),
    "0.5b-lora": ("voxcpm-0.5b", "lora", 2, {"lora": {"r": 8, "alpha": 16}}),
    "0.5b-lora-dropout-proj": ("voxcpm-0.5b", "lora", 1,
                               {"lora": {"r": 4, "alpha": 8, "dropout": 0.25,
                                         "enable_proj": True}}),
    "2-lora-recipe": ("voxcpm2", "lora", 2, {"grad_accum_steps": 2, "max_grad_norm": 1.0,
                                             "lora": {"r": 32, "alpha": 32}}),
    # rows 0 and 2 carry a reference recording: [103, ref, 104, text, 101, audio, 102]
    "2-full-reference-audio": ("voxcpm2", "full", 2, {"manifest": "with_ref"}),
    # other widths (head dim 8, patch 3, mean-mode DiT, uniform times, noisy conditions) and
    # other settings (no warm-up then a short cosine, weight decay 0.1, loss weights, LoRA on
    # the LMs and the projections only)
    "2-custom-lora-lm-proj": ("voxcpm2", "lora", 3, {
        "model": "voxcpm2-custom", "manifest": "with_ref", "learning_rate": 3e-3,
        "warmup_steps": 0, "weight_decay": 0.1, "lambdas": {"loss/diff": 0.5, "loss/stop": 2.0},
        "lora": {"r": 2, "alpha": 3, "enable_dit": False, "enable_proj": True}}),
    # chosen target lists: the LMs' MLPs, some of the DiT's layers (its attention values and
    # outputs, its input layer, the time MLPs' second layers), the stop head and one projection
    # (listed against the model's order: upstream wraps them, drawing A, in list order)
    "0.5b-lora-targets": ("voxcpm-0.5b", "lora", 2, {"lora": {
        "r": 4, "alpha": 8, "enable_proj": True,
        "target_modules_lm": ["gate_proj", "up_proj", "down_proj"],
        "target_modules_dit": ["v_proj", "o_proj", "in_proj", "linear_2"],
        "target_proj_modules": ["stop_head", "lm_to_dit_proj"]}}),
    # a cosine schedule longer than the run (max_steps != num_iters); the mean-mode DiT's and
    # noisy conditions' progress still counts num_iters
    "2-custom-full-longer-schedule": ("voxcpm2", "full", 2, {
        "model": "voxcpm2-custom", "learning_rate": 1e-3, "max_steps": 7}),
    # is_prompt rows: [text, 103, audio, 104], no loss on them (see PROMPT_ROWS)
    "0.5b-full-prompt": ("voxcpm-0.5b", "full", 2, {"manifest": "prompt"}),
    "0.5b-lora-prompt": ("voxcpm-0.5b", "lora", 2, {"manifest": "prompt",
                                                    "lora": {"r": 4, "alpha": 8}}),
    "2-full-prompt-with-ref": ("voxcpm2", "full", 2, {"manifest": "prompt_with_ref"}),
    "2-lora-prompt": ("voxcpm2", "lora", 3, {"manifest": "prompt", "lora": {"r": 8, "alpha": 16}}),
}
# per row: its is_prompt key (absent where None is listed: upstream reads a missing key of a
# column other rows hold as None). "prompt_with_ref" adds with_ref's references (rows 0 and 2):
# upstream ignores the flag on row 0, which has one. (Booleans only: a column mixing them
# with numbers fails upstream's JSON loading.)
PROMPT_ROWS = [True, False, None, True, None]
# a VoxCPM2 of other widths, as config.json overrides (see fixtures.write_random_model)
CUSTOM_V2 = {
    "lm_config": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 1,
                  "rope_scaling": {"long_factor": [1.0, 1.3, 1.6, 1.9],
                                   "short_factor": [1.0, 1.1, 1.2, 1.3]}},
    "encoder_config": {"hidden_dim": 16, "num_heads": 2, "num_layers": 1},
    "dit_config": {"hidden_dim": 24, "num_heads": 3, "num_layers": 1, "dit_mean_mode": True,
                   "cfm_config": {"t_scheduler": "uniform", "noise_cond_scale": 0.3,
                                  "noise_cond_prob_range": [0.2, 0.9]}},
    "patch_size": 3, "residual_lm_num_layers": 1,
}


class UpstreamTrainer:
    """The training oracle as one long-lived process (``voxcpm_train_oracle.py --serve``): each
    run is a fork of it, so upstream's imports are paid once per module, not once per case."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen([sys.executable, str(ORACLE), "--serve"], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)

    def train(self, config_path: Path) -> None:
        self.process.stdin.write(f"{config_path}\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith("RESULT "):
                break
        else:
            raise RuntimeError(f"the training oracle exited ({self.process.wait()})")
        if line.split()[1] != "0":
            log = Path(f"{config_path}.log").read_text(encoding="utf-8")
            raise RuntimeError(f"upstream training failed:\n{log[-4000:]}")

    def close(self) -> None:
        # killed, not asked to exit: unloading its imports at exit takes seconds, and it holds
        # nothing that needs saving
        self.process.kill()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A manifest per encoder rate (16 kHz for both generations here), clips of tones and
    noise, one of them stereo at 22.05 kHz."""
    root = tmp_path_factory.mktemp("voxcpm-train")
    rng = np.random.default_rng(0)
    rows = []
    for i, text in enumerate(TEXTS):
        rate = 22050 if i == 3 else 16000
        n = int(rate * (0.5 + 0.2 * i))
        t = np.arange(n) / rate
        x = 0.3 * np.sin(2 * np.pi * (180 + 40 * i) * t) + 0.05 * rng.standard_normal(n)
        if i == 3:
            x = np.stack([x, 0.5 * x], axis=1)
        sf.write(root / f"{i}.wav", x.astype(np.float32), rate)
        rows.append({"audio": str(root / f"{i}.wav"), "text": text})
    manifest = root / "train.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with_ref = [dict(r, ref_audio=rows[(i + 1) % len(rows)]["audio"]) if i in (0, 2) else r
                for i, r in enumerate(rows)]
    (root / "with_ref.jsonl").write_text("".join(json.dumps(r) + "\n" for r in with_ref),
                                         encoding="utf-8")
    for name, base in (("prompt", rows), ("prompt_with_ref", with_ref)):
        flagged = [r if flag is None else dict(r, is_prompt=flag)
                   for r, flag in zip(base, PROMPT_ROWS, strict=True)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flagged),
                                            encoding="utf-8")
    # validation: every row, one a prompt; many rows (more than 10 batches of 1), two with a
    # reference
    val = [dict(r, is_prompt=True) if i == 1 else r for i, r in enumerate(rows)]
    many = [dict(rows[i % 5], text=f"{TEXTS[i % 5]} {i}") for i in range(12)]
    many = [dict(r, ref_audio=rows[(i + 2) % 5]["audio"]) if i in (3, 7) else r
            for i, r in enumerate(many)]
    for name, lines in (("val", val), ("val_many", many)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines),
                                            encoding="utf-8")
    for name, extras in DECLARED_MANIFESTS.items():
        declared = []
        for row, extra in zip(rows, extras, strict=True):
            if "ref_audio" in extra:
                extra = dict(extra, ref_audio=rows[extra["ref_audio"]]["audio"])
            declared.append({**row, **extra})
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in declared),
                                            encoding="utf-8")
    models = {}
    for generation in ("voxcpm-0.5b", "voxcpm2"):
        base = write_random_model(root / generation, generation, seed=5)
        models[generation] = with_dtype(base, root / f"{generation}-fp32", "float32")
    models["voxcpm2-custom"] = write_random_model(root / "voxcpm2-custom", "voxcpm2", seed=6,
                                                  dtype="float32", overrides=CUSTOM_V2,
                                                  vae_overrides={"latent_dim": 4})
    upstream = UpstreamTrainer()
    yield {"manifest": manifest, "with_ref": root / "with_ref.jsonl", "root": root, **models,
           "prompt": root / "prompt.jsonl", "prompt_with_ref": root / "prompt_with_ref.jsonl",
           "val": root / "val.jsonl", "val_many": root / "val_many.jsonl",
           **{name: root / f"{name}.jsonl" for name in DECLARED_MANIFESTS},
           "upstream": upstream}
    upstream.close()


def _upstream(data, name, generation, method, batch_size, overrides, steps=STEPS
              ) -> tuple[dict, Path]:
    save = data["root"] / f"upstream-{name}"
    manifest = data[overrides.get("manifest", "manifest")]
    config = {
        "pretrained_path": str(data[overrides.get("model", generation)]),
        "train_manifest": str(manifest),
        "val_manifest": str(data[overrides["val"]]) if "val" in overrides else "",
        "sample_rate": 16000, "batch_size": batch_size,
        "grad_accum_steps": 1, "num_workers": 0, "num_iters": steps, "log_interval": 1,
        "valid_interval": 1000, "save_interval": 1000,
        "learning_rate": 1e-4 if method == "lora" else 1e-5, "weight_decay": 0.01,
        "warmup_steps": 1, "max_steps": steps, "max_batch_tokens": 8192,
        "save_path": str(save), "lambdas": {"loss/diff": 1.0, "loss/stop": 1.0},
        "max_grad_norm": 0.0, "log": str(save.with_suffix(".json")),
    }
    config.update({k: v for k, v in overrides.items()
                   if k not in ("lora", "manifest", "model", "val")})
    if method == "lora":
        config["lora"] = {"enable_lm": True, "enable_dit": True, "enable_proj": False,
                          "dropout": 0.0, **overrides["lora"]}
    path = save.with_suffix(".config.json")
    path.write_text(json.dumps(config), encoding="utf-8")
    data["upstream"].train(path)
    return json.loads(save.with_suffix(".json").read_text(encoding="utf-8")), save


def _ours(data, name, generation, method, batch_size, overrides, steps=STEPS):
    lora = overrides.get("lora", {})
    lambdas = overrides.get("lambdas", {})
    params = {"warmup_steps": overrides.get("warmup_steps", 1),
              "max_batch_tokens": overrides.get("max_batch_tokens", 8192),
              "preview": False, "grad_accum_steps": overrides.get("grad_accum_steps", 1),
              "max_grad_norm": overrides.get("max_grad_norm", 0.0),
              "weight_decay": overrides.get("weight_decay", 0.01),
              "lambda_diff": lambdas.get("loss/diff", 1.0),
              "lambda_stop": lambdas.get("loss/stop", 1.0),
              "max_steps": overrides.get("max_steps")}
    if "save_interval" in overrides:  # upstream keeps every step_<N> folder
        params.update(keep_last_n_checkpoints=-1, checkpoint_every=overrides["save_interval"])
    if "val" in overrides:
        params.update(val_manifest=str(data[overrides["val"]]),
                      valid_interval=overrides["valid_interval"])
    if method == "lora":
        params.update({"lora_r": lora["r"], "lora_alpha": lora["alpha"],
                       "lora_dropout": lora.get("dropout", 0.0),
                       "lora_enable_lm": lora.get("enable_lm", True),
                       "lora_enable_dit": lora.get("enable_dit", True),
                       "lora_enable_proj": lora.get("enable_proj", False),
                       **{f"lora_{k}": v for k, v in lora.items() if k.startswith("target_")}})
    learning_rate = overrides.get("learning_rate", 1e-4 if method == "lora" else 1e-5)
    config = TrainingConfig(method=method, model=str(data[overrides.get("model", generation)]),
                            dataset=data[overrides.get("manifest", "manifest")],
                            output_dir=data["root"] / f"ours-{name}",
                            steps=steps, learning_rate=learning_rate,
                            batch_size=batch_size, seed=42, save_every=1000, params=params)
    trainer = VoxCPMTrainer()
    run = trainer.prepare(config)
    start = time.perf_counter()
    trainer.train(run)
    seconds = time.perf_counter() - start
    exported = trainer.export(run, data["root"] / f"ours-{name}" / "export")
    metrics = [json.loads(line) for line in
               (config.output_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return metrics, exported, seconds


def _compare(data, name, generation, method, batch_size, overrides, steps=STEPS):
    upstream, saved = _upstream(data, name, generation, method, batch_size, overrides, steps)
    ours, exported, seconds = _ours(data, name, generation, method, batch_size, overrides, steps)
    train = [r for r in upstream["steps"] if r["split"] == "train"]
    assert len(train) == steps
    for theirs, mine in zip(train, ours, strict=True):
        for key in ("loss/diff", "loss/stop", "lr", "epoch", "grad_norm"):
            assert mine[key] == theirs[key], (name, theirs["step"], key, mine[key], theirs[key])
    validated = {r["step"]: r for r in upstream["steps"] if r["split"] == "val"}
    # ours count updates made (1 after the first, as F5's), upstream the step's 0-based index
    assert [r["step"] - 1 for r in ours if "val/loss/total" in r] == sorted(validated)
    for step, theirs in validated.items():
        for key in ("loss/total", "loss/diff", "loss/stop"):
            assert ours[step][f"val/{key}"] == theirs[key], (name, step, key)
    final = saved / f"step_{steps:07d}"
    files = (["lora_weights.safetensors", "lora_config.json"] if method == "lora"
             else ["model.safetensors", "config.json"])
    for file in files:
        assert (exported / file).read_bytes() == (final / file).read_bytes(), file
    print(f"{name}: upstream {upstream['seconds']:.2f} s, ours {seconds:.2f} s for {steps} steps")


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_step_matches_upstream(data, name):
    _compare(data, name, *CASES[name])


# Declared lengths (seconds) that upstream's max_batch_tokens estimate uses instead of the
# clips' (0.5, 0.7, 0.9, 1.1, 1.3 s; 25 VAE frames a second). Per row: extra manifest keys;
# "ref_audio" names a row whose clip is the reference.
DECLARED_MANIFESTS = {
    # 0.5B (patch 2), limit 52 // 2 = 26 positions; measured lengths 17, 30, 22, 42, 26 keep
    # rows 1, 3, 5; declared 38, 25, 22, 42, 22 keep rows 2, 3, 5 (an int, a value rounded to
    # 0.01 s; dataset_id only feeds upstream's per-dataset counters)
    "declared": [{"duration": 2.2, "dataset_id": 0}, {"duration": 0.3, "dataset_id": 2},
                 {"duration": 0.91, "dataset_id": 1}, {"duration": 1.1, "dataset_id": 0},
                 {"duration": 1, "dataset_id": 2}],
    # the same as text (upstream reads a column of strings with float())
    "declared_text": [{"duration": "2.2"}, {"duration": "0.3"}, {"duration": "0.91"},
                      {"duration": "1.1"}, {"duration": "1"}],
    # VoxCPM2 (patch 4), limit 26, no duration column: row 1's declared reference (1.7 s for
    # 0.7) drops it; row 2 has no reference but its ref_duration counts (drops it); row 3's
    # reference (1.3 s) goes uncounted, as the column is there but not on its row (keeps it);
    # row 5 declares its reference rounded. Measured 21, 26, 27, 35, 24 keep rows 1, 2, 5;
    # declared 27, 29, 16, 35, 24 keep rows 3, 5.
    "declared_ref": [{"ref_audio": 1, "ref_duration": 1.7}, {"ref_duration": 0.1},
                     {"ref_audio": 4}, {}, {"ref_audio": 0, "ref_duration": 0.52}],
}
DECLARED = {
    "0.5b-full-declared-durations": ("voxcpm-0.5b", "full", 2,
                                     {"manifest": "declared", "max_batch_tokens": 52}),
    "0.5b-lora-declared-durations-as-text": ("voxcpm-0.5b", "lora", 1, {
        "manifest": "declared_text", "max_batch_tokens": 26, "lora": {"r": 4, "alpha": 8}}),
    "2-full-declared-ref-durations": ("voxcpm2", "full", 2,
                                      {"manifest": "declared_ref", "max_batch_tokens": 52}),
}
DECLARED_DROPS = {"declared": [1, 4], "declared_text": [1, 4], "declared_ref": [1, 2, 4]}


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_declared_durations_filter_as_upstream(data, name):
    _compare(data, name, *DECLARED[name])
    manifest = DECLARED[name][3]["manifest"]
    prepared = json.loads((data["root"] / f"ours-{name}" / "prepared.json").read_text(
        encoding="utf-8"))
    assert [r["line"] for r in prepared["rejected"]] == DECLARED_DROPS[manifest]
    log = (data["root"] / f"upstream-{name}" / "train.log").read_text(encoding="utf-8")
    assert f"Filtering {len(DECLARED_DROPS[manifest])} / 5 training samples" in log


REALSIZE = {
    "0.5b-full-realsize": ("voxcpm-0.5b", "full", 1, {}),
    "0.5b-lora-realsize": ("voxcpm-0.5b", "lora", 1, {"lora": {"r": 8, "alpha": 16}}),
    "2-lora-realsize": ("voxcpm2", "lora", 1, {"max_grad_norm": 1.0,
                                              "lora": {"r": 32, "alpha": 32}}),
}


@pytest.mark.realsize
@pytest.mark.parametrize("name", sorted(REALSIZE))
def test_one_realsize_step_matches_upstream(data, tmp_path, name):
    """The released models' sizes (random weights): one step each. Upstream's process peaks
    above 16 GB for 0.5B full fine-tuning and VoxCPM2 (weights, their loaded copy, gradients
    and AdamW state in float32); 0.5B LoRA needs about 7 GB."""
    generation, *rest = REALSIZE[name]
    base = write_random_model(tmp_path / "base", generation, seed=5, size="realsize")
    realsize = {**data, generation: with_dtype(base, tmp_path / "fp32", "float32"),
                "root": tmp_path}
    _compare(realsize, name, generation, *rest, steps=1)


# validation on: losses at the steps upstream validates (every valid_interval and the last),
# and every training step after them. (Upstream's loader needs the same keys in both
# manifests; Mizuoto reads each alone.)
VALIDATION = {
    "0.5b-full-validation": ("voxcpm-0.5b", "full", 2, {"manifest": "prompt", "val": "val",
                                                        "valid_interval": 2}),
    # 12 rows in batches of 1: upstream stops at 10; LoRA dropout off while validating
    "2-lora-dropout-validation-capped": ("voxcpm2", "lora", 1, {
        "manifest": "with_ref", "val": "val_many", "valid_interval": 1,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.25}}),
}


@pytest.mark.parametrize("name", sorted(VALIDATION))
def test_validation_and_the_steps_after_it_match_upstream(data, name):
    _compare(data, name, *VALIDATION[name])
    log = (data["root"] / f"ours-{name}" / "metrics.jsonl").read_text(encoding="utf-8")
    assert "val/loss/total" in log


@pytest.mark.parametrize("method", ["full", "lora"])
def test_numbered_checkpoint_folders_match_upstreams(data, method):
    """Upstream saving every step (``save_interval`` 1) and ours keeping every step's folder:
    the same files, equal bytes but for the schedule's state (upstream's ``LambdaLR`` holds a
    ``partial``, ours the warm-up and length). Upstream numbers a periodic save by its step's
    0-based index (its ``step_<N-1>`` holds N steps, ``training_state.json`` saying N-1) and
    saves the last one again as ``step_<num_iters>``; ours are numbered by steps done."""
    import torch

    name = f"numbered-{method}"
    overrides = {"save_interval": 1}
    if method == "lora":
        overrides["lora"] = {"r": 4, "alpha": 8}
    _, saved = _upstream(data, name, "voxcpm-0.5b", method, 2, overrides)
    _ours(data, name, "voxcpm-0.5b", method, 2, overrides)
    ours = data["root"] / f"ours-{name}" / "checkpoints"
    folders = sorted(p.name for p in ours.glob("step_*"))
    assert folders == [f"step_{n:07d}" for n in range(1, STEPS + 1)]
    for n in range(1, STEPS + 1):
        mine, theirs = ours / f"step_{n:07d}", saved / f"step_{n - 1:07d}"
        files = sorted(p.name for p in theirs.iterdir())
        assert sorted(p.name for p in mine.iterdir()) == files
        if n == STEPS:  # upstream's final save: the same state, numbered as ours
            assert sorted(p.name for p in (saved / mine.name).iterdir()) == files
            theirs = saved / mine.name
        for file in files:
            if file == "scheduler.pth":
                a, b = (torch.load(f / file, weights_only=False) for f in (mine, theirs))
                assert a.pop("lr_lambdas") != b.pop("lr_lambdas") and a == b, n
            elif file == "training_state.json" and n < STEPS:
                assert json.loads((theirs / file).read_text()) == {"step": n - 1}
                assert json.loads((mine / file).read_text()) == {"step": n}
            else:
                assert (mine / file).read_bytes() == (theirs / file).read_bytes(), (n, file)


@pytest.mark.parametrize("name", ["0.5b-lora", "2-lora-recipe"])
def test_upstream_yaml_through_the_cli_matches_upstream(data, name):
    """``mizuoto train -e voxcpm --config upstream.yaml``: upstream's own recipe file (the one
    its script ran, with its ``lora:`` table, ``lambdas:``, ``save_interval``...) and nothing
    else (seed, method and model from the file and upstream's defaults) trains the same steps
    and saves the same LoRA bytes."""
    import yaml
    from click.testing import CliRunner

    from mizuoto.cli import cli

    generation, method, batch_size, overrides = CASES[name]
    upstream, saved = _upstream(data, f"cli-{name}", generation, method, batch_size, overrides)
    settings = json.loads(saved.with_suffix(".config.json").read_text(encoding="utf-8"))
    del settings["log"]  # the oracle's own output, not upstream's
    recipe = data["root"] / f"cli-{name}.yaml"
    recipe.write_text(yaml.safe_dump(settings), encoding="utf-8")
    output = data["root"] / f"ours-cli-{name}"
    done = CliRunner().invoke(cli, ["train", "-e", "voxcpm", "--config", str(recipe),
                                    "--output", str(output), "--param", "preview=false"],
                              obj={}, catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert '"lora"' in done.output or "lora_r" in done.output  # the recipe, printed
    ours = [json.loads(x) for x in (output / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in upstream["steps"] if r["split"] == "train"]
    assert len(ours) == len(train) == STEPS
    for theirs, mine in zip(train, ours, strict=True):
        for key in ("loss/diff", "loss/stop", "lr", "epoch", "grad_norm"):
            assert mine[key] == theirs[key], (name, theirs["step"], key)
    final = saved / f"step_{STEPS:07d}"
    for file in ("lora_weights.safetensors", "lora_config.json"):
        assert (output / "export" / file).read_bytes() == (final / file).read_bytes(), file
    recorded = json.loads((output / "recipe.json").read_text())
    assert recorded["seed"] == 42 and recorded["method"] == "lora"
