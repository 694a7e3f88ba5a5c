"""Sessions: tests (unit), contract, parity (against upstream), lint, bench, and ci (what CI runs).

    nox -s ci          # unit tests + contract suite + tiny-model parity: the README's test command
    nox -s parity -- --realsize   # also the real-size parity tests (slow; not in CI)
    nox -s bench       # benchmarks against upstream (slow; never in CI)
"""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["lint", "ci"]
nox.options.reuse_existing_virtualenvs = True

TORCH = ["torch==2.14.1", "torchaudio==2.11.0"]
PACKAGES = [
    "-e", "packages/mizuoto-core[hub,text,test]",
    "-e", "packages/mizuoto-f5tts",
    "-e", "packages/mizuoto-voxcpm",
    "-e", "contract-tests",
    "-e", "docs/examples/mizuoto-example",
]
# Upstream packages, test-only, without their declared dependencies (gradio, wandb, funasr, ...).
ORACLES_NO_DEPS = ["f5-tts==1.1.22", "vocos==0.1.0", "encodec==0.1.1", "voxcpm==2.0.3",
                   "torchcodec==0.17.0"]
ORACLE_REQUIREMENTS = [
    "packages/mizuoto-f5tts/tests/parity/oracle-requirements.txt",
    "packages/mizuoto-voxcpm/tests/parity/oracle-requirements.txt",
]
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def _install_base(session):
    session.install(*TORCH, "librosa", "pytest")
    session.install(*PACKAGES)


def _install_oracles(session):
    _ensure_ffmpeg(session)
    session.install("--no-deps", *ORACLES_NO_DEPS)
    for requirements in ORACLE_REQUIREMENTS:
        session.install("-r", requirements)


def _ensure_ffmpeg(session):
    """torchaudio.load (used by the upstream oracles) needs the system FFmpeg libraries."""
    if shutil.which("ffmpeg"):
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "ffmpeg", external=True,
                    env={"DEBIAN_FRONTEND": "noninteractive"})
    else:
        session.error("FFmpeg is required for the parity oracles: install it (apt-get install ffmpeg)")


@nox.session(python="3.11")
def tests(session):
    """Unit tests of every package (no upstream oracles)."""
    _install_base(session)
    session.run("pytest", "packages", "docs/examples", "-m", "not parity", *session.posargs,
                env=THREADS)


@nox.session(python="3.11")
def contract(session):
    """The contract suite against every installed engine (ours and the example plugin)."""
    _install_base(session)
    session.run("pytest", "--pyargs", "mizuoto_contract", *session.posargs, env=THREADS)


@nox.session(python="3.11")
def parity(session):
    """Bit-exact parity against upstream f5-tts and voxcpm on random-init checkpoints."""
    _install_base(session)
    _install_oracles(session)
    marker = "parity" if "--realsize" in session.posargs else "parity and not realsize"
    args = [a for a in session.posargs if a != "--realsize"]
    session.run("pytest", "packages", "-m", marker, *args, env=THREADS)


@nox.session(python="3.11")
def ci(session):
    """What CI runs: unit tests, the contract suite and the tiny-model parity tests."""
    _install_base(session)
    _install_oracles(session)
    session.run("pytest", "packages", "docs/examples", "-m", "not realsize", "-p", "no:cacheprovider",
                *session.posargs, env=THREADS)
    session.run("pytest", "--pyargs", "mizuoto_contract", "-p", "no:cacheprovider", env=THREADS)


@nox.session(python="3.11")
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python="3.11")
def bench(session):
    """Mizuoto vs upstream on real-size random-init models (slow; never part of CI)."""
    _install_base(session)
    _install_oracles(session)
    targets = session.posargs or ["f5tts", "voxcpm"]
    if "f5tts" in targets:
        session.run("python", "packages/mizuoto-f5tts/benchmarks/bench_f5tts.py")
    if "voxcpm" in targets:
        session.run("python", "packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py")
