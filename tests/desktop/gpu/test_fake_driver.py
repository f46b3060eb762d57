"""The NVML gateway on the fake driver library, through the real pynvml (issue 39).

`tests/fakes/nvml_driver` is a C library with NVML's entry points, structs and return codes;
here it is loaded by path into a private copy of pynvml (Linux: `libnvidia-ml.so.1`, Windows:
`nvml.dll`) and the production gateway reads it as it would a real driver. `GatewayContract`
runs on it, the Python fake's scenarios give the same samples through it, and each driver
behaviour the Python fake cannot have (a missing function, another struct size, MIG, a
version the library refuses) is a test.
"""

from __future__ import annotations

import asyncio
import ctypes
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import AsyncSampler, NvmlGateway, TelemetryError
from rbroker.gpu.scenario import parse_scenario
from rbroker.gpu.types import GpuSample, TelemetryState
from tests.conftest import GPU0, GPU1
from tests.desktop.gpu.test_nvml_gateway import TWO_GPUS, GatewayContract, _gpu
from tests.fakes import nvml_driver
from tests.fakes.nvml_driver import DriverSwitches, MigGpu

PROCESSES = _gpu(total_mib=24576, used_mib=1000) + textwrap.dedent(
    """
    [[gpu.process]]
    pid = 4000
    used_mib = 2048
    [[gpu.process]]
    pid = 4001
    used_mib = 1024
    [[gpu.process]]
    pid = 4002
    used_mib = 4096
    """
)

BUSY = PROCESSES.replace("used_mib = 2048\n", "used_mib = 2048\nsm_util = 37\n").replace(
    "used_mib = 4096\n", "used_mib = 4096\nsm_util = 100\n"
)
"""`PROCESSES` with pid 4000 at 37 % SM utilization and pid 4002 at 100 %, pid 4001 idle."""


class Driver:
    """The fake driver loaded in this process, its state file and a gateway over it."""

    def __init__(self, state: Path, lib: ModuleType) -> None:
        self.state = state
        self.lib = lib
        self.gateways: list[NvmlGateway] = []

    def write(self, scenario: str, switches: DriverSwitches | None = None) -> None:
        nvml_driver.write_state(self.state, textwrap.dedent(scenario), switches)

    def gateway(
        self, scenario: str | None = None, switches: DriverSwitches | None = None
    ) -> NvmlGateway:
        if scenario is not None:
            self.write(scenario, switches)
        gw = NvmlGateway(self.lib, source="nvml")
        self.gateways.append(gw)
        return gw


@pytest.fixture(params=[False, True], ids=["current", "old"])
def any_driver(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Driver]:
    yield from _driver(tmp_path, monkeypatch, old=request.param)


@pytest.fixture
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    yield from _driver(tmp_path, monkeypatch, old=False)


@pytest.fixture
def old_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Driver]:
    yield from _driver(tmp_path, monkeypatch, old=True)


def _driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: bool) -> Iterator[Driver]:
    state = tmp_path / "driver.state"
    monkeypatch.setenv(nvml_driver.STATE_ENV, str(state))
    d = Driver(state, nvml_driver.load(nvml_driver.library_file(old)))
    yield d
    for gw in d.gateways:
        gw.shutdown()


class TestFakeDriver(GatewayContract):
    """The contract every NVML library behind the gateway satisfies, on the fake driver."""

    @pytest.fixture
    def gateway(self, any_driver: Driver) -> Iterator[NvmlGateway]:
        yield any_driver.gateway(TWO_GPUS)


def _same(a: GpuSample, b: GpuSample) -> None:
    keys = lambda s: (  # noqa: E731
        s.uuid, s.total_mib, s.device_used_mib, s.processes_known, s.utilization
    )  # fmt: skip
    assert keys(a) == keys(b)
    assert sorted(a.processes, key=lambda p: p.pid) == sorted(b.processes, key=lambda p: p.pid)


@pytest.mark.parametrize(
    "scenario",
    [
        TWO_GPUS,
        PROCESSES,
        _gpu(total_mib=81920, reserved_mib=726, used_mib=8),
        _gpu(total_mib=24576, device_used_mib=12000)
        + "[[gpu.process]]\npid = 4000\nused_mib = 2048\n",
        _gpu(total_mib=24576, per_process_memory=False)
        + "[[gpu.process]]\npid = 4000\nused_mib = 10240\n",
        _gpu(total_mib=24576, process_list_error="no_permission"),
        _gpu(total_mib=24576, memory_api="v1", used_mib=734),
        BUSY,
        BUSY.replace("used_mib = 1000\n", 'used_mib = 1000\nutilization_error = "not_supported"\n'),
    ],
    ids=[
        "two-gpus", "processes", "reserved", "device-used", "wddm", "no-permission", "v1",
        "utilization", "utilization-not-supported",
    ],
)  # fmt: skip
def test_a_scenario_reads_the_same_through_either_fake(
    driver: Driver, tmp_path: Path, scenario: str
) -> None:
    """Memory, processes and per-process utilization (`{pid: SM percent}`, `{}` when none
    ran, None when unknown) alike; the pids are this machine's on both (`foreign_pids`)."""
    path = tmp_path / "scenario.toml"
    path.write_text(textwrap.dedent(scenario))
    python = NvmlGateway(FakeNvml(path), source="simulated")
    real = driver.gateway(scenario)
    python.foreign_pids = real.foreign_pids = False
    assert [g.uuid for g in python.enumerate()] == [g.uuid for g in real.enumerate()]
    for info in real.enumerate():
        _same(python.read(info.uuid), real.read(info.uuid))
    assert real.driver_version() == "550.54.14"


