"""Adoption with the numbers of issue 3, case 8 (architecture.md §3 adoption, §2 arithmetic).

A process already using 16 384 MiB on a 24 576 MiB GPU (headroom 1 024, 153 MiB used by a
graphics process) adopts a 16 384 MiB lease: admitted, and available is then 7 015 MiB.
The process is a real one; the simulated driver lists it through the scenario file.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

import rbroker
from tests.conftest import GPU0, SINGLE_24G, BrokerProcess, wait_until

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

TOTAL, HEADROOM, GRAPHICS, HELD = 24576, 1024, 153, 16384

HOLDER = """
import sys
import rbroker

socket_path, adopt = sys.argv[1], sys.argv[2] == "adopt"
try:
    with rbroker.lease(16384, adopt=adopt, project="tests", session="adopt",
                       purpose="adopt what it holds", socket=socket_path) as lease:
        print(f"granted {lease.lease_id}", flush=True)
        sys.stdin.readline()
except rbroker.RBrokerError as exc:
    print(f"error {exc.code} {exc.data.get('available_mib')}", flush=True)
"""


def _gpu(c: rbroker.Client) -> dict[str, Any]:
    (gpu,) = c.gpus()
    return dict(gpu)


def _scenario(pid: int) -> str:
    return (
        SINGLE_24G
        + f'\n[[gpu.process]]\npid = 4242\nkind = "graphics"\nused_mib = {GRAPHICS}\n'
        + f'\n[[gpu.process]]\npid = {pid}\nkind = "compute"\nused_mib = {HELD}\n'
    )


def test_case8_adopting_16_gib_already_in_use(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(SINGLE_24G, headroom_mib=HEADROOM)
    procs: list[subprocess.Popen[str]] = []
    try:
        # The asker starts paused; the driver lists its pid with 16 384 MiB; then it execs
        # the holder script (same pid, same start time) which asks from its own connection.
        asker = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import os, sys; sys.stdin.readline(); "
                f"os.execv(sys.executable, [sys.executable, '-c', {HOLDER!r}, "
                f"{broker.socket!r}, 'adopt'])",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(asker)
        broker.write_scenario(_scenario(asker.pid))
        with broker.client() as c:
            wait_until(lambda: _gpu(c)["device_used_mib"] == HELD + GRAPHICS)
            gpu = _gpu(c)
            assert gpu["available_mib"] == TOTAL - HEADROOM - HELD - GRAPHICS == 7015

            assert asker.stdin is not None and asker.stdout is not None
            asker.stdin.write("go\n")
            asker.stdin.flush()
            line = asker.stdout.readline().strip()
            assert line.startswith("granted"), line
            lease_id = line.split()[1]

            (lease,) = c.leases()["leases"]
            assert lease["lease_id"] == lease_id
            assert lease["adopt"] is True
            assert lease["granted_mib"] == HELD
            assert lease["admission"][GPU0]["extra_mib"] == 0
            assert lease["observed_mib"] == {GPU0: HELD}
            assert lease["over_grant"] is False
            gpu = _gpu(c)
            assert (gpu["device_used_mib"], gpu["outstanding_mib"], gpu["available_mib"]) == (
                HELD + GRAPHICS,
                0,
                7015,
            )
            # the same request without adopt is refused with the numbers
            with pytest.raises(rbroker.CapacityUnavailable) as refused:
                c.call(
                    "lease.acquire",
                    mib=HELD,
                    project="tests",
                    session="no-adopt",
                    purpose="without adopt",
                )
            assert refused.value.data["available_mib"] == 7015
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    stream.close()
