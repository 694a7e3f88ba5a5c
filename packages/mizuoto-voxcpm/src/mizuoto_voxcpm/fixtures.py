"""Random-init VoxCPM model directories in upstream's exact layout, for tests and benchmarks.

``write_random_model(directory, generation)`` writes ``config.json``, ``model.safetensors``
(no ``audio_vae.*`` keys), the audio VAE weights and the tokenizer files. Every tensor is drawn
from its own generator seeded by ``(seed, name)``, so the weights do not depend on the order in
which modules are built. The stop head is biased: ``stop="never"`` (default) never fires, so
length is bounded by the cap; ``stop="always"`` fires as soon as ``min_len`` allows;
``stop="random"`` leaves it random.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import attrs
import torch

from mizuoto.runtime.seeds import keyed_generator

GENERATIONS = ("voxcpm-0.5b", "voxcpm-1.5", "voxcpm2")


def _rope(head_dim: int, max_positions: int, original: int) -> dict[str, Any]:
    half = head_dim // 2
    return {
        "type": "longrope",
        "long_factor": [1.0 + 0.37 * i for i in range(half)],
        "short_factor": [1.0 + 0.11 * i for i in range(half)],
        "original_max_position_embeddings": original,
    }


def _lm(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int,
        head_dim: int, max_positions: int, original: int) -> dict[str, Any]:
    return {
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "max_position_embeddings": max_positions,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": _rope(head_dim, max_positions, original),
        "vocab_size": vocab,
        "use_mup": True,
        "scale_emb": 12,
        "dim_model_base": 256,
        "scale_depth": 1.4,
    }


def _local(hidden: int, ffn: int, heads: int, layers: int) -> dict[str, Any]:
    return {"hidden_dim": hidden, "ffn_dim": ffn, "num_heads": heads, "num_layers": layers}


_CFM = {"sigma_min": 1e-6, "solver": "euler", "t_scheduler": "log-norm",
        "training_cfg_rate": 0.1, "inference_cfg_rate": 2.0, "reg_loss_type": "l1"}


SIZES = ("tiny", "wide", "realsize")

# The released local DiT of every generation is 1024 wide with a 4096 feed-forward and a 64-wide
# latent; only the depth and the LMs make a model large. Kernel choice depends on these widths
# (a 1-ulp fp32 difference hid behind the tiny fixture's 32 -> 8 out_proj), so the "wide" size
# keeps them and stays two layers deep.
RELEASED_DIT_WIDTH, RELEASED_DIT_FFN, RELEASED_LATENT_DIM = 1024, 4096, 64


def tiny_config(generation: str, *, vocab_size: int, dtype: str = "bfloat16",
                wide: bool = False) -> dict[str, Any]:
    """A few-layer config of ``generation`` (head dim 16 everywhere, max_length 512).

    ``wide=True`` keeps the released local DiT and latent widths (1024 / 4096 -> 64, released
    patch size) at two layers: fast enough for CI, wide enough to run the released kernels.
    """
    _check(generation)
    lm = _lm(64, 2, 4, 2, 128, vocab_size, 16, 1024, 512)
    dit = _local(32, 64, 2, 2)
    if wide:
        dit = _local(RELEASED_DIT_WIDTH, RELEASED_DIT_FFN, RELEASED_DIT_WIDTH // 16, 2)
    config: dict[str, Any] = {
        "architecture": "voxcpm2" if generation == "voxcpm2" else "voxcpm",
        "lm_config": lm,
        "patch_size": 2 if generation == "voxcpm-0.5b" else 4,
        "feat_dim": RELEASED_LATENT_DIM if wide else 8,
        "residual_lm_num_layers": 2,
        "scalar_quantization_latent_dim": 16,
        "scalar_quantization_scale": 9,
        "encoder_config": _local(32, 64, 2, 2),
        "dit_config": {**dit, "cfm_config": dict(_CFM)},
        "max_length": 512,
        "device": "cpu",
        "dtype": dtype,
    }
    if generation == "voxcpm2":
        config["residual_lm_no_rope"] = True
        config["dit_config"]["dit_mean_mode"] = False
    return config


def realsize_config(generation: str, *, vocab_size: int = 73448,
                    dtype: str = "bfloat16") -> dict[str, Any]:
    """The released models' transformer sizes (for benchmarks on random weights)."""
    _check(generation)
    if generation == "voxcpm2":
        lm = _lm(2048, 28, 16, 2, 6144, vocab_size, 128, 32768, 32768)
        lm["kv_channels"] = 128
        # all four stacks share the head dim (2 × rope factors): the local ones set it
        local = {**_local(1024, 4096, 16, 12), "kv_channels": 128}
        config = {"architecture": "voxcpm2", "patch_size": 4, "residual_lm_num_layers": 8,
                  "residual_lm_no_rope": True, "scalar_quantization_latent_dim": 512,
                  "max_length": 8192}
    else:
        lm = _lm(1024, 24, 16, 2, 4096, vocab_size, 64, 32768, 32768)
        local = _local(1024, 4096, 16, 4 if generation == "voxcpm-0.5b" else 8)
        config = {"architecture": "voxcpm", "patch_size": 2 if generation == "voxcpm-0.5b" else 4,
                  "residual_lm_num_layers": 6, "scalar_quantization_latent_dim": 256,
                  "max_length": 4096}
    config.update({
        "lm_config": lm,
        "feat_dim": 64,
        "scalar_quantization_scale": 9,
        "encoder_config": dict(local),
        "dit_config": {**local, "cfm_config": dict(_CFM)},
        "device": "cpu",
        "dtype": dtype,
    })
    return config


