"""Windows (WDDM) readers behind `rbroker.gpu.process_counters`: counters and adapters.

- `read_dedicated_usage()`: every `\\GPU Process Memory(*)\\Dedicated Usage` value through
  PDH (pywin32's `win32pdh`), by the counter's English name so a localised Windows works.
- `adapter_addresses()`: each display adapter's LUID and PCI bus/device/function from the
  kernel-mode thunks of gdi32 (`D3DKMTEnumAdapters2`, `D3DKMTQueryAdapterInfo` with
  `KMTQAITYPE_ADAPTERADDRESS`), through ctypes.
- `WddmProcessMemory`: the two together as the gateway's per-process memory source.
- `EngineCounterReader`: every `\\GPU Engine(*)\\Utilization Percentage` value through one
  PDH query kept open (a rate: PDH needs two collections); `WddmProcessUtilization`: those
  mapped to NVML's GPUs the same way, as the gateway's per-process utilization source beside
  NVML's (which WDDM often lacks).

Windows only (the type checker checks it with `--platform win32`); elsewhere
`process_memory_source()` and `process_utilization_source()` return None. Every failure is
"unknown" (None or an empty mapping), never an exception into the sampler: a missing counter
keeps the cautious rule (memory unknown counts as 0 beside the device's figure; utilization
unknown is never idle).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rbroker.gpu.process_counters import (
    COUNTER_OBJECT,
    DEDICATED_COUNTER,
    ENGINE_OBJECT,
    UTILIZATION_COUNTER,
    PciAddress,
    dedicated_mib_by_adapter,
    map_adapters,
    observed_mib,
    utilization_by_adapter,
)

log = logging.getLogger(__name__)

#: `(uuid, pids) -> {pid: MiB}` for the pids a counter knows (the gateway's hook).
ProcessMemorySource = Callable[[str, Iterable[int]], dict[int, int]]

#: `uuid -> {pid: percent}` of the processes that ran on that GPU since the previous
#: collection, or None when unknown (the gateway's hook).
ProcessUtilizationSource = Callable[[str], dict[int, int] | None]

COUNTER_PATH = f"\\{COUNTER_OBJECT}(*)\\{DEDICATED_COUNTER}"
ENGINE_COUNTER_PATH = f"\\{ENGINE_OBJECT}(*)\\{UTILIZATION_COUNTER}"

if sys.platform == "win32":
    import ctypes
    from ctypes import wintypes

    import win32pdh

    KMTQAITYPE_ADAPTERADDRESS = 6  # d3dkmthk.h, KMTQUERYADAPTERINFOTYPE
    _MAX_ADAPTERS = 64

    class _LUID(ctypes.Structure):
        _fields_ = [("LowPart", wintypes.DWORD), ("HighPart", wintypes.LONG)]

    class _ADAPTERINFO(ctypes.Structure):
        _fields_ = [
            ("hAdapter", ctypes.c_uint32),
            ("AdapterLuid", _LUID),
            ("NumOfSources", wintypes.ULONG),
            ("bPrecisePresentRegionsPreferred", wintypes.BOOL),
        ]

    class _ENUMADAPTERS2(ctypes.Structure):
        _fields_ = [("NumAdapters", wintypes.ULONG), ("pAdapters", ctypes.POINTER(_ADAPTERINFO))]

    class _QUERYADAPTERINFO(ctypes.Structure):
        _fields_ = [
            ("hAdapter", ctypes.c_uint32),
            ("Type", ctypes.c_int),
            ("pPrivateDriverData", ctypes.c_void_p),
            ("PrivateDriverDataSize", ctypes.c_uint),
        ]

    class _ADAPTERADDRESS(ctypes.Structure):
        _fields_ = [
            ("BusNumber", ctypes.c_uint),
            ("DeviceNumber", ctypes.c_uint),
            ("FunctionNumber", ctypes.c_uint),
        ]

    class _CLOSEADAPTER(ctypes.Structure):
        _fields_ = [("hAdapter", ctypes.c_uint32)]

    def adapter_addresses() -> dict[int, PciAddress]:
        """`{luid: PCI address}` of every WDDM adapter; empty when gdi32 cannot say."""
        gdi32 = ctypes.WinDLL("gdi32")
        infos = (_ADAPTERINFO * _MAX_ADAPTERS)()
        enum = _ENUMADAPTERS2(_MAX_ADAPTERS, infos)
        if gdi32.D3DKMTEnumAdapters2(ctypes.byref(enum)) != 0:
            return {}
        out: dict[int, PciAddress] = {}
        for info in infos[: enum.NumAdapters]:
            luid = (info.AdapterLuid.HighPart & 0xFFFFFFFF) << 32 | info.AdapterLuid.LowPart
            addr = _ADAPTERADDRESS()
            query = _QUERYADAPTERINFO(
                info.hAdapter,
                KMTQAITYPE_ADAPTERADDRESS,
                ctypes.cast(ctypes.byref(addr), ctypes.c_void_p),
                ctypes.sizeof(addr),
            )
            if gdi32.D3DKMTQueryAdapterInfo(ctypes.byref(query)) == 0:
                out[luid] = PciAddress(None, addr.BusNumber, addr.DeviceNumber, addr.FunctionNumber)
            gdi32.D3DKMTCloseAdapter(ctypes.byref(_CLOSEADAPTER(info.hAdapter)))
        return out

    def read_dedicated_usage() -> dict[str, int]:
        """`{instance name: bytes}` of the `Dedicated Usage` counters; empty when the
        counter set is missing (older Windows, a broken counter registry)."""
        query = win32pdh.OpenQuery()
        try:
            counter = win32pdh.AddEnglishCounter(query, COUNTER_PATH)
            win32pdh.CollectQueryData(query)
            values = win32pdh.GetFormattedCounterArray(counter, win32pdh.PDH_FMT_LARGE)
        except Exception as exc:  # pywintypes.error: no such counter, no instances
            log.debug("reading %s failed: %s", COUNTER_PATH, exc)
            return {}
        finally:
            win32pdh.CloseQuery(query)
        return {str(k): int(v) for k, v in values.items()}

    class WddmProcessMemory:
        """Per-process dedicated memory of NVML's GPUs from the counters.

        Args:
            bus_ids: `{uuid: NVML PCI bus id}` of the GPUs (from the gateway).

        The adapter mapping is made once (LUIDs stay the same until the computer
        restarts); the counters are read at most once per `max_age_s` for all GPUs.
        """

        def __init__(self, bus_ids: Mapping[str, str], max_age_s: float = 0.2) -> None:
            self.luids, notes = map_adapters(adapter_addresses(), bus_ids)
            for note in notes:
                log.warning("GPU process memory counters: %s", note)
            self._max_age_s = max_age_s
            self._lock = threading.Lock()
            self._read_at = -1.0
            self._per_adapter: dict[int, dict[int, int]] = {}

        def __call__(self, uuid: str, pids: Iterable[int]) -> dict[int, int]:
            import time

            with self._lock:
                now = time.monotonic()
                if now - self._read_at > self._max_age_s:
                    bad: list[str] = []
                    self._per_adapter = dedicated_mib_by_adapter(read_dedicated_usage(), bad)
                    for line in bad[:3]:
                        log.debug("skipped counter %s", line)
                    self._read_at = now
                return observed_mib(self._per_adapter, self.luids.get(uuid), pids)

    class EngineCounterReader:
        """The `\\GPU Engine(*)\\Utilization Percentage` counters through one PDH query kept
        open: `Utilization Percentage` is a rate PDH computes from two collections of a query,
        so each `collect()` answers for the interval since the previous one.

        `collect()` gives `{luid: {pid: percent}}` (`utilization_by_adapter`), or None: on the
        first collection (no rate yet), and when PDH fails (no such counter set, as under
        Wine; a broken query), after which the query is closed and the next collection is a
        first one again. It never raises. A process whose engines appeared since the previous
        collection has no rate yet and is left out of that one answer.
        """

        def __init__(self) -> None:
            self._query: Any = None
            self._counter: Any = None

        def close(self) -> None:
            """Close the query (the next `collect()` is a first one)."""
            if self._query is not None:
                try:
                    win32pdh.CloseQuery(self._query)
                except Exception as exc:  # pywintypes.error: already gone
                    log.debug("closing the %s query failed: %s", ENGINE_OBJECT, exc)
            self._query = self._counter = None

        def collect(self) -> dict[int, dict[int, int]] | None:
            try:
                if self._query is None:
                    self._query = win32pdh.OpenQuery()
                    self._counter = win32pdh.AddEnglishCounter(self._query, ENGINE_COUNTER_PATH)
                    win32pdh.CollectQueryData(self._query)
                    return None  # a rate needs a second collection
                win32pdh.CollectQueryData(self._query)
                values = win32pdh.GetFormattedCounterArray(self._counter, win32pdh.PDH_FMT_DOUBLE)
            except Exception as exc:  # pywintypes.error: no such counter set, a broken query
                log.debug("reading %s failed: %s", ENGINE_COUNTER_PATH, exc)
                self.close()
                return None
            bad: list[str] = []
            per_adapter = utilization_by_adapter({str(k): v for k, v in values.items()}, bad)
            for line in bad[:3]:
                log.debug("skipped counter %s", line)
            return per_adapter

    class WddmProcessUtilization:
        """Per-process utilization of NVML's GPUs from the `GPU Engine` counters
        (`EngineCounterReader`).

        Args:
            bus_ids: `{uuid: NVML PCI bus id}` of the GPUs (from the gateway).

        The adapter mapping is made once, as for memory; the counters are collected at most
        once per `max_age_s` for all GPUs. A call answers `{pid: percent}` of the processes
        that ran on that GPU's adapter since the previous collection, or None (unknown): on
        the first collection, when PDH fails, and for a GPU mapped to no adapter.
        """

        def __init__(self, bus_ids: Mapping[str, str], max_age_s: float = 0.2) -> None:
            self.luids, notes = map_adapters(adapter_addresses(), bus_ids)
            for note in notes:
                log.warning("GPU engine counters: %s", note)
            self._max_age_s = max_age_s
            self._lock = threading.Lock()
            self._read_at = -1.0
            self._reader = EngineCounterReader()
            self._per_adapter: dict[int, dict[int, int]] | None = None

        def __call__(self, uuid: str) -> dict[int, int] | None:
            import time

            with self._lock:
                now = time.monotonic()
                if now - self._read_at > self._max_age_s:
                    self._per_adapter = self._reader.collect()
                    self._read_at = now
                luid = self.luids.get(uuid)
                if luid is None or self._per_adapter is None:
                    return None
                return dict(self._per_adapter.get(luid, {}))


def process_memory_source(bus_ids: Mapping[str, str]) -> ProcessMemorySource | None:
    """The counter source for these GPUs on Windows, else None (NVML's own figures)."""
    if sys.platform == "win32":
        try:
            return WddmProcessMemory(bus_ids)
        except Exception as exc:  # no gdi32 thunks, no pywin32: per-process memory unknown
            log.warning("GPU process memory counters unavailable: %s", exc)
    return None


def process_utilization_source(bus_ids: Mapping[str, str]) -> ProcessUtilizationSource | None:
    """The `GPU Engine` counter source for these GPUs on Windows, else None (NVML's own
    per-process utilization, or unknown)."""
    if sys.platform == "win32":
        try:
            return WddmProcessUtilization(bus_ids)
        except Exception as exc:  # no gdi32 thunks, no pywin32: per-process utilization unknown
            log.warning("GPU engine counters unavailable: %s", exc)
    return None
