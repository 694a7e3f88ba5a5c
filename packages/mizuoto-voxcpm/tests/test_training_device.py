"""The VoxCPM trainer's device and mixed precision: ``compute.device`` and
``mixed_precision`` reach the session; what this machine cannot do is refused naming the
setting. (CUDA runs are in benchmarks/gpu/checks.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from mizuoto.contracts import TrainingConfig
from mizuoto.errors import InvalidOption, InvalidRequest
from mizuoto_voxcpm.fixtures import with_dtype, write_random_model
from mizuoto_voxcpm.training import VoxCPMTrainer
from mizuoto_voxcpm.training.trainer import QUIRKS


def _chosen(compute="cpu", mixed_precision="auto", device=None):
    config = TrainingConfig(method="full", model="m", dataset="d", output_dir="o",
                            compute={"device": compute}, mixed_precision=mixed_precision)
    return VoxCPMTrainer().device_and_precision(config, device)


def test_auto_is_upstreams_choice():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert _chosen(device=cpu)[1] == "no"
    assert _chosen(device=cuda)[1] == "bf16"
    assert _chosen(mixed_precision="fp16", device=cuda)[1] == "fp16"
    assert _chosen(mixed_precision="no", device=cuda)[1] == "no"
    for mode in ("bf16", "fp16"):
        with pytest.raises(InvalidRequest, match="needs a CUDA device") as caught:
            _chosen(mixed_precision=mode, device=cpu)
        assert caught.value.field == "training.mixed_precision"


def test_device_choice():
    assert _chosen("cpu")[0] == torch.device("cpu")
    if not torch.cuda.is_available():
        assert _chosen("auto")[0] == torch.device("cpu")  # no MPS either: CUDA or the CPU
        with pytest.raises(InvalidOption, match="compute.device"):
            _chosen("cuda")


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")
def test_grad_scaling_follows_the_mode():
    from mizuoto.training import TrainingRunner

    off = TrainingRunner(device="cpu", quirks=QUIRKS).precision
    assert off.scaler is None
    with off.autocast():
        assert not torch.is_autocast_enabled("cpu")
    # built, not run, on a CPU machine: upstream scales bf16 too
    on = TrainingRunner(device="cuda:0", mixed_precision="bf16", quirks=QUIRKS).precision
    assert on.scaler is not None and on.mode == "bf16"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    import numpy as np
    import soundfile as sf

    root = tmp_path_factory.mktemp("device")
    model = with_dtype(write_random_model(root / "base", "voxcpm-0.5b", seed=6),
                       root / "model", "float32")
    rows = []
    for i in range(2):
        t = np.arange(int((0.4 + 0.1 * i) * 16000)) / 16000
        sf.write(root / f"{i}.wav", (0.3 * np.sin(2 * np.pi * (150 + 60 * i) * t)
                                     ).astype(np.float32), 16000)
        rows.append({"audio": f"{i}.wav", "text": f"Line number {i}."})
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, model


def _config(root, model, out, **kw):
    return TrainingConfig(method="lora", model=str(model), dataset=root / "train.jsonl",
                          output_dir=root / out, steps=1, learning_rate=1e-4, batch_size=2,
                          seed=42, save_every=1, params={"warmup_steps": 1}, **kw)


def test_the_settings_reach_the_session(workspace):
    root, model = workspace
    trainer = VoxCPMTrainer()
    run = trainer.prepare(_config(root, model, "cpu", compute={"device": "cpu"},
                                  mixed_precision="no"))
    session = trainer.build_session(run)
    assert session.device == torch.device("cpu") and session.mixed_precision == "no"
    assert session.dtype == torch.float32
    assert next(session.model.parameters()).device.type == "cpu"
    assert json.loads((root / "cpu" / "run.json").read_text())["mixed_precision"] == "no"
    if not torch.cuda.is_available():
        with pytest.raises(InvalidRequest, match="training.mixed_precision"):
            trainer.prepare(_config(root, model, "bf16", mixed_precision="bf16"))
        with pytest.raises(InvalidOption, match="compute.device"):
            trainer.prepare(_config(root, model, "cuda", compute={"device": "cuda"}))


class _Block(torch.nn.Module):
    """Frozen linears (one wrapped by LoRA, one tied to an embedding), a trainable one, a
    norm: the kinds of layer the VoxCPM model mixes."""

    def __init__(self) -> None:
        super().__init__()
        from mizuoto_voxcpm.lora import LoRALinear

        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(10, 16)
        self.frozen = torch.nn.Linear(16, 32)
        self.lora = LoRALinear(torch.nn.Linear(32, 16), r=4, alpha=8)
        torch.nn.init.normal_(self.lora.lora_B)
        torch.nn.init.normal_(self.lora.lora_A)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 10, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.trained = torch.nn.Linear(16, 16)
        for module in (self.embed, self.frozen, self.norm):
            module.requires_grad_(False)
        self.lora.weight.requires_grad_(False)
        self.lora.bias.requires_grad_(False)

    def forward(self, ids):
        x = self.embed(ids)
        x = self.trained(self.norm(self.lora(self.frozen(x))))
        return self.head(x).float().square().mean()


def test_low_memory_frozen_linears_keep_the_autocast_bits():
    """Under bf16 autocast (the CPU's here, CUDA's in training), frozen linear weights stored
    in bf16 give the same loss and gradients as float32 ones cast at every call."""
    from mizuoto.training.frozen_weights import frozen_linears_to
    from mizuoto_voxcpm.lora import LoRALinear

    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    results = []
    for cast in (False, True):
        block = _Block()
        if cast:
            # frozen + lora's base
            assert frozen_linears_to(block, torch.bfloat16, kinds=(LoRALinear,)) == 2
            assert block.frozen.weight.dtype == block.lora.weight.dtype == torch.bfloat16
            assert block.lora.bias.dtype == torch.bfloat16
            # tied to an embedding, trainable or not linear: left as they are
            assert block.head.weight.dtype == block.embed.weight.dtype == torch.float32
            assert block.trained.weight.dtype == block.lora.lora_A.dtype == torch.float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = block(ids)
        loss.backward()
        grads = {n: p.grad for n, p in block.named_parameters() if p.requires_grad}
        results.append((loss.detach(), grads))
    (plain_loss, plain), (cast_loss, cast) = results
    assert torch.equal(plain_loss, cast_loss)
    assert plain.keys() == cast.keys() and {"lora.lora_A", "trained.weight"} <= plain.keys()
    for name, grad in plain.items():
        assert torch.equal(grad, cast[name]), name


def test_lowest_streams_frozen_linears_from_host_memory(monkeypatch):
    """Each call sees a device copy of the frozen weights (a meta device stands for the GPU:
    only where tensors are is checked); the host tensors stay the parameters."""
    from mizuoto.training.frozen_weights import stream_frozen_linears
    from mizuoto_voxcpm.lora import LoRALinear

    block = _Block()
    # nothing to do on the CPU
    assert stream_frozen_linears(block, torch.device("cpu"), kinds=(LoRALinear,)) == 0
    assert stream_frozen_linears(block, torch.device("meta"), keep=(block.lora,),
                                 kinds=(LoRALinear,)) == 1
    assert block.frozen.weight.device.type == "cpu"
    seen = []
    linear = torch.nn.functional.linear

    def recording(x, weight, bias=None):
        seen.append((weight.device.type, bias.device.type))
        return linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", recording)
    out = block.frozen(torch.ones(2, 16, device="meta"))
    assert out.device.type == "meta" and seen == [("meta", "meta")]
    assert block.frozen.weight.device.type == "cpu"  # the host copy is the parameter again
    assert block.frozen.weight is dict(block.named_parameters())["frozen.weight"]
    assert "forward" not in vars(block.lora)  # kept: not streamed
