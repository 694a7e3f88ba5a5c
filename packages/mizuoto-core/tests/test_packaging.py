"""The four distributions build into wheels fit for an index: license text inside, complete
metadata, a long description without links that break off the repository, no development
extras; and the wheels alone, installed into a new environment, speak."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DISTRIBUTIONS = {"mizuoto-core": ("packages/mizuoto-core", "Apache-2.0"),
                 "mizuoto-f5tts": ("packages/mizuoto-f5tts", "MIT"),
                 "mizuoto-voxcpm": ("packages/mizuoto-voxcpm", "Apache-2.0"),
                 "mizuoto-contract-tests": ("contract-tests", "Apache-2.0")}
LICENSE_HEADINGS = {"Apache-2.0": "Apache License", "MIT": "MIT License"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    sources = [str(ROOT / where) for where, _ in DISTRIBUTIONS.values()]
    # one pip run, offline, with the environment's setuptools: a few seconds of CPU
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(folder), *sources], check=True, cwd=folder)
    return folder


def test_wheels_carry_their_license_and_complete_metadata(wheels):
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    for name, (_, license_id) in DISTRIBUTIONS.items():
        [wheel] = wheels.glob(f"{name.replace('-', '_')}-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            files = archive.namelist()
            [metadata_file] = [f for f in files if f.endswith(".dist-info/METADATA")]
            metadata = Parser().parsestr(archive.read(metadata_file).decode())
            [license_file] = [f for f in files if f.endswith(".dist-info/licenses/LICENSE")]
            license_text = archive.read(license_file).decode()
        assert metadata["License-Expression"] == license_id, name
        assert metadata.get_all("License-File") == ["LICENSE"], name
        assert license_text.lstrip().startswith(LICENSE_HEADINGS[license_id]), name
        assert metadata["Author"] and metadata["Keywords"], name
        assert any(c.startswith("Topic :: ") for c in metadata.get_all("Classifier")), name
        description = metadata.get_payload()
        assert name in description and "](../" not in description, name
        if name == "mizuoto-core":
            torch = [r for r in metadata.get_all("Requires-Dist") if r.startswith("torch")]
            assert torch == ["torch<2.15,>=2.4"]
        # the test tools are the root pyproject's dependency groups, not features for users
        assert not {"test", "browser-test"} & set(metadata.get_all("Provides-Extra") or []), name


def test_the_test_tools_are_development_groups():
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    assert any(r.startswith("pytest>") for r in groups["test"])
    assert any(r.startswith("playwright") for r in groups["browser-test"])


def test_the_wheels_alone_install_a_working_say(wheels, tmp_path):
    """A new environment gets Mizuoto only from the wheels (``--no-index``); the third-party
    requirements (torch, ...) it borrows from this environment, appended to its path after its
    own site-packages, since nothing can be downloaded here. This environment's own (editable)
    Mizuoto stays out: its ``.pth`` files are not run from an appended path, and the new
    environment's distributions come first."""
    environment = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(environment)
    python = environment / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                                "'purelib'))"], check=True, capture_output=True,
                               text=True).stdout.strip())
    (site / "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    wheel_files = [str(w) for w in wheels.glob("mizuoto_*.whl")
                   if "contract_tests" not in w.name]
    # no PYTHONPATH (a checkout's sources on it would look installed to pip and to Python)
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--no-index", "--no-deps", "-q", *wheel_files], check=True, env=env)
    mizuoto = environment / "bin" / "mizuoto"
    where = subprocess.run([str(python), "-c", "import mizuoto, mizuoto_f5tts; "
                            "print(mizuoto.__file__); print(mizuoto_f5tts.__file__)"],
                           capture_output=True, text=True, env=env)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    model = tmp_path / "f5-random"
    subprocess.run([str(mizuoto), "random-model", "f5tts/tiny-v1-base", str(model)],
                   check=True, env=env)
    output = tmp_path / "hello.wav"
    said = subprocess.run([str(mizuoto), "-q", "say", "-m", str(model), "Hello from the wheels.",
                           "-o", str(output)], capture_output=True, text=True, env=env)
    assert said.returncode == 0, said.stderr
    assert output.stat().st_size > 1000
