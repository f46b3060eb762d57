"""Capacity correctness, round 2: the broker fails closed at start, baselines and
observations need evidence, containers and unknown memory never count as zero.

Figures use a 24 576 MiB GPU with 1 024 MiB headroom:
available = total − headroom − device used − granted not yet allocated. Each test names
the right value and, in its docstring, what the broker gave before.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rbroker
from rbroker.gpu.nvml import real_nvml_available
from tests.conftest import GPU0, WORKER, BrokerProcess, start_broker, wait_until
from tests.desktop.conftest import WorkerProcess
from tests.fakes import gpu_scenarios as sim

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

TOTAL, HEADROOM = 24576, 1024
REPO_ROOT = Path(__file__).resolve().parents[4]
PARAMS: dict[str, Any] = {"project": "tests", "session": "evidence", "purpose": "capacity rules"}
ROOT_ONLY = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0, reason="needs root on Linux"
)


def _gpu_scenario(
    *processes: tuple[int, int],
    nvml: dict[str, sim.Value] | None = None,
    timers: dict[str, sim.Value] | None = None,
    **fields: sim.Value,
) -> str:
    """The scenario of the one GPU (`GPU0`, `TOTAL` MiB) with its other `fields`, the
    processes the driver lists as (pid, used_mib), and the `[nvml]` and `[timers]` tables."""
    rtx = sim.gpu(GPU0, name="Simulated RTX 4090", total_mib=TOTAL, processes=processes, **fields)
    return sim.scenario(rtx, nvml=nvml, timers=timers)


def _gpu(c: rbroker.Client) -> dict[str, Any]:
    (gpu,) = c.gpus()
    return dict(gpu)


def _settled(c: rbroker.Client, timeout_s: float = 8.0, **expected: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        gpu = _gpu(c)
        return gpu if all(gpu.get(k) == v for k, v in expected.items()) else None

    try:
        return dict(wait_until(check, timeout_s=timeout_s))  # type: ignore[arg-type]
    except AssertionError:
        raise AssertionError(f"expected {expected}, last seen {_gpu(c)}") from None


def _samples_pass(c: rbroker.Client, count: int) -> None:
    """Let about `count` more samples of GPU0 be taken (one a second), then check one is
    fresh."""
    time.sleep(count + 0.3)
    assert (_gpu(c)["sample_age_s"] or 0) < 1.5


# -- fail closed at start --------------------------------------------------------------------


@pytest.mark.skipif(real_nvml_available(), reason="this computer has a working NVIDIA driver")
def test_without_simulate_a_computer_without_gpus_gets_none_and_the_way_to_try(
    short_dir: Path,
) -> None:
    """Before: `rbroker broker` without `--simulate` ran on two invented 24 GiB GPUs and
    granted leases against them. Right: no GPUs, every request infeasible with the hint."""
    sock = str(short_dir / "b.sock")
    log_path = short_dir / "broker.log"
    # a broker on real GPUs takes the computer's lock `rbroker-broker` whatever
    # RBROKER_BROKER_LOCK says: in a network namespace of its own (where root may make one),
    # that lock is its own and not the one of a broker of this computer
    own_net = ["unshare", "--net"] if os.geteuid() == 0 and shutil.which("unshare") else []
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                *own_net,
                sys.executable,
                "-m",
                "rbroker",
                "broker",
                "--socket",
                sock,
                "--data-dir",
                str(short_dir / "data"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: Path(sock).exists() or proc.poll() is not None, timeout_s=20)
        assert proc.poll() is None, log_path.read_text()
        with rbroker.Client(sock) as c:
            assert c.gpus() == []
            status = c.status()
            assert not status["simulated"]
            assert status["nvml_problem"]["device_present"] is False
            with pytest.raises(rbroker.Infeasible) as err:
                c.call("lease.acquire", mib=1024, **PARAMS)
        assert "no NVIDIA GPU" in err.value.message and "--simulate" in err.value.message
        wait_until(lambda: "--simulate" in log_path.read_text(), timeout_s=5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


@pytest.mark.parametrize(
    ("init_error", "words"),
    [
        ("version_mismatch", "different versions (NVML error 18"),
        ("library_not_found", "NVML library (libnvidia-ml) is not installed"),
        ("unknown", "unknown error (999)"),
    ],
)
def test_nvml_init_failure_refuses_with_the_error_in_words(
    broker_factory: Callable[..., BrokerProcess], init_error: str, words: str
) -> None:
    """A GPU exists but `nvmlInit` fails: zero admissions, the NVML error in words."""
    scenario = _gpu_scenario(nvml={"init_error": init_error})
    broker = broker_factory(scenario, headroom_mib=HEADROOM)
    with broker.client() as c:
        assert c.gpus() == []
        assert c.status()["nvml_problem"]["device_present"] is True
        with pytest.raises(rbroker.TelemetryUnavailable) as err:
            c.call("lease.acquire", mib=1024, **PARAMS)
    assert "telemetry unavailable" in err.value.message and words in err.value.message


def test_nvml_init_failure_waits_then_serves_once_nvml_answers(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(
        _gpu_scenario(nvml={"init_error": "version_mismatch"}), headroom_mib=HEADROOM
    )
    granted: dict[str, Any] = {}
    holder = broker.client()  # the lease lives as long as this connection

    def wait_for_lease() -> None:
        granted.update(holder.call("lease.acquire", mib=4096, wait_s=60, **PARAMS)["lease"])

    waiter = threading.Thread(target=wait_for_lease)
    waiter.start()
    with holder, broker.client() as c:
        queue = wait_until(lambda: c.leases()["queue"], timeout_s=10)
        (request,) = queue  # type: ignore[misc]
        assert request["reason"].startswith("waiting: telemetry unavailable: the NVIDIA driver")
        time.sleep(2)
        assert c.leases()["leases"] == []  # nothing admitted while NVML fails
        broker.write_scenario(_gpu_scenario())  # the driver and library agree again
        waiter.join(30)
        assert granted["granted_mib"] == 4096
        gpu = _settled(c, outstanding_mib=4096)
        assert gpu["available_mib"] == TOTAL - HEADROOM - 4096
        assert c.status()["nvml_problem"] is None


REATTACH_3_S: dict[str, sim.Value] = {"lease_reattach_grace_s": 3}
"""A restored lease's holder has 3 s to re-attach (default 10): more than the SDK's longest
reconnect backoff (1 s) plus a broker start on a loaded machine."""


def test_leases_restored_while_nvml_fails_stay_alive(
    short_dir: Path, worker: Callable[..., WorkerProcess]
) -> None:
    broker = start_broker(_gpu_scenario(), headroom_mib=HEADROOM, root=short_dir)
    try:
        holder = worker("hold_lease", broker.socket, "6144", "restored", "0")
        lease_id = holder.read_line().split()[1]
        broker.stop(signal.SIGKILL)
        (short_dir / "scenario.toml").write_text(
            _gpu_scenario(timers=REATTACH_3_S, nvml={"init_error": "version_mismatch"})
        )
        broker = start_broker(
            (short_dir / "scenario.toml").read_text(), headroom_mib=HEADROOM, root=short_dir
        )
        with broker.client() as c:
            assert c.gpus() == []
            time.sleep(4)  # past the re-attach grace (3 s): the SDK re-attached at once
            (lease,) = c.leases()["leases"]
            assert lease["lease_id"] == lease_id
    finally:
        broker.stop(signal.SIGKILL)


# -- baselines and observations need evidence -----------------------------------------------


def test_one_sample_without_the_holder_does_not_reset_its_baseline(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """The holder uses 5 000 MiB outside any lease and holds an unused 6 144 MiB lease:
    available = 24 576 − 1 024 − 5 000 − 6 144 = 12 408, before, during and after samples
    in which NVML omits the holder. Before: 17 408 after the glitch, for good."""
    me = os.getpid()
    listed = _gpu_scenario((me, 5000), device_used_mib=5000)
    broker = broker_factory(listed, headroom_mib=HEADROOM)
    with broker.client() as c:
        _settled(c, device_used_mib=5000)
        c.call("lease.acquire", mib=6144, **PARAMS)
        right = TOTAL - HEADROOM - 5000 - 6144
        _settled(c, available_mib=right)
        broker.write_scenario(_gpu_scenario(device_used_mib=5000))  # the list omits the holder
        _samples_pass(c, 2)
        assert _gpu(c)["available_mib"] == right
        broker.write_scenario(listed)  # and lists it again
        _samples_pass(c, 3)
        assert _gpu(c)["available_mib"] == right


def _free_pid_above(start: int) -> int:
    """The first pid from `start` with no process, kept below the kernel's pid_max (past it
    the kernel wraps to 300, so does this: writing a pid past pid_max to ns_last_pid is
    EINVAL, which failed this test on a machine whose pids were near the wrap)."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    pid = start if start < pid_max - 1 else 300
    while Path(f"/proc/{pid}").exists():
        pid = pid + 1 if pid + 1 < pid_max - 1 else 300
    return pid


