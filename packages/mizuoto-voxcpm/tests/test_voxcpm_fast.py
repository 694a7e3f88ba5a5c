"""engines.voxcpm.fast: int8 profiles quantize what they say and say it in applied; the exact
default reports itself off and keeps float layers; refused where torch has no int8 kernels."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

import mizuoto
from mizuoto.errors import InvalidOption
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import with_dtype, write_random_model


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("voxcpm-fast")
    base = write_random_model(root / "v05", "voxcpm-0.5b", seed=3)
    return {"bfloat16": base, "float32": with_dtype(base, root / "v05-fp32", "float32")}


def _load(directory, fast):
    return VoxCPMEngine.load(directory, options=mizuoto.Options.from_mapping(
        {"engines.voxcpm.fast": fast}))


def _say(engine):
    return engine.synthesize(mizuoto.SynthesisRequest(text="Hello world.", seed=1,
                                                      params={"max_len": 4}))


def _float_linears(module):
    return sum(isinstance(m, nn.Linear) for m in module.modules())


def test_profiles_quantize_what_they_say(dirs):
    exact, lm_only, every = (_load(dirs["float32"], f) for f in ("off", "int8-lm", "int8"))
    assert _float_linears(exact.model.base_lm) > 0
    assert _float_linears(lm_only.model.base_lm) == _float_linears(lm_only.model.residual_lm) == 0
    assert _float_linears(lm_only.model.feat_decoder) == _float_linears(exact.model.feat_decoder)
    assert _float_linears(every.model.feat_decoder) == 0
    assert _float_linears(every.model.feat_encoder) == 0
    results = {f: _say(e) for f, e in (("off", exact), ("int8-lm", lm_only), ("int8", every))}
    for name, result in results.items():
        assert result.applied.compute["fast"] == name
        assert torch.isfinite(result.audio.samples).all()
    assert not torch.equal(results["int8-lm"].audio.samples, results["off"].audio.samples)
    # int8-lm leaves the DiT as the exact path's, and says so
    assert not lm_only.model.feat_decoder.estimator.patch_rows_only
    assert results["int8-lm"].applied.compute["fast_dit"] == "as exact"
    assert results["int8-lm"].applied.compute["fast_traces"].startswith("none (int8-lm")
    assert lm_only.model.feat_decoder.estimator.shape_traces is None
    assert lm_only.model.feat_encoder.shape_traces is None
    assert "fast_traces" not in results["off"].applied.compute


def test_the_int8_profiles_steps_replay_proven_traces_per_shape_with_the_same_bits(dirs):
    """A single stream's guided DiT evaluation, step encoding and both LMs' steps (one trace
    for every position, confirmed at the rehearsal's second) are traced and proven while
    loading (said in applied.compute); a batch's pairs get their own trace on first use; a
    prompt's encoding stays eager; the audio is the eager modules', bit for bit."""
    from mizuoto_voxcpm.fast import TRACED_STEPS

    engine = _load(dirs["float32"], "int8")
    estimator, encoder = engine.model.feat_decoder.estimator, engine.model.feat_encoder
    traces = estimator.shape_traces
    assert traces.traced == 1 and traces.eager_shapes == {}
    assert encoder.shape_traces.traced == 1
    lms = (engine.model.base_lm, engine.model.residual_lm)
    for lm in lms:
        assert lm.shape_traces.traced == 1 and lm.shape_traces.awaiting_confirmation == 0
    traced = _say(engine)
    assert traced.applied.compute["fast_traces"] == TRACED_STEPS
    assert encoder.shape_traces.traced == 1  # the prompt's patches: eager, not a new trace
    generator = torch.Generator().manual_seed(5)
    channels, patch = estimator.in_proj.in_features, engine.model.config.patch_size
    mu_width = estimator.cond_proj.out_features * (
        engine.model.config.patch_size if estimator.separate_condition else 1)
    for rows in (2, 6):  # a guided pair; three sequences' pairs (a batch)
        x = torch.randn(rows, channels, patch, generator=generator)
        mu = torch.randn(rows, mu_width, generator=generator)
        cond = torch.randn(rows, channels, patch, generator=generator)
        t, dt = torch.rand(rows, generator=generator), torch.zeros(rows)
        batched = rows > 2
        with torch.inference_mode():
            expected = estimator.evaluate(x, mu, t, cond, dt, pairs=batched)
            assert torch.equal(estimator(x, mu, t, cond, dt, pairs=batched), expected)
            assert torch.equal(estimator(x, mu, t, cond, dt, pairs=batched), expected)
    # the test's pair (its own strides) and the batch's pairs: a trace each
    assert traces.traced == 3 and traces.eager_shapes == {}
    with torch.inference_mode():
        patches = torch.randn(3, 1, patch, channels, generator=generator)
        assert torch.equal(encoder(patches), encoder.encode(patches))
    assert encoder.shape_traces.traced == 2
    assert all(lm.shape_traces.traced == 1 and lm.shape_traces.eager_shapes == {}
               for lm in lms)  # every position of the request: the one trace
    estimator.shape_traces = encoder.shape_traces = None
    for lm in lms:
        lm.shape_traces = None
    assert torch.equal(_say(engine).audio.samples, traced.audio.samples)  # eager: the same


def test_a_trace_that_fails_leaves_its_part_eager_and_applied_names_which(dirs, monkeypatch):
    """Each traced part says its name in a fallback's reason (both LMs apart); the eager part
    gives the audio it gives untraced."""
    from mizuoto.runtime.shape_traces import MethodCall

    real_trace = torch.jit.trace

    def refuse_lm_steps(module, *args, **kwargs):
        if isinstance(module, MethodCall) and module.method == "step_filled":
            raise RuntimeError("refused by the test")
        return real_trace(module, *args, **kwargs)

    monkeypatch.setattr(torch.jit, "trace", refuse_lm_steps)
    engine = _load(dirs["float32"], "int8")
    result = _say(engine)
    said = result.applied.compute["fast_traces"]
    assert said.startswith("eager where unproven: ")
    assert "base LM decode step: tracing failed: RuntimeError: refused by the test" in said
    assert "residual LM decode step: tracing failed" in said
    assert "local DiT" not in said and "local encoder" not in said
    engine.model.base_lm.shape_traces = engine.model.residual_lm.shape_traces = None
    assert torch.equal(_say(engine).audio.samples, result.audio.samples)


@pytest.mark.parametrize("profile", ["int8", "int8-lm"])
def test_a_fast_profile_samples_its_documented_steps_unless_something_sets_them(
        dirs, tmp_path, profile):
    """A fast profile's request that sets no steps takes FAST_PROFILE_STEPS (5, not upstream's
    10), said in applied.sampler and sampler_defaults; a request's steps, its
    inference_timesteps and the model directory's defaults still win; the exact path keeps
    upstream's 10."""
    from mizuoto.contracts.model_defaults import write_model_defaults
    from mizuoto_voxcpm.engine import FAST_PROFILE_STEPS

    fast, exact = _load(dirs["float32"], profile), _load(dirs["float32"], "off")
    assert FAST_PROFILE_STEPS == 5
    assert fast.sampler_defaults()["steps"] == 5 and exact.sampler_defaults()["steps"] == 10

    def steps(engine, **request):
        params = {"max_len": 2, **request.pop("params", {})}
        result = engine.synthesize(mizuoto.SynthesisRequest(text="Hi.", seed=1, params=params,
                                                            **request))
        return result.applied.sampler["steps"]

    assert steps(fast) == 5 and steps(exact) == 10
    assert steps(fast, steps=3) == 3
    assert steps(fast, params={"inference_timesteps": 10}) == 10
    with_defaults = tmp_path / "with-defaults"
    shutil.copytree(dirs["float32"], with_defaults)
    write_model_defaults(with_defaults, {"inference_timesteps": 8}, "test")
    assert steps(_load(with_defaults, profile)) == 8


