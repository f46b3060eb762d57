"""What real drivers do to the broker (issue 3, cases 1–3, and GPU inputs of architecture.md §2,
§6).

Each test runs a real broker process on a simulated GPU scenario; faults are injected by
rewriting the scenario file or with `sim.set`, which feed the production NVML gateway:
- a lost GPU among two (case 1), a driver/library version mismatch (case 2), a memory
  query hung for 60 s (case 3, slow: run in parallel with the other long cases by
  `test_clocks_and_stalls.test_long_cases_run_together`);
- per-process values that are garbage, memory v1, a memory query that is not supported
  (with and without a capacity override), a GPU that disappears so indices shift.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

import rbroker
from rbroker.gpu import nvml as nvml_module
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway, TelemetryError
from tests.conftest import GPU0, GPU1, SINGLE_24G, BrokerProcess, wait_until
from tests.desktop.conftest import RawConnection
from tests.fakes import gpu_scenarios as sim

PARAMS = {"project": "tests", "session": "faults", "purpose": "driver faults"}

TWO_GPUS = sim.scenario(
    sim.gpu(GPU0, name="Simulated RTX 4090"), sim.gpu(GPU1, name="Simulated RTX 4090")
)


def _gpu(c: rbroker.Client, uuid: str = GPU0) -> dict[str, Any]:
    for gpu in c.gpus():
        if gpu["uuid"] == uuid:
            return dict(gpu)
    raise AssertionError(f"{uuid} not listed")


def _telemetry(c: rbroker.Client, uuid: str, state: str, timeout_s: float = 10.0) -> None:
    try:
        wait_until(lambda: _gpu(c, uuid)["telemetry"] == state, timeout_s=timeout_s)
    except AssertionError:
        raise AssertionError(f"{uuid} not {state}: {_gpu(c, uuid)}") from None


def _queued(c: rbroker.Client, session: str) -> dict[str, Any] | None:
    for entry in c.leases()["queue"]:
        if entry["session"] == session:
            return dict(entry)
    return None


# -- case 1 ----------------------------------------------------------------------------------
def test_case1_lost_gpu_among_two(broker_factory: Callable[..., BrokerProcess]) -> None:
    """GPU0 raises GPU-lost on every call while it holds a lease: unpinned requests go to
    GPU1, a request pinned to GPU0 is refused with reason gpu_lost, the lease on GPU0 is
    kept and flagged, the broker stays up; all returns to normal when the fault clears."""
    broker = broker_factory(TWO_GPUS)
    with broker.client() as c:
        held = c.call("lease.acquire", mib=4096, gpu_uuid=GPU0, ttl_s=5, **PARAMS)["lease"]
        c.sim_set(GPU0, error="gpu_lost")
        _telemetry(c, GPU0, "lost")
        assert _gpu(c, GPU1)["telemetry"] == "ok"

        # Any-GPU requests go to the healthy GPU, even when GPU0 would be the pack choice.
        granted = [c.call("lease.acquire", mib=1024, wait_s=5, **PARAMS)["lease"] for _ in range(3)]
        assert [g["gpu_uuid"] for g in granted] == [GPU1] * 3

        with pytest.raises(rbroker.TelemetryUnavailable) as refused:
            c.call("lease.acquire", mib=1024, gpu_uuid=GPU0, wait_s=10, **PARAMS)
        assert refused.value.data["reason"] == "gpu_lost"
        assert refused.value.data["gpu_uuid"] == GPU0

        # Two GPUs at once cannot be had while one is lost: nothing is booked on GPU1.
        before = _gpu(c, GPU1)["outstanding_mib"]
        with pytest.raises(rbroker.RBrokerError) as both:
            c.call("lease.acquire", mib=1024, gpus=2, **PARAMS)
        assert both.value.code in ("telemetry_unavailable", "capacity_unavailable")
        assert _gpu(c, GPU1)["outstanding_mib"] == before

        # The lease on the lost GPU is kept (renewals work) and flagged.
        time.sleep(1.0)
        renewed = c.call("lease.renew", lease_id=held["lease_id"])["lease"]
        assert renewed["state"] == "active"
        (on_lost,) = [x for x in c.leases()["leases"] if x["lease_id"] == held["lease_id"]]
        assert "gpu_lost" in on_lost["flags"]
        assert on_lost["gpu_telemetry"] == {GPU0: "lost"}
        gpu0 = _gpu(c, GPU0)
        assert gpu0["total_mib"] == 24576  # last-known figures, never shown as free
        assert gpu0["outstanding_mib"] == 4096
        assert c.status()["gpus"] == {GPU0: "lost", GPU1: "ok"}

        c.sim_set(GPU0, error="")
        _telemetry(c, GPU0, "ok")
        again = c.call("lease.acquire", mib=1024, gpu_uuid=GPU0, wait_s=5, **PARAMS)["lease"]
        assert again["gpu_uuid"] == GPU0
        (on_lost,) = [x for x in c.leases()["leases"] if x["lease_id"] == held["lease_id"]]
        assert on_lost["flags"] == []
        assert c.call("lease.renew", lease_id=held["lease_id"])["lease"]["state"] == "active"
    assert broker.proc.poll() is None
    assert "Traceback" not in broker.log()


# -- case 2 ----------------------------------------------------------------------------------
def test_case2_version_mismatch_then_recovery(
    broker_factory: Callable[..., BrokerProcess], raw_connect: Callable[[str], RawConnection]
) -> None:
    """From some moment every NVML call raises a driver/library version mismatch: existing
    leases keep renewing, a new 1 024 MiB request waits with reason "telemetry unavailable",
    and it is admitted after NVML recovers."""
    broker = broker_factory(SINGLE_24G)
    with (
        broker.client() as c,
        rbroker.lease(2048, ttl_s=2, socket=broker.socket, **PARAMS) as held,  # type: ignore[arg-type]
    ):
        broker.write_scenario(
            sim.scenario(sim.gpu(name="Simulated RTX 4090", error="version_mismatch"))
        )
        _telemetry(c, GPU0, "unavailable")
        assert _gpu(c)["telemetry_reason"] == "version_mismatch"

        waiter = raw_connect(broker.socket)
        request_id = waiter.send_request(
            "lease.acquire", {"mib": 1024, "wait_s": 60, **PARAMS, "session": "mismatch"}
        )
        entry = wait_until(lambda: _queued(c, "mismatch"))
        assert isinstance(entry, dict)
        assert entry["reason_kind"] == "telemetry"
        assert "telemetry unavailable" in entry["reason"]
        assert "version_mismatch" in entry["reason"]

        # Several TTLs of the held lease pass: its SDK heartbeats keep it alive.
        time.sleep(5.0)
        assert not held.lost
        assert [x["lease_id"] for x in c.leases()["leases"]] == [held.lease_id]
        assert _queued(c, "mismatch") is not None

        broker.write_scenario(SINGLE_24G)
        answer = waiter.read_answer(request_id)
        assert answer["result"]["lease"]["granted_mib"] == 1024
        assert _gpu(c)["telemetry"] == "ok"
        assert not held.lost
    assert broker.proc.poll() is None


# -- case 3 (run by test_clocks_and_stalls.test_long_cases_run_together) -----------------------
CASE3_SCALE = 0.5
"""Issue 3's case 3 hangs NVML for 60 s and releases a lease every 2 s; the test runs it at
half that time scale (30 s, every 1 s): the hang is still 6 TTLs of the renewed leases
(5 s) and 20 NVML deadlines (1.5 s); the 25 releases still all fall inside it, and the
heartbeats asked for scale with it."""


def case3_hung_memory_query_for_60_s(
    broker_factory: Callable[..., BrokerProcess], raw_connect: Callable[[str], RawConnection]
) -> None:
    """NVML hangs for 60 s (× `CASE3_SCALE`): heartbeats and releases stay under 200 ms p99,
    no lease expires, and no request is admitted on a sample older than 2 s."""
    broker = broker_factory()
    hang_s = 60.0 * CASE3_SCALE
    with broker.client() as c:
        renewed_ids = [
            c.call("lease.acquire", mib=512, ttl_s=5, **PARAMS)["lease"]["lease_id"]
            for _ in range(5)
        ]
        released_ids = [
            c.call("lease.acquire", mib=512, ttl_s=120, **PARAMS)["lease"]["lease_id"]
            for _ in range(25)
        ]
        c.sim_set(GPU0, delay_s=3600.0)  # every NVML call on GPU0 hangs until told otherwise
        hung_at = time.monotonic()
        _telemetry(c, GPU0, "stale")

        waiter = raw_connect(broker.socket)
        request_id = waiter.send_request(
            "lease.acquire", {"mib": 1024, "wait_s": 120, **PARAMS, "session": "after-hang"}
        )
        beats: list[float] = []
        releases: list[float] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def heartbeat() -> None:
            with broker.client(timeout_s=10) as hb:
                while not stop.is_set():
                    for lease_id in renewed_ids:
                        started = time.monotonic()
                        try:
                            hb.call("lease.renew", lease_id=lease_id)
                        except BaseException as exc:
                            errors.append(exc)
                            return
                        beats.append(time.monotonic() - started)
                    stop.wait(0.1)

        def release() -> None:
            with broker.client(timeout_s=10) as rel:
                for lease_id in released_ids:
                    if stop.wait(2.0 * CASE3_SCALE):
                        return
                    started = time.monotonic()
                    try:
                        rel.call("lease.release", lease_id=lease_id)
                    except BaseException as exc:
                        errors.append(exc)
                        return
                    releases.append(time.monotonic() - started)

        threads = [threading.Thread(target=heartbeat), threading.Thread(target=release)]
        for t in threads:
            t.start()
        try:
            ages: list[float] = []
            while time.monotonic() - hung_at < hang_s:
                gpu = _gpu(c)
                assert gpu["telemetry"] == "stale", gpu
                ages.append(gpu["sample_age_s"])
                # never admitted on the old sample: refused at once when not willing to wait
                with pytest.raises(rbroker.TelemetryUnavailable):
                    c.call("lease.acquire", mib=512, **PARAMS)
                assert _queued(c, "after-hang") is not None
                time.sleep(1.0)
        finally:
            c.sim_set(GPU0, delay_s=0.0)  # the hung call returns
            stop.set()
            for t in threads:
                t.join(30)
        recovered_at = time.monotonic()
        assert not errors, errors
        assert max(ages) > hang_s - 5 * CASE3_SCALE  # the last good sample kept ageing

        answer = waiter.read_answer(request_id)
        granted_after = time.monotonic()
        assert answer["result"]["lease"]["granted_mib"] == 1024
        assert granted_after >= recovered_at
        assert _gpu(c)["sample_age_s"] < 2.0

        p99 = statistics.quantiles(beats, n=100)[98]
        print(
            f"\nduring a {hang_s:.0f} s NVML hang: {len(beats)} heartbeats, p50 "
            f"{statistics.median(beats) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max "
            f"{max(beats) * 1000:.1f} ms; {len(releases)} releases, max "
            f"{max(releases) * 1000:.1f} ms"
        )
        assert len(beats) > 500 * CASE3_SCALE
        assert p99 < 0.2, p99
        assert len(releases) >= 25  # every one, during the hang
        assert sorted(releases)[int(len(releases) * 0.99) - 1] < 0.2, releases

        view = c.leases(include_ended=True)
        assert {x["lease_id"] for x in view["leases"]} >= set(renewed_ids)
        assert {x["state"] for x in view["ended"]} == {"released"}
    assert broker.proc.poll() is None


# -- values real drivers report ----------------------------------------------------------------
def _observed(c: rbroker.Client, lease_id: str, expected: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        for lease in c.leases()["leases"]:
            if lease["lease_id"] == lease_id and lease["observed_mib"].get(GPU0) == expected:
                return dict(lease)
        return None

    try:
        found = wait_until(check, timeout_s=5)
    except AssertionError:
        raise AssertionError(f"observed {expected} never seen: {c.leases()}") from None
    assert isinstance(found, dict)
    return found


@pytest.mark.parametrize(
    ("record", "observed"),
    [
        ("sane", 2048),
        ("graphics", 2048),
        ("none", 0),
        ("larger-than-gpu", 0),
        ("wddm", 0),
    ],
)
def test_per_process_values_real_drivers_report(
    broker_factory: Callable[..., BrokerProcess], record: str, observed: int
) -> None:
    """The holder's own record counts as the lease's use only when it is believable; None,
    larger than the GPU or WDDM's missing values are unknown (0: the lease stays fully
    outstanding). Garbage records (pid 0, pids ≥ 2^32−1) never break a sample. Graphics
    processes count like compute ones."""
    broker = broker_factory(sim.scenario(sim.gpu(device_used_mib=9000)), headroom_mib=1024)
    with broker.client() as c:
        lease = c.call("lease.acquire", mib=4096, **PARAMS)["lease"]
        pid = os.getpid()
        kind = "graphics" if record == "graphics" else "compute"
        used = {"sane": 2048, "graphics": 2048, "none": None, "wddm": 2048}.get(record, 999_999)
        extra = {"per_process_memory": False} if record == "wddm" else {}
        garbage = [(0, 1000, "compute"), (2**32 - 1, 1000, "compute"), (2**32 + 5, 1000, "compute")]
        processes = [(pid, used, kind), *garbage]
        broker.write_scenario(
            sim.scenario(sim.gpu(device_used_mib=9000, processes=processes, **extra))
        )
        seen = _observed(c, lease["lease_id"], observed)
        assert seen["over_grant"] is False
        gpu = _gpu(c)
        assert gpu["telemetry"] == "ok"
        assert gpu["device_used_mib"] == 9000
        assert gpu["outstanding_mib"] == 4096 - observed
        assert gpu["available_mib"] == 24576 - 1024 - 9000 - (4096 - observed)


def test_memory_v1_gives_the_same_capacity(broker_factory: Callable[..., BrokerProcess]) -> None:
    """An old driver without memory v2: the broker falls back to v1, same arithmetic."""
    v2 = broker_factory(sim.scenario(sim.gpu(reserved_mib=300, used_mib=700)), headroom_mib=1024)
    v1 = broker_factory(sim.scenario(sim.gpu(used_mib=1000, memory_api="v1")), headroom_mib=1024)
    with v2.client() as a, v1.client() as b:
        ga, gb = _gpu(a), _gpu(b)
    assert (ga["memory_api"], gb["memory_api"]) == ("v2", "v1")
    keys = ("total_mib", "headroom_mib", "device_used_mib", "available_mib")
    assert [ga[k] for k in keys] == [gb[k] for k in keys] == [24576, 1024, 1000, 22552]


def test_capacity_unknown_without_override(broker_factory: Callable[..., BrokerProcess]) -> None:
    """A GPU whose memory query is not supported: requests refused with that reason."""
    broker = broker_factory(sim.scenario(sim.gpu(memory_api="not_supported")))
    with broker.client() as c:
        assert _gpu(c)["telemetry"] == "unknown_capacity"
        for pinned in ({}, {"gpu_uuid": GPU0}):
            with pytest.raises(rbroker.TelemetryUnavailable) as refused:
                c.call("lease.acquire", mib=1024, wait_s=5, **pinned, **PARAMS)
            assert refused.value.data["reason"] == "capacity_unknown"
            assert "capacity override" in refused.value.message


def test_capacity_override_for_an_unsupported_memory_query(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """`--capacity-mib UUID=MIB` makes such a GPU leasable; its use is the per-process sum."""
    text = sim.scenario(sim.gpu(memory_api="not_supported", processes=[(4000, 3000)]))
    broker = broker_factory(text, headroom_mib=1024, extra_args=["--capacity-mib", f"{GPU0}=16384"])
    with broker.client() as c:
        gpu = _gpu(c)
        assert gpu["telemetry"] == "ok"
        assert (gpu["total_mib"], gpu["device_used_mib"], gpu["available_mib"]) == (
            16384,
            3000,
            16384 - 1024 - 3000,
        )
        lease = c.call("lease.acquire", mib=12000, gpu_uuid=GPU0, **PARAMS)["lease"]
        assert lease["gpu_uuid"] == GPU0
        with pytest.raises(rbroker.CapacityUnavailable):
            c.call("lease.acquire", mib=1024, **PARAMS)


def test_gpu_disappearing_shifts_indices_harmlessly(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """GPUs are keyed by UUID: when GPU0 disappears, GPU1 becomes index 0 for NVML, its
    lease and capacity stay right, and GPU0 is reported lost (with its lease kept)."""
    broker = broker_factory(TWO_GPUS, headroom_mib=1024, extra_args=[])
    with broker.client() as c:
        on0 = c.call("lease.acquire", mib=2048, gpu_uuid=GPU0, **PARAMS)["lease"]
        on1 = c.call("lease.acquire", mib=4096, gpu_uuid=GPU1, **PARAMS)["lease"]
        only_gpu1 = sim.scenario(sim.gpu(GPU1, name="Simulated RTX 4090"))
        broker.write_scenario(only_gpu1)
        _telemetry(c, GPU0, "lost")
        gpu1 = _gpu(c, GPU1)
        assert gpu1["telemetry"] == "ok"
        assert gpu1["available_mib"] == 24576 - 1024 - 4096
        assert {x["lease_id"] for x in c.leases()["leases"]} == {
            on0["lease_id"],
            on1["lease_id"],
        }
        more = c.call("lease.acquire", mib=8192, wait_s=5, **PARAMS)["lease"]
        assert more["gpu_uuid"] == GPU1
        with pytest.raises(rbroker.TelemetryUnavailable):
            c.call("lease.acquire", mib=1024, gpu_uuid=GPU0, **PARAMS)
        broker.write_scenario(TWO_GPUS)  # it comes back (same UUID): usable again
        _telemetry(c, GPU0, "ok")
        back = c.call("lease.acquire", mib=1024, gpu_uuid=GPU0, wait_s=5, **PARAMS)["lease"]
        assert back["gpu_uuid"] == GPU0


# -- every NVML error a real driver raises becomes a telemetry state ---------------------------
class _Failing(FakeNvml):
    """The simulated library, with one NVML function raising a given error code."""

    def __init__(self, scenario: Path, function: str, code: int) -> None:
        super().__init__(scenario)
        self.failing, self.code = function, code

    def __getattribute__(self, name: str) -> Any:
        if name != "failing" and name == object.__getattribute__(self, "failing"):

            def fail(*args: object, **kwargs: object) -> object:
                raise pynvml.NVMLError(object.__getattribute__(self, "code"))

            return fail
        return object.__getattribute__(self, name)


@pytest.mark.parametrize(
    ("function", "code", "state", "reason"),
    [
        ("nvmlInit", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "unavailable", "library_not_found"),
        ("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "unavailable", "driver_not_loaded"),
        ("nvmlInit", pynvml.NVML_ERROR_NO_PERMISSION, "unavailable", "no_permission"),
        (
            "nvmlDeviceGetComputeRunningProcesses",
            pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            "unavailable",
            "version_mismatch",
        ),
        ("nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_GPU_IS_LOST, "lost", "gpu_lost"),
        ("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, "unavailable", "unknown_error"),
        ("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_TIMEOUT, "unavailable", "timeout"),
        (
            "nvmlDeviceGetMemoryInfo",
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            "unavailable",
            "function_not_found",
        ),
        (
            "nvmlDeviceGetMemoryInfo",
            pynvml.NVML_ERROR_NOT_SUPPORTED,
            "unknown_capacity",
            "not_supported",
        ),
        ("nvmlDeviceGetHandleByUUID", pynvml.NVML_ERROR_NOT_FOUND, "lost", "not_found"),
    ],
)
def test_nvml_error_codes_become_states(
    tmp_path: Path, function: str, code: int, state: str, reason: str
) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(sim.scenario(sim.gpu()))
    gateway = NvmlGateway(_Failing(scenario, function, code), source="simulated")
    with pytest.raises(TelemetryError) as err:
        gateway.read(GPU0)
    assert not isinstance(err.value, pynvml.NVMLError)
    assert (err.value.state.value, err.value.reason) == (state, reason)


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND]
)
def test_graphics_list_missing_is_not_an_error(tmp_path: Path, code: int) -> None:
    """Some GPUs or drivers cannot list graphics processes: the compute list still counts."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(sim.scenario(sim.gpu(processes=[(4000, 2048)])))
    lib = _Failing(scenario, "nvmlDeviceGetGraphicsRunningProcesses", code)
    sample = NvmlGateway(lib, source="simulated").read(GPU0)
    assert [(p.pid, p.used_mib) for p in sample.processes] == [(4000, 2048)]