def _check(generation: str) -> None:
    if generation not in GENERATIONS:
        raise ValueError(f"unknown generation {generation!r}; use one of {', '.join(GENERATIONS)}")


def seeded_tensor(seed: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A standard-normal tensor drawn from a generator keyed by ``(seed, name)``."""
    return torch.randn(shape, generator=keyed_generator(seed, name))


STOP_MODES = ("never", "always", "random")


def random_state_dict(config: dict[str, Any], *, seed: int = 0, stop: str = "never"
                      ) -> dict[str, torch.Tensor]:
    """Float32 weights for every key of the model built from ``config``."""
    from mizuoto_voxcpm.config import VoxCPMConfig
    from mizuoto_voxcpm.model import VoxCPMModel

    with torch.device("meta"):
        model = VoxCPMModel(VoxCPMConfig.from_dict(config))
    state = {}
    for name, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        value = seeded_tensor(seed, name, shape)
        if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            value = 1.0 + 0.1 * value
        elif name.endswith(".bias"):
            value = 0.02 * value
        elif len(shape) == 2 and not name.endswith("embed_tokens.weight"):
            value = value / shape[1] ** 0.5
        elif name.endswith("special_token"):
            value = value * 0.5
        state[name] = value.contiguous()
    if stop not in STOP_MODES:
        raise ValueError(f"stop must be one of {', '.join(STOP_MODES)}, got {stop!r}")
    if stop != "random":
        # silu(stop_proj(h)) is about 3 everywhere; the head's rows then decide the argmax
        hidden = state["stop_proj.bias"].numel()
        sign = 1.0 if stop == "always" else -1.0
        state["stop_proj.bias"] = torch.full((hidden,), 3.0)
        state["stop_proj.weight"] = state["stop_proj.weight"] * 0.01
        state["stop_head.weight"] = torch.stack([torch.full((hidden,), -sign),
                                                 torch.full((hidden,), sign)])
    return state


def write_random_model(directory: str | Path, generation: str, *, seed: int = 0,
                       dtype: str = "bfloat16", stop: str = "never", realsize: bool = False,
                       size: str = "tiny", weights_format: str = "safetensors",
                       legacy_tokenizer: bool = True, overrides: dict[str, Any] | None = None,
                       vae_overrides: dict[str, Any] | None = None) -> Path:
    """Write a random-init model directory of ``generation`` in upstream's layout.

    ``size``: ``"tiny"`` (CI), ``"wide"`` (tiny depth, released DiT and latent widths) or
    ``"realsize"`` (the released transformer sizes; ``realsize=True`` is the same).
    ``overrides``: ``config.json`` values to change (a dict for a section is merged into it,
    ``dit_config.cfm_config`` too); ``vae_overrides``: audio VAE config fields to change (its
    ``latent_dim`` becomes ``feat_dim``). Custom widths must keep upstream's constraints (one
    head dim for all stacks, twice the rope factors).
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    realsize = realsize or size == "realsize"
    from mizuoto.runtime.atomic import save_safetensors
    from mizuoto_voxcpm.audiovae.fixture import write_random_audiovae
    from mizuoto_voxcpm.tokenizer_fixture import write_test_tokenizer

    _check(generation)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_test_tokenizer(directory, legacy=legacy_tokenizer)
    vocab = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab_size = max(len(vocab["model"]["vocab"]),
                     1 + max(t["id"] for t in vocab.get("added_tokens", [{"id": 0}])))
    if realsize:
        config = realsize_config(generation, dtype=dtype)
    else:
        config = tiny_config(generation, vocab_size=vocab_size, dtype=dtype, wide=size == "wide")
    _merge(config, overrides or {})
    vae = _vae_config(generation, realsize)
    if size == "wide":
        vae = attrs.evolve(vae, latent_dim=RELEASED_LATENT_DIM)
    vae = attrs.evolve(vae, **(vae_overrides or {}))
    write_random_audiovae(directory, vae, seed=seed,
                          fmt="safetensors" if generation == "voxcpm2" else "pth")
    config["audio_vae_config"] = {k: list(v) if isinstance(v, tuple) else v
                                  for k, v in attrs.asdict(vae).items()}
    config["feat_dim"] = vae.latent_dim
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    state = random_state_dict(config, seed=seed, stop=stop)
    if weights_format == "safetensors":
        save_safetensors(state, directory / "model.safetensors")
    else:
        torch.save({"state_dict": state}, str(directory / "pytorch_model.bin"))
    return directory