def test_a_bfloat16_model_loads_in_float32_for_int8_with_the_dtype_on_auto(dirs):
    """The profile's kernels quantize float32 layers: with engines.voxcpm.dtype=auto asking
    for it is asking for float32, said in applied; the same audio as a float32 load."""
    engine = _load(dirs["bfloat16"], "int8-lm")
    result = _say(engine)
    assert result.applied.dtype == "float32"
    assert result.applied.compute["fast"] == "int8-lm"
    assert torch.equal(result.audio.samples, _say(_load(dirs["float32"], "int8-lm")).audio.samples)


def test_int8_needs_float32_and_refuses_a_lora(dirs, tmp_path):
    for setting in ("engines.voxcpm.dtype", "compute.dtype"):
        with pytest.raises(InvalidOption, match="engines.voxcpm.dtype=float32"):
            VoxCPMEngine.load(dirs["bfloat16"], options=mizuoto.Options.from_mapping(
                {"engines.voxcpm.fast": "int8-lm", setting: "bfloat16"}))
    with pytest.raises(InvalidOption, match="engines.voxcpm.fast"):
        _load(dirs["float32"], "fp4")
    engine = _load(dirs["float32"], "int8-lm")
    with pytest.raises(InvalidOption, match="engines.voxcpm.fast=off"):
        engine.set_lora(tmp_path)


