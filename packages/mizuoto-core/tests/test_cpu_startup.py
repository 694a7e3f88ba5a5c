"""compute.cpu_allocator and compute.cpu_pinning: finding jemalloc and tcmalloc, telling which
malloc is in use, refusing at load what the process did not start with (and saying how), and
the ``mizuoto`` command restarting itself with them.

Processes started with a library preloaded run without torch where they can (a fraction of a
second); the pinning and command checks import torch in one child each. That the audio stays
bit-identical is checked with each engine by the contract suite (test_plugin_contract.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import mizuoto
from mizuoto.cli import cli
from mizuoto.errors import InvalidOption
from mizuoto.options import ComputeOptions
from mizuoto.runtime import allocator
from mizuoto.runtime.allocator import (
    ALLOCATOR_PATH_ENV,
    check_cpu_allocator,
    find_allocator_library,
    loaded_allocator,
    preload_list,
)
from mizuoto.runtime.startup import RESTARTED_ENV, startup_environment
from mizuoto.runtime.threads import check_cpu_pinning, openmp_binding

REQUIRE_ALLOCATORS = os.environ.get("MIZUOTO_REQUIRE_ALLOCATORS") == "1"
# the libraries' start-time variables, removed from the children's environment
_START_VARIABLES = ("LD_PRELOAD", "OMP_PROC_BIND", "OMP_PLACES", RESTARTED_ENV)


def _installed(name: str) -> Path:
    """The system's library, or a skip (a failure under MIZUOTO_REQUIRE_ALLOCATORS=1, which the
    nox sessions set after installing them)."""
    path = find_allocator_library(name, environ={})
    if path is None:
        message = f"lib{name} is not installed ({allocator.install_hint(name)})"
        if REQUIRE_ALLOCATORS:
            pytest.fail(message)
        pytest.skip(message)
    return path


def _plain_environment(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in _START_VARIABLES}, **extra}


def _elf_like_this_interpreter(path: Path, *, machine: bytes | None = None) -> Path:
    """A file whose ELF header says it is built for this interpreter (or another machine)."""
    header = bytearray(Path(sys.executable).read_bytes()[:64])
    if machine is not None:
        header[18:20] = machine
    path.write_bytes(bytes(header))
    return path


def _not_loaded() -> str:
    """An allocator this test process does not use."""
    return "tcmalloc" if loaded_allocator() == "jemalloc" else "jemalloc"


# --- discovery ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["jemalloc", "tcmalloc"])
def test_the_installed_libraries_are_found(name):
    path = _installed(name)
    assert path.is_file() and path.name.startswith(f"lib{name}")
    assert "_debug" not in path.name


def test_the_override_path_comes_first_and_only_loadable_files_count(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "libjemalloc.so").write_text("not a library")
    chosen = _elf_like_this_interpreter(mine / "libjemalloc.so.2")
    foreign = _elf_like_this_interpreter(mine / "libtcmalloc_minimal.so.4", machine=b"\xb7\x00")
    assert find_allocator_library("jemalloc", environ={ALLOCATOR_PATH_ENV: str(mine)}) == chosen
    assert find_allocator_library("jemalloc",
                                  environ={ALLOCATOR_PATH_ENV: f"/nowhere:{chosen}"}) == chosen
    # built for another machine (aarch64 here): passed over for the system's, if any
    assert find_allocator_library("tcmalloc", environ={ALLOCATOR_PATH_ENV: str(mine)}) \
        != foreign
    with pytest.raises(ValueError, match="unknown allocator 'mimalloc'"):
        find_allocator_library("mimalloc")


def test_the_allocator_in_use_is_the_one_malloc_resolves_to(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "1000-2000 r-xp 00000000 08:01 11  /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
        "3000-4000 r-xp 00000000 08:01 12  /usr/lib/libtcmalloc_minimal_debug.so.4\n"
        "5000-6000 r-xp 00000000 08:01 13  /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7000-8000 rw-p 00000000 00:00 0\n")
    assert loaded_allocator(maps, address=0x1800) == "jemalloc"
    assert loaded_allocator(maps, address=0x3000) == "tcmalloc"  # a debug build is tcmalloc
    assert loaded_allocator(maps, address=0x5000) is None
    assert loaded_allocator(maps, address=0x7800) is None  # anonymous memory
    assert loaded_allocator(tmp_path / "absent", address=0x1800) is None


def test_a_preloaded_allocator_is_detected_in_a_fresh_process():
    jemalloc, tcmalloc = _installed("jemalloc"), _installed("tcmalloc")
    code = "from mizuoto.runtime.allocator import loaded_allocator; print(loaded_allocator())"

    def in_use(preload: str) -> str:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=_plain_environment(LD_PRELOAD=preload), timeout=60, check=True)
        return done.stdout.strip()

    assert in_use(str(jemalloc)) == "jemalloc"
    assert in_use(str(tcmalloc)) == "tcmalloc"
    assert in_use(f"{tcmalloc}:{jemalloc}") == "tcmalloc"  # both mapped; the first is malloc
    assert in_use(preload_list(jemalloc, str(tcmalloc))) == "jemalloc"


def test_preload_list_puts_the_allocator_first_and_drops_the_other():
    assert preload_list(Path("/lib/libjemalloc.so.2")) == "/lib/libjemalloc.so.2"
    assert preload_list(Path("/lib/libjemalloc.so.2"),
                        "/opt/libfoo.so /usr/lib/libtcmalloc.so.4:/opt/libbar.so") \
        == "/lib/libjemalloc.so.2:/opt/libfoo.so:/opt/libbar.so"


# --- refused from Python, with the fix --------------------------------------------------------

def test_an_allocator_not_preloaded_is_refused_with_the_command_to_start_with(tmp_path):
    wanted = _not_loaded()
    library = _elf_like_this_interpreter(tmp_path / f"lib{wanted}.so.2")
    check_cpu_allocator("default")
    with pytest.raises(InvalidOption) as caught:
        check_cpu_allocator(wanted, environ={ALLOCATOR_PATH_ENV: str(library)})
    assert caught.value.key == "compute.cpu_allocator"
    assert f"e.g. LD_PRELOAD={library} python" in str(caught.value)
    assert "preloaded before the process starts" in str(caught.value)
    with pytest.raises(InvalidOption, match=f"although LD_PRELOAD=/nowhere/lib{wanted}.so.2: "
                                            "the dynamic linker could not preload it"):
        check_cpu_allocator(wanted, environ={"LD_PRELOAD": f"/nowhere/lib{wanted}.so.2"})


def test_an_allocator_not_on_the_system_is_refused_with_how_to_install_it(monkeypatch):
    monkeypatch.setattr(allocator, "find_allocator_library", lambda name, environ=None: None)
    with pytest.raises(InvalidOption, match="apt-get install libjemalloc2"):
        check_cpu_allocator("jemalloc", environ={})
    with pytest.raises(InvalidOption, match="apt-get install libtcmalloc-minimal4"):
        check_cpu_allocator("tcmalloc", environ={})


def test_every_engine_load_checks_the_allocator(fake_plugin, tmp_path):
    """The base class checks it: an engine does nothing to honour or refuse it."""
    (tmp_path / "fake.json").write_text("{}")
    wanted = _not_loaded()
    options = mizuoto.Options.from_mapping({"compute.cpu_allocator": wanted})
    with pytest.raises(InvalidOption, match="compute.cpu_allocator.*is not loaded"):
        mizuoto.load(tmp_path, options=options)


def test_pinning_without_a_binding_is_refused_with_the_variables_to_set():
    if os.environ.get("OMP_PROC_BIND", "false").lower() != "false":
        assert openmp_binding() is not None  # this test process was started pinned
        return
    assert openmp_binding() is None
    check_cpu_pinning(ComputeOptions())
    with pytest.raises(InvalidOption) as caught:
        check_cpu_pinning(ComputeOptions(cpu_pinning=True))
    assert caught.value.key == "compute.cpu_pinning"
    assert "OMP_PROC_BIND=close OMP_PLACES=cores" in str(caught.value)


def test_pinned_threads_each_run_on_their_own_core():
    code = """
