"""Per-process GPU memory and utilization on Windows: the "GPU Process Memory" counter
parser, the adapter-to-NVML mapping, and the counters as observed memory in the capacity
model (issue 13, item 4), on the recorded sample in tests/data/windows/gpu_process_memory.json;
the "GPU Engine" utilization parser and the counters as per-process utilization beside NVML's
(issue 42, idle measured), on tests/data/windows/gpu_engine_utilization.json.

The production gateway runs on the simulated NVML with per-process memory None and
per-process utilization not supported (what WDDM often reports) and the recorded counter
values as its per-process sources. The Windows readers themselves (PDH, gdi32) run only on
Windows: under Wine, which has no "GPU Engine" performance object and no NVIDIA adapter, the
utilization reader answers unknown, which a test here states; real counter values are shown
only on real Windows (docs/development.md, "Windows in CI").
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rbroker.broker.holders import Holder
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway
from rbroker.gpu.process_counters import (
    CounterFormatError,
    PciAddress,
    dedicated_mib_by_adapter,
    format_luid,
    map_adapters,
    observed_mib,
    parse_bus_id,
    parse_engine_instance,
    parse_instance,
    utilization_by_adapter,
)
from rbroker.gpu.wddm import process_utilization_source
from tests.desktop.inprocess import InProcessBroker
from tests.fakes import gpu_scenarios as sim
from tests.windows.wine import UNDER_WINE

SAMPLE = Path(__file__).parents[2] / "data" / "windows" / "gpu_process_memory.json"
ENGINES = SAMPLE.with_name("gpu_engine_utilization.json")
NV_LUID = 0x0000D1A2
IGPU_LUID = 0x0000C3F1
HIGH_LUID = 1 << 32 | 0x00002A10
GPU1 = "GPU-5a1e0000-0000-0000-0000-000000000001"
GPU2 = "GPU-5a1e0000-0000-0000-0000-000000000002"


@pytest.fixture(scope="module")
def sample() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SAMPLE.read_text())
    return data


def _adapters(sample: dict[str, Any]) -> dict[int, PciAddress]:
    out = {}
    for text, (bus, device, function) in sample["adapters"].items():
        high, low = text.split("_")
        out[int(high, 16) << 32 | int(low, 16)] = PciAddress(None, bus, device, function)
    return out


def test_instance_name_of_the_issue() -> None:
    inst = parse_instance("pid_1234_luid_0x00000000_0x0000D1A2_phys_0")
    assert (inst.pid, inst.luid, inst.phys) == (1234, 0xD1A2, 0)
    assert format_luid(inst.luid) == "0x00000000_0x0000D1A2"
    high = parse_instance("pid_7_luid_0x00000001_0x00002A10_phys_3")
    assert (high.luid, high.phys) == (0x1_00002A10, 3)


@pytest.mark.parametrize(
    "name",
    ["_Total", "pid_x_luid_0x0_0x1_phys_0", "pid_1_luid_0x0_phys_0", "pid_1_luid_0x0_0x1", ""],
)
def test_malformed_instance_names_are_named(name: str) -> None:
    with pytest.raises(CounterFormatError) as err:
        parse_instance(name)
    assert repr(name) in str(err.value)


def test_recorded_sample_per_adapter_and_pid(sample: dict[str, Any]) -> None:
    bad: list[str] = []
    per_adapter = dedicated_mib_by_adapter(sample["dedicated_usage_bytes"], bad)
    assert per_adapter == {
        # 8 GiB; 1 GiB + 1 byte on phys 0 plus 1 MiB on phys 1 rounds up to 1 026 MiB;
        # pid 0 (kernel) left out; pid 6016 listed with 0 bytes
        NV_LUID: {1234: 8192, 5120: 1026, 6016: 0},
        # 128.5 MiB rounds up to 129: never under-counted
        IGPU_LUID: {6016: 256, 944: 129},
        HIGH_LUID: {7300: 3072},
    }
    assert len(bad) == 2
    assert any("'_Total'" in line for line in bad)
    assert any("pid_8100" in line and "-1" in line for line in bad)


@pytest.mark.parametrize("raw", [float("nan"), -5, "12", None, True])
def test_values_that_are_not_byte_counts_are_skipped(raw: object) -> None:
    bad: list[str] = []
    name = "pid_10_luid_0x00000000_0x0000D1A2_phys_0"
    assert dedicated_mib_by_adapter({name: raw}, bad) == {}  # type: ignore[dict-item]
    assert bad and name in bad[0]


def test_recorded_adapters_map_to_nvml_gpus_by_pci_address(sample: dict[str, Any]) -> None:
    mapping, notes = map_adapters(_adapters(sample), sample["nvml_bus_ids"])
    assert mapping == {GPU1: NV_LUID, GPU2: HIGH_LUID}
    assert notes == []


def test_bus_ids_in_both_nvml_spellings() -> None:
    assert parse_bus_id("00000000:65:00.0") == PciAddress(0, 0x65, 0, 0)
    assert parse_bus_id("0000:17:00.1\x00") == PciAddress(0, 0x17, 0, 1)
    with pytest.raises(CounterFormatError, match="'65:00'"):
        parse_bus_id("65:00")


def test_unmatched_and_ambiguous_gpus_map_to_nothing() -> None:
    adapters = {NV_LUID: PciAddress(None, 0x65, 0, 0)}
    gpus = {
        GPU1: "00000000:65:00.0",
        GPU2: "00000001:65:00.0",  # same bus/device/function, other domain
        "GPU-c": "00000000:b3:00.0",
        "GPU-d": "garbage",
    }
    mapping, notes = map_adapters(adapters, gpus)
    assert mapping == {}
    text = "\n".join(notes)
    assert f"{GPU1}: PCI 65:00.0 is ambiguous" in text
    assert f"{GPU2}: PCI 65:00.0 is ambiguous" in text
    assert "GPU-c: no Windows adapter at PCI b3:00.0" in text
    assert "GPU-d: not a PCI bus id" in text


def test_two_adapters_at_one_address_map_to_nothing() -> None:
    adapters = {1: PciAddress(None, 1, 0, 0), 2: PciAddress(None, 1, 0, 0)}
    mapping, notes = map_adapters(adapters, {GPU1: "00000000:01:00.0"})
    assert mapping == {} and "ambiguous" in notes[0]


def test_observed_mib_leaves_pids_without_a_counter_out(sample: dict[str, Any]) -> None:
    per_adapter = dedicated_mib_by_adapter(sample["dedicated_usage_bytes"])
    assert observed_mib(per_adapter, NV_LUID, [1234, 999]) == {1234: 8192}
    assert observed_mib(per_adapter, None, [1234]) == {}
    assert observed_mib(per_adapter, 0xDEAD, [1234]) == {}


# -- the counters as observed memory, through the production gateway ----------------------


def _wddm_gpu(uuid: str) -> str:
    """A GPU in WDDM mode: its driver lists processes but not their memory."""
    return sim.gpu(
        uuid, name="Simulated RTX A4000 (WDDM)", total_mib=16384, per_process_memory=False
    )


WDDM_SCENARIO = sim.scenario(_wddm_gpu(GPU1))


class RecordedCounters:
    """A per-process source built like `rbroker.gpu.wddm.WddmProcessMemory`, on recorded
    values: the sample's instance names with the sample's pid 1234 standing for `pid`."""

    def __init__(self, sample: dict[str, Any], bus_ids: dict[str, str], pid: int) -> None:
        values = {
            name.replace("pid_1234_", f"pid_{pid}_"): v
            for name, v in sample["dedicated_usage_bytes"].items()
        }
        self.per_adapter = dedicated_mib_by_adapter(values)
        self.luids, _ = map_adapters(_adapters(sample), bus_ids)
        self.bus_ids = bus_ids
        self.missing = False

    def __call__(self, uuid: str, pids: Iterable[int]) -> dict[int, int]:
        if self.missing:  # the counter set went away (a broken counter registry)
            return {}
        return observed_mib(self.per_adapter, self.luids.get(uuid), pids)


def _bus_ids_at_0x65(_found: Mapping[str, str]) -> dict[str, str]:
    # the simulated GPU 0 sits at bus 01; the recorded NVIDIA adapter is at bus 0x65
    return {GPU1: "00000000:65:00.0"}


@pytest.fixture
def wddm(tmp_path: Path, sample: dict[str, Any]) -> Iterator[tuple[InProcessBroker, Any]]:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(WDDM_SCENARIO)
    h = InProcessBroker(scenario, tmp_path, persist=False)
    made: list[RecordedCounters] = []

    def factory(bus_ids: Mapping[str, str]) -> RecordedCounters:
        assert bus_ids == {GPU1: "00000000:01:00.0"}  # what the gateway read from NVML
        made.append(RecordedCounters(sample, _bus_ids_at_0x65(bus_ids), os.getpid()))
        return made[0]

    gateway = h.broker.gateway
    gateway.process_memory_factory = factory
    gateway.enumerate()  # the broker re-enumerates; here once, by hand
    yield h, made[0]
    h.close()


def test_gateway_fills_none_from_the_counters(tmp_path: Path, sample: dict[str, Any]) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(WDDM_SCENARIO)
    fake = FakeNvml(scenario)
    gateway = NvmlGateway(fake, source="simulated")
    gateway.foreign_pids = False  # the recorded pids are this machine's pids
    gateway.process_memory_factory = lambda ids: RecordedCounters(
        sample, _bus_ids_at_0x65(ids), os.getpid()
    )
    (info,) = gateway.enumerate()
    fake.allocate(info.uuid, os.getpid(), 100)  # listed by NVML with memory None
    (proc,) = gateway.read(info.uuid).processes
    assert (proc.pid, proc.used_mib) == (os.getpid(), 8192)  # the counter, not NVML's None
    gateway.process_memory_factory = None
    gateway.process_memory = None
    (proc,) = gateway.read(info.uuid).processes
    assert proc.used_mib is None  # no counter source: unknown, as WDDM says


def test_counters_are_the_leases_observed_memory(wddm: tuple[InProcessBroker, Any]) -> None:
    h, counters = wddm
    h.broker.gateway.foreign_pids = False
    h.sample()
    me = Holder.of(os.getpid())
    task = h.acquire(me, mib=10240)
    lease = task.result()
    # NVML lists this pid (WDDM: memory None) and its device figure holds the 8 GiB the
    # counter shows: observed use discounts only what device_used can hold
    # (capacity.unbacked_mib), as on a real GPU, where the device figure holds every process
    h.fake.allocate(GPU1, os.getpid(), 8192)
    h.sample()
    assert lease.observed_mib == {GPU1: 8192}  # the recorded 8 GiB from the counter
    (gpu,) = h.broker.gpus_view()
    assert gpu["outstanding_mib"] == 10240 - 8192
    assert gpu["leased_in_use_mib"] == 8192
    counters.missing = True  # the counter disappears: unknown counts as 0 again
    h.sample()
    assert lease.observed_mib.get(GPU1, 0) == 0
    (gpu,) = h.broker.gpus_view()
    assert gpu["outstanding_mib"] == 10240


def test_the_mapping_is_made_again_only_when_the_gpus_change(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(WDDM_SCENARIO)
    gateway = NvmlGateway(FakeNvml(scenario), source="simulated")
    seen: list[dict[str, str]] = []

    def factory(bus_ids: Mapping[str, str]) -> None:
        seen.append(dict(bus_ids))

    gateway.process_memory_factory = factory
    gateway.enumerate()
    gateway.enumerate()  # the broker re-enumerates every 10 s: same GPUs, same mapping
    assert seen == [{GPU1: "00000000:01:00.0"}]
    scenario.write_text(sim.scenario(_wddm_gpu(GPU1), _wddm_gpu(GPU2)))
    gateway.enumerate()  # a GPU came: the mapping is made again for both
    assert seen[-1] == {GPU1: "00000000:01:00.0", GPU2: "00000000:02:00.0"}
    assert len(seen) == 2


# -- "GPU Engine": per-process utilization (issue 42) -----------------------------------------


@pytest.fixture(scope="module")
def engines() -> dict[str, float]:
    data: dict[str, float] = json.loads(ENGINES.read_text())["utilization_percent"]
    return data


def test_engine_instance_name_of_the_issue() -> None:
    inst = parse_engine_instance("pid_1234_luid_0x00000000_0x0000D1A2_phys_0_eng_0_engtype_3D")
    assert (inst.pid, inst.luid, inst.phys, inst.engine, inst.engine_type) == (
        1234,
        0xD1A2,
        0,
        0,
        "3D",
    )
    compute = parse_engine_instance(
        "pid_7_luid_0x00000001_0x00002A10_phys_1_eng_12_engtype_Compute_0"
    )
    assert (compute.luid, compute.phys, compute.engine) == (0x1_00002A10, 1, 12)
    assert compute.engine_type == "Compute_0"
    assert parse_engine_instance("pid_7_luid_0x0_0x1_phys_0_eng_2_engtype_").engine_type == ""


@pytest.mark.parametrize(
    "name",
    [
        "_Total",
        "pid_1234_luid_0x00000000_0x0000D1A2_phys_0",  # a "GPU Process Memory" instance
        "pid_x_luid_0x0_0x1_phys_0_eng_0_engtype_3D",
        "pid_1_luid_0x0_0x1_phys_0_eng_engtype_3D",
        "pid_1_luid_0x0_0x1_phys_0_engtype_3D",
        "",
    ],
)
def test_malformed_engine_instance_names_are_named(name: str) -> None:
    with pytest.raises(CounterFormatError) as err:
        parse_engine_instance(name)
    assert repr(name) in str(err.value)


def test_recorded_engines_per_adapter_and_pid(engines: dict[str, float]) -> None:
    bad: list[str] = []
    assert utilization_by_adapter(engines, bad) == {
        # the busiest engine, not the sum (12.5 + 3 + 87.25): 87.25 rounds up to 88; pid 5120's
        # busy engine is on physical adapter 1; an empty engine type is still an engine; pid
        # 6016 at 0 % and pid 0 (kernel) left out
        NV_LUID: {1234: 88, 5120: 41, 8200: 7},
        # any work at all is activity: 0.0001 % rounds up to 1
        IGPU_LUID: {6016: 5, 944: 1},
        # PDH's rate overshooting 100 is capped
        HIGH_LUID: {7300: 100},
    }
    assert len(bad) == 2
    assert any("'_Total'" in line for line in bad)
    assert any("pid_8100" in line and "-1.0" in line for line in bad)


@pytest.mark.parametrize("raw", [float("nan"), math.inf, -5, "12", None, True])
def test_values_that_are_not_percentages_are_skipped(raw: object) -> None:
    bad: list[str] = []
    name = "pid_10_luid_0x00000000_0x0000D1A2_phys_0_eng_0_engtype_3D"
    assert utilization_by_adapter({name: raw}, bad) == {}  # type: ignore[dict-item]
    assert bad and name in bad[0]


class RecordedEngines:
    """A per-process utilization source built like `rbroker.gpu.wddm.WddmProcessUtilization`,
    on recorded values, the sample's pid 1234 standing for `pid`: its first answer is unknown
    (PDH's rate needs two collections), as is every answer while `missing`."""

    def __init__(self, engines: dict[str, float], bus_ids: dict[str, str], pid: int) -> None:
        memory = json.loads(SAMPLE.read_text())
        values = {name.replace("pid_1234_", f"pid_{pid}_"): v for name, v in engines.items()}
        self.per_adapter = utilization_by_adapter(values)
        self.luids, _ = map_adapters(_adapters(memory), bus_ids)
        self.collections = 0
        self.missing = False

    def __call__(self, uuid: str) -> dict[int, int] | None:
        self.collections += 1
        luid = self.luids.get(uuid)
        if self.collections == 1 or self.missing or luid is None:
            return None
        return dict(self.per_adapter.get(luid, {}))


def _wddm_busy_gpu(uuid: str, **fields: object) -> str:
    """A WDDM GPU listing this process, whose NVML has no per-process utilization."""
    return sim.gpu(
        uuid,
        total_mib=16384,
        per_process_memory=False,
        processes=[(os.getpid(), None)],
        utilization_error="not_supported",
        **fields,  # type: ignore[arg-type]
    )


def test_gateway_reads_utilization_from_the_counters_where_nvml_has_none(
    tmp_path: Path, engines: dict[str, float]
) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(sim.scenario(_wddm_busy_gpu(GPU1)))
    fake = FakeNvml(scenario)
    gateway = NvmlGateway(fake, source="simulated")
    gateway.foreign_pids = False  # the recorded pids are this machine's pids
    made: list[RecordedEngines] = []

    def factory(bus_ids: Mapping[str, str]) -> RecordedEngines:
        assert bus_ids == {GPU1: "00000000:01:00.0"}  # what the gateway read from NVML
        made.append(RecordedEngines(engines, _bus_ids_at_0x65(bus_ids), os.getpid()))
        return made[-1]

    gateway.process_utilization_factory = factory
    (info,) = gateway.enumerate()
    assert gateway.read(info.uuid).utilization is None  # the counters' first collection
    # the busiest engine of this process on the NVIDIA adapter; the others on it too
    assert gateway.read(info.uuid).utilization == {os.getpid(): 88, 5120: 41, 8200: 7}
    made[0].missing = True  # the counter set went away: unknown again, the sample good
    sample = gateway.read(info.uuid)
    assert sample.utilization is None
    assert [p.pid for p in sample.processes] == [os.getpid()]


def test_nvml_and_the_counters_are_joined_a_pid_busy_by_either_is_busy(
    tmp_path: Path, engines: dict[str, float]
) -> None:
    """Where NVML answers too (NOT_FOUND read as nothing busy, or records), a pid's percent is
    the larger of the two: WDDM's NVML may answer nothing for a process that works."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(sim.scenario(_wddm_busy_gpu(GPU1)))
    fake = FakeNvml(scenario)
    gateway = NvmlGateway(fake, source="simulated")
    gateway.foreign_pids = False
    counters: list[RecordedEngines] = []

    def factory(bus_ids: Mapping[str, str]) -> RecordedEngines:
        counters.append(RecordedEngines(engines, _bus_ids_at_0x65(bus_ids), os.getpid()))
        return counters[-1]

    gateway.process_utilization_factory = factory
    (info,) = gateway.enumerate()
    fake.set_gpu(info.uuid, utilization_error="")
    assert gateway.read(info.uuid).utilization == {}  # NVML: none ran; counters: first sample
    assert gateway.read(info.uuid).utilization == {os.getpid(): 88, 5120: 41, 8200: 7}
    fake.set_utilization(info.uuid, os.getpid(), 95)
    fake.set_utilization(info.uuid, 4444, 30)
    assert gateway.read(info.uuid).utilization == {os.getpid(): 95, 5120: 41, 8200: 7, 4444: 30}

    def broken(uuid: str) -> dict[int, int] | None:
        raise OSError("a source failing otherwise")

    gateway.process_utilization = broken  # never fails the sample: NVML's answer alone
    assert gateway.read(info.uuid).utilization == {os.getpid(): 95, 4444: 30}


def test_an_idle_lease_on_a_wddm_gpu_from_the_counters(
    make_inprocess: Any, engines: dict[str, float]
) -> None:
    """The idle rule on the counters: unknown while they have not answered (NVML has no
    per-process utilization), then idle once nothing of the holder ran for `idle_after_s`,
    active again when its engines run."""
    idle_after_s = 600.0
    h = make_inprocess(sim.scenario(_wddm_busy_gpu(GPU1)), persist=False, idle_after_s=idle_after_s)
    gateway = h.broker.gateway
    gateway.foreign_pids = False
    quiet = {n: v for n, v in engines.items() if not n.startswith("pid_1234_")}
    source = RecordedEngines(quiet, {GPU1: "00000000:65:00.0"}, os.getpid())
    gateway.process_utilization_factory = lambda _ids: source
    gateway.enumerate()
    me = Holder.of(os.getpid())
    lease = h.acquire(me, mib=1024).result()

    def state() -> str:
        entries = h.broker.leases_view()["leases"]
        return str(next(x for x in entries if x["lease_id"] == lease.lease_id)["idle_state"])

    h.sample()  # the counters' first collection: no rate yet
    assert state() == "unknown"
    h.sample()
    h.clock.advance(idle_after_s + 1)
    h.sample()
    assert state() == "idle"
    busy = dict(quiet)
    busy[f"pid_{os.getpid()}_luid_0x00000000_0x0000D1A2_phys_0_eng_4_engtype_Compute_0"] = 12.0
    source.per_adapter = utilization_by_adapter(busy)
    h.sample()
    assert state() == "active"


@pytest.mark.skipif(sys.platform != "win32", reason="PDH and gdi32 are Windows'")
def test_the_engine_counter_reader_on_this_windows() -> None:
    """The PDH reader itself: its first collection is unknown (no rate yet); later ones are
    `{luid: {pid: percent}}` with percentages above 0. Under Wine there is no "GPU Engine"
    performance object (PDH: no such object): unknown on every collection, never an
    exception; nor has Wine's gdi32 `D3DKMTEnumAdapters2`, so no source is made for the
    gateway at all (its utilization stays NVML's). Real values are shown only on real
    Windows."""
    from rbroker.gpu.wddm import EngineCounterReader

    reader = EngineCounterReader()
    try:
        assert reader.collect() is None
        answers = []
        for _ in range(2):
            time.sleep(0.1)
            answers.append(reader.collect())
    finally:
        reader.close()
    for answer in answers:
        assert answer is None or all(
            0 < v <= 100 for per_pid in answer.values() for v in per_pid.values()
        ), answer
    source = process_utilization_source({GPU1: "00000000:65:00.0"})
    if UNDER_WINE:
        assert answers == [None, None]
        assert source is None
    else:
        assert None not in answers, "a second collection of a rate has a value"
        assert source is not None


def test_no_engine_counter_source_off_windows() -> None:
    if sys.platform == "win32":
        pytest.skip("the source exists on Windows")
    assert process_utilization_source({GPU1: "00000000:65:00.0"}) is None
