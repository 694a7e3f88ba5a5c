"""Sessions: tests (unit), contract, parity (against upstream), lint, docs (the site, links
checked), bench, fuzz (long property tests), compat (Python 3.12 and 3.13), and ci (what CI
runs, with lint, docs and compat).

    nox -s lint docs ci compat  # the README's test command: lint, the docs site, unit tests +
                                # contract suite + tiny-model parity, then the contract suite
                                # on 3.12 and 3.13
    nox -s parity -- --realsize   # also the real-size parity tests (slow; not in CI)
    nox -s bench       # benchmarks against upstream (slow; never in CI)
    nox -s bench_streams -- MODEL_DIR  # 1/4/8 concurrent VoxCPM streams, batched vs not
    nox -s fuzz        # the Hypothesis property tests, long profile (not in CI)
    nox -s gpu         # the GPU check (docs/gpu-check.md; on a lent GPU machine)
    nox -s gpu_rehearsal  # the GPU check's steps on the CPU, from the same wheels (in CI)
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import nox

nox.options.sessions = ["lint", "docs", "ci", "compat"]
COMPAT_PYTHONS = ["3.12", "3.13"]


def _expose_interpreters(versions: list[str]) -> None:
    """Put ``pythonX.Y`` of pyenv's installed versions on PATH for nox to find: pyenv's shims
    answer "command not found" for a version that is installed but not selected."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    links = os.path.join(tempfile.gettempdir(), "mizuoto-nox-pythons")
    for version in versions:
        if _runs(f"python{version}"):
            continue
        found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin",
                                              f"python{version}")))
        if found:
            os.makedirs(links, exist_ok=True)
            link = os.path.join(links, f"python{version}")
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(found[-1], link)
    if os.path.isdir(links):
        os.environ["PATH"] = links + os.pathsep + os.environ.get("PATH", "")


def _runs(command: str) -> bool:
    try:
        return subprocess.run([command, "--version"], capture_output=True).returncode == 0
    except OSError:
        return False


_expose_interpreters(COMPAT_PYTHONS)
nox.options.reuse_existing_virtualenvs = True

TORCH = ["torch==2.14.1", "torchaudio==2.11.0"]
PACKAGES = [
    "-e", "packages/mizuoto-core[hub,text,serve,ray,tensorboard,wyoming]",
    "-e", "packages/mizuoto-f5tts[arrow]",
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
# the root pyproject's development dependency group (pip >= 25.1), kept out of what users install
TEST_TOOLS = ["--group", "test"]
PIP = ["pip>=25.1"]  # the first pip that installs dependency groups
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
# pytest processes per suite (pytest-xdist): the tests run on one thread each (THREADS), so one
# per core, at most 2 (CI's machine; more would multiply the tests' models in memory)
TEST_WORKERS = int(os.environ.get("MIZUOTO_TEST_WORKERS", min(2, os.cpu_count() or 1)))


def _install_base(session):
    session.install(*PIP)
    session.install(*TORCH, "librosa", "pytest")
    session.install(*PACKAGES, *TEST_TOOLS)


def _install_oracles(session):
    _ensure_ffmpeg(session)
    session.install("--no-deps", *ORACLES_NO_DEPS)
    for requirements in ORACLE_REQUIREMENTS:
        session.install("-r", requirements)


def _ensure_ffmpeg(session):
    """torchaudio.load (used by the upstream oracles) needs the system FFmpeg libraries."""
    if shutil.which("ffmpeg"):
        return
    if not _apt_install(session, ["ffmpeg"]):
        session.error("FFmpeg is required by the parity tests (the upstream oracles read audio "
                      "with torchaudio): install it (apt-get install ffmpeg), or set "
                      f"{APT_OPT_IN}=1 to let this session apt-get install it")


#: Set to 1 to let a session apt-get install the system packages the tests need (FFmpeg,
#: jemalloc, tcmalloc); CI (the CI variable set) always may. Nothing is installed otherwise.
APT_OPT_IN = "MIZUOTO_APT_INSTALL"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


@contextlib.contextmanager
def _environment_discarded_in_ci(session):
    """Log the free disk; in CI, remove the session's environment when the session ends.

    Each environment holds PyPI's torch, a CUDA build (6-9 GB with its NVIDIA libraries), and a
    CI machine's disk can be short (one CI run died of a full disk within its first minute): so
    CI needs the space of its largest session, not of all three. CI's machine is never reused,
    so nothing is lost; locally (CI unset) environments are kept for the next run."""
    session.log(f"free disk: {shutil.disk_usage(os.getcwd()).free / 1e9:.1f} GB")
    try:
        yield
    finally:
        if _in_ci():
            shutil.rmtree(session.virtualenv.location, ignore_errors=True)


def _may_apt_install() -> bool:
    """On the host only in CI or when asked, and only as root with apt-get."""
    asked = _in_ci() or os.environ.get(APT_OPT_IN, "") == "1"
    return asked and hasattr(os, "geteuid") and os.geteuid() == 0 \
        and shutil.which("apt-get") is not None


def _apt_install(session, packages: list[str]) -> bool:
    """Install Debian ``packages`` where this session may (:func:`_may_apt_install`); False
    otherwise."""
    if not _may_apt_install():
        return False
    # run_install: system packages are part of setting up, so --install-only installs them too
    session.run_install("apt-get", "update", "-qq", external=True)
    session.run_install("apt-get", "install", "-y", "-qq", *packages, external=True,
                env={"DEBIAN_FRONTEND": "noninteractive"})
    return True


# The allocators compute.cpu_allocator preloads (library name -> Debian package).
ALLOCATOR_PACKAGES = {"libjemalloc.so": "libjemalloc2",
                      "libtcmalloc_minimal.so": "libtcmalloc-minimal4"}


def _missing_allocators() -> list[str]:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True,
                                 check=False).stdout
    except OSError:
        listing = ""
    return [package for library, package in ALLOCATOR_PACKAGES.items() if library not in listing]


