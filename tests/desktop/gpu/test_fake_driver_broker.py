"""A broker process on the fake NVIDIA driver, and the real-GPU check on it (issue 39).

The broker here is started without `--simulate`: it believes it has a real driver. Started
with `LD_LIBRARY_PATH` naming the fake driver's folder (`tests/fakes/nvml_driver`) and
`RBROKER_FAKE_NVML_STATE` naming its state file, the real pynvml loads
`libnvidia-ml.so.1` from there, and every GPU figure reaches the broker through pynvml's
ctypes calls and the driver's structs, on the broker's default timers (a sample a second).
Rewriting the state changes the GPUs under the running broker.

- The capacity rule (architecture.md §2: total − headroom − memory in use − grants not yet
  allocated) through this broker: the bodies of the simulated broker's tests run on it as they
  are (`driver_broker_factory` stands for `broker_factory`; `write_scenario` rewrites the
  driver's state): a grant of exactly what is available and a refusal one MiB past it, with
  the arithmetic, for memory v2 with reserved memory and v1; a waiter admitted when outside
  use falls; memory WDDM does not report per process counted in the device's figure; a GPU
  that vanishes failing closed while the other serves. Then, on one broker: outside use
  rising shrinks capacity, a lost GPU grants nothing, `rbroker status` says NVML and the
  driver's version; and on another, `nvmlInit` failing fails closed with the reason, until
  the driver answers.
- `bench/gpu_check.sh --fake-driver`: the `gpu`-marked tests (`TestRealNvml`,
  tests/desktop/gpu/test_real_gpu.py) pass on the fake driver, only the PyTorch and JAX
  ones skipped, so the real-GPU check itself is proven on every CI.

A broker on real NVML takes the computer's lock (an abstract Unix socket): as root each
broker here gets a network namespace of its own, so the lock is its own and no real broker
of this computer, nor a test standing for one, is in its way. Elsewhere the brokers of these
tests run one at a time, whichever xdist worker starts them (`one_at_a_time`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import rbroker
from rbroker.cli.main import main
from rbroker.demo.processes import broker_address, broker_command
from rbroker.gpu.nvml import in_child_pid_namespace
from rbroker.gpu.presence import nvidia_device_present
from rbroker.hosting.machine_lock import ENV_LOCK
from tests.conftest import GPU0, GPU1, BrokerProcess, short_tmp, wait_until
from tests.desktop.broker.capacity import test_capacity_admission as capacity_admission
from tests.desktop.conftest import RawConnection
from tests.desktop.gpu import test_gpu_faults as gpu_faults
from tests.fakes import gpu_scenarios as sim
from tests.fakes import nvml_driver
from tests.fakes.nvml_driver import DriverSwitches

pytestmark = [
    pytest.mark.contract,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the fake driver's broker runs on Linux"
    ),
]

REPO = Path(__file__).resolve().parents[3]
HEADROOM = 1024
PARAMS: dict[str, Any] = {"project": "tests", "session": "fake-driver", "purpose": "capacity"}


@functools.cache
def own_network() -> tuple[str, ...]:
    """`unshare --net` where this process may make a network namespace (root), else nothing."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return ()
    done = subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False)
    return ("unshare", "--net") if done.returncode == 0 else ()


@contextlib.contextmanager
def one_at_a_time(timeout_s: float = 180.0) -> Iterator[None]:
    """Held while a broker on the driver runs where it has no network namespace of its own
    (`own_network`): such brokers take the computer's lock, so the test workers start them one
    after another (a lock file in the temporary directory); nothing where they have one.

    Raises:
        TimeoutError: another worker's broker kept it `timeout_s` seconds.
    """
    if own_network():
        yield
        return
    path = Path(tempfile.gettempdir()) / "rbroker-fake-driver-broker.lock"
    with open(path, "a") as held:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} held for {timeout_s:g} s") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


@dataclass
class DriverBroker(BrokerProcess):
    """A `python -m rbroker broker` process (no `--simulate`) on the fake driver library.
    `scenario` is the driver's state file; `write_scenario` rewrites it from a scenario TOML
    (as a simulated broker's scenario), with `switches`."""

    switches: DriverSwitches | None = None
    turn: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def write_scenario(self, text: str) -> None:
        nvml_driver.write_state(self.scenario, textwrap.dedent(text), self.switches)