def test_an_old_driver_is_read_through_the_v2_process_lists_and_memory_v1(
    old_driver: Driver,
) -> None:
    """A driver before R510 has neither `nvmlDeviceGetComputeRunningProcesses_v3` (pynvml's
    unversioned call then raises NVMLLibraryMismatchError, not an NVMLError) nor memory v2:
    the gateway falls back to `_v2` and v1 and keeps every process figure."""
    gw = old_driver.gateway(PROCESSES)
    gw.enumerate()
    for _ in range(2):
        sample = gw.read(GPU0)
        assert sample.memory_api == "v1"
        assert sample.processes_known
        assert {p.pid: p.used_mib for p in sample.processes} == {4000: 2048, 4001: 1024, 4002: 4096}
        assert sample.device_used_mib == 1000 + 2048 + 1024 + 4096
    assert gw._process_calls["compute"] == ["nvmlDeviceGetComputeRunningProcesses_v2"]


def test_per_process_utilization_through_pynvml(driver: Driver) -> None:
    """`nvmlDeviceGetProcessUtilization` as pynvml calls it: a first call without a buffer
    answers NVML_ERROR_INSUFFICIENT_SIZE and the count, the second fills
    `c_nvmlProcessUtilizationSample_t` records (timeStamp in microseconds since 1970); a
    `lastSeenTimeStamp` newer than every sample answers NVML_ERROR_NOT_FOUND."""
    driver.write(BUSY)
    lib = driver.lib
    lib.nvmlInit()
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(0)
        fn = lib._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
        count = ctypes.c_uint(0)
        ret = fn(handle, None, ctypes.byref(count), ctypes.c_ulonglong(0))
        assert (ret, count.value) == (lib.NVML_ERROR_INSUFFICIENT_SIZE, 2)
        one = (lib.c_nvmlProcessUtilizationSample_t * 1)()
        count = ctypes.c_uint(1)
        ret = fn(handle, one, ctypes.byref(count), ctypes.c_ulonglong(0))
        assert (ret, count.value) == (lib.NVML_ERROR_INSUFFICIENT_SIZE, 2)

        records = lib.nvmlDeviceGetProcessUtilization(handle, 0)
        assert {(r.pid, r.smUtil, r.memUtil) for r in records} == {(4000, 37, 0), (4002, 100, 0)}
        stamp = records[0].timeStamp
        assert abs(stamp / 1e6 - time.time()) < 60
        later = lib.nvmlDeviceGetProcessUtilization(handle, stamp)
        assert min(r.timeStamp for r in later) > stamp
        with pytest.raises(lib.NVMLError) as err:
            lib.nvmlDeviceGetProcessUtilization(handle, 2**64 - 1)
        assert err.value.value == lib.NVML_ERROR_NOT_FOUND
        driver.write(PROCESSES)  # nothing busy: no sample at all
        with pytest.raises(lib.NVMLError) as err:
            lib.nvmlDeviceGetProcessUtilization(handle, 0)
        assert err.value.value == lib.NVML_ERROR_NOT_FOUND
    finally:
        lib.nvmlShutdown()


def test_the_gateway_reads_utilization_since_its_previous_sample(driver: Driver) -> None:
    gw = driver.gateway(BUSY)
    gw.foreign_pids = False
    gw.enumerate()
    assert gw.read(GPU0).utilization == {4000: 37, 4002: 100}
    seen = gw._utilization_seen[GPU0]
    driver.write(BUSY.replace("sm_util = 100", "sm_util = 0"))
    assert gw.read(GPU0).utilization == {4000: 37}
    assert gw._utilization_seen[GPU0] > seen
    driver.write(PROCESSES)
    assert gw.read(GPU0).utilization == {}
    driver.write(
        BUSY.replace("used_mib = 1000\n", 'used_mib = 1000\nutilization_error = "no_permission"\n')
    )
    sample = gw.read(GPU0)
    assert sample.utilization is None
    assert {p.pid for p in sample.processes} == {4000, 4001, 4002}


