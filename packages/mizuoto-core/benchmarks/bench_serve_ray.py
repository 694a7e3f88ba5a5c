"""``mizuoto serve --ray``: 1 replica against 2 for concurrent streams of one tiny random-init
VoxCPM2 model, on a local Ray instance bound to 127.0.0.1.

For each replica count: deploy, warm every replica up, then send ``--streams`` streaming
requests at once (raw PCM, distinct seeds) and report the time to first audio (p50, p95), the
wall time and seconds of audio per second; every response is compared with the same request
sent alone first (bytes). Bounded: every request has a timeout; Serve and Ray are shut down at
the end. Never run in CI.

    python packages/mizuoto-core/benchmarks/bench_serve_ray.py --streams 4 --patches 24
"""

from __future__ import annotations

import argparse
import logging
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stream(url: str, body: dict) -> tuple[float, bytes]:
    import httpx

    sent = time.monotonic()
    first = None
    data = b""
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=300) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            first = first or time.monotonic() - sent
            data += chunk
    return first or float("nan"), data


def _round(url: str, bodies: list[dict], alone: list[bytes]) -> dict:
    results: list[tuple[float, bytes] | None] = [None] * len(bodies)

    def one(i):
        results[i] = _stream(url, bodies[i])

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    wall = time.monotonic() - started
    ttfa = sorted(r[0] for r in results if r is not None)
    audio_seconds = sum(len(r[1]) / 2 / 24000 for r in results if r is not None)
    return {"identical": sum(r is not None and r[1] == a for r, a in zip(results, alone,
                                                                         strict=True)),
            "ttfa_p50": statistics.median(ttfa), "ttfa_p95": ttfa[int(0.95 * (len(ttfa) - 1))],
            "wall": wall, "audio_per_s": audio_seconds / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--patches", type=int, default=24)
    parser.add_argument("--cpus", type=float, default=0.5, help="CPUs per replica")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import ray
    from ray import serve

    from mizuoto.serve import ServeConfig
    from mizuoto.serve.ray import RaySettings, start
    from mizuoto_voxcpm.fixtures import write_random_model

    root = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    write_random_model(root / "vox", "voxcpm2", dtype="float32")
    bodies = [{"model": "vox", "input": f"Stream number {i}.", "voice": "default",
               "response_format": "pcm",
               "mizuoto": {"seed": i, "steps": 2, "params": {"max_len": args.patches}}}
              for i in range(args.streams)]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        alone = None
        port = _free_port()  # one Serve instance: its proxy keeps the port it started on
        for replicas in (1, 2):
            config = ServeConfig(models={"vox": str(root / "vox")}, voices_dir=root / "voices",
                                 port=port, queue_size=64)
            start(config, RaySettings(replicas=replicas, num_cpus=args.cpus, ingress_cpus=0.1))
            url = f"http://127.0.0.1:{port}"
            for _ in range(2 * replicas):  # a first request on each replica
                _stream(url, {**bodies[0], "mizuoto": {**bodies[0]["mizuoto"],
                                                        "params": {"max_len": 2}}})
            if alone is None:
                alone = [_stream(url, body)[1] for body in bodies]
            result = _round(url, bodies, alone)
            print(f"replicas={replicas} streams={args.streams} identical={result['identical']}/"
                  f"{args.streams} ttfa_p50={result['ttfa_p50']:.2f}s "
                  f"ttfa_p95={result['ttfa_p95']:.2f}s wall={result['wall']:.2f}s "
                  f"audio_s_per_s={result['audio_per_s']:.2f}")
            serve.delete("mizuoto")
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