def start_on_driver(
    scenario_text: str,
    headroom_mib: int | None = None,
    extra_args: list[str] | None = None,
    switches: DriverSwitches | None = None,
) -> DriverBroker:
    """Build the driver, write its state from `scenario_text`, start the broker on it (in a
    directory of its own, `-v`) and wait until it answers.

    Raises:
        RuntimeError: it exited or did not answer within 30 s (with its log).
    """
    folder = nvml_driver.linux_library()
    turn = contextlib.ExitStack()
    turn.enter_context(one_at_a_time())
    root = short_tmp()
    state = nvml_driver.write_state(root / "driver.state", textwrap.dedent(scenario_text), switches)
    sock = broker_address(root)
    args = ["-v", *(["--headroom-mib", str(headroom_mib)] if headroom_mib is not None else [])]
    env = {k: v for k, v in os.environ.items() if k != ENV_LOCK}  # ignored on real NVML
    library_path = os.pathsep.join(filter(None, [str(folder), env.get("LD_LIBRARY_PATH")]))
    env.update({"LD_LIBRARY_PATH": library_path, nvml_driver.STATE_ENV: str(state)})
    cmd = [*own_network(), *broker_command(sock, root / "data", None), *args, *(extra_args or [])]
    log_path = root / "broker.log"
    with turn, open(log_path, "ab") as log:  # the turn ends here only when the start fails
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        broker = DriverBroker(
            proc, sock, root / "data", state, log_path, extra_args or [], True, switches
        )
        broker.wait_answering(30)
        broker.turn = turn.pop_all()
    return broker


def _stop(broker: DriverBroker) -> None:
    try:
        broker.stop()
    finally:
        broker.turn.close()
    print(broker.log()[-3000:])
    shutil.rmtree(broker.scenario.parent, ignore_errors=True)


@pytest.fixture
def driver_broker_factory() -> Iterator[Callable[..., DriverBroker]]:
    """`broker_factory` on the fake driver: `factory(scenario_toml, headroom_mib=None,
    extra_args=None)` → a broker without `--simulate`; each is stopped at teardown."""
    started: list[DriverBroker] = []

    def factory(scenario_text: str = sim.scenario(sim.gpu()), **kw: Any) -> DriverBroker:
        broker = start_on_driver(scenario_text, **kw)
        started.append(broker)
        return broker

    yield factory
    for broker in started:
        _stop(broker)


# -- the simulated broker's capacity tests, on the driver ------------------------------------


@pytest.mark.parametrize(
    ("api", "reserved", "used"),
    [("v2", 726, 8), ("v1", 0, 734)],
    ids=["nvml-v2-reserved-726", "nvml-v1-used-734"],
)
def test_a_grant_within_capacity_and_a_refusal_past_it(
    driver_broker_factory: Callable[..., DriverBroker], api: str, reserved: int, used: int
) -> None:
    """81 920 − 1 024 − 734 = 80 162 MiB available, from memory v2 (726 reserved, the struct
    pynvml asks `nvmlDeviceGetMemoryInfo_v2` for) or v1 (v2 missing): 80 162 granted, 80 163
    and 80 500 refused with the figures (`test_capacity_admission`)."""
    capacity_admission.test_v1_and_v2_memory_give_the_same_available(
        driver_broker_factory, api, reserved, used
    )


def test_a_waiter_is_admitted_when_outside_use_falls(
    driver_broker_factory: Callable[..., DriverBroker],
    raw_connect: Callable[[str], RawConnection],
) -> None:
    """The driver's reserved memory falls from 726 to 0 MiB: a waiting 80 500 MiB request
    is admitted against 80 888 (`test_capacity_admission`)."""
    capacity_admission.test_waiting_request_is_admitted_when_room_appears(
        driver_broker_factory, raw_connect
    )


