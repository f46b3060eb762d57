"""The processes of a demo world: brokers, lease-holding workers and jobs, started as real
child processes that never outlive the demo.

Every child leads its own process group and ends with the demo (`rbroker.base.children.spawn`:
PR_SET_PDEATHSIG on Linux, a kill-on-close Job object on Windows), so a demo killed without
cleanup leaves nothing behind; `ProcessGroup` stops them all (the group first, so a job's
pool workers go too). A broker's address is `broker_address(root)`: a Unix socket in its
directory, or on Windows a named pipe named after that directory.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from rbroker.base.children import HARD_KILL, bind_to_parent, signal_tree, spawn
from rbroker.hosting.machine_lock import PER_SOCKET


def broker_address(root: Path, name: str = "broker") -> str:
    """The local API address of a broker whose files live in directory `root`: on POSIX the
    Unix socket `root/NAME.sock`; on Windows (no sockets in directories there) the named
    pipe `\\\\.\\pipe\\rbroker-NAME-<root's name>-<8 hex digits of root's full path>`, one per
    directory. Keep `root` short on POSIX: a socket path has at most ~100 bytes."""
    if sys.platform != "win32":
        return str(root / f"{name}.sock")
    full = str(Path(root).absolute()).lower()
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(root).name)[-40:].strip("-") or "root"
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return rf"\\.\pipe\rbroker-{name}-{tag}-{digest}"


def broker_command(socket: str, data_dir: Path, scenario: Path | None) -> list[str]:
    """`python -m rbroker broker` on `socket` and `data_dir`; simulated from `scenario`
    (a TOML file) when given, else on the real GPUs.

    A simulated broker admits against no real GPU memory, so it takes a machine lock of its
    own (`--machine-lock per-socket`): the demo's, the tests' and the benchmarks' brokers run
    side by side, and beside a real broker. On real GPUs it takes the machine-wide lock."""
    simulate = (
        ["--simulate", str(scenario), "--machine-lock", PER_SOCKET] if scenario is not None else []
    )
    return [
        sys.executable, "-m", "rbroker", "broker", *simulate,
        "--socket", socket, "--data-dir", str(data_dir),
    ]  # fmt: skip


@dataclass
class SimulatedBroker:
    """A running `python -m rbroker broker --simulate SCENARIO` process (what the tests and
    the benchmarks start): its socket, data dir, scenario file and log, all under one root."""

    proc: subprocess.Popen[bytes]
    socket: str
    data_dir: Path
    scenario: Path
    log_path: Path

    @classmethod
    def start(
        cls,
        scenario_text: str,
        root: Path,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        timeout_s: float = 20.0,
        **fields: Any,
    ) -> Any:
        """Write `scenario_text` (dedented) to `root/scenario.toml`, start the broker on
        `broker_address(root)` and `root/data` with the extra `args` (its output appended to
        `root/broker.log`, `env` added to this process's environment) and wait until it
        answers a local API connection. `fields` go to the constructor of `cls`.

        Raises:
            RuntimeError: it exited or did not answer within `timeout_s` (with its log).
        """
        scenario = root / "scenario.toml"
        scenario.write_text(textwrap.dedent(scenario_text))
        sock = broker_address(root)
        cmd = [*broker_command(sock, root / "data", scenario), *args]
        log_path = root / "broker.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        bind_to_parent(proc)  # Windows: ended with this process (the tests', the benchmarks')
        broker = cls(proc, sock, root / "data", scenario, log_path, **fields)
        broker.wait_answering(timeout_s)
        return broker

    def wait_answering(self, timeout_s: float) -> None:
        """Wait until the broker accepts a connection (killed with SIGKILL on failure).

        Raises:
            RuntimeError: it exited or did not answer within `timeout_s` (with its log).
        """
        from rbroker.base.exceptions import BrokerUnavailable
        from rbroker.client.local import Client

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with Client(self.socket, timeout_s=2):
                    return
            except BrokerUnavailable:
                time.sleep(0.05)
        self.terminate(HARD_KILL)
        raise RuntimeError(f"broker did not answer within {timeout_s:g} s:\n{self.log()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        """Everything the broker wrote so far."""
        return self.log_path.read_text(errors="replace")

    def terminate(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> bool:
        """Send `sig` and wait `timeout_s`, then SIGKILL; False when it had to be killed."""
        if self.proc.poll() is not None:
            return True
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return False
        return True


def worker_command(
    socket: str,
    mib: int,
    project: str,
    session: str,
    purpose: str,
    *,
    hold_s: float,
    gpu_uuid: str | None = None,
    use_mib: int | None = None,
    steps: int = 4,
    wait_s: float = 120.0,
    ttl_s: float = 10.0,
    announce: bool = False,
) -> list[str]:
    """A `rbroker.demo.worker` process that leases `mib` MiB and holds it `hold_s` seconds
    (see that module for the options)."""
    cmd = [
        sys.executable, "-m", "rbroker.demo.worker", "--socket", socket, "--mib", str(mib),
        "--hold-s", str(hold_s), "--project", project, "--session", session,
        "--purpose", purpose, "--steps", str(steps), "--wait-s", str(wait_s),
        "--ttl-s", str(ttl_s),
    ]  # fmt: skip
    if gpu_uuid:
        cmd += ["--gpu-uuid", gpu_uuid]
    if use_mib is not None:
        cmd += ["--use-mib", str(use_mib)]
    if announce:
        cmd.append("--announce")
    return cmd


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM `proc`, SIGKILL it after `grace_s` seconds; wait until it is gone."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class ProcessGroup:
    """The children of one demo: `spawn()` them, and on exit (also on Ctrl-C) SIGTERM each
    child's process group, wait up to `grace_s` in all, then SIGKILL what is left (Windows:
    each child's Job object is ended at once, `rbroker.base.children.signal_tree`)."""

    def __init__(self, grace_s: float = 5.0) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.grace_s = grace_s

    def spawn(
        self,
        cmd: list[str],
        *,
        stdout: IO[Any] | int | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `cmd` as a demo child (own process group, gone with this process); its
        stderr goes where its stdout goes when `stdout` is given."""
        proc: subprocess.Popen[bytes] = spawn(
            cmd,
            new_group=True,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout is not None else None,
            env=env,
        )
        self.procs.append(proc)
        return proc

    def adopt(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop `proc` with the others (it must have been started by
        `rbroker.base.children.spawn(new_group=True)`, as `spawn` does)."""
        self.procs.append(proc)

    def stop(self) -> None:
        """Stop every child (see the class docstring)."""
        for p in self.procs:
            signal_tree(p, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            signal_tree(p, HARD_KILL)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
