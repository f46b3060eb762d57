"""The NVML gateway contract (architecture.md §6), run over the fake NVML and, on a GPU machine,
real NVML.

`GatewayContract` holds what every pynvml-shaped library behind `NvmlGateway` must satisfy;
`TestFakeNvml` and `TestRealNvml` (marked `gpu`, skipped without a driver) run it.
`TestFakeScenarios` drives the fake through the states a real driver can be in: v1/v2
memory, unknown per-process memory, injected errors, scenario rewrites, simulated
allocations, hung calls.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pynvml
import pytest

from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import AsyncSampler, NvmlGateway, TelemetryError, real_nvml_available
from rbroker.gpu.scenario import ScenarioError
from rbroker.gpu.types import GpuSample, TelemetryState
from tests.conftest import GPU0, GPU1

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

MISSING_UUID = "GPU-00000000-0000-0000-0000-0000000000ff"


def _scenario(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.toml"
    path.write_text(textwrap.dedent(text))
    return path


def _rewrite(path: Path, text: str) -> None:
    """Rewrite the scenario so that its mtime surely changes."""
    before = path.stat().st_mtime_ns
    path.write_text(textwrap.dedent(text))
    os.utime(path, ns=(before, max(before + 1_000_000, time.time_ns())))


POSIX_ZOMBIES = pytest.mark.skipif(
    sys.platform == "win32",
    reason="POSIX only: a zombie (exited, not yet reaped) is a POSIX state; Windows has none",
)


class GatewayContract:
    """What every NVML library behind `NvmlGateway` must satisfy."""

    @pytest.fixture
    def gateway(self) -> Iterator[NvmlGateway]:
        raise NotImplementedError

    def test_enumerate_keys_gpus_by_uuid(self, gateway: NvmlGateway) -> None:
        infos = gateway.enumerate()
        assert infos
        uuids = [info.uuid for info in infos]
        assert len(set(uuids)) == len(uuids)
        assert all(u.startswith(("GPU-", "MIG-")) for u in uuids)
        assert all(isinstance(info.name, str) and info.name for info in infos)

    def test_sample_is_consistent(self, gateway: NvmlGateway) -> None:
        for info in gateway.enumerate():
            sample = gateway.read(info.uuid)
            assert isinstance(sample, GpuSample)
            assert sample.uuid == info.uuid
            assert sample.total_mib > 0
            assert 0 <= sample.device_used_mib <= sample.total_mib
            assert sample.memory_api in ("v1", "v2")
            assert sample.started_at <= sample.finished_at
            for proc in sample.processes:
                assert 0 < proc.pid < 2**32 - 1
                assert proc.kind in ("compute", "graphics")
                assert proc.used_mib is None or 0 <= proc.used_mib <= sample.total_mib

    def test_missing_gpu_is_a_telemetry_error(self, gateway: NvmlGateway) -> None:
        gateway.enumerate()
        with pytest.raises(TelemetryError) as err:
            gateway.read(MISSING_UUID)
        assert not isinstance(err.value, pynvml.NVMLError)
        assert err.value.state in (TelemetryState.LOST, TelemetryState.UNAVAILABLE)

    def test_async_sampler_reads_off_the_loop(self, gateway: NvmlGateway) -> None:
        uuid = gateway.enumerate()[0].uuid
        sampler = AsyncSampler(gateway, deadline_s=5.0)

        async def main() -> GpuSample:
            return await sampler.sample(uuid)

        try:
            sample = asyncio.run(main())
        finally:
            sampler.close()
        assert sample.uuid == uuid

    def test_driver_version_is_text(self, gateway: NvmlGateway) -> None:
        assert isinstance(gateway.driver_version(), str)


TWO_GPUS = f"""
[[gpu]]
uuid = "{GPU0}"
name = "Simulated RTX 4090"
total_mib = 24576
used_mib = 1000

[[gpu.process]]
pid = 4000
used_mib = 2048

[[gpu.process]]
pid = 4001
kind = "graphics"

