"""Where the broker looks for nvml.dll on Windows (issue 13, item 4): System32, the driver
store's `nv*` folders (newest first), NVSMI; and the one message that lists them all.

The search list is pure: here it runs over a directory laid out like a Windows install.
Loading the library (`preload_windows_nvml`) needs Windows: there (and under Wine) the fake
NVIDIA driver's `nvml.dll` (`tests/fakes/nvml_driver`, which `.ci/wine` and the Windows CI
job build) is placed in each place the search looks, or in none, or beside a file that is
not a DLL, and is found, loaded and read through `NvmlGateway`; and a broker process on real
NVML (no `--simulate`) finds it in a driver store and admits by its figures.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType

import pytest

import rbroker
from rbroker.base.children import HARD_KILL, spawn
from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker.broker.service import Broker
from rbroker.cli.main import main
from rbroker.demo.processes import SimulatedBroker, broker_address, broker_command
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway, TelemetryError
from rbroker.gpu.nvml_discovery import (
    NvmlNotFound,
    not_found_message,
    preload_windows_nvml,
    windows_candidates,
)
from rbroker.gpu.types import TelemetryState
from rbroker_protocol.errors import RpcError
from rbroker_protocol.localapi import AcquireParams
from tests.conftest import GPU0, SINGLE_24G, BrokerProcess
from tests.fakes import nvml_driver

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


def _windows(tmp_path: Path) -> tuple[Path, Path]:
    windir = tmp_path / "Windows"
    store = windir / "System32" / "DriverStore" / "FileRepository"
    for name, mtime in (
        ("nvltsi.inf_amd64_0a1b2c3d4e5f6a7b", 1_700_000_000),  # an older driver left over
        ("nvlti.inf_amd64_9f8e7d6c5b4a3f2e", 1_760_000_000),  # the current driver
        ("iigd_dch.inf_amd64_1234567890abcdef", 1_770_000_000),  # Intel: not NVIDIA's
    ):
        folder = store / name
        folder.mkdir(parents=True)
        (folder / "nvml.dll").write_bytes(b"MZ")
        os.utime(folder, (mtime, mtime))
    return windir, tmp_path / "Program Files"


def test_search_order_system32_driver_store_newest_first_then_nvsmi(tmp_path: Path) -> None:
    windir, program_files = _windows(tmp_path)
    found = windows_candidates({"WINDIR": str(windir), "ProgramFiles": str(program_files)})
    store = windir / "System32" / "DriverStore" / "FileRepository"
    assert found == [
        windir / "System32" / "nvml.dll",
        store / "nvlti.inf_amd64_9f8e7d6c5b4a3f2e" / "nvml.dll",
        store / "nvltsi.inf_amd64_0a1b2c3d4e5f6a7b" / "nvml.dll",
        program_files / "NVIDIA Corporation" / "NVSMI" / "nvml.dll",
    ]


def test_without_a_driver_store_the_pattern_is_still_named(tmp_path: Path) -> None:
    found = windows_candidates({"SystemRoot": str(tmp_path / "W")})
    store = tmp_path / "W" / "System32" / "DriverStore" / "FileRepository"
    assert found[1] == store / "nv*" / "nvml.dll"
    assert found[-1] == Path("C:\\Program Files") / "NVIDIA Corporation" / "NVSMI" / "nvml.dll"
    assert windows_candidates({})[0] == Path("C:\\Windows") / "System32" / "nvml.dll"


def test_one_message_lists_every_place_and_why(tmp_path: Path) -> None:
    windir, program_files = _windows(tmp_path)
    places = windows_candidates({"WINDIR": str(windir), "ProgramFiles": str(program_files)})
    tried = [(p, "missing") for p in places[:1]]
    tried += [(p, "[WinError 193] %1 is not a valid Win32 application") for p in places[1:3]]
    tried.append((places[3], "missing"))
    message = not_found_message(tried)
    assert "\n" not in message
    for path in places:
        assert str(path) in message
    assert message.count("(missing)") == 2
    assert message.count("WinError 193") == 2
    assert "--simulate" in message


@pytest.mark.skipif(sys.platform == "win32", reason="the refusal off Windows")
def test_preload_is_for_windows_only() -> None:
    with pytest.raises(RuntimeError, match="for Windows"):
        preload_windows_nvml(object())


def test_where_it_looked_reaches_status_and_refusals(tmp_path: Path) -> None:
    """The gateway's pre-init step (on Windows: the nvml.dll search) fails with the message;
    the broker starts fail-closed and says that message, not a generic one, in
    `broker.status` and in every refusal."""
    windir, program_files = _windows(tmp_path)
    places = windows_candidates({"WINDIR": str(windir), "ProgramFiles": str(program_files)})
    message = not_found_message([(p, "missing") for p in places])
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SINGLE_24G)
    fake = FakeNvml(scenario)  # a GPU exists; its library cannot be found
    gateway = NvmlGateway(fake, source="nvml")

    def not_found() -> None:
        raise TelemetryError(
            TelemetryState.UNAVAILABLE, "library_not_found", message, words=message
        )

    gateway.before_init = not_found
    config = BrokerConfig(socket_path=tmp_path / "unused.sock", data_dir=tmp_path)
    broker = Broker(config, gateway, fake)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(broker.start(background=False))
        problem = broker.status()["nvml_problem"]
        assert problem["reason"] == "library_not_found"
        assert problem["words"] == message
        params = AcquireParams(mib=1024, project="t", session="t", purpose="t")
        with pytest.raises(RpcError) as err:
            loop.run_until_complete(broker.acquire(params, "tester", Holder.of(os.getpid()), 1))
        assert f"telemetry unavailable: {message}" in str(err.value)
        assert str(places[1]) in str(err.value)
    finally:
        loop.run_until_complete(broker.stop())
        loop.close()


def test_rbroker_status_says_why_nvml_does_not_answer(
    broker_factory: Callable[..., BrokerProcess], capsys: pytest.CaptureFixture[str]
) -> None:
    """`rbroker status` prints the NVML problem's words (here the simulated driver's
    `library_not_found`, naming the library as this OS calls it)."""
    broker = broker_factory('[nvml]\ninit_error = "library_not_found"\n\n' + SINGLE_24G)
    assert main(["status", "--socket", str(broker.socket)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    library = "nvml.dll" if sys.platform == "win32" else "libnvidia-ml"
    assert f"GPU telemetry: the NVML library ({library}) is not installed" in out


@pytest.mark.skipif(sys.platform != "win32", reason="Windows only: the nvml.dll search")
def test_a_real_broker_without_nvml_dll_says_each_place_it_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker on real NVML (no --simulate) whose Windows folders hold no loadable
    nvml.dll (System32 has none, the driver store two that are not DLLs, no NVSMI) starts
    fail-closed; `rbroker status` says, on one line, each place it looked and why, and a
    lease is refused (`infeasible`: no GPU seen) with the same words."""
    windir, _ = _windows(tmp_path)
    address = broker_address(tmp_path)
    cmd = broker_command(address, tmp_path / "data", None)  # no scenario: real NVML
    # WINDIR moves System32 and the driver store; ProgramFiles stays this computer's (Wine
    # sets it again in every new process): NVSMI is looked for there
    env = {**os.environ, "WINDIR": str(windir)}
    program_files = Path(os.environ.get("PROGRAMFILES") or "C:\\Program Files")
    with open(tmp_path / "broker.log", "wb") as log:
        proc = spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    broker = SimulatedBroker(proc, address, tmp_path / "data", Path(), tmp_path / "broker.log")
    try:
        broker.wait_answering(30)
        monkeypatch.setenv("COLUMNS", "1000")  # rich folds a long path at the width
        assert main(["status", "--socket", address]) == 0
        out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
        store = windir / "System32" / "DriverStore" / "FileRepository"
        for place in (
            windir / "System32" / "nvml.dll",
            store / "nvlti.inf_amd64_9f8e7d6c5b4a3f2e" / "nvml.dll",
            store / "nvltsi.inf_amd64_0a1b2c3d4e5f6a7b" / "nvml.dll",
            program_files / "NVIDIA Corporation" / "NVSMI" / "nvml.dll",
        ):
            assert str(place) in out, (place, out)
        assert f"{windir / 'System32' / 'nvml.dll'} (missing)" in out
        assert "not a valid Win32 application" in out or "WinError" in out, out
        lease = rbroker.lease(1024, project="t", session="t", purpose="t", socket=address)
        with pytest.raises(rbroker.Infeasible) as err, lease:  # no GPU seen at all
            pass
        assert "nvml.dll" in str(err.value)
        assert str(windir / "System32" / "nvml.dll") in str(err.value)
    finally:
        broker.terminate(HARD_KILL)


