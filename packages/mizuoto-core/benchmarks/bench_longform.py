"""Long-form and batch synthesis on a tiny random F5-TTS model (docs/longform.md, docs/batch.md).

Long-form: for texts of 0.1, 1 and 10 MB, a fresh process speaks the first ``--sections``
sections to a FLAC file and reports its peak RSS (``ru_maxrss``), the time to scan the text
and the time per section. Flat peak RSS across text sizes is the point.
Batch: lines per second for ``--lines`` utterances in this process, in 2 worker processes and
on a local Ray instance (2 actors at 0.5 CPU), each after its model is loaded.

    python packages/mizuoto-core/benchmarks/bench_longform.py [--sections 20] [--lines 24]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES_MB = (0.1, 1.0, 10.0)


def _book(path: Path, megabytes: float) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        i = 0
        while handle.tell() < megabytes * 1e6:
            handle.write(f"Line {i} of a long book is read aloud by a tiny model. ")
            i += 1
    return path


def _long_form_child(model: str, book: str, sections: int) -> None:
    import mizuoto
    from mizuoto import SynthesisRequest
    from mizuoto.longform import _TextSource, synthesize_to

    options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1})
    engine = mizuoto.load(model, options=options)
    started = time.monotonic()
    total, _, _ = _TextSource(None, book).scan(300)
    scan = time.monotonic() - started
    out = Path(book).with_suffix(".flac")
    done = synthesize_to(engine, out, SynthesisRequest("x", seed=1, steps=4), text_file=book,
                         max_chars=300, stop_after=sections)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"sections": total, "scan_s": scan, "peak_mib": peak,
                      "per_section_s": (done.elapsed - scan) / sections,
                      "audio_s_per_section": done.seconds / sections}))


def _long_form(model: str, folder: Path, sections: int) -> None:
    print(f"long-form, first {sections} sections of 300 characters, 4 steps, one thread")
    print(f"{'text':>8} {'sections':>9} {'scan':>7} {'peak RSS':>9} {'s/section':>10} "
          f"{'audio/section':>14}")
    for megabytes in SIZES_MB:
        book = _book(folder / f"book-{megabytes}.txt", megabytes)
        out = subprocess.run(
            [sys.executable, __file__, "--child", model, str(book), str(sections)],
            capture_output=True, text=True, check=True, env={**os.environ,
                                                              "OMP_NUM_THREADS": "1"})
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{megabytes:>6} MB {row['sections']:>9} {row['scan_s']:>6.2f}s "
              f"{row['peak_mib']:>6.0f} MiB {row['per_section_s']:>9.2f}s "
              f"{row['audio_s_per_section']:>12.1f} s")


def _batch(model: str, folder: Path, lines: int) -> None:
    import mizuoto
    from mizuoto.batch import BatchJob, ModelLoader, run_batch
    from mizuoto.batch.ray import RaySettings, ray_records

    manifest = folder / "lines.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"l{i}", "text": f"Line number {i} is here.",
                                            "seed": i}) + "\n" for i in range(lines)))
    options = mizuoto.Options.from_mapping({"compute.device": "cpu", "compute.cpu_threads": 1})
    print(f"\nbatch, {lines} lines, 4 steps, one thread per worker (model loading included)")
    engine = mizuoto.load(model, options=options)
    job = BatchJob(manifest, folder / "local", defaults={"steps": 4})
    started = time.monotonic()
    run_batch(job, engine=engine)
    local = time.monotonic() - started
    print(f"  this process     {lines / local:6.2f} lines/s ({local:.1f} s; model loaded before)")
    loader = ModelLoader(model, options=options, workers=2)
    for name, kwargs in (("2 workers", {"load": loader, "workers": 2}),
                         ("Ray, 2 actors", {"records": ray_records(loader, RaySettings())})):
        out = folder / name.replace(" ", "-").replace(",", "")
        finished: list[float] = []

        def watch(progress, finished=finished):
            if progress.stage == "lines" and progress.done:
                finished.append(time.monotonic())

        started = time.monotonic()
        run_batch(BatchJob(manifest, out, defaults={"steps": 4}), progress=watch, **kwargs)
        elapsed = time.monotonic() - started
        same = all((out / f"l{i}.wav").read_bytes() == (folder / "local" / f"l{i}.wav")
                   .read_bytes() for i in range(lines))
        # Ray hands records back block by block: its first line arrives late and the rest
        # in bursts, so only the whole time compares
        print(f"  {name:<16} {lines / elapsed:6.2f} lines/s ({elapsed:.1f} s in all; the first "
              f"line after {finished[0] - started:.1f} s, start-up included); files equal to "
              f"this process's: {same}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sections", type=int, default=20)
    parser.add_argument("--lines", type=int, default=24)
    parser.add_argument("--child", nargs=3)
    args = parser.parse_args()
    if args.child:
        _long_form_child(args.child[0], args.child[1], int(args.child[2]))
        return
    from mizuoto_f5tts.fixtures import write_random_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = str(write_random_model_dir(folder / "f5", "v1_base", size="tiny"))
        _long_form(model, folder, args.sections)
        _batch(model, folder, args.lines)


if __name__ == "__main__":
    main()
