"""Per-process GPU memory and utilization from Windows' GPU counters: parsing and mapping.

Under WDDM, NVML lists the processes on a GPU but reports their memory as None. Windows
itself counts it: the performance object `GPU Process Memory` has one instance per process
and adapter, named `pid_<pid>_luid_<high>_<low>_phys_<n>` (e.g.
`pid_1234_luid_0x00000000_0x0000D1A2_phys_0`), whose counter `Dedicated Usage` is the
process's dedicated (on-board) memory on that adapter in bytes. `phys_<n>` is the physical
adapter inside a linked adapter group; a process's use is the sum over them.

Utilization (what the broker's idle rule reads where NVML gives no per-process utilization)
comes from the performance object `GPU Engine`: one instance per process, adapter and engine,
named `pid_<pid>_luid_<high>_<low>_phys_<n>_eng_<k>_engtype_<type>` (e.g.
`pid_1234_luid_0x00000000_0x0000D1A2_phys_0_eng_0_engtype_3D`; types such as `3D`, `Compute_0`,
`Copy`, `VideoDecode`), whose counter `Utilization Percentage` is the share of the interval
between two counter collections that the engine ran that process's work, in percent (a rate:
the first collection has no value). A process's utilization on an adapter is the *maximum*
over its engines (`utilization_by_adapter`).

Adapters are named by LUID, NVML's GPUs by UUID and PCI address. The mapping chosen here
goes through the PCI address: Windows gives each adapter LUID its bus/device/function
(`D3DKMTQueryAdapterInfo(KMTQAITYPE_ADAPTERADDRESS)`), NVML gives each GPU its PCI bus id
(`nvmlDeviceGetPciInfo().busId`, `DDDDDDDD:BB:DD.F`). NVML has no LUID query (CUDA has
`cuDeviceGetLuid`, but the broker does not load CUDA). Windows' adapter address has no PCI
domain, so a bus/device/function that two NVML GPUs share (different domains) maps to
neither: unknown, never a guess.

Everything here is pure: the Windows readers (`rbroker.gpu.wddm`) feed it, tests feed it
recorded values. (`parse_instance` and `dedicated_mib_by_adapter` read `GPU Process Memory`,
`parse_engine_instance` and `utilization_by_adapter` read `GPU Engine`; the adapter mapping
serves both.)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MIB = 1024 * 1024

COUNTER_OBJECT = "GPU Process Memory"
DEDICATED_COUNTER = "Dedicated Usage"
ENGINE_OBJECT = "GPU Engine"
UTILIZATION_COUNTER = "Utilization Percentage"

_INSTANCE = re.compile(
    r"^pid_(?P<pid>\d+)_luid_(?P<high>0x[0-9a-fA-F]{1,8})_(?P<low>0x[0-9a-fA-F]{1,8})"
    r"_phys_(?P<phys>\d+)$"
)
_ENGINE_INSTANCE = re.compile(
    r"^pid_(?P<pid>\d+)_luid_(?P<high>0x[0-9a-fA-F]{1,8})_(?P<low>0x[0-9a-fA-F]{1,8})"
    r"_phys_(?P<phys>\d+)_eng_(?P<eng>\d+)_engtype_(?P<type>.*)$"
)
_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})"
    r"\.(?P<function>[0-7])$"
)


@dataclass(frozen=True, slots=True)
class CounterInstance:
    """One parsed `GPU Process Memory` instance name: `luid` is the adapter LUID as one
    64-bit integer (`high << 32 | low`), `phys` the physical adapter index."""

    pid: int
    luid: int
    phys: int


@dataclass(frozen=True, slots=True)
class PciAddress:
    """A PCI location; `domain` is None where the source does not give it (Windows)."""

    domain: int | None
    bus: int
    device: int
    function: int


@dataclass(frozen=True, slots=True)
class EngineInstance:
    """One parsed `GPU Engine` instance name: `luid` as in `CounterInstance`, `engine` the
    engine's index on that physical adapter, `engine_type` its kind as Windows names it
    (`3D`, `Compute_0`, `Copy`, `VideoDecode`, ...; may be empty on some drivers)."""

    pid: int
    luid: int
    phys: int
    engine: int
    engine_type: str


class CounterFormatError(ValueError):
    """A counter instance name or value that does not have the documented shape."""


def parse_instance(name: str) -> CounterInstance:
    """Parse `pid_1234_luid_0x00000000_0x0000D1A2_phys_0`.

    Raises:
        CounterFormatError: the name does not have that shape (the message quotes it).
    """
    m = _INSTANCE.match(name.strip())
    if m is None:
        raise CounterFormatError(
            f"not a {COUNTER_OBJECT} instance name (want pid_N_luid_0xH_0xL_phys_N): {name!r}"
        )
    luid = int(m["high"], 16) << 32 | int(m["low"], 16)
    return CounterInstance(pid=int(m["pid"]), luid=luid, phys=int(m["phys"]))


def parse_engine_instance(name: str) -> EngineInstance:
    """Parse `pid_1234_luid_0x00000000_0x0000D1A2_phys_0_eng_0_engtype_3D`.

    Raises:
        CounterFormatError: the name does not have that shape (the message quotes it).
    """
    m = _ENGINE_INSTANCE.match(name.strip())
    if m is None:
        raise CounterFormatError(
            f"not a {ENGINE_OBJECT} instance name "
            f"(want pid_N_luid_0xH_0xL_phys_N_eng_N_engtype_T): {name!r}"
        )
    luid = int(m["high"], 16) << 32 | int(m["low"], 16)
    return EngineInstance(
        pid=int(m["pid"]),
        luid=luid,
        phys=int(m["phys"]),
        engine=int(m["eng"]),
        engine_type=m["type"],
    )


def format_luid(luid: int) -> str:
    """`0x00000000_0x0000D1A2`: a LUID the way the counter instance names spell it."""
    return f"0x{luid >> 32:08X}_0x{luid & 0xFFFFFFFF:08X}"


def dedicated_mib_by_adapter(
    values: Mapping[str, float | int], bad: list[str] | None = None
) -> dict[int, dict[int, int]]:
    """`{luid: {pid: MiB}}` from `{instance name: Dedicated Usage bytes}`.

    Bytes are summed over a process's physical adapters and rounded *up* to MiB (cautious:
    what a process uses is never under-counted). Instances whose name or value is malformed
    (negative, not a number, NaN) are skipped and, when `bad` is given, appended to it as
    `name: why`; pid 0 (the idle process, kernel allocations) is skipped too.
    """
    totals: dict[int, dict[int, int]] = {}
    for name, raw in values.items():
        try:
            inst = parse_instance(name)
        except CounterFormatError as exc:
            if bad is not None:
                bad.append(str(exc))
            continue
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not raw >= 0:
            if bad is not None:
                bad.append(f"{name}: {DEDICATED_COUNTER} is {raw!r}, not a byte count")
            continue
        if inst.pid == 0:
            continue
        per_pid = totals.setdefault(inst.luid, {})
        per_pid[inst.pid] = per_pid.get(inst.pid, 0) + int(raw)
    return {
        luid: {pid: -(-b // MIB) for pid, b in per_pid.items()} for luid, per_pid in totals.items()
    }


def utilization_by_adapter(
    values: Mapping[str, float | int], bad: list[str] | None = None
) -> dict[int, dict[int, int]]:
    """`{luid: {pid: percent}}` from `{instance name: Utilization Percentage}` of `GPU Engine`
    (percent of the interval between the last two counter collections).

    A process's utilization on an adapter is the *maximum* over its engines and physical
    adapters, not the sum: each engine runs in parallel with the others, so one engine busy
    all the time is a GPU busy all the time, and a sum over, say, a 3D and a copy engine could
    pass 100 % with neither full. Task Manager shows the same: a process's "GPU" column is its
    busiest engine. Percentages are rounded *up* to whole percent and capped at 100 (PDH's
    rate can overshoot): any work at all counts as activity, so a busy lease is never
    called idle for a fraction of a percent. Only processes above 0 % are kept (as NVML's
    per-process utilization lists only processes that ran). Malformed names or values
    (negative, not a number, NaN, infinite) are skipped and, when `bad` is given, appended to
    it as `name: why`; pid 0 (the idle process, the kernel) is skipped too.
    """
    out: dict[int, dict[int, int]] = {}
    for name, raw in values.items():
        try:
            inst = parse_engine_instance(name)
        except CounterFormatError as exc:
            if bad is not None:
                bad.append(str(exc))
            continue
        if (
            isinstance(raw, bool)
            or not isinstance(raw, int | float)
            or not (raw >= 0 and math.isfinite(raw))
        ):
            if bad is not None:
                bad.append(f"{name}: {UTILIZATION_COUNTER} is {raw!r}, not a percentage")
            continue
        percent = min(100, math.ceil(raw))
        if inst.pid == 0 or percent == 0:
            continue
        per_pid = out.setdefault(inst.luid, {})
        per_pid[inst.pid] = max(per_pid.get(inst.pid, 0), percent)
    return out


def parse_bus_id(bus_id: str) -> PciAddress:
    """Parse NVML's PCI bus id (`00000000:65:00.0`, or the legacy `0000:65:00.0`).

    Raises:
        CounterFormatError: not a PCI bus id.
    """
    m = _BUS_ID.match(bus_id.strip().rstrip("\x00"))
    if m is None:
        raise CounterFormatError(f"not a PCI bus id (want DDDDDDDD:BB:DD.F): {bus_id!r}")
    domain = int(m["domain"], 16) if m["domain"] else None
    return PciAddress(domain, int(m["bus"], 16), int(m["device"], 16), int(m["function"]))


def map_adapters(
    adapters: Mapping[int, PciAddress], gpus: Mapping[str, str]
) -> tuple[dict[str, int], list[str]]:
    """Match Windows adapters (`{luid: address}`) to NVML GPUs (`{uuid: PCI bus id}`).

    A GPU maps to the adapter at its bus/device/function (and domain, when both sides give
    one). A GPU that matches no adapter, or an address that several GPUs or several
    adapters share, maps to nothing: its processes' memory stays unknown.

    Returns:
        `({uuid: luid}, notes)`: `notes` says in words why each unmapped GPU is unmapped.
    """
    notes: list[str] = []
    parsed: dict[str, PciAddress] = {}
    for uuid, bus_id in gpus.items():
        try:
            parsed[uuid] = parse_bus_id(bus_id)
        except CounterFormatError as exc:
            notes.append(f"{uuid}: {exc}")

    def same(a: PciAddress, b: PciAddress) -> bool:
        if (a.bus, a.device, a.function) != (b.bus, b.device, b.function):
            return False
        return a.domain is None or b.domain is None or a.domain == b.domain

    out: dict[str, int] = {}
    for uuid, addr in parsed.items():
        luids = [luid for luid, a in adapters.items() if same(a, addr)]
        # another GPU that the same adapter address fits (the adapter side has no domain)
        rivals = [
            u
            for u, other in parsed.items()
            if u != uuid and any(same(adapters[luid], other) for luid in luids)
        ]
        where = f"{addr.bus:02x}:{addr.device:02x}.{addr.function}"
        if not luids:
            notes.append(f"{uuid}: no Windows adapter at PCI {where}")
        elif len(luids) > 1 or rivals:
            notes.append(f"{uuid}: PCI {where} is ambiguous (Windows gives no PCI domain)")
        else:
            out[uuid] = luids[0]
    return out, notes


def observed_mib(
    per_adapter: Mapping[int, Mapping[int, int]], luid: int | None, pids: Iterable[int]
) -> dict[int, int]:
    """The counter MiB of `pids` on adapter `luid`; pids without a counter are left out
    (their memory stays unknown, which the capacity model counts as 0)."""
    if luid is None:
        return {}
    on_adapter = per_adapter.get(luid, {})
    return {pid: on_adapter[pid] for pid in pids if pid in on_adapter}