def test_memory_not_reported_per_process_counts_in_the_device_figure(
    driver_broker_factory: Callable[..., DriverBroker],
    raw_connect: Callable[[str], RawConnection],
) -> None:
    """Processes whose memory the driver reports as NVML_VALUE_NOT_AVAILABLE (WDDM): their
    20 480 MiB count through the device's used memory; a request past the 3 072 left waits
    with the arithmetic (`test_capacity_admission`)."""
    capacity_admission.test_unknown_process_memory_counts_inside_device_used(
        driver_broker_factory, raw_connect
    )


def test_a_vanished_gpu_fails_closed_and_the_other_serves(
    driver_broker_factory: Callable[..., DriverBroker],
) -> None:
    """GPU0 leaves the driver (its handle answers GPU_IS_LOST): lost, pinned requests
    refused, leases kept, GPU1 serves on; back under the same UUID, usable again
    (`test_gpu_faults`)."""
    gpu_faults.test_gpu_disappearing_shifts_indices_harmlessly(driver_broker_factory)


# -- one broker: outside use, a lost GPU, the status line ------------------------------------

TWO_GPUS = sim.scenario(
    sim.gpu(GPU0, name="Fake RTX 4090", used_mib=1000),
    sim.gpu(GPU1, name="Fake RTX 4090"),
)


def _gpu(c: rbroker.Client, uuid: str) -> dict[str, Any]:
    (gpu,) = [g for g in c.gpus() if g["uuid"] == uuid]
    return dict(gpu)


def _until(c: rbroker.Client, uuid: str, timeout_s: float = 15.0, **expected: Any) -> None:
    """Wait until the broker shows `expected` for GPU `uuid` (a sample a second)."""

    def seen() -> bool:
        gpu = _gpu(c, uuid)
        return all(gpu.get(k) == v for k, v in expected.items())

    try:
        wait_until(seen, timeout_s=timeout_s, interval_s=0.1)
    except AssertionError:
        raise AssertionError(f"expected {expected}, last seen {_gpu(c, uuid)}") from None


@pytest.fixture(scope="class")
def shared(request: pytest.FixtureRequest) -> Iterator[DriverBroker]:
    """One broker for the tests of a class (stopped after its last: no other broker on the
    driver runs beside it where there is no network namespace of its own)."""
    broker = start_on_driver(TWO_GPUS, headroom_mib=HEADROOM)
    yield broker
    _stop(broker)


