"""Parity of the F5-TTS network, sampler and Vocos with upstream f5-tts 1.1.22 / vocos 0.1.0.

One random tiny checkpoint per variant, written in upstream's layout by our fixture writer, is
loaded by upstream's ``load_model`` / ``load_vocoder`` and by ours; outputs must be bitwise equal.
"""

from __future__ import annotations

import contextlib
import io

import attrs
import pytest
import torch

from mizuoto.runtime.module_state import kernel_state, state_differences
from mizuoto_f5tts.checkpoint import find_checkpoint, load_f5_model, load_vocos, read_vocab
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.variants import VARIANT_NAMES, get_variant

pytestmark = pytest.mark.parity

# E2 layout with the text blocks and padding mask switched on, so UNetT's text path is covered
_E2_CONV = attrs.evolve(
    get_variant("e2_base", "tiny"), size="custom", text_dim=32, conv_layers=2,
    text_mask_padding=True, pe_attn_head=None,
)
_CASES = {name: get_variant(name, "tiny") for name in VARIANT_NAMES} | {"e2_conv": _E2_CONV}


def _upstream_model(variant, model_dir, dtype=None):
    from f5_tts.infer.utils_infer import get_tokenizer, load_checkpoint, load_model
    from f5_tts.model import CFM, DiT, UNetT

    cls = DiT if variant.backbone == "dit" else UNetT
    ckpt, vocab = str(find_checkpoint(model_dir)), str(model_dir / "vocab.txt")
    with contextlib.redirect_stdout(io.StringIO()):
        if dtype is None:
            return load_model(
                cls, variant.upstream_config(), ckpt, mel_spec_type="vocos", vocab_file=vocab,
                device="cpu",
            )
        # load_model has no dtype argument; build it the same way and pass the dtype through
        vocab_map, size = get_tokenizer(vocab, "custom")
        model = CFM(
            transformer=cls(**variant.upstream_config(), text_num_embeds=size, mel_dim=100),
            mel_spec_kwargs=dict(mel_spec_type="vocos"),
            odeint_kwargs=dict(method="euler"),
            vocab_char_map=vocab_map,
        )
        return load_checkpoint(model, ckpt, "cpu", dtype=dtype)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("f5_models")
    loaded = {}
    for case, variant in _CASES.items():
        model_dir = write_random_model_dir(root / case, variant, seed=11)
        ours, vocab = load_f5_model(model_dir, variant)
        # upstream's load_model leaves the model in training mode (dropout on) until sample()
        upstream = _upstream_model(variant, model_dir).eval()
        loaded[case] = (variant, model_dir, upstream, ours, vocab)
    return loaded


def _text(batch: int, vocab_size: int, length: int = 30) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    text = torch.randint(0, vocab_size, (batch, length), generator=g)
    if batch > 1:
        text[1, length - 8 :] = -1  # batch padding
    return text


@pytest.mark.parametrize("case", list(_CASES))
def test_state_dict_layout_equal(models, case):
    _, _, upstream, ours, _ = models[case]
    theirs = {k: (tuple(v.shape), v.dtype) for k, v in upstream.state_dict().items()}
    mine = {k: (tuple(v.shape), v.dtype) for k, v in ours.state_dict().items()}
    assert mine == theirs
    for key, value in upstream.state_dict().items():
        assert torch.equal(value, ours.state_dict()[key]), key


@pytest.mark.parametrize("case", list(_CASES))
def test_module_state_matches_upstream(models, case):
    """requires_grad, dtypes, strides, memory format and train/eval per tensor and module, as
    upstream has them when ``sample()`` runs (kernel choice depends on each of them)."""
    _, _, upstream, ours, _ = models[case]
    theirs, mine = kernel_state(upstream), kernel_state(ours)
    assert {k for k in mine if k.startswith("param:")} == {k for k in theirs
                                                           if k.startswith("param:")}
    assert state_differences(mine, theirs) == []


@pytest.mark.parametrize("case", list(_CASES))
@pytest.mark.parametrize("batch", [1, 2])
def test_backbone_forward_equal(models, case, batch):
    _, _, upstream, ours, vocab = models[case]
    g = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 45, 100, generator=g)
    cond = torch.randn(batch, 45, 100, generator=g)
    text = _text(batch, len(vocab))
    mask = None if batch == 1 else torch.arange(45)[None] < torch.tensor([45, 37])[:, None]
    time = torch.tensor(0.37)
    calls = [{}, {"cfg_infer": True}, {"drop_audio_cond": True, "drop_text": True}]
    with torch.no_grad():
        for kwargs in calls:
            inputs = dict(x=x, cond=cond, text=text, time=time, mask=mask, **kwargs)
            expected = upstream.transformer(**inputs)
            actual = ours.transformer(**inputs)
            assert torch.equal(actual, expected), kwargs