[[gpu]]
uuid = "{GPU1}"
name = "Simulated RTX 4090"
total_mib = 24576
"""


class TestFakeNvml(GatewayContract):
    @pytest.fixture
    def gateway(self, tmp_path: Path) -> Iterator[NvmlGateway]:
        gw = NvmlGateway(FakeNvml(_scenario(tmp_path, TWO_GPUS)), source="simulated")
        yield gw
        gw.shutdown()


@pytest.mark.gpu
class TestRealNvml(GatewayContract):
    @pytest.fixture
    def gateway(self) -> Iterator[NvmlGateway]:
        if not real_nvml_available():
            pytest.skip("no NVIDIA driver answers on this machine")
        gw = NvmlGateway(pynvml, source="nvml")
        yield gw
        gw.shutdown()


def _gpu(**fields: object) -> str:
    lines = [f'uuid = "{GPU0}"', 'name = "Simulated GPU"']
    for key, value in fields.items():
        if isinstance(value, str):
            lines.append(f'{key} = "{value}"')
        elif isinstance(value, bool):
            lines.append(f"{key} = {str(value).lower()}")
        else:
            lines.append(f"{key} = {value}")
    return "[[gpu]]\n" + "\n".join(lines) + "\n"


class TestFakeScenarios:
    """The fake NVML through the production gateway, state by state."""

    def _gateway(self, tmp_path: Path, text: str) -> tuple[NvmlGateway, FakeNvml, Path]:
        path = _scenario(tmp_path, text)
        fake = FakeNvml(path)
        gw = NvmlGateway(fake, source="simulated")
        gw.enumerate()
        return gw, fake, path

    def test_v2_and_v1_give_the_same_device_used(self, tmp_path: Path) -> None:
        v2, _, _ = self._gateway(
            tmp_path, _gpu(total_mib=81920, reserved_mib=726, used_mib=8, memory_api="v2")
        )
        (tmp_path / "v1").mkdir()
        v1, _, _ = self._gateway(
            tmp_path / "v1", _gpu(total_mib=81920, reserved_mib=0, used_mib=734, memory_api="v1")
        )
        a, b = v2.read(GPU0), v1.read(GPU0)
        assert (a.memory_api, b.memory_api) == ("v2", "v1")
        assert a.total_mib == b.total_mib == 81920
        assert a.device_used_mib == b.device_used_mib == 734

    def test_v2_reserved_is_counted_as_used(self, tmp_path: Path) -> None:
        gw, _, _ = self._gateway(tmp_path, _gpu(total_mib=24576, reserved_mib=500, used_mib=0))
        assert gw.read(GPU0).device_used_mib == 500

    def test_unknown_per_process_memory_is_none(self, tmp_path: Path) -> None:
        text = _gpu(total_mib=24576, per_process_memory=False) + textwrap.dedent(
            """
            [[gpu.process]]
            pid = 4000
            used_mib = 10240
            [[gpu.process]]
            pid = 4001
            used_mib = 10240
            """
        )
        gw, _, _ = self._gateway(tmp_path, text)
        sample = gw.read(GPU0)
        assert sample.device_used_mib == 20480
        assert sorted(p.pid for p in sample.processes) == [4000, 4001]
        assert all(p.used_mib is None for p in sample.processes)

    def test_known_per_process_memory(self, tmp_path: Path) -> None:
        gw, _, _ = self._gateway(tmp_path, TWO_GPUS)
        procs = {p.pid: p for p in gw.read(GPU0).processes}
        assert procs[4000].used_mib == 2048 and procs[4000].kind == "compute"
        assert procs[4001].used_mib is None and procs[4001].kind == "graphics"
        assert gw.read(GPU0).device_used_mib == 1000 + 2048

    def test_device_used_may_disagree_with_the_process_list(self, tmp_path: Path) -> None:
        text = _gpu(total_mib=24576, device_used_mib=12000) + "[[gpu.process]]\npid = 4000\n"
        text += "used_mib = 2048\n"
        gw, _, _ = self._gateway(tmp_path, text)
        assert gw.read(GPU0).device_used_mib == 12000

    @pytest.mark.parametrize(
        ("error", "state", "reason"),
        [
            ("gpu_lost", TelemetryState.LOST, "gpu_lost"),
            ("version_mismatch", TelemetryState.UNAVAILABLE, "version_mismatch"),
            ("unknown", TelemetryState.UNAVAILABLE, "unknown_error"),
            ("no_permission", TelemetryState.UNAVAILABLE, "no_permission"),
        ],
    )
    def test_injected_error_becomes_a_telemetry_state(
        self, tmp_path: Path, error: str, state: TelemetryState, reason: str
    ) -> None:
        gw, _, _ = self._gateway(tmp_path, _gpu(total_mib=24576, error=error))
        with pytest.raises(TelemetryError) as err:
            gw.read(GPU0)
        assert not isinstance(err.value, pynvml.NVMLError)
        assert err.value.__cause__ is None and err.value.__suppress_context__
        assert (err.value.state, err.value.reason) == (state, reason)

    def test_error_at_enumeration_is_a_telemetry_error(self, tmp_path: Path) -> None:
        fake = FakeNvml(_scenario(tmp_path, _gpu(total_mib=24576)))
        fake.nvmlDeviceGetCount = _raise_version_mismatch  # type: ignore[method-assign]
        with pytest.raises(TelemetryError) as err:
            NvmlGateway(fake).enumerate()
        assert err.value.state is TelemetryState.UNAVAILABLE

    def test_memory_query_not_supported_is_unknown_capacity(self, tmp_path: Path) -> None:
        gw, _, _ = self._gateway(tmp_path, _gpu(total_mib=24576, memory_api="not_supported"))
        with pytest.raises(TelemetryError) as err:
            gw.read(GPU0)
        assert (err.value.state, err.value.reason) == (
            TelemetryState.UNKNOWN_CAPACITY,
            "not_supported",
        )

    def test_memory_query_coming_back_uses_v2_again(self, tmp_path: Path) -> None:
        """`not_supported` means no memory query at all, not "v2 missing": when the query
        works again, v2 (with its reserved memory) is used, not v1 for ever after."""
        gw, fake, _ = self._gateway(tmp_path, _gpu(total_mib=24576, memory_api="not_supported"))
        with pytest.raises(TelemetryError):
            gw.read(GPU0)
        fake.set_gpu(GPU0, memory_api="v2", reserved_mib=300)
        sample = gw.read(GPU0)
        assert (sample.memory_api, sample.device_used_mib) == ("v2", 300)

    def test_v1_only_library_is_remembered(self, tmp_path: Path) -> None:
        gw, fake, _ = self._gateway(tmp_path, _gpu(total_mib=24576, memory_api="v1"))
        calls: list[object] = []
        real = fake.nvmlDeviceGetMemoryInfo

        def counting(handle: object, version: int | None = None) -> object:
            calls.append(version)
            return real(handle, version)

        fake.nvmlDeviceGetMemoryInfo = counting  # type: ignore[method-assign,assignment]
        for _ in range(3):
            assert gw.read(GPU0).memory_api == "v1"
        assert calls == [pynvml.nvmlMemory_v2, None, None, None]  # v2 tried once, not each time

    def test_errors_clear_when_the_driver_recovers(self, tmp_path: Path) -> None:
        gw, fake, _ = self._gateway(tmp_path, _gpu(total_mib=24576))
        fake.set_gpu(GPU0, error="gpu_lost")
        with pytest.raises(TelemetryError):
            gw.read(GPU0)
        fake.set_gpu(GPU0, error="")
        assert gw.read(GPU0).total_mib == 24576

    def test_scenario_rewrite_is_picked_up(self, tmp_path: Path) -> None:
        gw, _, path = self._gateway(tmp_path, _gpu(total_mib=24576, used_mib=1000))
        assert gw.read(GPU0).device_used_mib == 1000
        _rewrite(path, _gpu(total_mib=24576, used_mib=5000))
        assert gw.read(GPU0).device_used_mib == 5000
        _rewrite(path, _gpu(total_mib=24576, error="gpu_lost"))
        with pytest.raises(TelemetryError) as err:
            gw.read(GPU0)
        assert err.value.state is TelemetryState.LOST

    @pytest.mark.parametrize(
        "bad",
        [
            "this is not toml [[[",
            _gpu(total_mib=-1),
            _gpu(total_mib=24576, memory_api="v3"),
            _gpu(total_mib=24576, colour="green"),
            "",
        ],
        ids=["not-toml", "negative-total", "bad-api", "unknown-key", "empty"],
    )
    def test_invalid_rewrite_keeps_the_previous_scenario(self, tmp_path: Path, bad: str) -> None:
        gw, _, path = self._gateway(tmp_path, _gpu(total_mib=24576, used_mib=1000))
        assert gw.read(GPU0).device_used_mib == 1000
        _rewrite(path, bad)
        with pytest.raises(ScenarioError) as refused:
            FakeNvml(path)  # the same text refused at start
        assert str(refused.value).startswith(f"{path}: ")  # naming the file
        sample = gw.read(GPU0)
        assert (sample.total_mib, sample.device_used_mib) == (24576, 1000)
        _rewrite(path, _gpu(total_mib=24576, used_mib=3000))  # a later good rewrite applies
        assert gw.read(GPU0).device_used_mib == 3000

    def test_sim_allocation_vanishes_when_the_process_exits(self, tmp_path: Path) -> None:
        gw, fake, _ = self._gateway(tmp_path, _gpu(total_mib=24576, used_mib=1000))
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert fake.allocate(GPU0, proc.pid, 3000) == 3000
            assert fake.allocate(GPU0, proc.pid, 1096) == 4096
            sample = gw.read(GPU0)
            assert sample.device_used_mib == 1000 + 4096
            assert {p.pid: p.used_mib for p in sample.processes} == {proc.pid: 4096}
            proc.kill()
            proc.wait(10)
            sample = gw.read(GPU0)
            assert sample.device_used_mib == 1000
            assert sample.processes == ()
        finally:
            proc.kill()
            proc.wait(10)

    @POSIX_ZOMBIES
    def test_sim_allocation_of_a_zombie_is_gone(self, tmp_path: Path) -> None:
        gw, fake, _ = self._gateway(tmp_path, _gpu(total_mib=24576))
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            fake.allocate(GPU0, proc.pid, 2048)
            assert gw.read(GPU0).device_used_mib == 2048
            proc.kill()
            deadline = time.monotonic() + 5
            while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert gw.read(GPU0).device_used_mib == 0  # dead but not yet reaped
        finally:
            proc.kill()
            proc.wait(10)

    def test_sim_free(self, tmp_path: Path) -> None:
        gw, fake, _ = self._gateway(tmp_path, _gpu(total_mib=24576))
        fake.allocate(GPU0, os.getpid(), 4096)
        assert fake.free(GPU0, os.getpid(), 1024) == 3072
        assert gw.read(GPU0).device_used_mib == 3072
        assert fake.free(GPU0, os.getpid()) == 0
        assert gw.read(GPU0).device_used_mib == 0

    @pytest.mark.parametrize(
        "reaped", [True, pytest.param(False, marks=POSIX_ZOMBIES)], ids=["exited", "zombie"]
    )
    def test_allocation_for_a_dead_pid_is_refused(self, tmp_path: Path, reaped: bool) -> None:
        _, fake, _ = self._gateway(tmp_path, _gpu(total_mib=24576))
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        try:
            if reaped:
                proc.wait(10)
            else:
                deadline = time.monotonic() + 5
                while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
            with pytest.raises(ProcessLookupError):
                fake.allocate(GPU0, proc.pid, 1024)
        finally:
            proc.wait(10)

    def test_hung_call_times_out_and_is_never_doubled(self, tmp_path: Path) -> None:
        gw, fake, _ = self._gateway(tmp_path, _gpu(total_mib=24576, delay_s=5.0))
        calls: list[float] = []
        read = gw.read

        def counting_read(uuid: str) -> GpuSample:
            calls.append(time.monotonic())
            return read(uuid)

        gw.read = counting_read  # type: ignore[method-assign]
        sampler = AsyncSampler(gw, deadline_s=0.3)

        async def main() -> None:
            started = time.monotonic()
            with pytest.raises(TelemetryError) as err:
                await sampler.sample(GPU0)
            elapsed = time.monotonic() - started
            assert (err.value.state, err.value.reason) == (TelemetryState.STALE, "timeout")
            assert 0.25 <= elapsed < 1.5, elapsed  # the call itself hangs for 5 s
            assert sampler.busy(GPU0)

            # Asked again while the first call hangs: no second call, an answer at once.
            started = time.monotonic()
            with pytest.raises(TelemetryError) as again:
                await sampler.sample(GPU0)
            assert again.value.state is TelemetryState.STALE
            assert time.monotonic() - started < 1.0
            assert len(calls) == 1

            # The driver recovers: the hung call returns, and the next sample is a new call.
            fake.set_gpu(GPU0, delay_s=0.0)
            deadline = time.monotonic() + 5
            while sampler.busy(GPU0):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            sample = await sampler.sample(GPU0)
            assert sample.total_mib == 24576
            assert len(calls) == 2

        try:
            asyncio.run(main())
        finally:
            fake.set_gpu(GPU0, delay_s=0.0)
            sampler.close()

    def test_hung_gpu_does_not_hold_up_another(self, tmp_path: Path) -> None:
        text = _gpu(total_mib=24576, delay_s=5.0) + f'[[gpu]]\nuuid = "{GPU1}"\ntotal_mib = 8192\n'
        gw, fake, _ = self._gateway(tmp_path, text)
        sampler = AsyncSampler(gw, deadline_s=3.0)

        async def main() -> None:
            hung = asyncio.create_task(sampler.sample(GPU0))
            started = time.monotonic()
            sample = await sampler.sample(GPU1)
            assert sample.total_mib == 8192
            assert time.monotonic() - started < 1.5  # not behind GPU0's 3 s deadline
            with pytest.raises(TelemetryError):
                await hung

        try:
            asyncio.run(main())
        finally:
            fake.set_gpu(GPU0, delay_s=0.0)
            sampler.close()


def _raise_version_mismatch() -> int:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[[gpu]]\nname = 3\n", "name must be a string, got 3"),
        ("[[gpu]]\nuuid = 3\n", "uuid must be a string, got 3"),
        ('[[gpu]]\nname = "  "\n', "name must not be empty"),
        ("[[gpu]]\nmemory_api = 2\n", "memory_api must be a string, got 2"),
        ("[[gpu]]\nerror = false\n", "error must be a string, got False"),
        ('[[gpu]]\nper_process_memory = "yes"\n', "per_process_memory must be true or false"),
        ("[[gpu]]\ntotal_mib = true\n", "total_mib must be a non-negative integer, got True"),
        ("[[gpu]]\nused_mib = 1.5\n", "used_mib must be a non-negative integer, got 1.5"),
        ("[[gpu]]\ndevice_used_mib = true\n", "device_used_mib must be within 0..24576"),
        ("[[gpu]]\ndelay_s = true\n", "delay_s must be a finite non-negative number, got True"),
        ("[[gpu]]\ndelay_s = nan\n", "delay_s must be a finite non-negative number, got nan"),
        ("[[gpu]]\ndelay_s = inf\n", "delay_s must be a finite non-negative number, got inf"),
        ("gpu = [1, 2]\n", "gpu #1: must be a [[gpu]] table, got 1"),
        ("[[gpu]]\nprocess = 3\n", "process must be [[gpu.process]] tables"),
        ("[[gpu]]\nprocess = [1]\n", "process must be [[gpu.process]] tables"),
        ("[[gpu]]\n[[gpu.process]]\npid = true\n", "process pid must be an integer"),
        (
            "[[gpu]]\n[[gpu.process]]\npid = 5\nused_mib = false\n",
            "process used_mib must be an integer >= 0, got False",
        ),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(
    tmp_path: Path, text: str, named: str
) -> None:
    """Every scenario field is checked for its type, not only its range: a wrong type is a
    `ScenarioError` naming the GPU and the field (never a crash, never accepted)."""
    path = _scenario(tmp_path, text)
    with pytest.raises(ScenarioError) as refused:
        FakeNvml(path)
    assert named in str(refused.value)
    assert str(refused.value).startswith(f"{path}: gpu #1")


def test_a_sim_set_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    """`sim.set` goes through the same checks as the file (`SimGpu.with_changes`)."""
    fake = FakeNvml(_scenario(tmp_path, _gpu(total_mib=24576)))
    for changes, named in (({"name": 3}, "name must be a string"), ({"delay_s": True}, "delay_s")):
        with pytest.raises(ScenarioError, match=named):
            fake.set_gpu(GPU0, **changes)