@pytest.mark.parametrize("profile", ["int8", "int8-lm"])
def test_int8_where_torch_has_no_int8_kernels_is_refused_before_the_model_is_read(
        dirs, monkeypatch, profile):
    from mizuoto.runtime import dynamic_int8
    from mizuoto_voxcpm import engine as engine_module

    def never(*args, **kwargs):
        raise AssertionError("the model was read before the option was checked")

    monkeypatch.setattr(engine_module, "load_model", never)
    monkeypatch.setattr(dynamic_int8, "dynamic_int8_unavailable",
                        lambda: "this torch has no int8 kernel for this CPU")
    with pytest.raises(InvalidOption, match="engines.voxcpm.fast") as error:
        _load(dirs["float32"], profile)
    assert "no int8 kernel" in str(error.value) and "engines.voxcpm.fast=off" in str(error.value)


def test_the_int8_profile_runs_the_packed_kernel_where_torch_has_it_near_the_exact_path(dirs):
    """The int8 kernel is said in applied.compute["fast_kernel"] (fbgemm's packed one where
    this torch has it, else the dynamic layer) and in the model's
    identity; on this tiny model its audio stays near the exact path's (not equal: int8)."""
    from mizuoto.benchmarking.quality import snr_db
    from mizuoto.identity import model_identity
    from mizuoto.runtime.packed_int8 import KERNEL_NAME, PackedInt8Linear, packed_int8_unavailable
    from mizuoto_voxcpm.fast import (
        DYNAMIC_KERNEL,
        FOLDED_HEADS,
        FUSED_ELEMENTWISE,
        FUSED_PRODUCTS,
        PATCH_ROWS_ONLY,
    )

    packed = packed_int8_unavailable() is None
    kernel = KERNEL_NAME if packed else DYNAMIC_KERNEL
    exact, fast = _load(dirs["float32"], "off"), _load(dirs["float32"], "int8")
    request = mizuoto.SynthesisRequest(text="Hello world.", seed=1, steps=10,
                                       params={"max_len": 4})
    reference, result = exact.synthesize(request), fast.synthesize(request)
    assert result.applied.compute["fast_kernel"] == kernel
    assert "fast_kernel" not in reference.applied.compute
    assert model_identity(fast)["fast_kernel"] == kernel and "fast_kernel" not in \
        model_identity(exact)
    attention = fast.model.base_lm.layers[0].self_attn
    assert attention.folded_heads and not exact.model.base_lm.layers[0].self_attn.folded_heads
    assert result.applied.compute["fast_attention"] == FOLDED_HEADS
    # over the filled cache positions (the exact path's spans grow by 256, masked)
    assert result.applied.compute["attention"] == "fast"
    assert reference.applied.compute["attention"] == "exact"
    assert result.applied.compute["fast_elementwise"] == FUSED_ELEMENTWISE
    assert "fast_elementwise" not in reference.applied.compute
    assert fast.model.base_lm.norm.fused and not exact.model.base_lm.norm.fused
    assert result.applied.compute["fast_dit"] == PATCH_ROWS_ONLY
    assert fast.model.feat_decoder.estimator.patch_rows_only
    assert not exact.model.feat_decoder.estimator.patch_rows_only
    if kernel == KERNEL_NAME:
        assert any(isinstance(m, PackedInt8Linear) for m in fast.model.feat_decoder.modules())
        # q/k/v and gate/up one product each, in every component's decoder layers
        assert isinstance(attention.qkv_proj, PackedInt8Linear)
        assert isinstance(fast.model.feat_decoder.estimator.decoder.layers[0].mlp.gate_up_proj,
                          PackedInt8Linear)
        assert result.applied.compute["fast_products"] == FUSED_PRODUCTS
    a, b = reference.audio.samples.numpy().ravel(), result.audio.samples.numpy().ravel()
    assert a.shape == b.shape and not torch.equal(reference.audio.samples, result.audio.samples)
    assert snr_db(a, b) > 20  # 38 dB (packed), 33 dB (dynamic) on an AVX512 EPYC