_SAMPLE_SETTINGS = [
    dict(steps=8, cfg_strength=2.0, sway_sampling_coef=-1.0, method="euler"),
    dict(steps=7, cfg_strength=2.0, sway_sampling_coef=-1.0, method="midpoint"),
    dict(steps=6, cfg_strength=0.0, sway_sampling_coef=None, method="euler", use_epss=False),
    dict(steps=5, cfg_strength=1.5, sway_sampling_coef=0.5, method="midpoint", use_epss=False),
]


def _sample_both(upstream, ours, cond, text, duration, settings, **kwargs):
    settings = dict(settings)
    method = settings.pop("method")
    upstream.odeint_kwargs = dict(method=method)
    expected, _ = upstream.sample(cond, text, duration, **settings, **kwargs)
    actual, _ = ours.sample(cond, text, duration, method=method, **settings, **kwargs)
    return expected, actual


@pytest.mark.parametrize("case", list(_CASES))
@pytest.mark.parametrize("settings", _SAMPLE_SETTINGS, ids=lambda s: f"{s['method']}-{s['steps']}")
def test_sample_equal(models, case, settings):
    _, _, upstream, ours, vocab = models[case]
    g = torch.Generator().manual_seed(3)
    for batch in (1, 2):
        cond = torch.randn(batch, 40, 100, generator=g)
        lens = torch.tensor([40, 31][:batch])
        duration = 90 if batch == 1 else torch.tensor([90, 70])
        text = _text(batch, len(vocab))
        expected, actual = _sample_both(
            upstream, ours, cond, text, duration, settings, lens=lens, seed=7
        )
        assert actual.shape == (batch, 90, 100)
        assert torch.equal(actual, expected), batch


@pytest.mark.parametrize("case", ["v1_base", "e2_base"])
def test_sample_global_rng_audio_cond_and_editing_equal(models, case):
    _, _, upstream, ours, vocab = models[case]
    settings = _SAMPLE_SETTINGS[0]
    text = _text(1, len(vocab))
    wav = 0.1 * torch.randn(1, 24 * 256, generator=torch.Generator().manual_seed(9))

    # no seed: both draw from torch's global generator
    upstream.odeint_kwargs = dict(method="euler")
    torch.manual_seed(123)
    expected, _ = upstream.sample(wav, text, 60, steps=8, cfg_strength=2.0, sway_sampling_coef=-1.0)
    torch.manual_seed(123)
    actual, _ = ours.sample(
        wav, text, 60, steps=8, cfg_strength=2.0, sway_sampling_coef=-1.0, method="euler"
    )
    assert torch.equal(actual, expected)

    # speech editing: keep frames outside [10, 18) of the reference
    cond = torch.randn(1, 40, 100, generator=torch.Generator().manual_seed(2))
    edit_mask = torch.ones(1, 40, dtype=torch.bool)
    edit_mask[:, 10:18] = False
    expected, actual = _sample_both(
        upstream, ours, cond, text, 40, settings, edit_mask=edit_mask, seed=4
    )
    assert torch.equal(actual, expected)
    assert torch.equal(actual[:, :10], cond[:, :10])

    expected, actual = _sample_both(
        upstream, ours, cond, text, 80, settings, no_ref_audio=True, seed=4
    )
    assert torch.equal(actual, expected)


def test_sample_generator_matches_global_seed(models):
    _, _, upstream, ours, vocab = models["v1_base"]
    cond = torch.randn(1, 40, 100, generator=torch.Generator().manual_seed(1))
    text = _text(1, len(vocab))
    upstream.odeint_kwargs = dict(method="euler")
    torch.manual_seed(99)
    expected, _ = upstream.sample(cond, text, 70, steps=6, cfg_strength=2.0)
    actual, trajectory = ours.sample(
        cond, text, 70, steps=6, cfg_strength=2.0, method="euler",
        generator=torch.Generator().manual_seed(99), keep_trajectory=True,
    )
    assert torch.equal(actual, expected)
    assert trajectory.shape == (7, 1, 70, 100)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ["v1_base", "base", "e2_base"])
def test_half_precision_sample_equal(models, case, dtype):
    variant, model_dir, _, _, vocab = models[case]
    upstream = _upstream_model(variant, model_dir, dtype=dtype)
    ours, _ = load_f5_model(model_dir, variant, dtype=dtype)
    assert ours.transformer.rotary_embed.inv_freq.dtype == dtype
    text = _text(1, len(vocab))
    wav = 0.1 * torch.randn(1, 30 * 256, generator=torch.Generator().manual_seed(6))
    expected, actual = _sample_both(upstream, ours, wav, text, 70, _SAMPLE_SETTINGS[0], seed=8)
    assert actual.dtype == dtype
    assert torch.equal(actual, expected)


