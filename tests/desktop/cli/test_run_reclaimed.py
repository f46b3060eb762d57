"""An idle lease reclaimed by policy, end to end with real processes (issue 42;
docs/architecture.md §3 "Idle" and "Reclaim"): a broker process with `[idle]`
`reclaim_after_s`, a holder under `rbroker run` whose command uses its GPU and then stops,
and a second `rbroker run` waiting for that memory. The rule itself (warning, thresholds,
exempt projects) is tested on the in-process harness (tests/desktop/broker/test_reclaim.py);
what only processes show is here: the holder's own `rbroker run` says it on stderr, its
command is not killed and goes on, and the waiter's command runs once the lease is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rbroker.gpu.nvml import in_child_pid_namespace
from tests.conftest import GPU0, SINGLE_24G, BrokerProcess, wait_until

pytestmark = pytest.mark.contract  # it starts a broker and commands of its own

# the command under the holder's lease: 8 000 MiB in use on its GPU (what a CUDA allocation
# would show), its pid for the test, then it sleeps until told to stop
HOLDER = """
import os, sys, time, rbroker
with rbroker.Client(os.environ["RBROKER_SOCKET"]) as client:
    client.sim_allocate(8000)  # the one GPU
Path = __import__("pathlib").Path
Path(sys.argv[1]).write_text(str(os.getpid()))
stop = Path(sys.argv[2])
while not stop.exists():
    time.sleep(0.05)
print("holder went on", flush=True)
"""


def _run(broker: BrokerProcess, mib: int, wait_s: float, *cmd: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["RBROKER_SOCKET"] = broker.socket
    args = [sys.executable, "-m", "rbroker", "run", "--socket", broker.socket, "--mib", str(mib)]
    args += ["--project", "tests", "--purpose", "reclaim test", "--wait", str(wait_s), "--", *cmd]
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_holder_that_stops_using_its_gpu_is_reclaimed_and_the_waiter_runs(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    if in_child_pid_namespace():
        pytest.skip("NVML's pids are the host's: from a child pid namespace idle is unknown")
    config = tmp_path / "broker.toml"
    config.write_text("[idle]\nidle_after_s = 1\nreclaim_after_s = 3\n")
    bp = broker_factory(SINGLE_24G, extra_args=["--config", str(config)])
    pid_file, stop = tmp_path / "pid", tmp_path / "stop"
    # 24 576 MiB − 1 229 headroom: 16 000 leased leaves 7 347, short of the waiter's 8 000
    holder = _run(bp, 16000, 0, sys.executable, "-c", HOLDER, str(pid_file), str(stop))
    waiter = None
    try:
        assert wait_until(lambda: pid_file.exists() or holder.poll() is not None, timeout_s=30)
        assert holder.poll() is None, holder.communicate()
        pid = pid_file.read_text()
        with bp.client() as c:
            c.call("sim.set", gpu_uuid=GPU0, process_utilization={pid: 60})  # busy
            waiter = _run(bp, 8000, 60, sys.executable, "-c", "print('waiter ran')")
            assert wait_until(lambda: c.leases()["queue"], timeout_s=20)
            # busy for longer than reclaim_after_s with a request waiting: never reclaimed
            assert not _ended(c, within_s=5)
            (lease,) = c.leases()["leases"]
            assert lease["idle_state"] == "active", lease
            c.call("sim.set", gpu_uuid=GPU0, process_utilization={pid: 0})  # it stops
            assert wait_until(lambda: _ended(c, within_s=0), timeout_s=20)
            ended_leases = c.leases(include_ended=True)["ended"]
            (ended,) = [x for x in ended_leases if x["granted_mib"] == 16000]
        assert ended["state"] == "revoked"
        assert ended["ended_reason"].startswith("reclaimed: idle "), ended
        assert ended["ended_reason"].endswith(" while 1 request waited"), ended
        out, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 0, err
        assert out.strip() == "waiter ran"
        # nothing was killed: the holder's command goes on and ends with its own code
        assert holder.poll() is None
        stop.touch()
        out, err = holder.communicate(timeout=30)
        assert holder.returncode == 0, err
        assert out.strip() == "holder went on"
        # told while it runs ("runs on"), or at its end when the command ended first
        # ("ran its last part": once the reclaim came as the stop file was written)
        assert "reclaimed: idle" in err and " WITHOUT a lease" in err, err
    finally:
        for proc in (holder, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)


def _ended(client: object, within_s: float) -> bool:
    """Whether the 16 000 MiB lease ended, polling up to `within_s` seconds."""

    def gone() -> bool:
        view = client.leases(include_ended=True)  # type: ignore[attr-defined]
        return any(x["granted_mib"] == 16000 for x in view["ended"])

    if within_s <= 0:
        return gone()
    try:
        wait_until(gone, timeout_s=within_s)
    except AssertionError:
        return False
    return True