def _spawn_with_pid(pid: int, args: list[str]) -> subprocess.Popen[bytes] | None:
    """Start `args` as process `pid` (root: the next pid the kernel hands out is set through
    /proc/sys/kernel/ns_last_pid); None when another process took it first."""
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.pid == pid:
        return proc
    proc.kill()
    proc.communicate()
    return None


@ROOT_ONLY
def test_a_reused_pid_does_not_inherit_a_dead_processs_memory(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """The driver still lists a dead pid with 6 144 MiB; a new process gets that pid and at
    once leases 6 144: available = 24 576 − 1 024 − 6 144 (others') − 6 144 (outstanding)
    = 11 264. Before: 17 408 (the dead process's memory counted as the lease's use)."""
    broker = broker_factory(_gpu_scenario(), headroom_mib=HEADROOM)
    holder = None
    try:
        for _attempt in range(10):
            pid = _free_pid_above(int(Path("/proc/sys/kernel/ns_last_pid").read_text()) + 400)
            broker.write_scenario(_gpu_scenario((pid, 6144)))
            with broker.client() as c:
                _settled(c, device_used_mib=6144)
                _samples_pass(c, 1)
            args = [
                sys.executable,
                "-u",
                str(WORKER / "hold_lease.py"),
                broker.socket,
                "6144",
                "reused-pid",
                "0",
            ]
            holder = _spawn_with_pid(pid, args)
            if holder is not None:
                break
        assert holder is not None, "could not start a process with a chosen pid"
        assert holder.stdout is not None
        assert holder.stdout.readline().split()[0] == b"granted"
        with broker.client() as c:
            _samples_pass(c, 3)
            gpu = _gpu(c)
        assert gpu["available_mib"] == TOTAL - HEADROOM - 6144 - 6144, gpu
        assert gpu["outstanding_mib"] == 6144
    finally:
        if holder is not None:
            holder.kill()
            holder.communicate()


CONTAINER_SCRIPT = """
import os, subprocess, sys, time
from pathlib import Path
sock, scenario, data, worker = sys.argv[1:5]
broker = subprocess.Popen([sys.executable, "-m", "rbroker", "broker", "--simulate", scenario,
    "--socket", sock, "--data-dir", data, "--headroom-mib", "1024"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not Path(sock).exists():
    time.sleep(0.05)
time.sleep(0.5)
Path("/proc/sys/kernel/ns_last_pid").write_text("6")
holder = subprocess.Popen([sys.executable, "-u", worker, sock, "4096", "in-container", "0"],
    stdout=subprocess.PIPE)
print(holder.pid, holder.stdout.readline().decode().strip(), flush=True)
broker.wait()
"""


@ROOT_ONLY
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_a_container_with_its_own_proc_never_attributes_host_pids(short_dir: Path) -> None:
    """In a pid namespace that mounted its own /proc (one NSpid entry), a holder with pid 7
    leases 4 096 while NVML lists host pid 7 with 4 096 of someone else: available =
    24 576 − 1 024 − 4 096 − 4 096 = 15 360. Before: 19 456. A client outside that
    namespace (pid 0 for the broker) is told so; before: "the requesting process has
    exited"."""
    scenario = short_dir / "scenario.toml"
    scenario.write_text(_gpu_scenario((7, 4096)))
    sock = str(short_dir / "b.sock")
    script = short_dir / "container.py"
    script.write_text(textwrap.dedent(CONTAINER_SCRIPT))
    proc = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            sys.executable,
            str(script),
            sock,
            str(scenario),
            str(short_dir / "data"),
            str(WORKER / "hold_lease.py"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        pid, word, *_ = proc.stdout.readline().decode().split()
        assert (pid, word) == ("7", "granted")
        with rbroker.Client(sock) as c:
            _samples_pass(c, 2)
            gpu = _gpu(c)
            # this test process is outside the broker's pid namespace: SO_PEERCRED says 0
            with pytest.raises(rbroker.RBrokerError) as err:
                c.call("lease.acquire", mib=512, **PARAMS)
        assert gpu["available_mib"] == TOTAL - HEADROOM - 4096 - 4096, gpu
        assert err.value.code == "not_allowed"
        assert err.value.message.startswith("cannot identify the calling process")
        assert "another pid namespace" in err.value.message
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()


# -- unknown is not unavailable, and unknown is not zero ------------------------------------


def test_a_process_list_without_permission_leaves_the_gpu_usable(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """NO_PERMISSION on the process list (MIG slices, some containers): per-process memory
    unknown, the device figure counts, the GPU stays usable. Before: GPU unavailable."""
    scenario = _gpu_scenario(process_list_error="no_permission", used_mib=3000)
    broker = broker_factory(scenario, headroom_mib=HEADROOM)
    with broker.client() as c:
        gpu = _settled(c, device_used_mib=3000)
        assert gpu["telemetry"] == "ok"
        c.call("lease.acquire", mib=4096, **PARAMS)
        c.sim_allocate(4096)  # the lease's use cannot be seen: it stays outstanding
        gpu = _settled(c, device_used_mib=3000 + 4096)
        assert gpu["outstanding_mib"] == 4096
        assert gpu["available_mib"] == TOTAL - HEADROOM - 3000 - 4096 - 4096


def test_an_override_with_unknown_used_memory_refuses_instead_of_assuming_zero(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """Memory query not supported (unified memory) + per-process memory unknown + a capacity
    override: used is unknown. Before: used counted as 0 and a 20 000 MiB lease granted
    next to 12 000 MiB in use."""
    scenario = _gpu_scenario((4242, 12000), memory_api="not_supported", per_process_memory=False)
    broker = broker_factory(
        scenario, headroom_mib=HEADROOM, extra_args=["--capacity-mib", f"{GPU0}={TOTAL}"]
    )
    with broker.client() as c:
        gpu = _settled(c, telemetry="unknown_capacity")  # type: ignore[arg-type]
        assert gpu["telemetry_reason"] == "used_unknown"
        with pytest.raises(rbroker.TelemetryUnavailable) as err:
            c.call("lease.acquire", mib=20000, **PARAMS)
    assert "memory in use" in err.value.message and "unknown" in err.value.message


def _lease_and_hold(path: str) -> list[dict[str, Any]]:
    """As the other user: take a lease, keep it past several holder checks, list, release."""
    from tests.desktop.conftest import RawConnection

    conn = RawConnection(path)
    try:
        got = conn.request("lease.acquire", {"mib": 1024, **PARAMS})
        time.sleep(2.0)  # the broker checks holders every 0.25 s
        listed = conn.request("leases.list", {})
        return [got, listed]
    finally:
        conn.close()


@ROOT_ONLY
@pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("runuser") is None,
    reason="needs unshare and runuser",
)
def test_a_broker_that_cannot_see_other_users_processes_still_serves_them(
    short_dir: Path, other_user: Any
) -> None:
    """/proc mounted with hidepid=2 (multi-user HPC hosts): the broker, running as its own
    account, cannot see other users' processes. Liveness comes from kill(pid, 0) (EPERM:
    alive), identity from the socket. Before: every other user was refused with "the
    requesting process has exited"."""
    from tests.os_users import create_user, open_to_everyone, python_as, remove_user, run_as

    if tuple(int(x) for x in os.uname().release.split(".")[:2]) < (5, 8):
        pytest.skip("a private hidepid /proc needs per-mount proc options (Linux 5.8)")
    broker_user = create_user("rbt-brk")
    proc: subprocess.Popen[bytes] | None = None
    try:
        python = python_as(broker_user.name)
        if python is None:
            pytest.skip(f"no Python with rbroker is reachable by OS account {broker_user.name}")
        short_dir.chmod(0o755)
        (short_dir / "run").mkdir()
        (short_dir / "data").mkdir()
        for path in (short_dir / "run", short_dir / "data"):
            shutil.chown(path, broker_user.name)
        (short_dir / "scenario.toml").write_text(_gpu_scenario())
        sock = str(short_dir / "run" / "b.sock")
        broker_cmd = [
            "runuser",
            "-u",
            broker_user.name,
            "--",
            "env",
            f"PYTHONPATH={REPO_ROOT}",
            *python,
            "broker",
            "--simulate",
            str(short_dir / "scenario.toml"),
            "--socket",
            sock,
            "--data-dir",
            str(short_dir / "data"),
            "-v",
        ]
        inner = "mount -t proc -o hidepid=2 proc /proc && exec " + shlex.join(broker_cmd)
        log = open(short_dir / "broker.log", "wb")  # noqa: SIM115 - closed below
        # unshare and sh exec; runuser forks the broker and waits: a process group of their
        # own, killed whole below (killing runuser alone left the broker running)
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
            start_new_session=True,
        )
        log.close()
        wait_until(lambda: Path(sock).exists() or proc.poll() is not None, timeout_s=60)
        assert proc.poll() is None, (short_dir / "broker.log").read_text()
        open_to_everyone(short_dir / "run", sock)
        got, listed = run_as(other_user, _lease_and_hold, sock)
        assert "result" in got, got
        assert got["result"]["lease"]["owner"] == other_user.name
        (lease,) = listed["result"]["leases"]
        assert lease["lease_id"] == got["result"]["lease"]["lease_id"]  # not holder_exited
    finally:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        remove_user(broker_user)
