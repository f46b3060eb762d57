"""How `rbroker run` and the SDK name the granted GPU in `CUDA_VISIBLE_DEVICES`.

Right values: a plain GPU by its NVML index with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (tools that
parse the variable as integers break on a UUID), a MIG slice by its `MIG-` UUID (it has no
index of its own), and `--cuda-devices index|uuid` to choose. The child's environment is read
back by a real child process of a real `rbroker run` against real broker processes: the
simulated two-GPU broker, and a broker on a simulated MIG-enabled GPU (`tests.desktop.mig`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rbroker
from tests.conftest import WORKER, BrokerProcess, short_tmp
from tests.desktop.mig import SLICE_A, SLICE_B
from tests.fakes.gpu_scenarios import GPU0, GPU1, gpu, scenario

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

REPORT_ENV = str(Path(WORKER) / "report_env.py")
ROOT = Path(__file__).resolve().parents[3]

TWO_24G = scenario(gpu(GPU0, name="Simulated RTX 4090"), gpu(GPU1, name="Simulated RTX 4090"))


def _env(socket: str) -> dict[str, str]:
    drop = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["RBROKER_SOCKET"] = socket
    return env


def _run(
    socket: str, tmp_path: Path, *flags: str, gpu: str | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    out = tmp_path / "report.json"
    out.unlink(missing_ok=True)
    args = [sys.executable, "-m", "rbroker", "run", "--socket", socket, "--mib", "4096"]
    args += ["--project", "tests", "--purpose", "cuda devices", *flags]
    if gpu is not None:
        args += ["--gpu", gpu]
    args += ["--", sys.executable, REPORT_ENV, str(out), "0"]
    done = subprocess.run(args, env=_env(socket), capture_output=True, text=True, timeout=60)
    return done, json.loads(out.read_text()) if out.exists() else None


@pytest.fixture
def two_gpus(broker_factory: Any) -> BrokerProcess:
    bp: BrokerProcess = broker_factory(TWO_24G)
    return bp


@pytest.fixture
def mig_socket() -> Iterator[str]:
    """A broker process serving the two slices of a simulated MIG-enabled GPU."""
    root = short_tmp()
    sock = str(root / "broker.sock")
    log = open(root / "broker.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.desktop.mig", sock, str(root / "data")],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, (root / "broker.log").read_text()
            try:
                with rbroker.Client(sock, timeout_s=2) as c:
                    if len(c.gpus()) == 2:
                        break
            except rbroker.BrokerUnavailable:
                pass
            assert time.monotonic() < deadline, "the MIG broker did not answer within 20 s"
            time.sleep(0.05)
        yield sock
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


def _no_leases(socket: str) -> bool:
    with rbroker.Client(socket) as c:
        deadline = time.monotonic() + 10
        while c.leases()["leases"] and time.monotonic() < deadline:
            time.sleep(0.05)
        return not c.leases()["leases"]


def test_plain_gpu_is_named_by_index_with_pci_bus_order(
    two_gpus: BrokerProcess, tmp_path: Path
) -> None:
    # GPU1 is NVML index 1: before, the child saw its UUID (GPU-5a1e…0002) and no order
    for flags in ((), ("--cuda-devices", "auto"), ("--cuda-devices", "index")):
        done, report = _run(two_gpus.socket, tmp_path, *flags, gpu=GPU1)
        assert done.returncode == 0, done.stderr
        assert report is not None
        assert report["cuda_visible_devices"] == "1"
        assert report["cuda_device_order"] == "PCI_BUS_ID"
    done, report = _run(two_gpus.socket, tmp_path, "--cuda-devices", "uuid", gpu=GPU1)
    assert done.returncode == 0, done.stderr
    assert report is not None
    assert report["cuda_visible_devices"] == GPU1
    assert report["cuda_device_order"] is None


def test_mig_slice_is_named_by_uuid(mig_socket: str, tmp_path: Path) -> None:
    for flags in ((), ("--cuda-devices", "uuid")):
        done, report = _run(mig_socket, tmp_path, *flags, gpu=SLICE_B)
        assert done.returncode == 0, done.stderr
        assert report is not None
        assert report["cuda_visible_devices"] == SLICE_B  # both slices share NVML index 0
        assert report["cuda_device_order"] is None
    # an index cannot name a slice: refused in one line, the command never runs, lease freed
    done, report = _run(mig_socket, tmp_path, "--cuda-devices", "index", gpu=SLICE_A)
    assert done.returncode == 2
    assert report is None
    assert done.stderr.strip().splitlines() == [
        f"rbroker run: cannot name {SLICE_A} by index: a MIG slice has no CUDA index; "
        "use the UUID form (--cuda-devices uuid or auto)"
    ]
    assert _no_leases(mig_socket)


def test_sdk_lease_offers_the_same_choice(two_gpus: BrokerProcess, mig_socket: str) -> None:
    with rbroker.lease(
        1024, project="tests", session="sdk", purpose="cuda env", gpu_uuid=GPU1,
        socket=two_gpus.socket,
    ) as lease:  # fmt: skip
        assert lease.cuda_visible_devices == GPU1  # unchanged meaning: the UUIDs
        assert lease.gpu_indices == [1]
        assert lease.cuda_env() == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        assert lease.cuda_env("index") == lease.cuda_env()
        assert lease.cuda_env("uuid") == {"CUDA_VISIBLE_DEVICES": GPU1}
        with pytest.raises(ValueError, match="unknown CUDA device form 'pci'"):
            lease.cuda_env("pci")
    with rbroker.lease(
        1024, project="tests", session="sdk", purpose="cuda env", socket=mig_socket
    ) as lease:
        assert lease.gpu_uuid in (SLICE_A, SLICE_B)
        assert lease.gpu_indices is None
        assert lease.cuda_env() == {"CUDA_VISIBLE_DEVICES": lease.gpu_uuid}
        with pytest.raises(ValueError, match="a MIG slice has no CUDA index"):
            lease.cuda_env("index")


def test_the_flag_is_documented_in_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rbroker", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0
    assert "--cuda-devices {auto,index,uuid}" in done.stdout
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "rbroker", "run", "--mib", "1", "--cuda-devices", "pci", "--", "x"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "invalid choice: 'pci'" in bad.stderr
