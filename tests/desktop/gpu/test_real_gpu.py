"""Checks on a real NVIDIA GPU (marker `gpu`; skipped without a driver). Run them with
`bench/gpu_check.sh`.

- The NVML contract suite (`test_nvml_gateway.GatewayContract`) runs on real NVML as
  `test_nvml_gateway.py::TestRealNvml`; this file adds what needs a broker on real NVML:
- a broker started without `--simulate` uses real NVML and reports every GPU with a sane
  capacity split;
- where PyTorch with CUDA is installed: memory allocated inside a lease is attributed to
  that lease (observed within 5 % of the allocation plus the CUDA context), and is no
  longer outstanding; and after `lease.limit_torch()` an allocation past the grant raises
  `torch.cuda.OutOfMemoryError` while the lease stays active;
- where JAX with CUDA is installed: with `XLA_PYTHON_CLIENT_MEM_FRACTION` from the lease, an
  allocation past the grant fails while the lease stays active.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rbroker
from rbroker.gpu.nvml import real_nvml_available
from tests.conftest import WORKER, short_tmp, wait_until

pytestmark = [
    pytest.mark.contract,
    pytest.mark.gpu,
    pytest.mark.skipif(not real_nvml_available(), reason="no NVIDIA driver answers here"),
]


@pytest.fixture
def real_broker() -> Iterator[str]:
    """A broker process on real NVML (no --simulate); yields its socket path."""
    root = short_tmp()
    sock = str(root / "broker.sock")
    log = open(root / "broker.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rbroker",
            "broker",
            "--socket",
            sock,
            "--data-dir",
            str(root / "data"),
            "-v",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (root / "broker.log").read_text()
            try:
                with rbroker.Client(sock, timeout_s=5):
                    break
            except rbroker.BrokerUnavailable:
                assert time.monotonic() < deadline, "broker did not answer within 60 s"
                time.sleep(0.1)
        yield sock
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        print(Path(root / "broker.log").read_text()[-3000:])


def test_broker_on_real_nvml_reports_every_gpu(real_broker: str) -> None:
    with rbroker.Client(real_broker) as c:
        hello = c.hello()
        assert hello["simulated"] is False
        assert hello["telemetry_source"] == "nvml"
        status = c.status()
        assert status["driver_version"] not in ("", "unknown", "simulated")
        gpus = c.gpus()
        assert gpus
        for gpu in gpus:
            print(
                f"\n{gpu['uuid']} {gpu['name']}: telemetry {gpu['telemetry']}, "
                f"memory {gpu.get('memory_api')}, total {gpu.get('total_mib')} MiB, "
                f"used {gpu.get('device_used_mib')}, available {gpu.get('available_mib')}"
            )
            assert gpu["uuid"].startswith(("GPU-", "MIG-"))
            if gpu["telemetry"] == "unknown_capacity":
                continue  # memory query not supported on this GPU: refused, by design
            assert gpu["telemetry"] == "ok", gpu
            assert gpu["memory_api"] in ("v1", "v2")
            assert gpu["total_mib"] > 0
            assert 0 <= gpu["device_used_mib"] <= gpu["total_mib"]
            assert gpu["available_mib"] <= gpu["total_mib"] - gpu["headroom_mib"]


def _lease_of(c: rbroker.Client, lease_id: str) -> dict[str, Any]:
    for lease in c.leases()["leases"]:
        if lease["lease_id"] == lease_id:
            return dict(lease)
    raise AssertionError(f"lease {lease_id} not active")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed")
def test_cuda_allocation_is_attributed_to_its_lease(real_broker: str) -> None:
    alloc_mib, lease_mib = 2048, 4096
    worker = subprocess.Popen(
        [sys.executable, "-u", str(WORKER / "cuda_alloc.py"), real_broker, str(lease_mib), "2048"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
    )
    assert worker.stdin is not None and worker.stdout is not None
    try:
        granted = worker.stdout.readline().split()
        assert granted and granted[0] == "granted", granted
        lease_id, uuid = granted[1], granted[2]
        context = worker.stdout.readline().split()
        assert context and context[0] == "context", context
        context_mib = int(context[1])
        if context_mib < 0:
            pytest.skip(
                "NVML does not list this process (another pid namespace, e.g. a container "
                "without --pid=host): its memory stays unknown to the broker, counted as 0"
            )
        assert worker.stdout.readline().split() == ["allocated", str(alloc_mib)]
        expected = context_mib + alloc_mib
        with rbroker.Client(real_broker) as c:

            def observed() -> int:
                return int(_lease_of(c, lease_id)["observed_mib"].get(uuid, 0))

            try:
                wait_until(lambda: abs(observed() - expected) <= 0.05 * expected, timeout_s=15)
            except AssertionError:
                raise AssertionError(
                    f"observed {observed()} MiB, expected {expected} "
                    f"({alloc_mib} allocated + {context_mib} CUDA context) ± 5 %"
                ) from None
            lease = _lease_of(c, lease_id)
            print(
                f"\nlease {lease_id}: granted {lease_mib} MiB, allocated {alloc_mib} + CUDA "
                f"context {context_mib} = {expected} MiB; broker observed "
                f"{lease['observed_mib'][uuid]} MiB"
            )
            assert lease["over_grant"] is False
            (gpu,) = [g for g in c.gpus() if g["uuid"] == uuid]
            own = max(0, lease_mib - lease["observed_mib"][uuid])
            assert gpu["outstanding_mib"] >= own
        worker.stdin.write("done\n")
        worker.stdin.flush()
        assert worker.wait(60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        worker.stdin.close()
        worker.stdout.close()


def _capped(real_broker: str, framework: str, lease_mib: int = 2048) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-u", str(WORKER / "capped_alloc.py"), real_broker, str(lease_mib),
         framework],
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    print(f"\n{framework}: {out}")
    return dict(out)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed")
def test_limit_torch_stops_an_allocation_past_the_grant(real_broker: str) -> None:
    out = _capped(real_broker, "torch")
    (fraction,) = out["fractions"]
    assert 0 < fraction <= out["memory_fraction"] + 0.01
    assert out["first_ok"] is True  # half the grant fits under the cap
    assert out["second_error"] == "OutOfMemoryError", out  # the grant again on top: refused
    assert out["lease_active"] is True  # the lease is intact: rbroker never stops work


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX not installed")
def test_jax_memory_fraction_stops_an_allocation_past_the_grant(real_broker: str) -> None:
    out = _capped(real_broker, "jax")
    assert out["first_ok"] is True
    assert out["second_error"] is not None, out  # RESOURCE_EXHAUSTED from XLA's allocator
    assert out["lease_active"] is True
