"""Per-process GPU utilization (issue 42, idle measured): the simulated NVML answers
`nvmlDeviceGetProcessUtilization` in pynvml's shapes, and the gateway reads it into
`GpuSample.utilization` — `{pid: percent}`, `{}` when nothing ran, None when unknown — and
never fails a sample for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest

from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway
from rbroker.gpu.scenario import ScenarioError, parse_scenario
from tests.fakes.gpu_scenarios import GPU0, gpu, scenario


def _gateway(tmp_path: Path, text: str) -> tuple[FakeNvml, NvmlGateway]:
    path = tmp_path / "scenario.toml"
    path.write_text(text)
    fake = FakeNvml(path)
    gateway = NvmlGateway(fake, source="simulated")
    gateway.foreign_pids = False  # the simulated pids are this machine's
    gateway.enumerate()
    return fake, gateway


def test_the_fake_answers_in_pynvmls_shapes(tmp_path: Path) -> None:
    fake, _ = _gateway(
        tmp_path, scenario(gpu(GPU0, processes=[(4000, 100), (4001, 100)], utilization={4000: 37}))
    )
    handle = fake.nvmlDeviceGetHandleByUUID(GPU0)
    (record,) = fake.nvmlDeviceGetProcessUtilization(handle, 0)
    assert (record.pid, record.smUtil, record.memUtil) == (4000, 37, 0)
    assert record.timeStamp > 0
    assert fake.nvmlDeviceGetProcessUtilization(handle, record.timeStamp)[0].timeStamp > (
        record.timeStamp
    )
    fake.set_utilization(GPU0, 4000, 0)
    with pytest.raises(pynvml.NVMLError) as err:  # NVML: no sample newer than the time given
        fake.nvmlDeviceGetProcessUtilization(handle, 0)
    assert err.value.value == pynvml.NVML_ERROR_NOT_FOUND


def test_the_sample_carries_busy_pids_and_an_empty_map_when_none_ran(tmp_path: Path) -> None:
    fake, gateway = _gateway(
        tmp_path, scenario(gpu(GPU0, processes=[(4000, 100), (4001, 100)], utilization={4000: 5}))
    )
    assert gateway.read(GPU0).utilization == {4000: 5}
    fake.set_utilization(GPU0, 4000, 0)
    fake.set_utilization(GPU0, 4001, 80)
    assert gateway.read(GPU0).utilization == {4001: 80}
    fake.set_utilization(GPU0, 4001, 0)
    assert gateway.read(GPU0).utilization == {}


@pytest.mark.parametrize("error", ["not_supported", "no_permission"])
def test_an_unreadable_utilization_is_unknown_and_the_sample_still_good(
    tmp_path: Path, error: str
) -> None:
    fake, gateway = _gateway(tmp_path, scenario(gpu(GPU0, processes=[(4000, 100)])))
    fake.set_gpu(GPU0, utilization_error=error)
    sample = gateway.read(GPU0)
    assert sample.utilization is None
    assert [p.pid for p in sample.processes] == [4000]


def test_a_library_without_the_call_gives_unknown(tmp_path: Path) -> None:
    class Older(FakeNvml):
        def __getattribute__(self, name: str) -> Any:
            if name == "nvmlDeviceGetProcessUtilization":
                raise AttributeError(name)
            return super().__getattribute__(name)

    path = tmp_path / "scenario.toml"
    path.write_text(scenario(gpu(GPU0, processes=[(4000, 100)], utilization={4000: 50})))
    gateway = NvmlGateway(Older(path), source="simulated")
    gateway.foreign_pids = False
    gateway.enumerate()
    assert gateway.read(GPU0).utilization is None


def test_pids_of_another_namespace_or_an_unknown_process_list_give_unknown(
    tmp_path: Path,
) -> None:
    fake, gateway = _gateway(
        tmp_path, scenario(gpu(GPU0, processes=[(4000, 100)], utilization={4000: 50}))
    )
    gateway.foreign_pids = True
    assert gateway.read(GPU0).utilization is None
    gateway.foreign_pids = False
    fake.set_gpu(GPU0, process_list_error="not_supported")
    assert gateway.read(GPU0).utilization is None


def test_the_scenario_refuses_a_percent_out_of_range() -> None:
    with pytest.raises(ScenarioError, match="sm_util"):
        parse_scenario(scenario(gpu(GPU0, processes=[(4000, 100)], utilization={4000: 101})))
    with pytest.raises(ScenarioError, match="utilization_error"):
        parse_scenario(scenario(gpu(GPU0, utilization_error="nope")))