class TestOneBroker:
    """Tests that share one broker on two 24 576 MiB GPUs (GPU0 with 1 000 MiB in use),
    headroom 1 024 MiB; each leaves the driver's state and the broker as it found them."""

    @pytest.fixture
    def broker(self, shared: DriverBroker) -> Iterator[DriverBroker]:
        with shared.client() as c:
            _until(c, GPU0, available_mib=24576 - HEADROOM - 1000, telemetry="ok")
            _until(c, GPU1, available_mib=24576 - HEADROOM, telemetry="ok")
        yield shared
        shared.write_scenario(TWO_GPUS)
        with shared.client() as c:
            for lease in c.leases()["leases"]:
                c.call("lease.release", lease_id=lease["lease_id"])

    def test_the_broker_reads_the_driver_through_pynvml(self, broker: DriverBroker) -> None:
        with broker.client() as c:
            hello = c.hello()
            assert (hello["simulated"], hello["telemetry_source"]) == (False, "nvml")
            assert c.status()["driver_version"] == "550.54.14"
            assert [(g["uuid"], g["name"], g["total_mib"]) for g in c.gpus()] == [
                (GPU0, "Fake RTX 4090", 24576),
                (GPU1, "Fake RTX 4090", 24576),
            ]

    def test_rbroker_status_says_nvml_and_the_driver(
        self, broker: DriverBroker, capsys: pytest.CaptureFixture[str], monkeypatch: Any
    ) -> None:
        monkeypatch.setenv("COLUMNS", "1000")  # one header line, as rich folds nothing
        assert main(["status", "--socket", broker.socket]) == 0
        out = capsys.readouterr().out
        assert "telemetry: NVML (driver 550.54.14)" in out, out
        assert "SIMULATED" not in out and "no real GPU is read" not in out, out

    def test_outside_use_rising_shrinks_capacity(self, broker: DriverBroker) -> None:
        """Another program takes 12 000 MiB of GPU0 (the driver's used memory rises to
        13 000): available falls from 22 552 to 24 576 − 1 024 − 13 000 = 10 552 MiB, and a
        12 000 MiB request that fit before is refused with those figures."""
        with broker.client() as c:
            fits = c.call("lease.acquire", mib=12000, gpu_uuid=GPU0, **PARAMS)["lease"]
            assert fits["admission"][GPU0]["available_mib"] == 22552
            c.call("lease.release", lease_id=fits["lease_id"])
            broker.write_scenario(TWO_GPUS.replace("used_mib = 1000", "used_mib = 13000"))
            _until(c, GPU0, device_used_mib=13000, available_mib=10552)
            with pytest.raises(rbroker.CapacityUnavailable) as refused:
                c.call("lease.acquire", mib=12000, gpu_uuid=GPU0, **PARAMS)
            data = refused.value.data
            assert (data["available_mib"], data["device_used_mib"]) == (10552, 13000)
            assert (data["total_mib"], data["headroom_mib"]) == (24576, HEADROOM)
            assert "10 552" in refused.value.message, refused.value.message
            assert c.leases()["leases"] == []

    def test_a_lost_gpu_grants_nothing(self, broker: DriverBroker) -> None:
        """GPU0's queries answer NVML_ERROR_GPU_IS_LOST: lost with its last figures, never
        shown as free; a request pinned to it is refused with reason gpu_lost and nothing is
        granted there; a request for any GPU goes to GPU1; when it answers again, it serves."""
        with broker.client() as c:
            broker.write_scenario(
                TWO_GPUS.replace("used_mib = 1000", 'used_mib = 1000\nerror = "gpu_lost"')
            )
            _until(c, GPU0, telemetry="lost")
            with pytest.raises(rbroker.TelemetryUnavailable) as refused:
                c.call("lease.acquire", mib=1024, gpu_uuid=GPU0, wait_s=2, **PARAMS)
            assert refused.value.data["reason"] == "gpu_lost"
            assert refused.value.data["gpu_uuid"] == GPU0
            anywhere = c.call("lease.acquire", mib=1024, **PARAMS)["lease"]
            assert anywhere["gpu_uuid"] == GPU1
            assert [x["gpu_uuid"] for x in c.leases()["leases"]] == [GPU1]
            assert c.status()["gpus"] == {GPU0: "lost", GPU1: "ok"}
            broker.write_scenario(TWO_GPUS)
            _until(c, GPU0, telemetry="ok")
            back = c.call("lease.acquire", mib=1024, gpu_uuid=GPU0, wait_s=5, **PARAMS)["lease"]
            assert back["gpu_uuid"] == GPU0


# -- idle, measured through the driver -------------------------------------------------------


def test_a_lease_idle_and_busy_again_through_the_driver(
    driver_broker_factory: Callable[..., DriverBroker], tmp_path: Path
) -> None:
    """The holder (this process) is listed on GPU0 without SM utilization: past
    `[idle] idle_after_s = 1` its lease is idle; once the driver's
    `nvmlDeviceGetProcessUtilization` shows it at 50 %, active again. From another pid
    namespace than the initial one the driver's pids are not this machine's: unknown."""
    config = tmp_path / "broker.toml"
    config.write_text("[idle]\nidle_after_s = 1\n")

    def listed(sm_util: int) -> str:
        return sim.scenario(
            sim.gpu(GPU0, processes=[(os.getpid(), 1000)], utilization={os.getpid(): sm_util})
        )

    broker = driver_broker_factory(listed(0), extra_args=["--config", str(config)])
    expected = "unknown" if in_child_pid_namespace() else "idle"
    with broker.client() as c:
        lease_id = c.call("lease.acquire", mib=2000, **PARAMS)["lease"]["lease_id"]

        def state() -> str | None:
            (lease,) = [x for x in c.leases()["leases"] if x["lease_id"] == lease_id]
            return lease.get("idle_state")

        wait_until(lambda: state() == expected, timeout_s=15, interval_s=0.1)
        if expected == "unknown":
            return
        broker.write_scenario(listed(50))
        wait_until(lambda: state() == "active", timeout_s=15, interval_s=0.1)


# -- nvmlInit failing -------------------------------------------------------------------------


