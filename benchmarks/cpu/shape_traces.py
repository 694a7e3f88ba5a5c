"""A fast profile's VoxCPM local DiT evaluation, local encoder step and base LM decode step
replayed as proven TorchScript traces (:class:`mizuoto.runtime.shape_traces.ShapeTraces`)
against the same calls run eagerly, and whole streams with the traces against without them.

    mizuoto random-model voxcpm/realsize-0.5b DIR     # once: random weights of the real size
    python benchmarks/cpu/shape_traces.py DIR --threads 2
    python benchmarks/cpu/shape_traces.py DIR --threads 2 --streams 8

Paired, in one process: each repeat times the eager and the traced call in turn (alternating
which goes first) on the inputs of a single stream's guided evaluation (the encoder: one
patch; the base LM: a step at positions 100 and 600, one trace for both), and the figure is
the median of the per-repeat ratio traced / eager (below 1: the
trace is faster). ``--streams N`` then times N pairs of 20-patch streams of the ``int8``
profile, traced and eager in turn, and checks that both give the same audio. Not a test: the figures depend on
the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import mizuoto
from mizuoto import ComputeOptions, Options, SynthesisRequest


def _paired(run: Callable[[], object], switch: Callable[[bool], None],
            repeats: int) -> dict[bool, list[float]]:
    """Seconds of ``run`` eager (False) and traced (True), in turn, alternating the order."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for repeat in range(repeats):
        for traced in ((False, True) if repeat % 2 else (True, False)):
            switch(traced)
            start = time.perf_counter()
            run()
            times[traced].append(time.perf_counter() - start)
    return times


def _ratio(eager: list[float], traced: list[float], per: int = 1) -> str:
    ratios = [t / e for e, t in zip(eager, traced, strict=True)]
    quartiles = statistics.quantiles(ratios) if len(ratios) > 1 else [ratios[0]] * 3
    return (f"eager {statistics.median(eager) * 1000 / per:.2f} ms, traced "
            f"{statistics.median(traced) * 1000 / per:.2f} ms, ratio "
            f"{statistics.median(ratios):.3f} (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a VoxCPM model directory")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--streams", type=int, default=0, help="pairs of 20-patch streams")
    args = parser.parse_args()
    engine = mizuoto.load(args.model, options=Options(
        compute=ComputeOptions(device="cpu", cpu_threads=args.threads),
        engines={"voxcpm": {"fast": "int8"}}))
    estimator, encoder = engine.model.feat_decoder.estimator, engine.model.feat_encoder
    traces, encoder_traces = estimator.shape_traces, encoder.shape_traces
    lms = [engine.model.base_lm, engine.model.residual_lm]
    lm_traces = [lm.shape_traces for lm in lms]
    if traces is None:
        raise SystemExit("this engine's DiT is not traced (applied.compute['fast_traces'])")
    calls = []
    evaluate = estimator.evaluate

    def capture(*inputs, **kwargs):
        calls.append(inputs)
        return evaluate(*inputs, **kwargs)

    estimator.evaluate = capture  # the eager call under the trace's first proof
    estimator.shape_traces = None
    engine.synthesize(SynthesisRequest("Hello there.", seed=0,
                                       params={"max_len": 2, "retry_badcase": False}))
    del estimator.evaluate
    inputs = calls[-1]
    config = engine.model.config
    patch = torch.randn(1, 1, config.patch_size, config.feat_dim)

    def switch(traced: bool) -> None:
        estimator.shape_traces = traces if traced else None
        encoder.shape_traces = encoder_traces if traced else None
        for lm, lm_trace in zip(lms, lm_traces, strict=True):
            lm.shape_traces = lm_trace if traced else None

    with torch.inference_mode():
        times = _paired(lambda: [estimator(*inputs) for _ in range(5)], switch, args.repeats)
        print(f"one guided DiT evaluation {tuple(inputs[0].shape)}, {args.threads} threads: "
              + _ratio(times[False], times[True], per=5))
        times = _paired(lambda: [encoder(patch) for _ in range(5)], switch, args.repeats)
        print(f"one step's encoding {tuple(patch.shape)}, {args.threads} threads: "
              + _ratio(times[False], times[True], per=5))
        cache = engine.model.caches.lm
        embed = torch.randn(1, engine.model.base_lm.config.hidden_size)

        def lm_steps(position: int) -> None:
            for _ in range(5):
                cache.length = position  # the same step again: its position reclaimed
                cache.position.fill_(position)
                engine.model.base_lm.step(embed, cache)

        for position in (100, 600):
            times = _paired(lambda position=position: lm_steps(position), switch,
                            args.repeats // 3)
            print(f"one base LM step at position {position}, {args.threads} threads: "
                  + _ratio(times[False], times[True], per=5))
        cache.length = 0  # the next prefill writes over these steps' keys and values
        cache.position.zero_()
    if not args.streams:
        return
    request = SynthesisRequest("The quick brown fox jumps over the lazy dog near the river.",
                               seed=1, params={"max_len": 20, "retry_badcase": False})
    audio = {}

    def stream() -> None:
        chunks = [chunk.audio.samples.reshape(-1) for chunk in engine.stream(request)]
        audio[estimator.shape_traces is not None] = torch.cat(chunks)

    times = _paired(stream, switch, args.streams)
    print(f"20-patch int8 streams, {args.streams} pairs: " + _ratio(times[False], times[True]))
    print("same audio:", torch.equal(audio[False], audio[True]))


if __name__ == "__main__":
    main()
