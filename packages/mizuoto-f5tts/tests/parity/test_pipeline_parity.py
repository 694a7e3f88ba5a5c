"""The whole F5-TTS pipeline against upstream f5-tts 1.1.22, sample for sample.

Random tiny model directories of each variant are loaded by upstream (``load_model``,
``load_vocoder(is_local=True)``) and by Mizuoto. Upstream is driven as ``F5TTS.infer`` drives
it (``torch.manual_seed`` once, ``preprocess_ref_audio_text``, ``infer_process``) with its
chunk thread pool cut to one worker, so chunks draw their noise in order. Speech editing is
``infer/speech_edit.py``'s logic with local files. Besides the tiny released layouts, a few
other widths (``WIDE``: qk-norm, long skip, additive UNetT skips, fractional ``ff_mult``) are
written in upstream's layout and left to Mizuoto's auto-detection.

Compared with ``torch.equal``: the mel fed to Vocos (every chunk) and the final audio. One
chunk is float32 on both sides. Several chunks: upstream's crossfade makes float64, and
Mizuoto returns that float64 result cast to float32, so we compare with upstream's float64
cast to float32 (and check the float64 values were not already float32).
"""

from __future__ import annotations

import concurrent.futures
from importlib.resources import files
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch

import mizuoto
from mizuoto import EditRequest, Reference, SynthesisRequest
from mizuoto_f5tts.engine import F5Engine
from mizuoto_f5tts.fixtures import write_random_model_dir
from mizuoto_f5tts.variants import get_variant

pytestmark = pytest.mark.parity

EXAMPLES = Path(str(files("f5_tts").joinpath("infer/examples/basic")))
EN_WAV, ZH_WAV = EXAMPLES / "basic_ref_en.wav", EXAMPLES / "basic_ref_zh.wav"
EN_TEXT = "Some call me nature, others call me mother nature."  # basic.toml
ZH_TEXT = "对，这就是我，万人敬仰的太乙真人。"  # speech_edit.py
EN_GEN = "I don't really care what you call me."
ZH_GEN = "我是一个测试，你好世界。"
LONG_GEN = ("I don't really care what you call me. I've been a silent spectator, watching "
            "species evolve, empires rise and fall. But always remember, I am mighty and "
            "enduring. Respect me and I'll nurture you; ignore me and you shall face the "
            "consequences.")
SEED = 1234
VARIANTS = ("v1_base", "base", "e2_base")
# other widths, written in upstream's layout and auto-detected (checkpoint.detect_variant);
# ff_mult 4.3 at dim 112 and 2.3 at dim 208 give inner widths (481, 478) that inner / dim
# does not rebuild through int(dim * mult)
WIDE = {
    "wide_v1": attrs.evolve(get_variant("v1_base", "tiny"), size="custom", dim=112, depth=1,
                            heads=7, text_dim=48, conv_layers=1, ff_mult=4.3, qk_norm="rms_norm"),
    "wide_v0": attrs.evolve(get_variant("base", "tiny"), size="custom", dim=96, depth=3, heads=2,
                            dim_head=64, text_dim=48, conv_layers=0, ff_mult=3,
                            long_skip_connection=True),
    "wide_e2": attrs.evolve(get_variant("e2_base", "tiny"), size="custom", dim=208, depth=2,
                            heads=2, dim_head=32, text_dim=48, conv_layers=1, ff_mult=2.3,
                            skip_connect_type="add"),
}


def _variant(name: str):
    return WIDE[name] if name in WIDE else get_variant(name, "tiny")


def _silent(*args, **kwargs):
    return None


@pytest.fixture(scope="module")
def upstream():
    from f5_tts.infer import utils_infer

    return utils_infer


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("f5models")
    return {name: write_random_model_dir(root / name, _variant(name), seed=7)
            for name in (*VARIANTS, *WIDE)}


@pytest.fixture(scope="module")
def ours(model_dirs):
    options = mizuoto.Options.from_mapping({"compute.device": "cpu"})
    return {name: F5Engine.load(path, options=options) for name, path in model_dirs.items()}


@pytest.fixture(scope="module")
def theirs(upstream, model_dirs):
    """Upstream models by (variant, ode method), built on demand, and the vocoders."""
    from f5_tts.model import DiT, UNetT

    from mizuoto_f5tts.checkpoint import find_checkpoint

    cache: dict = {}

    def get(name: str, method: str = "euler"):
        if (name, method) not in cache:
            variant = _variant(name)
            directory = model_dirs[name]
            model = upstream.load_model(
                DiT if variant.backbone == "dit" else UNetT, variant.upstream_config(),
                str(find_checkpoint(directory)), mel_spec_type="vocos",
                vocab_file=str(directory / "vocab.txt"), ode_method=method, device="cpu")
            vocoder = upstream.load_vocoder("vocos", is_local=True,
                                            local_path=str(directory / "vocos"), device="cpu")
            cache[name, method] = (model, vocoder)
        return cache[name, method]

    return get


