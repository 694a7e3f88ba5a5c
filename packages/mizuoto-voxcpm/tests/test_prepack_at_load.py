"""compute.prepack proves its packed kernels while the model loads (one rehearsed patch), not
in the first request: a request of one stream at the load's thread count proves nothing, gives
the bits of compute.prepack=off, and finds the model's cache slot as the load left it."""

from __future__ import annotations

import pytest
import torch

import mizuoto
from mizuoto.runtime.prepack import MAX_ROWS, PrepackedLinear, has_packable_layers
from mizuoto.runtime.prepack_fused import FusedPrepack
from mizuoto_voxcpm.engine import VoxCPMEngine
from mizuoto_voxcpm.fixtures import with_dtype, write_random_model

# longer than prepack.MAX_ROWS tokens: the prefill runs plain layers and proves nothing
TEXT = "Hello world, this is a slightly longer test sentence."


@pytest.fixture(scope="module", params=["voxcpm-0.5b", "voxcpm-1.5", "voxcpm2"])
def model_dir(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("voxcpm-prepack-load")
    return with_dtype(write_random_model(root / "model", request.param, seed=3),
                      root / "fp32", "float32")


def _load(model_dir, mode):
    return VoxCPMEngine.load(model_dir, options=mizuoto.Options.from_mapping(
        {"compute.device": "cpu", "compute.prepack": mode}))


def _say(engine):
    return engine.synthesize(mizuoto.SynthesisRequest(text=TEXT, seed=1, params={"max_len": 4}))


def test_the_decode_is_proven_at_load(model_dir, monkeypatch):
    engine = _load(model_dir, "auto")
    groups = engine.model.component_groups()
    assert has_packable_layers(groups), "float32 MKL packing runs on every x86 CPU torch has"
    tried = [m for g in groups.values() for root in g for m in root.modules()
             if isinstance(m, PrepackedLinear) and (m._rows_ok or m._rows_tried)]
    assert len(tried) > 20  # the LMs', encoder's, DiT's and stop head's layers
    slot = engine.model.caches
    assert (slot.lm.length, int(slot.lm.position), slot.residual.length) == (0, 0, 0)
    proofs = []
    original = PrepackedLinear._try
    monkeypatch.setattr(PrepackedLinear, "_try",
                        lambda self, key, x: proofs.append(key) or original(self, key, x))
    fused = FusedPrepack._try
    monkeypatch.setattr(FusedPrepack, "_try",
                        lambda self, key, x: proofs.append(key) or fused(self, key, x))
    packed = _say(engine)
    assert proofs == [], "a request proved kernels the load should have"
    assert torch.equal(packed.audio.samples, _say(_load(model_dir, "off")).audio.samples)


def test_a_bfloat16_load_proves_the_prefill_too(tmp_path, monkeypatch):
    """bfloat16, as VoxCPM ships: where the kernel sums each row on its own (bf16dot, a CPU
    without native bfloat16) every packed product, fused or alone, is proven for a prefill's
    long inputs at load, so the first request's prefill does not run torch's own kernel
    (10 GMAC/s on AVX2) while it waits for a proof; and a request proves nothing."""
    from mizuoto.runtime.prepack import MANY_ROWS, ROW_INVARIANT

    model_dir = with_dtype(write_random_model(tmp_path / "model", "voxcpm-0.5b", seed=3),
                           tmp_path / "bf16", "bfloat16")
    engine = _load(model_dir, "auto")
    modules = [m for g in engine.model.component_groups().values() for root in g
               for m in root.modules()]
    fused = [f for m in modules for f in (getattr(m, "qkv_fused", None),
                                          getattr(m, "gate_up_fused", None))
             if isinstance(f, FusedPrepack)]
    alone = [m for m in modules if isinstance(m, PrepackedLinear) and m._pack is not None]
    for product, kernel in [(f, f.kernel) for f in fused] + [(m, m._pack[0]) for m in alone]:
        if kernel in ROW_INVARIANT and any(key[3] for key in product._rows_ok):
            assert any(key[0] == MANY_ROWS for key in product._rows_ok), product
    proofs = []
    for cls in (PrepackedLinear, FusedPrepack):
        original = cls._try
        monkeypatch.setattr(cls, "_try", lambda self, key, x, original=original: (
            proofs.append(key) or original(self, key, x)))
    packed = _say(engine)
    assert proofs == [], "a request proved kernels the load should have"
    assert torch.equal(packed.audio.samples, _say(_load(model_dir, "off")).audio.samples)


def test_nothing_is_rehearsed_without_packable_layers(model_dir, monkeypatch):
    calls = []
    monkeypatch.setattr("mizuoto_voxcpm.engine.rehearse_patches",
                        lambda model, patches: calls.append(patches))
    _load(model_dir, "off")
    assert calls == []
    _load(model_dir, "auto")
    assert len(calls) == 1
    assert calls == [1]  # the exact path has no step traces to confirm: one patch


def test_the_dits_guided_rows_are_proven_at_load(model_dir):
    """The DiT's evaluation of one stream has more rows than MAX_ROWS once a patch is long
    (VoxCPM1.5, VoxCPM2): its layers prove that row count at load too."""
    model = _load(model_dir, "auto").model
    assert model.dit_rows == {2: 10, 4: 22 if model.config.is_v2 else 18}[model.patch_size]
    layers = [m for m in model.feat_decoder.estimator.decoder.modules()
              if isinstance(m, PrepackedLinear)]
    assert layers
    # q/k/v and gate/up are proven as one fused product (each layer alone where it is not)
    fused = [f for m in model.feat_decoder.estimator.decoder.modules()
             for f in (getattr(m, "qkv_fused", None), getattr(m, "gate_up_fused", None))
             if f is not None]
    assert len(fused) == 2 * len(model.feat_decoder.estimator.decoder.layers)
    fused_rows = {id(layer): {key[0] for key in f._rows_ok | f._rows_tried}
                  for f in fused for layer in f.layers}
    for layer in layers:
        rows = {key[0] for key in layer._rows_ok | layer._rows_tried}
        assert rows | fused_rows.get(id(layer), set()) == {model.dit_rows}, rows
    others = [m for m in model.base_lm.modules() if isinstance(m, PrepackedLinear)]
    assert {m._max_rows for m in others} == {MAX_ROWS}


def test_the_vaes_stream_shapes_are_rehearsed_only_when_something_can_pack(model_dir,
                                                                           monkeypatch):
    calls = []
    monkeypatch.setattr("mizuoto_voxcpm.engine.rehearse_stream_decode",
                        lambda vae, **kw: calls.append(kw))
    off = _load(model_dir, "off")
    assert calls == []
    assert off.synthesize(mizuoto.SynthesisRequest(text="Hi.", seed=1, params={"max_len": 2})
                          ).applied.compute["prepack"] == {"mode": "off"}
    engine = _load(model_dir, "auto")
    assert len(calls) == (1 if torch.backends.mkldnn.is_available() else 0)
    result = engine.synthesize(mizuoto.SynthesisRequest(text="Hi.", seed=1,
                                                        params={"max_len": 2}))
    vae = result.applied.compute["prepack"]["modules"]["vae"]
    assert sum(vae.values()) == sum(1 for m in engine.vae.modules()
                                    if isinstance(m, torch.nn.ConvTranspose1d)) > 0


def test_a_batching_load_packs_the_dit_and_encoder_for_a_full_batch(model_dir):
    """With max_batch rows a step the DiT's and the local encoder's layers see max_batch times
    a stream's rows: they may pack for that many (each count proven on first use)."""
    model = VoxCPMEngine.load(model_dir, options=mizuoto.Options.from_mapping(
        {"compute.device": "cpu", "compute.prepack": "auto",
         "engines.voxcpm.max_batch": 4})).model
    dit = [m for m in model.feat_decoder.estimator.modules() if isinstance(m, PrepackedLinear)]
    encoder = [m for m in model.feat_encoder.modules() if isinstance(m, PrepackedLinear)]
    assert dit and encoder
    assert {m._max_rows for m in dit} == {4 * model.dit_rows}
    assert {m._max_rows for m in encoder} == {max(MAX_ROWS, 4 * model.encoder_rows)}
    assert {m._max_rows for m in model.base_lm.modules()
            if isinstance(m, PrepackedLinear)} == {MAX_ROWS}


@pytest.fixture(scope="module")
def first_generation_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("voxcpm-prepack-batch")
    return with_dtype(write_random_model(root / "model", "voxcpm-0.5b", seed=3),
                      root / "fp32", "float32")


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                    reason="torch built without oneDNN: nothing can pack")
def test_a_batch_of_stream_segments_proves_its_shapes_and_keeps_the_plain_bits(
        first_generation_dir, monkeypatch):
    """decode_segments proves the VAE's transposed convolutions at each batch size on the
    step that first meets it: the segments are those of F.conv_transpose1d at that batch."""
    from mizuoto.runtime.prepack_conv_transpose import PrepackedConvTranspose1d
    from mizuoto_voxcpm.decoding import StreamDecoder, decode_segments

    engine = _load(first_generation_dir, "auto")
    config, vae = engine.config, engine.vae
    generator = torch.Generator().manual_seed(0)
    patches = [[torch.randn(1, config.patch_size, config.feat_dim, generator=generator)
                for _ in range(3)] for _ in range(4)]

    def segments():
        decoders = [StreamDecoder(vae, context=[], v2=False, patch_size=config.patch_size)
                    for _ in range(3)]
        # three streams, then two (a batch size of its own)
        return [decode_segments(decoders[:rows], step[:rows])
                for rows, step in zip((3, 3, 2, 2), patches, strict=True)]

    layers = [m for m in vae.modules() if isinstance(m, PrepackedConvTranspose1d)]
    before = {id(m): set(m._tried) for m in layers}
    packed = segments()
    batch_sizes = {key[0][0] for m in layers for key in m._tried - before[id(m)]}
    assert batch_sizes == {2, 3}
    assert any(key[0][0] > 1 for m in layers for key in m._packs), "a batch shape packed"
    monkeypatch.setattr(PrepackedConvTranspose1d, "forward", torch.nn.ConvTranspose1d.forward)
    for got, want in zip(packed, segments(), strict=True):
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                    reason="torch built without oneDNN: nothing can pack")
def test_a_batching_load_proves_the_batch_segments_shapes(first_generation_dir):
    """With max_batch above 1 the load rehearses each batch size's windows: the first batches
    of streams prove nothing (no listener waits for a proof), and the segments are still
    those of F.conv_transpose1d at that batch."""
    from mizuoto.runtime.prepack_conv_transpose import PrepackedConvTranspose1d
    from mizuoto_voxcpm.decoding import StreamDecoder, decode_segments

    engine = VoxCPMEngine.load(first_generation_dir, options=mizuoto.Options.from_mapping(
        {"compute.device": "cpu", "compute.prepack": "auto", "engines.voxcpm.max_batch": 3}))
    config, vae = engine.config, engine.vae
    layers = [m for m in vae.modules() if isinstance(m, PrepackedConvTranspose1d)]
    assert {key[0][0] for m in layers for key in m._tried} >= {1, 2, 3}
    before = {id(m): set(m._tried) for m in layers}
    generator = torch.Generator().manual_seed(0)
    for rows in (3, 2):
        decoders = [StreamDecoder(vae, context=[], v2=False, patch_size=config.patch_size)
                    for _ in range(rows)]
        for _ in range(3):  # windows of one, two and three patches
            decode_segments(decoders, [torch.randn(1, config.patch_size, config.feat_dim,
                                                   generator=generator) for _ in range(rows)])
    assert all(m._tried == before[id(m)] for m in layers)