def test_an_old_driver_without_process_utilization_reads_unknown(old_driver: Driver) -> None:
    """The library has no `nvmlDeviceGetProcessUtilization` (pynvml: FUNCTION_NOT_FOUND):
    utilization unknown, the sample otherwise whole."""
    gw = old_driver.gateway(BUSY)
    gw.foreign_pids = False
    gw.enumerate()
    sample = gw.read(GPU0)
    assert sample.utilization is None
    assert sample.processes_known
    assert {p.pid: p.used_mib for p in sample.processes} == {4000: 2048, 4001: 1024, 4002: 4096}


def test_the_unversioned_call_of_this_pynvml_fails_on_an_old_driver(old_driver: Driver) -> None:
    """What the gateway guards against: pynvml itself has no fallback."""
    old_driver.write(PROCESSES)
    lib = old_driver.lib
    lib.nvmlInit()
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(lib.NVMLLibraryMismatchError):
            lib.nvmlDeviceGetComputeRunningProcesses(handle)
        assert len(lib.nvmlDeviceGetComputeRunningProcesses_v2(handle)) == 3
        with pytest.raises(lib.NVMLError_FunctionNotFound):
            lib.nvmlDeviceGetMemoryInfo(handle, version=lib.nvmlMemory_v2)
    finally:
        lib.nvmlShutdown()


@pytest.mark.parametrize("size", ["v1", "wide"])
def test_process_records_of_another_size_are_unknown_never_garbage(
    driver: Driver, size: str
) -> None:
    """A library writing records of 16 (older) or 32 bytes (newer) where pynvml reads 24
    (nvitop#75): pynvml reads records across two, so the list is unknown; no made-up pid or
    figure reaches the sample, and the device's used memory still counts all of it."""
    gw = driver.gateway(PROCESSES, DriverSwitches(process_struct=size))
    gw.enumerate()
    sample = gw.read(GPU0)
    assert not sample.processes_known
    assert {p.pid for p in sample.processes} <= {4000, 4001, 4002}
    assert all(p.used_mib in (None, 2048, 1024, 4096) for p in sample.processes)
    assert sample.device_used_mib == 1000 + 2048 + 1024 + 4096


def test_the_real_record_size_is_read_whole(driver: Driver) -> None:
    gw = driver.gateway(PROCESSES, DriverSwitches(process_struct="v2"))
    gw.enumerate()
    sample = gw.read(GPU0)
    assert sample.processes_known
    assert {p.pid: p.used_mib for p in sample.processes} == {4000: 2048, 4001: 1024, 4002: 4096}


def test_a_library_refusing_the_memory_v2_version_falls_back_to_v1(driver: Driver) -> None:
    """NVML_ERROR_ARGUMENT_VERSION_MISMATCH from `nvmlDeviceGetMemoryInfo_v2` (a library that
    knows another `nvmlMemory_v2` version): v1, remembered."""
    gw = driver.gateway(
        _gpu(total_mib=24576, used_mib=700, reserved_mib=300),
        DriverSwitches(memory_v2_error={GPU0: "argument_version_mismatch"}),
    )
    gw.enumerate()
    assert [gw.read(GPU0).memory_api for _ in range(2)] == ["v1", "v1"]
    assert gw.read(GPU0).device_used_mib == 700 + 300  # v1: reserved is in used
    assert GPU0 in gw._v2_missing


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("version_mismatch", "version_mismatch"),
        ("library_not_found", "library_not_found"),
        ("driver_not_loaded", "driver_not_loaded"),
        ("unknown", "unknown_error"),
    ],
)
def test_nvml_init_failing_is_a_telemetry_error(driver: Driver, error: str, reason: str) -> None:
    gw = driver.gateway(f'[nvml]\ninit_error = "{error}"\n' + _gpu(total_mib=24576))
    with pytest.raises(TelemetryError) as err:
        gw.enumerate()
    assert (err.value.state, err.value.reason) == (TelemetryState.UNAVAILABLE, reason)
    assert gw.driver_version() == "unknown"


def test_no_driver_state_is_a_driver_not_loaded(driver: Driver) -> None:
    """The library without its kernel side (here: no state file) fails closed at init."""
    gw = driver.gateway()
    with pytest.raises(TelemetryError) as err:
        gw.enumerate()
    assert err.value.reason == "driver_not_loaded"


def test_an_error_listing_the_gpus_is_a_telemetry_error(driver: Driver) -> None:
    gw = driver.gateway(_gpu(total_mib=24576), DriverSwitches(count_error="unknown"))
    with pytest.raises(TelemetryError) as err:
        gw.enumerate()
    assert (err.value.state, err.value.reason) == (TelemetryState.UNAVAILABLE, "unknown_error")