def _record_decode(vocoder, into: list):
    original = vocoder.decode

    def decode(mel, *args, **kwargs):
        into.append(mel.detach().clone())
        return original(mel, *args, **kwargs)

    return decode


def _upstream_synthesize(upstream, model, vocoder, ref_wav, ref_text, gen_text, *, steps,
                         cfg=2.0, sway=-1.0, speed=1.0, fix_duration=None, target_rms=0.1,
                         cross_fade=0.15, seed=SEED, monkeypatch):
    mels: list[torch.Tensor] = []
    monkeypatch.setattr(vocoder, "decode", _record_decode(vocoder, mels))
    # one worker: the chunks draw from the global generator in order (upstream's pool races)
    monkeypatch.setattr(upstream, "ThreadPoolExecutor",
                        lambda: concurrent.futures.ThreadPoolExecutor(max_workers=1))
    torch.manual_seed(seed)  # what F5TTS.infer's seed_everything does to torch
    ref_file, ref_text = upstream.preprocess_ref_audio_text(str(ref_wav), ref_text,
                                                            show_info=_silent)
    wave, rate, _ = upstream.infer_process(
        ref_file, ref_text, gen_text, model, vocoder, show_info=_silent, progress=None,
        target_rms=target_rms, cross_fade_duration=cross_fade, nfe_step=steps,
        cfg_strength=cfg, sway_sampling_coef=sway, speed=speed, fix_duration=fix_duration,
        device="cpu")
    monkeypatch.undo()
    assert rate == 24000
    return wave, mels


def _ours_synthesize(engine, ref_wav, ref_text, gen_text, *, steps, cfg=2.0, seed=SEED,
                     **params):
    mels: list[torch.Tensor] = []
    engine.vocoder.decode = _record_decode(engine.vocoder, mels)
    try:
        result = engine.synthesize(SynthesisRequest(
            gen_text, reference=Reference(ref_wav, text=ref_text), seed=seed, steps=steps,
            guidance=cfg, params=params))
    finally:
        del engine.vocoder.decode
    return result, mels


def _assert_same(result, mels, wave, upstream_mels, several: bool) -> None:
    chunks = len(upstream_mels)
    assert (chunks > 1) == several
    assert result.applied.chunks == chunks == len(mels)
    for ours_mel, their_mel in zip(mels, upstream_mels, strict=True):
        assert ours_mel.shape == their_mel.shape
        assert torch.equal(ours_mel, their_mel)
    if wave.dtype == np.float64:  # several chunks joined by upstream's float64 crossfade
        assert several
        assert not np.array_equal(wave, wave.astype(np.float32))  # the float64 is real
        expected = torch.from_numpy(wave).to(torch.float32)
    else:
        assert wave.dtype == np.float32
        expected = torch.from_numpy(wave)
    assert result.audio.samples.shape == expected.shape
    assert torch.equal(result.audio.samples, expected)