def _allocator_env(session) -> dict[str, str]:
    """Install jemalloc and tcmalloc where the session may, so that the tests proving they keep
    the audio bit-identical run; once they are there, and always in CI, a test that cannot
    find one fails (MIZUOTO_REQUIRE_ALLOCATORS=1) instead of skipping. Elsewhere those tests
    skip, saying so."""
    missing = _missing_allocators()
    if missing and _apt_install(session, missing):
        missing = _missing_allocators()
    if missing and not _in_ci():
        session.warn(f"not installed: {', '.join(missing)}; the compute.cpu_allocator tests "
                     "(test_cpu_startup.py) will skip: apt-get install " + " ".join(missing)
                     + f", or set {APT_OPT_IN}=1 to let this session install them")
        return {}
    return {"MIZUOTO_REQUIRE_ALLOCATORS": "1"}


BROWSER_TEST = ["--group", "browser-test"]


CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def _has_chromium() -> bool:
    return any(shutil.which(name) for name in CHROMIUM_NAMES)


def _browser_env(session) -> dict[str, str]:
    """Install Playwright (without its browser downloads) and Debian's Chromium where the
    session may, for the page's browser tests (tests/test_web_page.py), which must run here:
    without Chromium they fail (MIZUOTO_REQUIRE_BROWSER=1), never skip. Their screenshots go
    to the session's folder."""
    session.install(*BROWSER_TEST, env={"PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"})
    if not _has_chromium() and not _apt_install(session, ["chromium"]):
        session.warn("Chromium is not installed: the page's browser tests (test_web_page.py) "
                     f"will fail. apt-get install chromium, or set {APT_OPT_IN}=1 to let this "
                     "session install it")
    screenshots = os.path.join(session.create_tmp(), "screenshots")
    session.log(f"the page's screenshots: {screenshots}")
    return {"MIZUOTO_SCREENSHOTS": screenshots, "MIZUOTO_REQUIRE_BROWSER": "1"}


@nox.session(python="3.11")
def tests(session):
    """Unit tests of every package (no upstream oracles)."""
    _install_base(session)
    _run_suites(session, "not parity and not fuzz_only", ["core", "f5tts", "voxcpm",
                                                        "contract-selftest"],
                env={**THREADS, **_allocator_env(session)})


@nox.session(python="3.11")
def contract(session):
    """The contract suite against every installed engine (ours and the example plugin)."""
    _install_base(session)
    _run_suites(session, "not realsize and not fuzz_only", ["contract"])


