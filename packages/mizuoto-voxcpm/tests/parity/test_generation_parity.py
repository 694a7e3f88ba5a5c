"""Generation parity with upstream voxcpm 2.0.3: same random checkpoint, same seed, same bits.

Each generation (VoxCPM-0.5B and VoxCPM1.5 layout, VoxCPM2) is written once as a tiny
random-init directory; the float32 runs use a copy with ``"dtype": "float32"``. Upstream runs
through ``voxcpm.core.VoxCPM`` (no denoiser, no compile). 2.0.3 takes no seed, so the harness
seeds the global generator before every attempt with ``seed + attempt``, which is what Mizuoto
does with its own generator. CPU, one thread, ``np.array_equal`` on the waveforms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import mizuoto
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import with_dtype, write_random_model

pytestmark = pytest.mark.parity

voxcpm_core = pytest.importorskip("voxcpm.core")

GENERATIONS = ("voxcpm-0.5b", "voxcpm-1.5", "voxcpm2")
DTYPES = ("bfloat16", "float32")
SEED = 1234
EN = "Hello world, this is a test."
ZH = "你好世界，今天天气很好。"
REF_TEXT = {"en": "Some call me nature.", "zh": "对，这就是我。"}
EXAMPLES = Path(voxcpm_core.__file__).parents[1] / "f5_tts" / "infer" / "examples" / "basic"
# short caps keep the tiny run fast; text is long enough that retry never triggers by default
FAST = {"max_len": 5}
MIZUOTO_ONLY = {"reference_prefix", "split_text", "chunk_tokens"}


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, Path]:
    """Short clips (0.6 s) of the real speech examples shipped with f5-tts, 24 kHz."""
    directory = tmp_path_factory.mktemp("refs")
    paths = {}
    for lang in ("en", "zh"):
        samples, rate = sf.read(EXAMPLES / f"basic_ref_{lang}.wav", dtype="float32")
        paths[lang] = directory / f"ref_{lang}.wav"
        sf.write(paths[lang], samples[: int(rate * 0.6)], rate)
    return paths


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("voxcpm")
    dirs = {}
    for generation in GENERATIONS:
        base = write_random_model(root / generation, generation, seed=3)
        dirs[generation, "bfloat16"] = base
        dirs[generation, "float32"] = with_dtype(base, root / f"{generation}-fp32", "float32")
    stop = write_random_model(root / "voxcpm2-stop", "voxcpm2", seed=3, stop="always")
    dirs["voxcpm2", "stop"] = stop
    dirs["voxcpm-0.5b", "stop"] = write_random_model(root / "v05-stop", "voxcpm-0.5b", seed=3,
                                                     stop="always")
    for generation in ("voxcpm-0.5b", "voxcpm2"):  # a VAE whose decoder draws noise
        dirs[generation, "noise"] = write_random_model(root / f"{generation}-noise", generation,
                                                       seed=3, vae_overrides={
                                                           "use_noise_block": True})
    return dirs


class _Upstream:
    """``voxcpm.core.VoxCPM`` with its global generator seeded before each attempt."""

    def __init__(self, directory: Path) -> None:
        self.tts = voxcpm_core.VoxCPM(voxcpm_model_path=str(directory), enable_denoiser=False,
                                      optimize=False)
        self.attempts = 0
        self.seed = 0
        inference = self.tts.tts_model._inference

        def seeded(*args, **kwargs):
            torch.manual_seed(self.seed + self.attempts)
            self.attempts += 1
            yield from inference(*args, **kwargs)

        self.tts.tts_model._inference = seeded

    def generate(self, seed: int, **kwargs) -> np.ndarray:
        self.seed, self.attempts = seed, 0
        return self.tts.generate(**kwargs)

    def stream(self, seed: int, **kwargs) -> list[np.ndarray]:
        self.seed, self.attempts = seed, 0
        return list(self.tts.generate_streaming(**kwargs))


_cache: dict = {}


def _upstream(directory: Path) -> _Upstream:
    key = ("up", directory)
    if key not in _cache:
        _cache[key] = _Upstream(directory)
    return _cache[key]


def _engine(directory: Path) -> VoxCPMEngine:
    key = ("mz", directory)
    if key not in _cache:
        _cache[key] = VoxCPMEngine.load(directory)
    return _cache[key]


def _assert_same(upstream: np.ndarray, ours: torch.Tensor) -> None:
    ours = ours.numpy()
    assert upstream.dtype == ours.dtype == np.float32
    assert upstream.shape == ours.shape
    assert np.array_equal(upstream, ours), f"max diff {np.abs(upstream - ours).max()}"


def _run(directory, *, upstream_kwargs, request_kwargs, params=None, seed=SEED):
    params = {**FAST, **(params or {})}
    upstream_params = {k: v for k, v in params.items() if k not in MIZUOTO_ONLY}
    up = _upstream(directory)
    expected = up.generate(seed, **upstream_kwargs, **upstream_params)
    engine = _engine(directory)
    result = engine.synthesize(mizuoto.SynthesisRequest(seed=seed, params=params,
                                                        **request_kwargs))
    _assert_same(expected, result.audio.samples)
    assert result.applied.retries == up.attempts - 1
    return result


def _clone_upstream(generation: str, path: Path, text: str) -> dict:
    kwargs = {"prompt_wav_path": str(path), "prompt_text": text}
    if generation == "voxcpm2":
        kwargs["reference_wav_path"] = str(path)  # reference_prefix on: both modes together
    return kwargs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_zero_shot(model_dirs, generation, dtype, lang):
    text = EN if lang == "en" else ZH
    result = _run(model_dirs[generation, dtype], upstream_kwargs={"text": text},
                  request_kwargs={"text": text})
    assert result.applied.extra["mode"] == "zero_shot"
    assert result.applied.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_clone(model_dirs, references, generation, dtype, lang):
    text, ref = (EN, references["en"]) if lang == "en" else (ZH, references["zh"])
    result = _run(model_dirs[generation, dtype],
                  upstream_kwargs={"text": text, **_clone_upstream(generation, ref,
                                                                    REF_TEXT[lang])},
                  request_kwargs={"text": text,
                                  "reference": mizuoto.Reference(ref, REF_TEXT[lang])})
    expected_mode = "ref_continuation" if generation == "voxcpm2" else "continuation"
    assert result.applied.extra["mode"] == expected_mode


@pytest.mark.parametrize("dtype", DTYPES)
def test_v2_reference_only(model_dirs, references, dtype):
    ref = references["en"]
    result = _run(model_dirs["voxcpm2", dtype],
                  upstream_kwargs={"text": EN, "reference_wav_path": str(ref)},
                  request_kwargs={"text": EN, "reference": mizuoto.Reference(ref)})
    assert result.applied.extra["mode"] == "reference"


@pytest.mark.parametrize("dtype", DTYPES)
def test_v2_continuation_only(model_dirs, references, dtype):
    ref = references["zh"]
    result = _run(model_dirs["voxcpm2", dtype],
                  upstream_kwargs={"text": ZH, "prompt_wav_path": str(ref),
                                   "prompt_text": REF_TEXT["zh"]},
                  request_kwargs={"text": ZH, "reference": mizuoto.Reference(ref, REF_TEXT["zh"])},
                  params={"reference_prefix": False})
    assert result.applied.extra["mode"] == "continuation"


@pytest.mark.parametrize("dtype", DTYPES)
def test_v2_voice_design(model_dirs, dtype):
    instruction = "A warm, low female voice"
    _run(model_dirs["voxcpm2", dtype], upstream_kwargs={"text": f"({instruction}){EN}"},
         request_kwargs={"text": EN, "instruction": instruction})


def test_v2_instruction_with_cloned_voice(model_dirs, references):
    instruction = "speaking slowly"
    ref = references["en"]
    _run(model_dirs["voxcpm2", "bfloat16"],
         upstream_kwargs={"text": f"({instruction}){EN}", "reference_wav_path": str(ref)},
         request_kwargs={"text": EN, "instruction": instruction,
                         "reference": mizuoto.Reference(ref)})


@pytest.mark.parametrize("generation", ["voxcpm-0.5b", "voxcpm2"])
def test_normalize(model_dirs, generation):
    text = "I paid $3.50 for 2 apples on 2024-05-01."
    _run(model_dirs[generation, "bfloat16"],
         upstream_kwargs={"text": text},
         request_kwargs={"text": text}, params={"normalize": True})


@pytest.mark.parametrize("generation", GENERATIONS)
def test_forced_retry(model_dirs, generation):
    # ratio 0.5: the cap (tokens/2 + 10, at most max_len) is always a badcase -> 3 attempts
    params = {"max_len": 4, "retry_badcase_ratio_threshold": 0.5}
    result = _run(model_dirs[generation, "bfloat16"],
                  upstream_kwargs={"text": "hello world"},
                  request_kwargs={"text": "hello world"}, params=params)
    assert result.applied.retries == 2


def test_retry_limit_one(model_dirs):
    params = {"max_len": 4, "retry_badcase_ratio_threshold": 0.5, "retry_badcase_max_times": 1}
    result = _run(model_dirs["voxcpm2", "float32"], upstream_kwargs={"text": "hello world"},
                  request_kwargs={"text": "hello world"}, params=params)
    assert result.applied.retries == 0


@pytest.mark.parametrize("generation", ["voxcpm-0.5b", "voxcpm2"])
def test_stop_head(model_dirs, generation):
    # a biased stop head fires as soon as min_len allows: patch index min_len + 1
    result = _run(model_dirs[generation, "stop"], upstream_kwargs={"text": EN},
                  request_kwargs={"text": EN}, params={"max_len": 20, "min_len": 3})
    assert result.applied.extra["patches"] == 5


@pytest.mark.parametrize("generation", GENERATIONS)
def test_cap_reached(model_dirs, generation):
    result = _run(model_dirs[generation, "float32"], upstream_kwargs={"text": EN},
                  request_kwargs={"text": EN}, params={"max_len": 7})
    assert result.applied.extra["patches"] == 7


@pytest.mark.parametrize(("steps", "guidance"), [(1, 2.0), (4, 1.5), (50, 3.0), (7, 0.0)])
def test_steps_and_guidance(model_dirs, steps, guidance):
    generation = "voxcpm2" if steps != 4 else "voxcpm-1.5"
    _run(model_dirs[generation, "bfloat16"],
         upstream_kwargs={"text": EN, "inference_timesteps": steps, "cfg_value": guidance},
         request_kwargs={"text": EN, "steps": steps, "guidance": guidance},
         params={"max_len": 3})


def _stream_both(directory, upstream_kwargs, request_kwargs, params):
    up = _upstream(directory)
    expected = up.stream(SEED, **upstream_kwargs, **params)
    engine = _engine(directory)
    chunks = list(engine.stream(mizuoto.SynthesisRequest(seed=SEED, params=params,
                                                         **request_kwargs)))
    assert [c.audio.num_samples for c in chunks] == [len(e) for e in expected]
    for want, got in zip(expected, chunks, strict=True):
        _assert_same(want, got.audio.samples)
    assert chunks[-1].is_last and chunks[-1].applied is not None
    assert not any(c.is_last for c in chunks[:-1])
    return chunks


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generation", GENERATIONS)
def test_stream_zero_shot(model_dirs, generation, dtype):
    chunks = _stream_both(model_dirs[generation, dtype], {"text": EN}, {"text": EN},
                          {"max_len": 4})
    assert len(chunks) == 4


@pytest.mark.parametrize("generation", GENERATIONS)
def test_stream_with_voice(model_dirs, references, generation):
    directory = model_dirs[generation, "bfloat16"]
    ref = references["zh"]
    voice = _engine(directory).build_voice(mizuoto.Reference(ref, REF_TEXT["zh"]))
    _stream_both(directory, {"text": ZH, **_clone_upstream(generation, ref, REF_TEXT["zh"])},
                 {"text": ZH, "voice": voice}, {"max_len": 4})


@pytest.mark.parametrize("generation", ["voxcpm-0.5b", "voxcpm2"])
def test_stream_stops_where_upstream_stops(model_dirs, generation):
    # the stop head fires as soon as min_len (2) allows; Mizuoto reads it before yielding the
    # patch's chunk (to mark it last), upstream after: the same chunks either way
    chunks = _stream_both(model_dirs[generation, "stop"], {"text": EN}, {"text": EN},
                          {"max_len": 8})
    assert len(chunks) == 4

@pytest.mark.parametrize("generation", GENERATIONS)
def test_voice_cache(model_dirs, references, generation, tmp_path):
    directory = model_dirs[generation, "float32"]
    ref = references["en"]
    engine = _engine(directory)
    voice = engine.build_voice(mizuoto.Reference(ref, REF_TEXT["en"]))
    voice = mizuoto.Voice.load(voice.save(tmp_path / "voice.safetensors"))
    _run(directory, upstream_kwargs={"text": EN, **_clone_upstream(generation, ref,
                                                                    REF_TEXT["en"])},
         request_kwargs={"text": EN, "voice": voice})


def test_voice_cache_reference_only(model_dirs, references):
    directory = model_dirs["voxcpm2", "bfloat16"]
    ref = references["zh"]
    voice = _engine(directory).build_voice(mizuoto.Reference(ref))
    _run(directory, upstream_kwargs={"text": ZH, "reference_wav_path": str(ref)},
         request_kwargs={"text": ZH, "voice": voice})


def test_voice_from_bf16_model_works_on_fp32_copy(model_dirs, references):
    # voices hold float32 VAE latents: the same weights in another dtype accept them
    ref = references["en"]
    voice = _engine(model_dirs["voxcpm2", "bfloat16"]).build_voice(mizuoto.Reference(ref))
    directory = model_dirs["voxcpm2", "float32"]
    _run(directory, upstream_kwargs={"text": EN, "reference_wav_path": str(ref)},
         request_kwargs={"text": EN, "voice": voice})


def test_v2_instruction_with_saved_voice(model_dirs, references):
    # a voice built with a transcript holds both layouts; an instruction uses the reference only
    instruction = "whispering"
    ref = references["zh"]
    directory = model_dirs["voxcpm2", "float32"]
    voice = _engine(directory).build_voice(mizuoto.Reference(ref, REF_TEXT["zh"]))
    result = _run(directory,
                  upstream_kwargs={"text": f"({instruction}){ZH}", "reference_wav_path": str(ref)},
                  request_kwargs={"text": ZH, "instruction": instruction, "voice": voice})
    assert result.applied.extra["mode"] == "reference" and result.applied.warnings


def _rope(head_dim: int, original: int) -> dict:
    return {"long_factor": [1.0 + 0.37 * i for i in range(head_dim // 2)],
            "short_factor": [1.0 + 0.11 * i for i in range(head_dim // 2)],
            "original_max_position_embeddings": original}


# Widths unlike the fixture's, each within upstream's constraints (one head dim for all stacks,
# twice the rope factors; local stacks share the LM's key/value heads), with the request
# settings swept against them: name -> (generation, config overrides, VAE overrides, request)
CUSTOM = {
    # head dim 8, patch 1, no muP, cache of 300 (no multiple of the CPU attention span),
    # max_position_embeddings == original (the short rope factors), an 8 kHz VAE
    "0.5b-head8-patch1": ("voxcpm-0.5b", {
        "lm_config": {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
                      "num_hidden_layers": 3, "use_mup": False, "rope_theta": 1e6,
                      "max_position_embeddings": 512, "rope_scaling": _rope(8, 512)},
        "encoder_config": {"hidden_dim": 8, "num_heads": 1, "num_layers": 1},
        "dit_config": {"hidden_dim": 32, "num_heads": 4, "ffn_dim": 100, "num_layers": 3},
        "patch_size": 1, "residual_lm_num_layers": 3, "max_length": 300,
        "scalar_quantization_scale": 3, "dit_mean_mode": True},
        {"encoder_rates": (2, 4, 5), "decoder_rates": (5, 4, 2), "sample_rate": 8000,
         "latent_dim": 4},
        {"seed": 0, "steps": 2, "guidance": 0.0, "text": "Hi", "lang": "en",
         "modes": ("clone", "stream")}),
    # head dim 32 through kv_channels (hidden 48), patch 5, rope theta 1e6, 22.05 kHz VAE
    "1.5-kv-channels-patch5": ("voxcpm-1.5", {
        "lm_config": {"hidden_size": 48, "kv_channels": 32, "num_attention_heads": 2,
                      "num_key_value_heads": 2, "scale_emb": 2.5, "scale_depth": 1.0,
                      "rope_theta": 1e6, "rope_scaling": _rope(32, 256)},
        "encoder_config": {"hidden_dim": 40, "num_heads": 2, "kv_channels": 32},
        "dit_config": {"hidden_dim": 128, "num_heads": 4},
        "patch_size": 5, "residual_lm_num_layers": 1, "scalar_quantization_latent_dim": 24},
        {"encoder_rates": (2, 3, 4, 5), "decoder_rates": (5, 4, 3, 2), "sample_rate": 22050,
         "latent_dim": 16, "depthwise": False},
        {"seed": 2**31 - 1, "steps": 25, "guidance": 1.5, "text": ZH, "lang": "zh",
         "modes": ("zero_shot", "stream")}),
    # VoxCPM2: a rotary residual LM, the mean-mode DiT, a 24 kHz decoder conditioned by concat
    "2-rope-residual-24k": ("voxcpm2", {
        "lm_config": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 1,
                      "num_hidden_layers": 1, "rope_scaling": _rope(8, 256)},
        "encoder_config": {"hidden_dim": 16, "num_heads": 2},
        "dit_config": {"hidden_dim": 8, "num_heads": 1, "num_layers": 3, "dit_mean_mode": True},
        "patch_size": 3, "residual_lm_no_rope": False, "max_length": 1000},
        {"out_sample_rate": 24000, "sr_bin_boundaries": (16000,), "cond_type": "concat",
         "cond_out_layer": True, "cond_dim": 16, "latent_dim": 4, "decoder_dim": 64},
        {"seed": 2**32 - 1, "steps": 3, "guidance": 3.0, "text": "A. B. C.", "lang": "en",
         "modes": ("clone", "stream")}),
    "2-no-rope-lm-unconditioned-vae": ("voxcpm2", {
        "lm_config": {"no_rope": True, "use_mup": False, "num_hidden_layers": 3},
        "patch_size": 2, "residual_lm_num_layers": 1},
        {"sr_bin_boundaries": None, "cond_type": "add", "latent_dim": 16},
        {"seed": 1, "steps": 1, "guidance": 1.0, "text": "混合 mixed 文本 42。", "lang": "zh",
         "modes": ("zero_shot", "clone")}),
}


@pytest.fixture(scope="module")
def custom_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("voxcpm-custom")
    return {name: write_random_model(root / name, generation, seed=8, overrides=overrides,
                                     vae_overrides=vae, dtype="float32" if i % 2 else "bfloat16")
            for i, (name, (generation, overrides, vae, _)) in enumerate(CUSTOM.items())}


@pytest.mark.parametrize(("name", "mode"), [(name, mode) for name in sorted(CUSTOM)
                                             for mode in CUSTOM[name][3]["modes"]])
def test_custom_widths(custom_dirs, references, name, mode):
    generation, _, _, request = CUSTOM[name]
    directory, text, lang = custom_dirs[name], request["text"], request["lang"]
    settings = {"inference_timesteps": request["steps"], "cfg_value": request["guidance"]}
    if mode == "stream":
        up = _upstream(directory)
        expected = up.stream(request["seed"], text=text, max_len=3, **settings)
        chunks = list(_engine(directory).stream(mizuoto.SynthesisRequest(
            text, seed=request["seed"], params={"max_len": 3, **settings})))
        assert [c.audio.num_samples for c in chunks] == [len(e) for e in expected]
        for want, got in zip(expected, chunks, strict=True):
            _assert_same(want, got.audio.samples)
        return
    upstream_kwargs, request_kwargs = {"text": text}, {"text": text}
    if mode == "clone":
        ref = references[lang]
        upstream_kwargs.update(_clone_upstream(generation, ref, REF_TEXT[lang]))
        request_kwargs["reference"] = mizuoto.Reference(ref, REF_TEXT[lang])
    _run(directory, upstream_kwargs=upstream_kwargs, request_kwargs=request_kwargs,
         params={"max_len": 3, **settings}, seed=request["seed"])


@pytest.mark.parametrize("generation", ["voxcpm-0.5b", "voxcpm2"])
def test_vae_noise_continues_the_sampler(model_dirs, references, generation):
    """Upstream's VAE noise blocks draw from the global generator its sampler used: after the
    kept (third) attempt's draws, and when streaming between one patch's draw and the next."""
    directory = model_dirs[generation, "noise"]
    ref = references["en"]
    _run(directory, upstream_kwargs={"text": EN, **_clone_upstream(generation, ref,
                                                                    REF_TEXT["en"])},
         request_kwargs={"text": EN, "reference": mizuoto.Reference(ref, REF_TEXT["en"])},
         params={"max_len": 3, "retry_badcase_ratio_threshold": 0.1})
    _stream_both(directory, {"text": EN}, {"text": EN}, {"max_len": 3})


def test_pytorch_model_bin(tmp_path_factory):
    # VoxCPM-0.5B ships pytorch_model.bin; upstream reads {"state_dict": ...} or a plain dict
    directory = write_random_model(tmp_path_factory.mktemp("bin") / "v05", "voxcpm-0.5b",
                                   seed=4, weights_format="bin")
    _run(directory, upstream_kwargs={"text": EN}, request_kwargs={"text": EN})


@pytest.mark.parametrize("generation", ["voxcpm-1.5", "voxcpm2"])
def test_in_memory_reference_audio(model_dirs, references, generation, tmp_path):
    # an Audio object gives what upstream gives for the same samples in a float WAV file
    samples, rate = sf.read(references["en"], dtype="float32")
    path = tmp_path / "float.wav"
    sf.write(path, samples, rate, subtype="FLOAT")
    audio = mizuoto.Audio(torch.from_numpy(samples), rate)
    _run(model_dirs[generation, "bfloat16"],
         upstream_kwargs={"text": EN, **_clone_upstream(generation, path, REF_TEXT["en"])},
         request_kwargs={"text": EN, "reference": mizuoto.Reference(audio, REF_TEXT["en"])})