# name, variant, reference, text, steps, params (Mizuoto names), several chunks
CASES = [
    *[(f"{v}-en", v, "en", EN_GEN, 4, {}, False) for v in VARIANTS],
    *[(f"{v}-zh", v, "zh", ZH_GEN, 4, {}, False) for v in VARIANTS],
    ("v1-long", "v1_base", "en", LONG_GEN, 4, {}, True),
    ("e2-long-fixed", "e2_base", "en", LONG_GEN, 4, {"fix_duration": 30.0}, True),
    ("v1-epss7", "v1_base", "en", EN_GEN, 7, {}, False),
    ("v1-epss12", "v1_base", "en", EN_GEN, 12, {}, False),  # the fast profiles' grid
    ("v1-epss16-zh", "v1_base", "zh", ZH_GEN, 16, {}, False),
    ("v1-uniform8-sway", "v1_base", "en", EN_GEN, 8, {"sway_sampling_coef": 0.5}, False),
    ("base-no-sway", "base", "en", EN_GEN, 5, {"sway_sampling_coef": None}, False),
    ("v1-midpoint", "v1_base", "en", EN_GEN, 4, {"method": "midpoint"}, False),
    ("e2-midpoint", "e2_base", "zh", ZH_GEN, 6, {"method": "midpoint"}, False),
    ("v1-speed", "v1_base", "en", EN_GEN, 4, {"speed": 0.7}, False),
    ("v1-fix-duration", "v1_base", "zh", ZH_GEN, 4, {"fix_duration": 9.5}, False),
    ("v1-short-text", "v1_base", "en", "Hi there.", 4, {}, False),
    ("v1-quiet-reference", "v1_base", "quiet", EN_GEN, 4, {"target_rms": 0.2}, False),
    ("v1-no-crossfade", "v1_base", "en", LONG_GEN, 4, {"cross_fade_duration": 0.0}, True),
]
_UPSTREAM_NAMES = {"sway_sampling_coef": "sway", "speed": "speed", "fix_duration": "fix_duration",
                   "target_rms": "target_rms", "cross_fade_duration": "cross_fade"}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    import soundfile
    import torchaudio

    folder = tmp_path_factory.mktemp("refs")
    quiet, stereo = folder / "quiet.wav", folder / "stereo44.wav"
    data, rate = soundfile.read(EN_WAV, dtype="int16")
    soundfile.write(quiet, (data // 8).astype(np.int16), rate, subtype="PCM_16")
    mono = torchaudio.functional.resample(torch.from_numpy(data / 32768.0).float(), rate, 44100)
    soundfile.write(stereo, torch.stack([mono, mono.roll(300) * 0.7], 1).numpy(), 44100,
                    subtype="PCM_16")
    # the transcript without final punctuation and with trailing spaces: upstream ends it
    return {"en": (EN_WAV, EN_TEXT), "zh": (ZH_WAV, ZH_TEXT), "quiet": (quiet, EN_TEXT),
            "stereo44": (stereo, EN_TEXT[:-1] + "  ")}


@pytest.mark.parametrize(("name", "variant", "ref", "text", "steps", "params", "several"),
                         CASES, ids=[case[0] for case in CASES])
def test_synthesis_matches_upstream(name, variant, ref, text, steps, params, several, ours,
                                    theirs, upstream, references, monkeypatch):
    _check_synthesis(variant, ref, text, steps, params, several, ours=ours, theirs=theirs,
                     upstream=upstream, references=references, monkeypatch=monkeypatch)


def _check_synthesis(variant, ref, text, steps, params, several, *, cfg=2.0, seed=SEED, ours,
                     theirs, upstream, references, monkeypatch):
    ref_wav, ref_text = references[ref]
    model, vocoder = theirs(variant, params.get("method", "euler"))
    upstream_kwargs = {_UPSTREAM_NAMES[k]: v for k, v in params.items() if k != "method"}
    wave, upstream_mels = _upstream_synthesize(upstream, model, vocoder, ref_wav, ref_text, text,
                                               steps=steps, cfg=cfg, seed=seed,
                                               monkeypatch=monkeypatch, **upstream_kwargs)
    result, mels = _ours_synthesize(ours[variant], ref_wav, ref_text, text, steps=steps, cfg=cfg,
                                    seed=seed, **params)
    _assert_same(result, mels, wave, upstream_mels, several)


MIXED_GEN = "我爱Python编程, and 数字123。"
# name, variant, reference, text, steps, guidance, seed, params, several chunks
OTHER_CASES = [
    ("wide-v1-qk-ff4.3", "wide_v1", "en", EN_GEN, 3, 3.7, 0, {"sway_sampling_coef": 0.3},
     False),
    ("wide-v0-long-skip", "wide_v0", "stereo44", ZH_GEN, 2, 0.0, 2**32 - 1, {"speed": 1.3},
     False),
    ("wide-e2-add-ff2.3", "wide_e2", "zh", MIXED_GEN, 5, 0.5, 2**31 - 1,
     {"method": "midpoint"}, False),
    ("v1-one-step-one-char", "v1_base", "en", "A", 1, 1.0, 0, {"sway_sampling_coef": None},
     False),
    ("e2-long-fixed-under-reference", "e2_base", "stereo44", LONG_GEN, 2, 2.0, 987654321,
     {"speed": 0.7, "fix_duration": 3.0}, True),
]


@pytest.mark.parametrize(("name", "variant", "ref", "text", "steps", "cfg", "seed", "params",
                          "several"), OTHER_CASES, ids=[case[0] for case in OTHER_CASES])
def test_other_widths_and_seeds_match_upstream(name, variant, ref, text, steps, cfg, seed, params,
                                               several, ours, theirs, upstream, references,
                                               monkeypatch):
    _check_synthesis(variant, ref, text, steps, params, several, cfg=cfg, seed=seed, ours=ours,
                     theirs=theirs, upstream=upstream, references=references,
                     monkeypatch=monkeypatch)


def _upstream_edit(upstream, model, vocoder, wav, target_text, parts, durations, *, steps,
                   cfg=2.0, sway=-1.0, target_rms=0.1):
    """speech_edit.py's steps, with local files and an explicit seed."""
    import torch.nn.functional as F
    import torchaudio
    from f5_tts.model.utils import convert_char_to_pinyin

    audio, sr = torchaudio.load(str(wav))
    if audio.shape[0] > 1:
        audio = torch.mean(audio, dim=0, keepdim=True)
    rms = torch.sqrt(torch.mean(torch.square(audio)))
    if rms < target_rms:
        audio = audio * target_rms / rms
    if sr != 24000:
        audio = torchaudio.transforms.Resample(sr, 24000)(audio)
    with torch.inference_mode():
        original = model.mel_spec(audio).permute(0, 2, 1)
    cond = torch.zeros(1, 0, 100)
    mask = torch.zeros(1, 0, dtype=torch.bool)
    pending = list(durations) if durations is not None else None
    offset = 0
    for start, end in parts:
        length = end - start if pending is None else pending.pop(0)
        first, last = round(start * 24000 / 256), round(end * 24000 / 256)
        new = round(length * 24000 / 256)
        cond = torch.cat((cond, original[:, offset:first], torch.zeros(1, new, 100)), dim=1)
        mask = torch.cat((mask, torch.ones(1, first - offset, dtype=torch.bool),
                          torch.zeros(1, new, dtype=torch.bool)), dim=-1)
        offset = last
    cond = torch.cat((cond, original[:, offset:]), dim=1)
    mask = F.pad(mask, (0, cond.shape[1] - mask.shape[-1]), value=True)
    torch.manual_seed(SEED)
    with torch.inference_mode():
        generated, _ = model.sample(cond=cond, text=convert_char_to_pinyin([target_text]),
                                    duration=cond.shape[1], steps=steps, cfg_strength=cfg,
                                    sway_sampling_coef=sway, seed=None, edit_mask=mask)
        mel = generated.to(torch.float32).permute(0, 2, 1)
        wave = vocoder.decode(mel).cpu()
    if rms < target_rms:
        wave = wave * rms / target_rms
    return wave, mel


EDITS = [
    ("v1-en", "v1_base", EN_WAV, EN_TEXT, "Some call me optimist, others call me realist.",
     [(1.42, 2.44), (4.04, 4.9)], [1.2, 1.0]),
    ("e2-zh", "e2_base", ZH_WAV, ZH_TEXT, "对，那就是你，万人敬仰的太白金星。",
     [(0.84, 1.4), (1.92, 2.4), (4.26, 6.26)], None),
    ("base-zh", "base", ZH_WAV, ZH_TEXT, "对，这就是你，万人敬仰的李白金星。",
     [(1.5, 2.784), (4.083, 6.76)], [1.284, 2.677]),
    ("wide-e2-en", "wide_e2", EN_WAV, EN_TEXT, "Call me whatever you want.",
     [(0.5, 1.0), (3.0, 4.0), (4.2, 6.0)], [0.05, 1.0, 0.3]),
]


@pytest.mark.parametrize(("name", "variant", "wav", "origin", "target", "parts", "durations"),
                         EDITS, ids=[edit[0] for edit in EDITS])
def test_edit_matches_upstream(name, variant, wav, origin, target, parts, durations, ours,
                               theirs, upstream):
    model, vocoder = theirs(variant)
    wave, mel = _upstream_edit(upstream, model, vocoder, wav, target, parts, durations, steps=4)
    engine = ours[variant]
    mels: list[torch.Tensor] = []
    engine.vocoder.decode = _record_decode(engine.vocoder, mels)
    try:
        params = {} if durations is None else {"edit_durations": durations}
        result = engine.edit(EditRequest(Reference(wav, text=origin), target, parts, seed=SEED,
                                         steps=4, params=params))
    finally:
        del engine.vocoder.decode
    assert len(mels) == 1 and torch.equal(mels[0], mel)
    assert torch.equal(result.audio.samples, wave[0])


def test_remove_silence_matches_upstream(tmp_path, upstream):
    """Upstream's export with remove_silence, read back by soundfile, equals ours."""
    import soundfile

    from mizuoto_f5tts.silence import remove_silence

    rng = np.random.default_rng(3)
    speech = (rng.standard_normal(24000) * 0.1).astype(np.float32)
    gap = np.zeros(int(1.7 * 24000), np.float32)
    for wave in (np.concatenate([speech, gap, speech, gap[:5000], speech]),
                 np.concatenate([gap, speech, gap]).astype(np.float64)):
        path = tmp_path / "out.wav"
        soundfile.write(path, wave, 24000)  # F5TTS.export_wav
        upstream.remove_silence_for_generated_wav(str(path))
        expected, rate = soundfile.read(path, dtype="float32")
        assert rate == 24000
        got = remove_silence(wave, 24000)
        assert got.shape == expected.shape and len(got) < len(wave)
        assert np.array_equal(got, expected)