def test_auto_takes_the_packed_kernel_wherever_torch_has_it(monkeypatch):
    """The packed kernel narrows its weights to 7 bits where the CPU would clip byte-product
    pairs (AVX2), so auto takes it on every CPU; the dynamic layer only where torch lacks the
    packed op, and when asked for."""
    from mizuoto.runtime.packed_int8 import KERNEL_NAME, packed_int8_unavailable
    from mizuoto_voxcpm import fast as fast_module

    expected = KERNEL_NAME if packed_int8_unavailable() is None else fast_module.DYNAMIC_KERNEL
    assert fast_module.fast_kernel("int8", "auto") == expected
    assert fast_module.fast_kernel("int8", "dynamic") == fast_module.DYNAMIC_KERNEL
    monkeypatch.setattr(fast_module, "packed_int8_unavailable", lambda: "no fbgemm here")
    assert fast_module.fast_kernel("int8", "auto") == fast_module.DYNAMIC_KERNEL


def test_the_int8_kernel_option_chooses_the_kernel_and_refuses_one_torch_lacks(dirs, monkeypatch):
    from mizuoto_voxcpm import engine as engine_module
    from mizuoto_voxcpm import fast as fast_module
    from mizuoto_voxcpm.fast import DYNAMIC_KERNEL

    def load(kernel):
        return VoxCPMEngine.load(dirs["float32"], options=mizuoto.Options.from_mapping(
            {"engines.voxcpm.fast": "int8", "engines.voxcpm.int8_kernel": kernel}))

    dynamic = load("dynamic")
    applied = _say(dynamic).applied.compute
    assert applied["fast_kernel"] == DYNAMIC_KERNEL
    # per-tensor weights: fusing would change them, so the products stay apart
    assert applied["fast_products"] == "separate"
    assert dynamic.model.base_lm.layers[0].self_attn.qkv_proj is None
    assert not any(type(m).__name__ == "PackedInt8Linear" for m in dynamic.model.modules())
    with pytest.raises(InvalidOption, match="engines.voxcpm.int8_kernel"):
        load("vnni")

    def never(*args, **kwargs):
        raise AssertionError("the model was read before the option was checked")

    monkeypatch.setattr(engine_module, "load_model", never)
    monkeypatch.setattr(fast_module, "packed_int8_unavailable", lambda: "no fbgemm here")
    with pytest.raises(InvalidOption, match="engines.voxcpm.int8_kernel=auto or dynamic"):
        load("packed")