def test_a_driver_that_does_not_initialise_fails_closed_with_the_reason(
    driver_broker_factory: Callable[..., DriverBroker],
) -> None:
    """`nvmlInit` answers NVML_ERROR_LIB_RM_VERSION_MISMATCH (18; after a driver upgrade,
    until the computer restarts): no GPU, nothing granted, the reason by name and in words;
    once the driver answers, the broker finds the GPU and grants. Whether the refusal is
    "telemetry unavailable" or "infeasible: no NVIDIA GPU" depends on the OS showing a GPU
    (`rbroker.gpu.presence`), which no fake driver changes."""
    broker = driver_broker_factory(
        sim.scenario(sim.gpu(GPU0, name="Fake RTX 4090"), nvml={"init_error": "version_mismatch"}),
        headroom_mib=HEADROOM,
    )
    present = nvidia_device_present()
    with broker.client() as c:
        assert c.gpus() == []
        problem = c.status()["nvml_problem"]
        assert (problem["reason"], problem["device_present"]) == ("version_mismatch", present)
        expected = rbroker.TelemetryUnavailable if present else rbroker.Infeasible
        with pytest.raises(expected) as refused:
            c.call("lease.acquire", mib=1024, **PARAMS)
        assert refused.value.data["reason"] == "version_mismatch"
        assert "different versions (NVML error 18" in refused.value.message
        assert c.leases()["leases"] == []

        broker.write_scenario(sim.scenario(sim.gpu(GPU0, name="Fake RTX 4090")))
        wait_until(lambda: c.gpus(), timeout_s=30, interval_s=0.1)  # retried with backoff
        lease = c.call("lease.acquire", mib=1024, wait_s=10, **PARAMS)["lease"]
        assert lease["gpu_uuid"] == GPU0
        status = c.status()
        assert (status["nvml_problem"], status["driver_version"]) == (None, "550.54.14")


# -- the real-GPU check, on the fake driver ----------------------------------------------------

REAL_GPU_TESTS = {
    f"tests.desktop.gpu.test_nvml_gateway.TestRealNvml::{name}"
    for name in (
        "test_enumerate_keys_gpus_by_uuid",
        "test_sample_is_consistent",
        "test_missing_gpu_is_a_telemetry_error",
        "test_async_sampler_reads_off_the_loop",
        "test_driver_version_is_text",
    )
} | {"tests.desktop.gpu.test_real_gpu::test_broker_on_real_nvml_reports_every_gpu"}
"""The `gpu`-marked tests that need no CUDA framework: each must pass on the fake driver."""

FRAMEWORK_SKIPS = {"PyTorch not installed", "JAX not installed"}


def test_the_real_gpu_check_passes_on_the_fake_driver(tmp_path: Path) -> None:
    """`bench/gpu_check.sh --fake-driver` exits 0; every `gpu`-marked test ran and passed
    but the PyTorch and JAX ones, skipped because neither is installed (read from the run's
    JUnit XML, not its text)."""
    nvml_driver.linux_library()  # skips, or fails under CI, where there is no cc
    report = tmp_path / "gpu.xml"
    with one_at_a_time():  # its broker takes the computer's lock unless it runs as root
        done = subprocess.run(
            ["bash", str(REPO / "bench" / "gpu_check.sh"), "--fake-driver", "-n0",
             f"--junitxml={report}"],
            capture_output=True, text=True, timeout=240, check=False,
            env={**os.environ, "PYTHON": sys.executable},
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "fake NVIDIA driver: " in done.stdout
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        skipped = case.find("skipped")
        failed = case.find("failure") is not None or case.find("error") is not None
        if failed:
            outcomes[name] = "failed"
        elif skipped is not None:
            outcomes[name] = f"skipped: {skipped.get('message', '')}"
        else:
            outcomes[name] = "passed"
    passed = {name for name, outcome in outcomes.items() if outcome == "passed"}
    others = {name: outcome for name, outcome in outcomes.items() if outcome != "passed"}
    assert passed >= REAL_GPU_TESTS, outcomes
    assert set(others.values()) <= {f"skipped: {why}" for why in FRAMEWORK_SKIPS}, others