def _merge(config: dict[str, Any], overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            _merge(config[key], value)
        else:
            config[key] = value


def _vae_config(generation: str, realsize: bool):
    from mizuoto_voxcpm.audiovae import fixture

    if generation == "voxcpm2":
        return fixture.VOXCPM2 if realsize else fixture.TINY_V2
    if generation == "voxcpm-1.5":
        return fixture.VOXCPM1_5 if realsize else fixture.TINY_V1_44K
    return fixture.VOXCPM_0_5B if realsize else fixture.TINY_V1_16K


def with_dtype(source: str | Path, target: str | Path, dtype: str) -> Path:
    """Copy a model directory (files linked) with ``config.json``'s ``dtype`` replaced."""
    source, target = Path(source), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name == "config.json":
            continue
        link = target / path.name
        if not link.exists():
            link.symlink_to(path.resolve())
    config = copy.deepcopy(json.loads((source / "config.json").read_text(encoding="utf-8")))
    config["dtype"] = dtype
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return target


def write_random_lora(directory: str | Path, model_dir: str | Path, *, seed: int = 0,
                      base_model: str | None = None, **lora: Any) -> Path:
    """Write ``lora_weights.safetensors`` + ``lora_config.json`` for the model in ``model_dir``
    (``lora``: ``LoRAConfig`` fields, default LM and DiT at r 8, alpha 16), every tensor drawn
    from its own keyed generator; ``lora_B`` is non-zero so that the LoRA changes the output."""
    from mizuoto_voxcpm.config import VoxCPMConfig
    from mizuoto_voxcpm.lora import apply_lora, lora_config_for, write_lora_dir
    from mizuoto_voxcpm.model import VoxCPMModel

    config = VoxCPMConfig.from_model_dir(model_dir)
    lora_config = lora_config_for(config.is_v2, **{"enable_lm": True, "enable_dit": True, **lora})
    with torch.device("meta"):
        model = VoxCPMModel(config)
    model = model.to_empty(device="cpu")
    apply_lora(model, lora_config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(0.05 * seeded_tensor(seed, name, tuple(parameter.shape)))
    write_lora_dir(Path(directory), model, lora_config,
                   base_model=base_model if base_model is not None else str(model_dir))
    return Path(directory)