@pytest.mark.parametrize(
    ("source", "nested", "expected"),
    [
        ("nvml", False, 2048),
        ("nvml", True, None),
        ("simulated", False, 2048),
        ("simulated", True, None),
    ],
    ids=["host-pids", "container-pid-namespace", "simulation", "simulation-in-a-container"],
)
def test_per_process_figures_from_another_pid_namespace_are_unknown(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    nested: bool,
    expected: int | None,
) -> None:
    """NVML read from a container's own pid namespace lists the host's pids: they name
    other processes here (or none), so every per-process figure is unknown; device_used
    still counts the memory. The simulated library plays the host's driver: same rule."""
    monkeypatch.setattr(nvml_module, "in_child_pid_namespace", lambda: nested)
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(sim.scenario(sim.gpu(processes=[(4000, 2048)])))
    sample = NvmlGateway(FakeNvml(scenario), source=source).read(GPU0)
    assert [(p.pid, p.used_mib) for p in sample.processes] == [(4000, expected)]
    assert sample.device_used_mib == 2048


def test_pid_namespace_probe_compares_with_the_initial_namespace(tmp_path: Path) -> None:
    """Not `NSpid` (a container that mounted its own /proc shows one entry there): the
    inode of /proc/self/ns/pid against the kernel's initial pid namespace; doubt counts as
    another namespace."""
    if not sys.platform.startswith("linux"):
        assert nvml_module.in_child_pid_namespace() is False
        return
    own = os.stat("/proc/self/ns/pid").st_ino
    assert nvml_module.in_child_pid_namespace() is (own != 0xEFFFFFFC)
    assert nvml_module.in_child_pid_namespace(str(tmp_path / "missing")) is True
    other = tmp_path / "ns"
    other.write_text("")
    assert nvml_module.in_child_pid_namespace(str(other)) is True