@pytest.mark.parametrize("setting", [None, "bfloat16", "float32", "int8"])
def test_the_int8_profile_decodes_in_the_vae_dtype_it_says(dirs, setting):
    """engines.voxcpm.fast_vae: int8's VAE decoder runs its transposed and pointwise
    convolutions in int8 by default (auto, where torch has the packed kernel), in float32 or
    bfloat16 when asked for; said in applied.compute["fast_vae"]; a whole utterance and a
    stream both give float32 audio, near the float32 decoder's."""
    from mizuoto.benchmarking.quality import snr_db
    from mizuoto.runtime.packed_int8 import packed_int8_unavailable
    from mizuoto.runtime.packed_int8_conv import Int8ConvTranspose1d, Int8PointwiseConv1d

    options = {"engines.voxcpm.fast": "int8"}
    if setting is not None:
        options["engines.voxcpm.fast_vae"] = setting
    engine = VoxCPMEngine.load(dirs["float32"], options=mizuoto.Options.from_mapping(options))
    expected = setting or ("int8" if packed_int8_unavailable() is None else "float32")
    dtype = "bfloat16" if expected == "bfloat16" else "float32"
    assert str(next(engine.vae.decoder.parameters()).dtype) == f"torch.{dtype}"
    assert next(engine.vae.encoder.parameters()).dtype == torch.float32
    int8_layers = [m for m in engine.vae.modules()
                   if isinstance(m, (Int8ConvTranspose1d, Int8PointwiseConv1d))]
    assert bool(int8_layers) == (expected == "int8")
    assert all(any(m is layer for layer in engine.vae.decoder.modules()) for m in int8_layers)
    result = _say(engine)
    assert result.applied.compute["fast_vae"] == expected
    streamed = torch.cat([chunk.audio.samples.reshape(-1) for chunk in engine.stream(
        mizuoto.SynthesisRequest(text="Hello world.", seed=1, params={"max_len": 4}))])
    for audio in (result.audio.samples, streamed):
        assert audio.dtype == torch.float32 and torch.isfinite(audio).all()
    if expected != "float32":
        float32 = _say(VoxCPMEngine.load(dirs["float32"], options=mizuoto.Options.from_mapping(
            {"engines.voxcpm.fast": "int8", "engines.voxcpm.fast_vae": "float32"})))
        a, b = float32.audio.samples.numpy().ravel(), result.audio.samples.numpy().ravel()
        assert a.shape == b.shape and not torch.equal(float32.audio.samples,
                                                      result.audio.samples)
        assert snr_db(a, b) > 20


def test_the_vae_dtype_is_a_fast_profile_setting_only(dirs):
    exact = _load(dirs["float32"], "off")
    assert next(exact.vae.decoder.parameters()).dtype == torch.float32
    assert "fast_vae" not in _say(exact).applied.compute
    with pytest.raises(InvalidOption, match="engines.voxcpm.fast_vae") as error:
        VoxCPMEngine.load(dirs["float32"], options=mizuoto.Options.from_mapping(
            {"engines.voxcpm.fast_vae": "bfloat16"}))
    assert "engines.voxcpm.fast=int8" in str(error.value)
    with pytest.raises(InvalidOption, match="engines.voxcpm.fast_vae"):
        VoxCPMEngine.load(dirs["float32"], options=mizuoto.Options.from_mapping(
            {"engines.voxcpm.fast": "int8", "engines.voxcpm.fast_vae": "float16"}))