def test_pt_checkpoint_loads_like_upstream(tmp_path):
    variant = get_variant("base", "tiny")
    model_dir = write_random_model_dir(tmp_path, variant, checkpoint_format="pt", seed=2)
    assert find_checkpoint(model_dir).suffix == ".pt"
    upstream = _upstream_model(variant, model_dir)
    ours, vocab = load_f5_model(model_dir)  # variant detected: a "model_1200000" DiT is v0 Base
    assert len(vocab) == len(read_vocab(model_dir / "vocab.txt"))
    for key, value in upstream.state_dict().items():
        assert torch.equal(value, ours.state_dict()[key]), key
    text = _text(1, len(vocab))
    cond = torch.randn(1, 30, 100, generator=torch.Generator().manual_seed(0))
    expected, actual = _sample_both(upstream, ours, cond, text, 60, _SAMPLE_SETTINGS[1], seed=1)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("size", ["tiny"])
def test_vocos_equal(models, size):
    from f5_tts.infer.utils_infer import load_vocoder

    vocos_dir = models["v1_base"][1] / "vocos"
    with contextlib.redirect_stdout(io.StringIO()):
        upstream = load_vocoder("vocos", is_local=True, local_path=str(vocos_dir), device="cpu")
    ours = load_vocos(vocos_dir)
    assert set(ours.state_dict()) == set(upstream.state_dict())
    assert state_differences(kernel_state(ours), kernel_state(upstream)) == []
    g = torch.Generator().manual_seed(0)
    mel = torch.randn(2, 100, 57, generator=g)
    expected, actual = upstream.decode(mel), ours.decode(mel)
    assert actual.shape == (2, 57 * 256)  # frames * hop with "same" padding
    assert torch.equal(actual, expected)
    wav = 0.1 * torch.randn(2, 24000, generator=g)
    assert torch.equal(ours(wav), upstream(wav))


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_real_architectures_match_upstream_configs(name):
    """Our real-size configs build upstream's exact parameter layout (on "meta": no weights)."""
    from importlib.resources import files

    import yaml
    from f5_tts.model import DiT, UNetT

    upstream_name = {"v1_base": "F5TTS_v1_Base", "base": "F5TTS_Base", "e2_base": "E2TTS_Base"}
    config_path = files("f5_tts").joinpath(f"configs/{upstream_name[name]}.yaml")
    arch = yaml.safe_load(config_path.read_text())["model"]["arch"]
    variant = get_variant(name, "real")
    for key in ("dim", "depth", "heads", "ff_mult", "text_mask_padding", "pe_attn_head"):
        assert getattr(variant, key) == arch.get(key, getattr(variant, key)), key
    assert variant.text_dim == arch.get("text_dim")
    assert variant.conv_layers == arch.get("conv_layers", 0)
    cls = DiT if variant.backbone == "dit" else UNetT
    with torch.device("meta"):
        theirs = cls(**arch, text_num_embeds=2545, mel_dim=100)
        mine = variant.build_backbone(text_num_embeds=2545)
    shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}  # noqa: E731
    assert shapes(mine) == shapes(theirs)
    assert sum(p.numel() for p in mine.parameters()) > 330e6


@pytest.mark.realsize
def test_real_vocos_equal(tmp_path):
    from f5_tts.infer.utils_infer import load_vocoder

    from mizuoto_f5tts.fixtures import write_random_vocos_dir

    vocos_dir = write_random_vocos_dir(tmp_path, size="real", seed=3)
    with contextlib.redirect_stdout(io.StringIO()):
        upstream = load_vocoder("vocos", is_local=True, local_path=str(vocos_dir), device="cpu")
    ours = load_vocos(vocos_dir)
    assert sum(p.numel() for p in ours.parameters()) == pytest.approx(13.5e6, rel=0.01)
    mel = torch.randn(1, 100, 120, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ours.decode(mel), upstream.decode(mel))


@pytest.mark.realsize
@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_real_model_sample_equal(tmp_path, name):
    """Real-size random checkpoint: 2 Euler steps over 1.5 s, upstream vs ours (slow, ~3 GB)."""
    variant = get_variant(name, "real")
    model_dir = write_random_model_dir(tmp_path, variant, seed=1)
    upstream = _upstream_model(variant, model_dir).eval()
    ours, vocab = load_f5_model(model_dir)
    assert ours.transformer.depth == variant.depth
    text = _text(1, len(vocab), length=20)
    cond = torch.randn(1, 60, 100, generator=torch.Generator().manual_seed(0))
    expected, actual = _sample_both(
        upstream, ours, cond, text, 140, dict(_SAMPLE_SETTINGS[0], steps=2), seed=5
    )
    assert torch.equal(actual, expected)
