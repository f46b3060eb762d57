"""Where the broker looks for nvml.dll on Windows (issue 13, item 4): System32, the driver
store's `nv*` folders (newest first), NVSMI; and the one message that lists them all.

The search list is pure: here it runs over a directory laid out like a Windows install.
Loading the library (`preload_windows_nvml`) needs Windows.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import rbroker
from rbroker._children import HARD_KILL, spawn
from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker.broker.service import Broker
from rbroker.cli.main import main
from rbroker.demo.processes import SimulatedBroker, broker_address, broker_command
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway, TelemetryError
from rbroker.gpu.nvml_discovery import not_found_message, preload_windows_nvml, windows_candidates
from rbroker.gpu.types import TelemetryState
from rbroker_protocol.errors import RpcError
from rbroker_protocol.localapi import AcquireParams
from tests.conftest import SINGLE_24G, BrokerProcess


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