@nox.session(python="3.11")
def parity(session):
    """Bit-exact parity against upstream f5-tts and voxcpm on random-init checkpoints."""
    _install_base(session)
    _install_oracles(session)
    realsize = "--realsize" in session.posargs
    marker = "parity" if realsize else "parity and not realsize"
    session.posargs[:] = [a for a in session.posargs if a != "--realsize"]
    # real-size models: one at a time (tens of GB of memory and disk each)
    _run_suites(session, marker, ["core", "f5tts", "voxcpm"],
                workers=1 if realsize else TEST_WORKERS)


# Each distribution's tests run in their own pytest process: their test modules share basenames
# (tests/test_engine.py, tests/parity/conftest.py), which one pytest process cannot import twice.
SUITES = {
    "core": ["packages/mizuoto-core/tests"],
    "f5tts": ["packages/mizuoto-f5tts/tests"],
    "voxcpm": ["packages/mizuoto-voxcpm/tests"],
    "contract-selftest": ["contract-tests/tests"],  # the suite run against the example plugin
    "contract": ["--pyargs", "mizuoto_contract"],
}


# The Hypothesis property tests (test_fuzz_*.py, the contract suite's hostile-input tests).
FUZZ_SUITES = {
    "core": ["packages/mizuoto-core/tests/test_fuzz_requests.py",
             "packages/mizuoto-core/tests/test_fuzz_audio.py",
             "packages/mizuoto-core/tests/test_fuzz_cli.py",
             "packages/mizuoto-core/tests/test_fuzz_batch.py",
             "packages/mizuoto-core/tests/test_fuzz_serve.py",
             "packages/mizuoto-core/tests/test_fuzz_settings_files.py",
             "packages/mizuoto-core/tests/test_disk_full.py"],
    "f5tts": ["packages/mizuoto-f5tts/tests/test_fuzz_engine.py",
              "packages/mizuoto-f5tts/tests/test_fuzz_model_files.py"],
    "voxcpm": ["packages/mizuoto-voxcpm/tests/test_fuzz_engine.py",
               "packages/mizuoto-voxcpm/tests/test_fuzz_model_files.py"],
    "contract": ["--pyargs", "mizuoto_contract", "-k", "hostile or non_finite"],
}