def test_a_fast_profile_stream_decodes_only_each_windows_newest_patch(dirs):
    """The first generation's stream re-decodes a 3-patch window per patch; a fast profile
    decodes only what the newest patch's samples depend on (said in applied), samples equal
    to the whole window's up to float rounding; the exact path decodes the whole window."""
    from mizuoto_voxcpm.decoding import StreamDecoder, decode_segments
    from mizuoto_voxcpm.engine import TAIL_DECODE

    exact, fast = _load(dirs["float32"], "off"), _load(dirs["float32"], "int8")
    request = mizuoto.SynthesisRequest(text="Hello world.", seed=1, params={"max_len": 4})
    chunks = list(fast.stream(request))
    assert chunks[-1].applied.compute["fast_stream_decode"] == TAIL_DECODE
    assert "fast_stream_decode" not in list(exact.stream(request))[-1].applied.compute
    assert fast._steps.tail_decode and not exact._steps.tail_decode
    config = exact.config
    patches = [torch.randn(1, config.patch_size, config.feat_dim) for _ in range(4)]
    whole, tail = (StreamDecoder(exact.vae, context=[], v2=False, patch_size=config.patch_size,
                                 tail=t) for t in (False, True))
    assert tail.tail and not whole.tail
    for patch in patches:
        expected = whole.decode(patch)
        (alone,) = decode_segments([tail], [patch])
        assert alone.shape == expected.shape
        torch.testing.assert_close(alone, expected, rtol=1e-4, atol=1e-5)


def test_an_int8_vae_is_refused_where_torch_lacks_the_packed_kernel(dirs, monkeypatch):
    from mizuoto_voxcpm import fast as fast_module

    monkeypatch.setattr(fast_module, "packed_int8_unavailable", lambda: "no fbgemm here")
    with pytest.raises(InvalidOption, match="engines.voxcpm.fast_vae") as error:
        VoxCPMEngine.load(dirs["float32"], options=mizuoto.Options.from_mapping(
            {"engines.voxcpm.fast": "int8", "engines.voxcpm.fast_vae": "int8"}))
    assert "no fbgemm here" in str(error.value) and "fast_vae=auto" in str(error.value)
    assert fast_module.fast_vae("int8", "auto") == "float32"


@pytest.mark.parametrize(("dtype", "fast"), [("bfloat16", "off"), ("float32", "off"),
                                             ("float32", "int8")])
def test_a_model_loaded_under_inference_mode_gives_the_same_audio(dirs, dtype, fast):
    """Loading inside ``torch.inference_mode()`` makes inference tensors, which keep no
    version counter: the packed copies' stamps (prepacked, int8 linears and convolutions)
    must not need one (they raised RuntimeError before)."""
    with torch.inference_mode():
        inside = _load(dirs[dtype], fast)
        in_block = _say(inside)
    outside = _say(_load(dirs[dtype], fast))
    assert torch.equal(in_block.audio.samples, outside.audio.samples)
    assert torch.equal(_say(inside).audio.samples, outside.audio.samples)


def test_applied_fast_traces_reads_what_trace_fast_steps_set():
    """``fast_traces_applied`` decides nothing itself: a model whose parts trace_fast_steps
    left untraced (int8 under compute.compile) reads as such, one traced reads as traced."""
    from types import SimpleNamespace

    from mizuoto_voxcpm.fast import TRACED_STEPS, fast_traces_applied, trace_fast_steps

    class Part:
        shape_traces = None

        def trace_steps(self, name=None):
            self.shape_traces = SimpleNamespace(traced=1, name=name, eager_shapes={})

        trace_evaluations = trace_steps

    def model():
        return SimpleNamespace(feat_decoder=SimpleNamespace(estimator=Part()),
                               feat_encoder=Part(), base_lm=Part(), residual_lm=Part())

    compiled, plain = model(), model()
    assert trace_fast_steps(compiled, "int8", compiled=True) is False
    assert trace_fast_steps(plain, "int8", compiled=False) is True
    assert fast_traces_applied(compiled, "int8") == {
        "fast_traces": "none: compute.compile owns the DiT"}
    assert fast_traces_applied(plain, "int8") == {"fast_traces": TRACED_STEPS}
    assert fast_traces_applied(plain, "off") == {}
