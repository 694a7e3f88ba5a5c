"""Benchmark: the AudioVAE's out-of-memory fallback (tiled decode) against the whole-utterance
decode, for each generation's VAE at the fixtures' sizes (``tiny``: CI's; ``wide``: tiny
channels, the released 64-dim latents; ``realsize``: the released VAEs), on random weights and
random latents. Prints the tile overlap, the largest difference, the SNR of the tiled audio
against the whole decode (in dB), the decode times and the decoder's peak allocation.

    python packages/mizuoto-voxcpm/benchmarks/bench_vae_tiles.py                   # all sizes
    python packages/mizuoto-voxcpm/benchmarks/bench_vae_tiles.py --sizes tiny --frames 1000

Never run in CI (real size takes a minute or two on two cores).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

GENERATIONS = ("voxcpm-0.5b", "voxcpm-1.5", "voxcpm2")
SIZES = ("tiny", "wide", "realsize")


def _config(generation: str, size: str):
    import attrs

    from mizuoto_voxcpm.audiovae import fixture
    from mizuoto_voxcpm.fixtures import RELEASED_LATENT_DIM

    tiny = {"voxcpm-0.5b": fixture.TINY_V1_16K, "voxcpm-1.5": fixture.TINY_V1_44K,
            "voxcpm2": fixture.TINY_V2}[generation]
    if size == "tiny":
        return tiny
    if size == "wide":
        return attrs.evolve(tiny, latent_dim=RELEASED_LATENT_DIM)
    return {"voxcpm-0.5b": fixture.VOXCPM_0_5B, "voxcpm-1.5": fixture.VOXCPM1_5,
            "voxcpm2": fixture.VOXCPM2}[generation]


def _measure(generation: str, size: str, frames: int, directory: Path) -> dict:
    import torch

    from mizuoto.nn.dsp.tiles import decode_tiled
    from mizuoto_voxcpm.audiovae import load_audio_vae
    from mizuoto_voxcpm.audiovae.fixture import write_random_audiovae
    from mizuoto_voxcpm.decoding import VAE_TILE_FRAMES, vae_tile_overlap

    config = _config(generation, size)
    write_random_audiovae(directory, config, seed=0)
    vae = load_audio_vae(directory, config)
    latents = torch.randn(1, vae.latent_dim, frames, generator=torch.Generator().manual_seed(0))
    overlap = vae_tile_overlap(vae)
    with torch.inference_mode():
        vae.decode(latents[..., :8])  # warm-up: the first call sets up the kernels
        start = time.perf_counter()
        whole = vae.decode(latents)
        whole_s = time.perf_counter() - start
        start = time.perf_counter()
        tiled = decode_tiled(vae.decode, latents, tile=VAE_TILE_FRAMES, overlap=overlap,
                             hop=vae.decode_hop_length)
        tiled_s = time.perf_counter() - start
    difference = (tiled - whole).double()
    noise = float(difference.pow(2).sum())
    signal = float(whole.double().pow(2).sum())
    return {"generation": generation, "size": size, "field": vae.decoder_receptive_field,
            "overlap": overlap, "samples": whole.shape[-1], "seconds": whole.shape[-1] / (
                vae.out_sample_rate), "max_diff": float(difference.abs().max()),
            "peak": float(whole.abs().max()),
            "snr_db": math.inf if noise == 0 else 10 * math.log10(signal / noise),
            "whole_s": whole_s, "tiled_s": tiled_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=700,
                        help="latent frames per utterance (700: 28 s, four tiles)")
    parser.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES))
    parser.add_argument("--generations", nargs="+", choices=GENERATIONS,
                        default=list(GENERATIONS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    print("| VAE | size | receptive field | overlap | audio | max abs diff (peak) | SNR | "
          "whole / tiled decode |")
    print("|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        for generation in args.generations:
            with tempfile.TemporaryDirectory() as directory:
                row = _measure(generation, size, args.frames, Path(directory))
            snr = "exact" if math.isinf(row["snr_db"]) else f"{row['snr_db']:.0f} dB"
            print(f"| {row['generation']} | {row['size']} | {row['field']} frames | "
                  f"{row['overlap']} frames | {row['seconds']:.1f} s | {row['max_diff']:.1e} "
                  f"({row['peak']:.2f}) | {snr} | {row['whole_s']:.2f} s / "
                  f"{row['tiled_s']:.2f} s |", flush=True)


if __name__ == "__main__":
    main()
