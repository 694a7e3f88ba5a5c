"""The GPU check's rules (benchmarks/gpu/): what passes and what fails, decided here on the
CPU, without a GPU. The check's steps themselves run in `nox -s gpu_rehearsal`."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))
import checks  # noqa: E402
import import_check  # noqa: E402
import steps  # noqa: E402

sys.path.remove(str(GPU))


def _ctx(device="cuda"):
    return steps.Context(device=device, rehearse=device == "cpu", python=sys.executable,
                         env={}, work=Path("."))


def test_a_skipped_or_missing_training_case_fails():
    clean = {"tests": 2, "failures": 0, "errors": 0, "skipped": 0}
    assert steps.training_passed(clean, 2, 0)
    assert not steps.training_passed({**clean, "skipped": 1}, 2, 0)  # argbind missing
    assert not steps.training_passed({**clean, "tests": 1}, 2, 0)  # a case not collected
    assert not steps.training_passed({**clean, "tests": 0}, 0 + 2, 0)  # exit 0, nothing run
    assert not steps.training_passed(None, 2, 0)  # no report at all
    assert not steps.training_passed(clean, 2, 1)


def test_junit_counts_add_up_the_suites(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text('<testsuites><testsuite tests="2" failures="0" errors="0" skipped="1"/>'
                      '<testsuite tests="1" failures="1" errors="0" skipped="0"/></testsuites>')
    assert steps.junit_counts(report) == {"tests": 3, "failures": 1, "errors": 0,
                                          "skipped": 1}


def _entry(side, device, dtype, peak):
    return {"side": side, "runs": [{"device": device, "dtype": dtype, "peak_gpu_mb": peak}]}


def test_a_configuration_must_run_on_the_device_and_dtype_it_claims():
    entries = {"base": _entry("mizuoto", "cuda:0", "bfloat16", 812.0),
               "upstream": _entry("upstream", "cuda", None, 640.0)}
    assert all(c.passed for c in steps.placement_checks("x", entries, _ctx(), "bfloat16"))
    wrong = {"base": _entry("mizuoto", "cuda:0", "float32", 812.0),  # another dtype
             "upstream": _entry("upstream", "cuda", None, 0.0)}  # said cuda, used none
    failed = [c.name for c in steps.placement_checks("x", wrong, _ctx(), "bfloat16")
              if not c.passed]
    assert failed == ["x: base ran in bfloat16", "x: upstream ran on cuda"]


def test_the_lone_stream_must_have_gone_through_the_scheduler():
    row = {"batch": 1, "identical": True, "steps": 12, "batched_rows": 0, "seconds": 1.0,
           "snr_db": float("inf"), "patches_alone": 4, "patches_batched": 4}
    assert steps.batching_checks("b", [row])[0].passed
    # no scheduler step taken: identical, but compared the unbatched path with itself
    assert not steps.batching_checks("b", [{**row, "steps": 0}])[0].passed
    assert not steps.batching_checks("b", [])[0].passed
    # a batch whose rows never shared a kernel call is not "stepped together"
    batch = {**row, "batch": 8, "batched_rows": 0, "seconds": 2.0, "snr_db": 40.0}
    checks = steps.batching_checks("b", [row, batch])
    assert checks[0].passed and not checks[1].passed
    assert steps.batching_checks("b", [row, {**batch, "batched_rows": 64}])[1].passed


def test_a_step_that_no_longer_fits_is_skipped():
    assert checks.fits(100, 150) and not checks.fits(40, 150)


def _wheel(folder: Path, name: str, version: str, requires=()) -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{dist}.dist-info/METADATA", "Metadata-Version: 2.1\n"
                         f"Name: {name}\nVersion: {version}\n"
                         + "".join(f"Requires-Dist: {r}\n" for r in requires))


@pytest.fixture
def lists(tmp_path, monkeypatch):
    carried = tmp_path / "carried.txt"
    carried.write_text("# pins\nalpha==1.0  # a comment\nbeta==2.0\n")
    device = tmp_path / "device.txt"
    device.write_text("numpy==2.5.2\nscipy\n")
    monkeypatch.setattr(import_check, "CARRIED", carried)
    monkeypatch.setattr(import_check, "DEVICE", device)
    monkeypatch.setattr(import_check, "OURS", ())
    folder = tmp_path / "whl"
    folder.mkdir()
    return folder


def test_the_wheel_folder_is_read_against_both_lists(lists):
    _wheel(lists, "alpha", "1.0", ["beta>=2", "numpy>=2", "scipy", "gradio; extra == 'ui'"])
    _wheel(lists, "beta", "2.0", ["wandb"])  # a NOT_NEEDED requirement
    assert import_check.check_folder(lists) == []


def test_the_wheel_folder_problems_are_named(lists):
    _wheel(lists, "alpha", "1.0", ["numpy<2", "pandas"])
    _wheel(lists, "alpha", "1.1")
    problems = import_check.check_folder(lists)
    assert any("two versions of alpha" in p for p in problems)
    assert any("beta==2.0 (carried-wheels.txt) is missing" in p for p in problems)
    assert any("needs numpy<2, but the device has numpy 2.5.2" in p for p in problems)
    assert any("needs pandas: neither carried nor on the device" in p for p in problems)