# -- the search for real: the fake driver's nvml.dll where drivers put it (issue 39) ---------
WINDOWS_ONLY = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows only: loading nvml.dll (under Wine on Linux CI)"
)
STORE_FOLDER = "nvlti.inf_amd64_9f8e7d6c5b4a3f2e"
DRIVER = """
[[gpu]]
uuid = "GPU-5a1e0000-0000-0000-0000-000000000001"
name = "Fake RTX 4090"
total_mib = 24576
used_mib = 1000
[[gpu.process]]
pid = 4000
used_mib = 2048
"""


def _tree(root: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """A Windows install under `root` with no nvml.dll yet: its `WINDIR` and `ProgramFiles`,
    and the three places the search looks (one driver-store folder)."""
    windir, program_files = root / "Windows", root / "Program Files"
    (windir / "System32").mkdir(parents=True)
    (program_files / "NVIDIA Corporation").mkdir(parents=True)
    store = windir / "System32" / "DriverStore" / "FileRepository"
    places = {
        "System32": windir / "System32" / "nvml.dll",
        "driver store": store / STORE_FOLDER / "nvml.dll",
        "NVSMI": program_files / "NVIDIA Corporation" / "NVSMI" / "nvml.dll",
    }
    return {"WINDIR": str(windir), "ProgramFiles": str(program_files)}, places


def _place(library: Path, where: Path) -> Path:
    where.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(library, where)
    return where


def _loaded_file(lib: ctypes.CDLL) -> Path:
    """The file Windows loaded for `lib` (GetModuleFileNameW of its handle)."""
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    get_name = kernel32.GetModuleFileNameW
    get_name.argtypes = [wintypes.HMODULE, wintypes.LPWSTR, wintypes.DWORD]
    buf = ctypes.create_unicode_buffer(32768)
    n = get_name(lib._handle, buf, len(buf))
    assert n > 0, f"GetModuleFileNameW: error {ctypes.get_last_error()}"
    return Path(buf.value)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake driver's state (one GPU) in `RBROKER_FAKE_NVML_STATE`."""
    path = nvml_driver.write_state(tmp_path / "driver.state", textwrap.dedent(DRIVER))
    monkeypatch.setenv(nvml_driver.STATE_ENV, str(path))
    return path


@pytest.fixture
def pynvml_copy() -> ModuleType:
    """A new private pynvml bound to no library (each test's own: a bound one stays bound)."""
    return nvml_driver.unbound()


def _read_through(lib: ModuleType) -> None:
    """Initialise through the bound copy and read the fake driver's GPU as the broker does."""
    gateway = NvmlGateway(lib, source="nvml")
    try:
        assert [info.uuid for info in gateway.enumerate()] == [GPU0]
        sample = gateway.read(GPU0)
        assert (sample.total_mib, sample.device_used_mib) == (24576, 1000 + 2048)
        assert [(p.pid, p.used_mib) for p in sample.processes] == [(4000, 2048)]
        assert gateway.driver_version() == "550.54.14"
    finally:
        gateway.shutdown()


@WINDOWS_ONLY
@pytest.mark.parametrize(
    ("place", "old"),
    [("System32", False), ("driver store", False), ("NVSMI", True)],
    ids=["system32", "driver-store", "nvsmi-old-driver"],
)
def test_nvml_dll_is_found_loaded_and_read_in_each_place(
    tmp_path: Path, state: Path, pynvml_copy: ModuleType, place: str, old: bool
) -> None:
    """The fake driver's nvml.dll alone in one place of the search (NVSMI: a driver before
    R510, as pre-DCH installs are) is the one loaded, by path, into pynvml (the module
    Windows reports for its handle is that file), and the GPU reads through it; the places
    before it are empty."""
    environ, places = _tree(tmp_path / "install")
    placed = _place(nvml_driver.windows_library(old), places[place])
    assert preload_windows_nvml(pynvml_copy, environ) == str(placed)
    assert os.path.samefile(_loaded_file(pynvml_copy.nvmlLib), placed)
    _read_through(pynvml_copy)
    assert preload_windows_nvml(pynvml_copy, environ) == "already loaded"


@WINDOWS_ONLY
def test_with_nvml_dll_nowhere_the_refusal_names_every_place(
    tmp_path: Path, state: Path, pynvml_copy: ModuleType
) -> None:
    environ, places = _tree(tmp_path / "install")
    with pytest.raises(NvmlNotFound) as err:
        preload_windows_nvml(pynvml_copy, environ)
    message = str(err.value)
    assert "\n" not in message
    store = places["driver store"].parent.parent
    for place in (places["System32"], store / "nv*" / "nvml.dll", places["NVSMI"]):
        assert f"{place} (missing)" in message, (place, message)
    assert message.count("(missing)") == 3
    assert pynvml_copy.nvmlLib is None


@WINDOWS_ONLY
def test_a_file_that_is_not_a_dll_is_passed_over_with_the_loaders_error(
    tmp_path: Path, state: Path, pynvml_copy: ModuleType
) -> None:
    """A few bytes named nvml.dll in System32 (a broken install): the loader refuses it, the
    search goes on to the driver store and uses the library there; with nothing after it,
    the refusal names System32 with the loader's own error, not `missing`."""
    for install in ("with-a-driver", "without"):
        environ, places = _tree(tmp_path / install)
        bad = places["System32"]
        bad.write_bytes(b"MZ\x90\x00 not a library")
        if install == "with-a-driver":
            placed = _place(nvml_driver.windows_library(), places["driver store"])
            assert preload_windows_nvml(pynvml_copy, environ) == str(placed)
            assert os.path.samefile(_loaded_file(pynvml_copy.nvmlLib), placed)
            _read_through(pynvml_copy)
            continue
        with pytest.raises(OSError) as loader:
            ctypes.CDLL(str(bad))
        with pytest.raises(NvmlNotFound) as err:
            preload_windows_nvml(nvml_driver.unbound(), environ)
        assert f"{bad} ({loader.value})" in str(err.value), str(err.value)
        assert f"{places['NVSMI']} (missing)" in str(err.value)


BROKER_DRIVER = """
[[gpu]]
uuid = "GPU-5a1e0000-0000-0000-0000-000000000001"
name = "Fake RTX 4090"
total_mib = 24576
used_mib = 3000
"""
AVAILABLE_MIB = 24576 - 1229 - 3000  # total − default headroom − the driver's used: 20 347
USABLE_MIB = 24576 - 1229  # what one lease may ever hold: 23 347


@WINDOWS_ONLY
def test_a_real_broker_finds_the_fake_driver_and_admits_by_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rbroker broker` on real NVML (no --simulate) whose `WINDIR` is a tree holding the fake
    driver's nvml.dll in a driver-store folder (ProgramFiles cannot be moved: Wine sets it
    again in every new process under Wine, so NVSMI is not used here): it loads that file (its log
    says so), `rbroker status` says "NVML (driver 550.54.14)" and shows the driver's GPU, and
    leases are granted and refused by the capacity arithmetic (architecture.md §2) on the
    driver's figures: 24 576 MiB total, 3 000 used, 1 229 headroom."""
    environ, places = _tree(tmp_path / "install")
    placed = _place(nvml_driver.windows_library(), places["driver store"])
    state = nvml_driver.write_state(tmp_path / "driver.state", textwrap.dedent(BROKER_DRIVER))
    address = broker_address(tmp_path)
    cmd = [*broker_command(address, tmp_path / "data", None), "-v"]  # no scenario: real NVML
    env = {**os.environ, "WINDIR": environ["WINDIR"], nvml_driver.STATE_ENV: str(state)}
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log:
        proc = spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    broker = SimulatedBroker(proc, address, tmp_path / "data", Path(), log_path)

    def lease(mib: int) -> AbstractContextManager[rbroker.Lease]:
        return rbroker.lease(mib, project="t", session="t", purpose="t", socket=address)

    try:
        broker.wait_answering(30)
        monkeypatch.setenv("COLUMNS", "1000")  # rich folds long lines at the width
        assert main(["status", "--socket", address]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "telemetry: NVML (driver 550.54.14)" in out, out
        assert f"24576 {AVAILABLE_MIB}" in out and GPU0 in out, out  # total, available
        assert "GPU telemetry:" not in out, out  # no NVML problem
        with pytest.raises(rbroker.CapacityUnavailable), lease(AVAILABLE_MIB + 1):
            pass
        with lease(AVAILABLE_MIB) as held:
            assert held.gpu_uuid == GPU0
            with pytest.raises(rbroker.CapacityUnavailable), lease(1):
                pass  # the grant is outstanding: nothing is left
        with pytest.raises(rbroker.Infeasible), lease(USABLE_MIB + 1):
            pass
        assert f"NVML library: {placed}" in log_path.read_text(errors="replace")
    finally:
        broker.terminate(HARD_KILL)
