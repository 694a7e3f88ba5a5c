"""The four distributions build into wheels fit for an index: license text inside, complete
metadata, a long description without links that break off the repository."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DISTRIBUTIONS = {"mizuoto-core": ("packages/mizuoto-core", "Apache-2.0"),
                 "mizuoto-f5tts": ("packages/mizuoto-f5tts", "MIT"),
                 "mizuoto-voxcpm": ("packages/mizuoto-voxcpm", "Apache-2.0"),
                 "mizuoto-contract-tests": ("contract-tests", "Apache-2.0")}
LICENSE_HEADINGS = {"Apache-2.0": "Apache License", "MIT": "MIT License"}


def test_wheels_carry_their_license_and_complete_metadata(tmp_path):
    sources = [str(ROOT / where) for where, _ in DISTRIBUTIONS.values()]
    # one pip run, offline, with the environment's setuptools: a few seconds of CPU
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(tmp_path), *sources], check=True,
                   cwd=tmp_path)
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    for name, (_, license_id) in DISTRIBUTIONS.items():
        [wheel] = tmp_path.glob(f"{name.replace('-', '_')}-*.whl")
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