def _run_suites(session, marker: str, names=SUITES, suites=SUITES, env=THREADS,
                workers: int = TEST_WORKERS) -> None:
    """Run each suite (on ``workers`` pytest processes), then print one closing line that
    totals them all."""
    reports = []
    failed = []
    for name in names:
        report = os.path.join(session.create_tmp(), f"junit-{name}.xml")
        reports.append(report)
        try:
            session.run("pytest", *suites[name], "-m", marker, "-p", "no:cacheprovider",
                        # loadfile: a module's tests on one worker, so its module-scoped
                        # fixtures (models, a Ray instance) are built once and tests that
                        # rely on the module's order hold (test_serve_ray's Ctrl-C test)
                        *(["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []),
                        f"--junitxml={report}", *session.posargs, env=env)
        except nox.command.CommandFailed:
            failed.append(name)
    session.run("python", "-c", _TOTAL, str(len(failed)), *reports)
    if failed:
        session.error(f"failing suites: {', '.join(failed)}")


_TOTAL = """
import sys, xml.etree.ElementTree as ET
t = f = s = 0
failed_suites = int(sys.argv[1])
for path in sys.argv[2:]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        continue
    for suite in root.iter("testsuite"):
        n, e, x, k = (int(suite.get(a, 0)) for a in ("tests", "errors", "failures", "skipped"))
        t += n; f += e + x; s += k
# A suite that failed without failing tests (a crash, a usage error) counts as one failure.
f = max(f, failed_suites)
print(f"total: {t - f - s} passed, {f} failed, {s} skipped")
"""


def _plugins_output(session) -> str | None:
    """``mizuoto plugins``'s output; None under ``--install-only``, where nox runs nothing."""
    return session.run("mizuoto", "plugins", silent=True)


def _listed(output: str, plugin: str) -> bool:
    """Whether ``mizuoto plugins`` lists ``plugin`` (each plugin starts a line with its name)."""
    return any(line.split()[:1] == [plugin] for line in output.splitlines())


def _check_plugin_discovery(session) -> None:
    """Core alone reports no engine; installing an engine makes it appear, uninstalling it makes
    it disappear (real pip installs of the distributions, not mocks)."""
    engines = ["mizuoto-f5tts", "mizuoto-voxcpm", "mizuoto-example"]
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", *engines)
    alone = _plugins_output(session)
    if alone is None:  # --install-only: nox ran nothing, so nothing was uninstalled either
        return
    if "No plugins installed" not in alone:
        session.error(f"core alone should report no engines, got: {alone!r}")
    session.install("--no-deps", "packages/mizuoto-f5tts")  # a regular (non-editable) install
    with_f5 = _plugins_output(session)
    if not _listed(with_f5, "f5tts") or _listed(with_f5, "voxcpm"):
        session.error(f"after installing mizuoto-f5tts: {with_f5!r}")
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", "mizuoto-f5tts")
    if _listed(_plugins_output(session) or "", "f5tts"):
        session.error("mizuoto-f5tts still listed after uninstalling it")
    session.install("--no-deps", *PACKAGES[2:])  # back to the editable engines
    session.log("plugin discovery: core alone, +f5tts, -f5tts all as expected")


@nox.session(python="3.11")
def ci(session):
    """What CI runs: unit tests (the page's in headless Chromium too), the contract suite and
    the tiny-model parity tests."""
    with _environment_discarded_in_ci(session):
        _install_base(session)
        _install_oracles(session)
        _check_plugin_discovery(session)
        _build_kernels(session)
        _run_suites(session, "not realsize and not fuzz_only",
                    env={**THREADS, **_allocator_env(session), **_browser_env(session)})


def _build_kernels(session):
    """Core's bf16dot kernel is compiled once per machine and Python on first use: here, not
    inside a test with a time limit (it says why where it cannot run: another CPU kind, no
    compiler, and the tests then run without it)."""
    session.run("python", "-c", "from mizuoto.runtime import bf16_dot; "
                "print('bf16dot kernel:', 'runs' if bf16_dot.runs() else "
                "bf16_dot.unavailable_reason())")


@nox.session(python=COMPAT_PYTHONS)
def compat(session):
    """The newer Pythons: regular (not editable) installs of core and both engines with only
    their declared dependencies (no librosa, no upstream oracles, torch without torchaudio),
    then the contract suite against both engines and the engines' command line.

    Installed as a user adds to an environment: core first, then the engines together with
    another extra of core (an engine's requirement on core must not conflict with the core
    already installed: ResolutionImpossible before), then the test tools."""
    with _environment_discarded_in_ci(session):
        session.install(*PIP)
        session.install(TORCH[0])
        session.install("./packages/mizuoto-core")
        session.install("./packages/mizuoto-voxcpm", "./packages/mizuoto-f5tts",
                        "./packages/mizuoto-core[serve]")
        session.install("./packages/mizuoto-core[text,serve]", "./contract-tests", *TEST_TOOLS)
        for undeclared in ("librosa", "torchaudio", "f5_tts", "voxcpm"):
            session.run("python", "-c", f"import importlib.util, sys; "
                        f"importlib.util.find_spec({undeclared!r}) and "
                        f"sys.exit('{undeclared} is installed: "
                        "this session proves we run without it')")
        _check_plugin_listing(session)
        _build_kernels(session)  # from the installed wheel's source
        tmp = session.create_tmp()
        for fixture in COMPAT_FIXTURES:
            model = os.path.join(tmp, fixture.replace("/", "-"))
            if not os.path.isdir(model):
                session.run("mizuoto", "-q", "random-model", fixture, model)
            session.run("mizuoto", "-q", "say", "-m", model, "Hello from Mizuoto.",
                        "-o", os.path.join(tmp, "hello.wav"), env=THREADS)
        _run_suites(session, "not realsize and not fuzz_only", ["contract"], suites=COMPAT_SUITES,
                    env=THREADS)


# On the newer Pythons the contract suite runs against one model of each engine (3.11 runs it
# against them all): what differs between Pythons shows on any model, and CI's time is short.
COMPAT_FIXTURES = ("f5tts/tiny-v1-base", "voxcpm/tiny-2")
COMPAT_SUITES = {"contract": [*SUITES["contract"], "-k", " or ".join(COMPAT_FIXTURES)]}


def _check_plugin_listing(session) -> None:
    output = _plugins_output(session)
    if output is None:  # --install-only
        return
    if not (_listed(output, "f5tts") and _listed(output, "voxcpm")):
        session.error(f"mizuoto plugins should list both engines, got: {output!r}")


@nox.session(python="3.11")
def fuzz(session):
    """The property tests with the long Hypothesis profile: twenty times CI's examples, random
    (CI's are derandomized), failures kept in .hypothesis/ and replayed first (not in CI).

    nox -s fuzz            # about 8 minutes on two cores
    nox -s fuzz -- -x      # stop at the first failure
    """
    _install_base(session)
    env = {**THREADS, "MIZUOTO_HYPOTHESIS_PROFILE": "fuzz"}
    _run_suites(session, "not parity", FUZZ_SUITES, suites=FUZZ_SUITES, env=env)


@nox.session(python="3.11")
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python="3.11")
def docs(session):
    """Build the docs site (mkdocs.yml) in strict mode: a link to a missing page or anchor
    fails it. Seconds, and no torch: mkdocs alone."""
    session.install("mkdocs>=1.6,<2")
    session.run("mkdocs", "build", "--strict", "--quiet")


@nox.session(python="3.11")
def bench_streams(session):
    """1, 4 and 8 concurrent streams on one VoxCPM model, batched by the scheduler against
    unbatched (benchmarks/cpu/streams.py; never part of CI): ``-- MODEL_DIR`` for a real
    model, else a random tiny one (it shows the script runs, its numbers mean nothing)."""
    _install_base(session)
    session.run("python", "benchmarks/cpu/streams.py", *(session.posargs or ["--tiny"]))


@nox.session(python="3.11")
def bench(session):
    """Mizuoto vs upstream on real-size random-init models (slow; never part of CI)."""
    _install_base(session)
    _install_oracles(session)
    targets = session.posargs or ["f5tts", "voxcpm"]
    if "f5tts" in targets:
        session.run("python", "packages/mizuoto-f5tts/benchmarks/bench_f5tts.py")
    if "voxcpm" in targets:
        # one random real-size model for both runs; the second times the streaming path's
        # first audio (docs/performance.md)
        model = os.path.join(session.create_tmp(), "voxcpm-0.5b")
        session.run("python", "packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py", "--dir", model)
        session.run("python", "packages/mizuoto-voxcpm/benchmarks/bench_voxcpm.py", "--dir", model,
                    "--stream", "--patches", "4")


@nox.session(python=False)
def gpu(session):
    """The GPU check (benchmarks/gpu/checks.py; needs CUDA, never part of CI): one command of
    at most 9 minutes, installing only from the wheel folder .whl/ (built here first by
    benchmarks/gpu/wheels.sh when missing). See docs/gpu-check.md; on a machine without nox,
    run the script itself."""
    if not glob.glob(".whl/*.whl"):
        session.run("bash", "benchmarks/gpu/wheels.sh", external=True)
    session.run("python3", "benchmarks/gpu/checks.py", *session.posargs, external=True)


@nox.session(python=False)
def gpu_rehearsal(session):
    """The GPU check rehearsed on this CPU (in CI): the wheel folder built as for the GPU, a
    fresh Python 3.12 environment with the device's torch, every step on tiny models
    (benchmarks/gpu/checks.py --rehearse). In CI its environment (PyPI's torch build, about
    6 GB with its NVIDIA libraries) is removed at the end."""
    tmp = session.create_tmp()
    wheels = os.path.join(tmp, "wheels")
    venv = os.path.join(tmp, "venv")
    session.log(f"free disk: {shutil.disk_usage(os.getcwd()).free / 1e9:.1f} GB")
    try:
        session.run("bash", "benchmarks/gpu/wheels.sh", wheels, external=True,
                    env={"PYTHON": sys.executable})
        session.run(sys.executable, "benchmarks/gpu/checks.py", "--rehearse", "--wheels",
                    wheels, "--venv", venv, "--out", tmp, *session.posargs, external=True)
    finally:
        if _in_ci():
            shutil.rmtree(venv, ignore_errors=True)
