"""Does the wheel folder, with the device's own packages, hold everything the GPU check needs?

    python benchmarks/gpu/import_check.py .whl            # the folder against the lists (here)
    python benchmarks/gpu/import_check.py .whl --imports  # and import every module (there)

Without ``--imports`` nothing is installed or imported: the folder's wheels are read against
carried-wheels.txt (each pin there, once, at its version) and device-packages.txt (the device
image's packages): every requirement a carried wheel declares must be met by another carried
wheel or by a device package (at its known version where the list gives one), except the ones
:data:`NOT_NEEDED` names with the reason. The folder must stay under :data:`MAX_BYTES`.
With ``--imports`` (run in the environment the check installed) every module in :data:`IMPORTS`
is imported and the carried pins must be the versions Python finds. Exit status 1 on any
problem, each printed on its own line.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).resolve().parent
CARRIED = HERE / "carried-wheels.txt"
DEVICE = HERE / "device-packages.txt"
#: The device tool carries 64 MiB with the work tree; the folder keeps room to spare.
MAX_BYTES = 40_000_000
#: Built from this checkout by wheels.sh, not pinned in carried-wheels.txt.
OURS = ("mizuoto-core", "mizuoto-f5tts", "mizuoto-voxcpm", "mizuoto-contract-tests")
#: Requirements declared upstream that the paths the check drives never import (CI installs
#: upstream with --no-deps too): name -> why it is left out.
NOT_NEEDED = {
    "bitsandbytes": "f5-tts: 8-bit optimisers, not used by the trainer's defaults",
    "cached-path": "f5-tts: downloads; the parity tests' oracle_stubs stand in",
    "wandb": "f5-tts: logging; the parity tests' oracle_stubs stand in",
    "gradio": "f5-tts, voxcpm: their web demos",
    "hydra-core": "f5-tts: its training command line; the oracle calls the Trainer",
    "tomli": "f5-tts: Python < 3.11 only in practice",
    "transformers-stream-generator": "f5-tts: its chat demo",
    "unidecode": "f5-tts: its dataset preparation scripts for other corpora",
    "torchcodec": "torchaudio.load's decoder; the check reads WAVs with soundfile "
                  "(benchmarks/gpu/wav_shim)",
    "addict": "voxcpm: its ModelScope path",
    "modelscope": "voxcpm: downloads",
    "funasr": "voxcpm: its demo's speech recognition",
    "spaces": "voxcpm: Hugging Face Spaces",
    "simplejson": "voxcpm: on the device list anyway; not imported on our paths",
    "matplotlib": "on the device list (version unknown)",
}
#: The modules the check imports, upstream's included, in the order a failure is clearest.
IMPORTS = ("torch", "torchaudio", "numpy", "soundfile", "soxr", "librosa", "transformers",
           "tokenizers", "accelerate", "datasets", "pyarrow", "x_transformers", "einx",
           "vocos", "encodec", "wetext", "argbind", "tensorboardX", "pytest", "mizuoto",
           "mizuoto_f5tts", "mizuoto_voxcpm", "mizuoto_contract", "voxcpm",
           "voxcpm.training", "f5_tts.model", "f5_tts.model.dataset",
           "f5_tts.train.datasets.prepare_csv_wavs")
#: Modules that import only beside the parity tests' stand-ins (wandb, cached_path).
NEEDS_STUBS = ("f5_tts.infer.utils_infer",)

_PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s#]+)")


def read_pins(path: Path) -> dict[str, str | None]:
    """``name -> version`` (None where the list gives no version) of a one-a-line list."""
    pins: dict[str, str | None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = _PIN.match(text)
        name, version = (match.group(1), match.group(2)) if match else (text, None)
        pins[canonicalize_name(name)] = version
    return pins


def _wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode("utf-8")
    return [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
            if line.startswith("Requires-Dist:")]


#: The device: CPython 3.12 on x86-64 Linux, no extras asked for.
_DEVICE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3",
                   "sys_platform": "linux", "platform_system": "Linux",
                   "platform_machine": "x86_64", "implementation_name": "cpython",
                   "platform_python_implementation": "CPython", "os_name": "posix",
                   "extra": ""}


def check_folder(folder: Path) -> list[str]:
    """The problems of the wheel folder against the two lists (empty when it is fit)."""
    problems = []
    wheels = sorted(folder.glob("*.whl"))
    carried: dict[str, str] = {}
    for wheel in wheels:
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if name in carried:
            problems.append(f"two versions of {name}: {carried[name]} and {version} "
                            "(pip refuses to install both)")
        carried[name] = str(version)
    pins = read_pins(CARRIED)
    for name, version in pins.items():
        if carried.get(name) != version:
            problems.append(f"{name}=={version} (carried-wheels.txt) is "
                            f"{'missing' if name not in carried else carried[name]} in {folder}")
    for name in OURS:
        if name not in carried:
            problems.append(f"{name} is not in {folder}: run benchmarks/gpu/wheels.sh")
    for name in sorted(set(carried) - set(pins) - set(OURS)):
        problems.append(f"{name} is in {folder} but not pinned in carried-wheels.txt")
    device = read_pins(DEVICE)
    for wheel in wheels:
        owner = parse_wheel_filename(wheel.name)[0]
        for requirement in _wheel_requirements(wheel):
            if requirement.marker and not requirement.marker.evaluate(_DEVICE_MARKERS):
                continue
            name = canonicalize_name(requirement.name)
            if name in NOT_NEEDED:
                continue
            if name not in carried and name not in device:
                problems.append(f"{owner} needs {requirement}: neither carried nor on the "
                                "device (add it to carried-wheels.txt)")
                continue
            found = carried[name] if name in carried else device[name]  # None: not known
            if found is not None and not requirement.specifier.contains(found,
                                                                        prereleases=True):
                problems.append(f"{owner} needs {requirement}, but "
                                f"{'the folder' if name in carried else 'the device'} has "
                                f"{name} {found}")
    size = sum(wheel.stat().st_size for wheel in wheels)
    if size > MAX_BYTES:
        problems.append(f"{folder} holds {size / 1e6:.1f} MB, over {MAX_BYTES / 1e6:.0f} MB")
    return problems


def check_imports(stubs: Path | None = None) -> list[str]:
    """Import every module the check needs; the carried pins must be what Python finds."""
    problems = []
    for module in IMPORTS:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any failure to import is the finding
            problems.append(f"import {module}: {type(exc).__name__}: {exc}")
    if stubs is not None:
        sys.path.insert(0, str(stubs))
    for module in NEEDS_STUBS:
        try:
            importlib.import_module(module)
        except Exception as exc:
            problems.append(f"import {module}: {type(exc).__name__}: {exc}")
    problems += _check_wav_stand_ins()
    for name, version in read_pins(CARRIED).items():
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found = None
        if found != version:
            problems.append(f"{name}: Python finds {found}, the folder carries {version} "
                            "(is the install directory first on PYTHONPATH?)")
    return problems


def _check_wav_stand_ins() -> list[str]:
    """Upstream's WAV reads go through the check's stand-ins (wav_shim): no FFmpeg there."""
    import shutil

    import torchaudio

    problems = []
    if getattr(torchaudio.load, "__name__", "") != "soundfile_load":
        problems.append("torchaudio.load is torchaudio's own: benchmarks/gpu/wav_shim is not "
                        "on PYTHONPATH")
    ffprobe = shutil.which("ffprobe") or ""
    if Path(ffprobe).parent != HERE / "wav_shim" / "bin":
        problems.append(f"ffprobe is {ffprobe or 'missing'}, not benchmarks/gpu/wav_shim/bin's")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the wheel folder (wheels.sh's .whl/)")
    parser.add_argument("--imports", action="store_true",
                        help="also import every module the check needs (in its environment)")
    parser.add_argument("--stubs", type=Path, help="the parity tests' oracle_stubs folder")
    args = parser.parse_args(argv)
    problems = check_folder(args.folder)
    if args.imports:
        problems += check_imports(args.stubs)
    for problem in problems:
        print(f"problem: {problem}")
    size = sum(w.stat().st_size for w in args.folder.glob("*.whl"))
    print(f"{len(list(args.folder.glob('*.whl')))} wheels, {size / 1e6:.1f} MB; "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