import json, os, torch
from mizuoto.runtime.threads import check_cpu_pinning, openmp_binding
from mizuoto.options import ComputeOptions
check_cpu_pinning(ComputeOptions(cpu_pinning=True, cpu_threads=2))
x = torch.randn(256, 256)
(x @ x).sum()  # starts the OpenMP team
print(json.dumps({"binding": openmp_binding(), "cpus": [
    len(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")]}))
"""
    environment = startup_environment(ComputeOptions(cpu_pinning=True, cpu_threads=2),
                                      _plain_environment())
    assert environment["OMP_PROC_BIND"] == "close" and environment["OMP_NUM_THREADS"] == "2"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    pinned = json.loads(done.stdout)
    assert pinned["binding"] == "close"
    if len(os.sched_getaffinity(0)) > 1:  # on one CPU every set is that CPU
        assert max(pinned["cpus"]) < len(os.sched_getaffinity(0)), pinned


# --- the environment the command restarts with ----------------------------------------------

def test_startup_environment(tmp_path, monkeypatch):
    wanted = _not_loaded()
    library = _elf_like_this_interpreter(tmp_path / f"lib{wanted}.so.2")
    plain = {ALLOCATOR_PATH_ENV: str(library), "LD_PRELOAD": "/opt/libfoo.so"}
    assert startup_environment(ComputeOptions(), plain) is None
    restart = startup_environment(ComputeOptions(cpu_allocator=wanted), plain)
    assert restart == {**plain, "LD_PRELOAD": f"{library}:/opt/libfoo.so", RESTARTED_ENV: "1"}
    assert startup_environment(ComputeOptions(cpu_allocator=wanted), restart) is None  # once
    pinned = startup_environment(ComputeOptions(cpu_pinning=True), plain)
    assert pinned == {**plain, "OMP_PROC_BIND": "close", "OMP_PLACES": "cores",
                      RESTARTED_ENV: "1"}
    # a binding of the user's own is kept
    assert startup_environment(ComputeOptions(cpu_pinning=True),
                               {**plain, "OMP_PROC_BIND": "spread"}) is None
    monkeypatch.setattr("mizuoto.runtime.startup.find_allocator_library",
                        lambda name, environ=None: None)
    with pytest.raises(InvalidOption, match=f"lib{wanted} was not found on this system: "
                                            "install it"):
        startup_environment(ComputeOptions(cpu_allocator=wanted), plain)


def test_the_command_in_process_does_not_restart_and_the_load_says_why(fake_plugin, tmp_path,
                                                                       monkeypatch):
    """``cli`` invoked inside another program (not ``main``) never replaces that process; a
    restarted process does not hand its guard down to the processes it starts."""
    (tmp_path / "fake.json").write_text("{}")
    monkeypatch.setenv(RESTARTED_ENV, "1")
    result = CliRunner().invoke(cli, ["say", "-m", str(tmp_path), "-o", str(tmp_path / "o.wav"),
                                      "--option", f"compute.cpu_allocator={_not_loaded()}",
                                      "hello"], obj={})
    assert result.exit_code == 2
    assert "is not loaded" in result.output and "LD_PRELOAD=" in result.output
    assert RESTARTED_ENV not in os.environ


def test_the_command_restarts_itself_with_the_allocator_and_pinning(tmp_path):
    """``python -m mizuoto say`` with the toy engine of the example plugin (installed wherever
    the tests run): one restart, then the result reports what was in effect."""
    from mizuoto_example.engine import write_tiny_model

    _installed("jemalloc")
    model = tmp_path / "toy"
    write_tiny_model(model)
    environment = _plain_environment(MIZUOTO_PLUGINS="toy", MIZUOTO_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto", "say", "-m", str(model), "-o",
         str(tmp_path / "out.wav"), "--seed", "1", "--option", "compute.cpu_allocator=jemalloc",
         "--option", "compute.cpu_pinning=true", "hello"],
        env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("restarting with") == 1, done.stderr
    assert "cpu_allocator=jemalloc" in done.stderr and "cpu_pinning=True" in done.stderr
    assert (tmp_path / "out.wav").is_file(), done.stderr


# --- OpenMP's wait policy -------------------------------------------------------------------------

def test_wait_policy_environment_keeps_the_users_choice():
    from mizuoto.runtime.threads import wait_policy_environment

    assert wait_policy_environment(ComputeOptions(), {}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_policy_environment(ComputeOptions(), {"OMP_WAIT_POLICY": "active"}) == {}
    active = ComputeOptions(cpu_wait_policy="active")
    assert wait_policy_environment(active, {"OMP_WAIT_POLICY": "passive"}) == {
        "OMP_WAIT_POLICY": "ACTIVE"}
    assert wait_policy_environment(active, {"OMP_WAIT_POLICY": "ACTIVE"}) == {}


@pytest.mark.parametrize(("threads", "cpus", "busy", "policy"), [
    (2, 2, 0.0, "ACTIVE"), (2, 2, 0.25, "ACTIVE"), (2, 2, 0.5, "PASSIVE"), (2, 2, 1.0, "PASSIVE"),
    (1, 2, 0.9, "ACTIVE"), (1, 2, 1.5, "PASSIVE"), (4, 2, 0.1, "ACTIVE"), (8, 16, 7.0, "ACTIVE"),
    (8, 16, 9.0, "PASSIVE"), (2, 2, None, "PASSIVE")])
def test_auto_spins_only_where_the_threads_cores_are_idle(threads, cpus, busy, policy):
    """One CPU-bound neighbour on two cores made a spinning request 4x slower: any steady
    neighbour on the threads' cores means passive; unknown (no /proc/stat) means passive."""
    from mizuoto.runtime.threads import auto_wait_policy

    assert auto_wait_policy(threads, cpus, busy, serving=False) == policy
    assert auto_wait_policy(threads, cpus, busy, serving=True) == "PASSIVE"


def test_auto_asks_about_the_machine_only_for_a_one_shot_command():
    from mizuoto.runtime.threads import wait_policy_environment

    asked = []

    def idle():
        asked.append(True)
        return 0.0

    def busy():
        return 2.0

    assert wait_policy_environment(ComputeOptions(), {}, serving=True, busy=idle) == {
        "OMP_WAIT_POLICY": "PASSIVE"}
    assert not asked  # a server does not look: the load changes while it lives
    assert wait_policy_environment(ComputeOptions(), {}, serving=False, busy=idle) == {
        "OMP_WAIT_POLICY": "ACTIVE"}
    assert wait_policy_environment(ComputeOptions(), {}, serving=False, busy=busy) == {
        "OMP_WAIT_POLICY": "PASSIVE"}
    # the user's own setting is kept and the machine not probed
    asked.clear()
    assert wait_policy_environment(ComputeOptions(), {"OMP_WAIT_POLICY": "PASSIVE"},
                                   serving=False, busy=idle) == {}
    assert not asked
    # an explicit policy is the policy, idle or not
    assert wait_policy_environment(ComputeOptions(cpu_wait_policy="passive"), {},
                                   serving=False, busy=idle) == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_a_cpu_quota_means_passive_without_looking_at_the_cpus():
    from mizuoto.runtime.threads import auto_wait_policy, wait_policy_environment

    assert auto_wait_policy(2, 16, 0.0, serving=False, quota=2.0) == "PASSIVE"

    def never():
        raise AssertionError("busy cores asked under a quota")

    assert wait_policy_environment(ComputeOptions(), {}, serving=False, busy=never,
                                   quota=lambda: 1.5) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_policy_environment(ComputeOptions(), {}, serving=False, busy=lambda: 0.0,
                                   quota=lambda: None) == {"OMP_WAIT_POLICY": "ACTIVE"}


@pytest.mark.parametrize(("files", "cgroup", "cores"), [
    ({"app/cpu.max": "150000 100000\n"}, "0::/app\n", 1.5),
    ({"app/cpu.max": "max 100000\n"}, "0::/app\n", None),
    ({"cpu.max": "200000 100000\n"}, "0::/\n", 2.0),
    ({"cpu/job/cpu.cfs_quota_us": "50000\n", "cpu/job/cpu.cfs_period_us": "100000\n"},
     "4:cpu,cpuacct:/job\n3:memory:/job\n", 0.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
     "4:cpu,cpuacct:/\n", None),
    ({}, "0::/gone\n", None),
])
def test_cpu_quota_cores_reads_cgroup_v2_and_v1(monkeypatch, tmp_path, files, cgroup, cores):
    from mizuoto.runtime import threads

    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "self-cgroup").write_text(cgroup)
    monkeypatch.setattr(threads, "CGROUP_ROOT", root)
    monkeypatch.setattr(threads, "PROC_SELF_CGROUP", tmp_path / "self-cgroup")
    assert threads.cpu_quota_cores() == cores


def test_busy_cores_reads_the_cpus_this_process_may_use(monkeypatch, tmp_path):
    """The non-idle share of this process's CPUs between two readings of /proc/stat (iowait
    counts as idle, a hypervisor's steal as busy), times their count."""
    from mizuoto.runtime import threads

    readings = iter([
        "cpu  1 1 1 1 1 1 1 1\ncpu0 100 0 0 900 0 0 0 0 0 0\ncpu1 0 0 0 1000 0 0 0 0 0 0\n"
        "cpu2 0 0 0 0 0 0 0 0 0 0\nintr 5\n",
        "cpu  1 1 1 1 1 1 1 1\ncpu0 150 0 10 930 10 0 0 0 0 0\ncpu1 0 0 0 1080 0 0 0 20 0 0\n"
        "cpu2 500 0 0 0 0 0 0 0 0 0\nintr 9\n"])
    stat = tmp_path / "stat"
    monkeypatch.setattr(threads, "PROC_STAT", stat)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("time.sleep", lambda s: stat.write_text(next(readings)))
    stat.write_text(next(readings))
    # cpu0: 60 busy of 100; cpu1: 20 (steal) of 100; cpu2 is not ours
    assert threads.busy_cores(0.1) == pytest.approx(2 * 80 / 200)
    monkeypatch.setattr(threads, "PROC_STAT", tmp_path / "absent")
    assert threads.busy_cores(0.1) is None


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="reads Linux's /proc/stat")
def test_busy_cores_on_this_machine_is_within_its_cpus():
    import os

    from mizuoto.runtime.threads import busy_cores

    busy = busy_cores(0.05)
    assert busy is not None and 0.0 <= busy <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("command", ["serve", "wyoming", "batch"])
def test_long_lived_commands_ask_for_a_servers_wait_policy(monkeypatch, tmp_path, command):
    """serve, wyoming and batch live while the machine's load changes: auto is passive
    there however idle the machine looks at start."""
    import importlib

    from click.testing import CliRunner

    from mizuoto.cli import cli

    module = importlib.import_module(f"mizuoto.commands.{command}")
    seen = {}

    def record(options_file, option_pairs, **kwargs):
        seen.update(kwargs)
        raise SystemExit(3)

    monkeypatch.setattr(module, "options_to_load", record)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("hello\n")
    arguments = {"serve": ["serve", "-m", "x"], "wyoming": ["wyoming", "-m", "x"],
                 "batch": ["batch", "-m", "x", "in.txt", "-o", "out"]}[command]
    result = CliRunner().invoke(cli, arguments, obj={})
    assert seen == {"serving": True}, result.output


def test_a_wait_policy_asked_for_after_torch_started_is_refused(monkeypatch):
    import torch  # noqa: F401  (OpenMP has read its policy)

    from mizuoto.runtime.threads import apply_cpu_wait_policy

    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    apply_cpu_wait_policy(ComputeOptions())  # auto: whatever the process started with
    apply_cpu_wait_policy(ComputeOptions(cpu_wait_policy="active"))
    with pytest.raises(InvalidOption) as caught:
        apply_cpu_wait_policy(ComputeOptions(cpu_wait_policy="passive"))
    assert caught.value.key == "compute.cpu_wait_policy"
    assert "OMP_WAIT_POLICY=PASSIVE" in str(caught.value)


@pytest.mark.parametrize(("user", "option", "reported"), [
    (None, "auto", None), ("active", "auto", "active"), ("active", "passive", "passive")])
def test_the_command_sets_the_wait_policy_before_torch_starts(tmp_path, user, option, reported):
    """The policy is set in the command's own environment (no restart) and the result reports
    the one torch's threads run with; a policy of the user's own is kept under ``auto``; with
    none, auto's choice from the idle cores is the one reported (``--debug`` logs it)."""
    from mizuoto_example.engine import write_tiny_model

    model = tmp_path / "toy"
    write_tiny_model(model)
    environment = _plain_environment(MIZUOTO_PLUGINS="toy", MIZUOTO_HOME=str(tmp_path / "home"))
    environment.pop("OMP_WAIT_POLICY", None)
    if user:
        environment["OMP_WAIT_POLICY"] = user
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto", "--debug", "say", "-m", str(model), "-o",
         str(tmp_path / "out.wav"), "--seed", "1", "--option",
         f"compute.cpu_wait_policy={option}", "hello"],
        env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "restarting with" not in done.stderr
    if reported is None:
        chosen = re.search(r"compute.cpu_wait_policy=auto: (active|passive) \(", done.stderr)
        assert chosen, done.stderr
        reported = chosen.group(1)
    assert f"cpu_wait_policy={reported}" in done.stdout + done.stderr