SLICE_A = "MIG-a1000000-0000-0000-0000-00000000000a"
SLICE_B = "MIG-a1000000-0000-0000-0000-00000000000b"
A100 = "GPU-a1000000-0000-0000-0000-000000000001"


def _mig(positions: int = 3) -> DriverSwitches:
    slices = parse_scenario(
        f'[[gpu]]\nuuid = "{SLICE_A}"\nname = "slice"\ntotal_mib = 40192\n'
        f'[[gpu]]\nuuid = "{SLICE_B}"\nname = "slice"\ntotal_mib = 40192\nused_mib = 10000\n'
        'process_list_error = "not_supported"\n'
    )
    return DriverSwitches(mig=(MigGpu(A100, "Fake A100", positions, tuple(slices)),))


def test_mig_slices_are_enumerated_by_their_own_uuids(driver: Driver) -> None:
    """A GPU in MIG mode is read as its slices (an empty position is skipped), beside a whole
    GPU; a slice whose process list is not supported has its processes unknown."""
    gw = driver.gateway(_gpu(total_mib=24576), _mig())
    infos = gw.enumerate()
    assert [(i.uuid, i.index) for i in infos] == [(GPU0, 0), (SLICE_A, 1), (SLICE_B, 1)]
    assert "MIG slice 1" in infos[2].name
    a, b = gw.read(SLICE_A), gw.read(SLICE_B)
    assert (a.total_mib, a.device_used_mib, a.processes_known) == (40192, 0, True)
    assert (b.total_mib, b.device_used_mib, b.processes_known) == (40192, 10000, False)


def test_unified_memory_has_no_memory_query(driver: Driver) -> None:
    """NOT_SUPPORTED for the memory query (a GPU sharing the host's memory): unknown
    capacity, never a guess."""
    gw = driver.gateway(_gpu(total_mib=24576, memory_api="not_supported"))
    gw.enumerate()
    with pytest.raises(TelemetryError) as err:
        gw.read(GPU0)
    assert (err.value.state, err.value.reason) == (TelemetryState.UNKNOWN_CAPACITY, "not_supported")


def test_wddm_reports_no_per_process_memory(driver: Driver) -> None:
    """Windows' WDDM driver model: NVML_VALUE_NOT_AVAILABLE for each process's memory."""
    gw = driver.gateway(
        _gpu(total_mib=24576, per_process_memory=False)
        + "[[gpu.process]]\npid = 4000\nused_mib = 2048\n"
    )
    gw.enumerate()
    sample = gw.read(GPU0)
    assert [(p.pid, p.used_mib) for p in sample.processes] == [(4000, None)]
    assert sample.device_used_mib == 2048


@pytest.mark.parametrize("how", ["error", "gone"])
def test_a_gpu_lost_mid_run(driver: Driver, how: str) -> None:
    """The GPU falls off the bus between two reads (its queries answer GPU_IS_LOST, or it is
    no longer listed at all): LOST, and the other GPU reads on."""
    gw = driver.gateway(TWO_GPUS)
    gw.enumerate()
    assert gw.read(GPU0).total_mib == 24576
    lost = TWO_GPUS.replace(
        'name = "Simulated RTX 4090"\ntotal_mib = 24576\nused_mib = 1000',
        'name = "Simulated RTX 4090"\ntotal_mib = 24576\nerror = "gpu_lost"',
        1,
    )
    if how == "gone":
        lost = f'[[gpu]]\nuuid = "{GPU1}"\nname = "Simulated RTX 4090"\ntotal_mib = 24576\n'
    assert lost != TWO_GPUS
    driver.write(lost)
    with pytest.raises(TelemetryError) as err:
        gw.read(GPU0)
    assert err.value.state is TelemetryState.LOST
    assert gw.read(GPU1).total_mib == 24576


def test_a_slow_call_is_given_up_and_never_doubled(driver: Driver) -> None:
    """A query that hangs (the driver's delay): the sampler gives up at its deadline with
    STALE while the call goes on; when the driver answers again, so does the GPU."""
    gw = driver.gateway(_gpu(total_mib=24576), DriverSwitches(delay_ms={GPU0: 30_000}))
    gw.enumerate()
    sampler = AsyncSampler(gw, deadline_s=0.3)

    async def twice() -> list[str]:
        reasons = []
        for _ in range(2):
            try:
                await sampler.sample(GPU0)
            except TelemetryError as exc:
                reasons.append(exc.reason)
            assert sampler.busy(GPU0)
        return reasons

    try:
        assert asyncio.run(twice()) == ["timeout", "timeout"]
        driver.write(_gpu(total_mib=24576))  # the hang ends: the state is read every 50 ms
        deadline = time.monotonic() + 10
        while sampler.busy(GPU0):
            assert time.monotonic() < deadline, "the hung call never returned"
            time.sleep(0.05)
        assert asyncio.run(sampler.sample(GPU0)).total_mib == 24576
    finally:
        sampler.close()
