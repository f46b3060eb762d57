"""A coordinator on this computer, as a separate process: set up, serve, wait, enroll.

One way to start an embedded coordinator for the demo, the screenshots, the end-to-end tests
and the benchmarks: `rbroker-server setup` in a data dir (SQLite unless a database URL is
given, plain HTTP unless `tls`), optional settings written into its `config.toml`, `serve`
on a free 127.0.0.1 port, a wait for `GET /healthz` = 200, then enrollment of broker data
dirs with a 0600 key file. `rbroker` never imports `rbroker_server` (docs/architecture.md §1):
every step runs `python -m rbroker_server` as a child process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rbroker.base.children import spawn


def server_available() -> bool:
    """True when the `server` extra is installed (`rbroker_server` and Litestar import)."""
    return all(importlib.util.find_spec(m) is not None for m in ("rbroker_server", "litestar"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class CoordinatorError(RuntimeError):
    """Setting up, starting or enrolling at the local coordinator failed (message says why)."""


def run_module(
    module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `python -m MODULE ARGS...` (this interpreter) and return the finished process
    with its text output; a non-zero exit is the caller's to judge."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def server_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `python -m rbroker_server ARGS...` and return the finished process (text)."""
    return run_module("rbroker_server", *args, env=env, timeout=timeout)


@dataclass
class LocalCoordinator:
    """A coordinator set up in `data_dir`; `start()` serves it as a child process.

    `token` is the setup group's viewer token, `first_code` its first enrollment code
    (one use). `url` is `http://host:port`, or `https://` when set up with a CA (`ca_file`).
    """

    data_dir: Path
    port: int
    token: str
    first_code: str
    group: str = "default"
    ca_file: str | None = None
    """The CA of a coordinator set up with `tls` (served over HTTPS)."""
    database_url: str = ""
    """Empty: SQLite in `data_dir`."""
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    prefix: list[str] = field(default_factory=list)
    """Command prefix (e.g. `ip netns exec NAME`) to run `serve` somewhere else."""
    env: dict[str, str] | None = None
    """Environment of the child processes (None: this process's)."""
    log_name: str = ""
    """File in `data_dir` that gets `serve`'s output (empty: `serve-PORT.log`)."""

    @classmethod
    def setup(
        cls,
        data_dir: Path,
        *,
        port: int | None = None,
        group: str | None = None,
        tls: bool = False,
        database_url: str = "",
        settings: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> LocalCoordinator:
        """`rbroker-server setup` in `data_dir` for 127.0.0.1:`port` (a free one if None),
        then `settings` (e.g. `stale_after_s=8.0`) written into its config.toml.

        Raises:
            CoordinatorError: setup failed or printed no viewer token / enrollment code.
        """
        port = port or free_port()
        done = server_cli(
            "setup",
            "--data-dir",
            str(data_dir),
            "--bind",
            "127.0.0.1",
            "--public-hostname",
            "127.0.0.1",
            "--port",
            str(port),
            "--non-interactive",
            *(["--group", group] if group else []),
            *(["--self-signed"] if tls else []),
            *(["--database-url", database_url] if database_url else []),
            env=env,
        )
        token = re.search(r"viewer token:\s+(rbv_[A-Za-z0-9_-]+)", done.stdout)
        code = re.search(r"enrollment code:\s+(rbe_[A-Za-z0-9_-]+)", done.stdout)
        if done.returncode != 0 or token is None or code is None:
            raise CoordinatorError(
                f"rbroker-server setup failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
        ca = re.search(r"TLS CA \(copy to computers\): (\S+)", done.stdout)
        if bool(ca) != tls:
            raise CoordinatorError(f"rbroker-server setup: TLS CA expected={tls}: {done.stdout}")
        if settings:
            config = data_dir / "config.toml"
            lines = config.read_text(encoding="utf-8").splitlines()
            for key, value in settings.items():
                lines = [ln for ln in lines if not ln.startswith(f"{key} =")]
                lines.append(f"{key} = {value!r}")
            config.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return cls(
            data_dir,
            port,
            token.group(1),
            code.group(1),
            group=group or "default",
            ca_file=ca.group(1) if ca else None,
            database_url=database_url,
            env=env,
        )

    @property
    def url(self) -> str:
        return f"{'https' if self.ca_file else 'http'}://{self.host}:{self.port}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What httpx needs to trust this coordinator (its CA when set up with TLS)."""
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True

    @property
    def log_path(self) -> Path:
        return self.data_dir / (self.log_name or f"serve-{self.port}.log")

    def start(
        self,
        wait: bool = True,
        timeout_s: float = 30.0,
        log_level: str = "warning",
        bind: bool = False,
    ) -> None:
        """Serve (again, after `stop()`) as a child process and, with `wait`, wait until
        `/healthz` answers (not with a `prefix`: the caller knows where it runs). With
        `bind` it leads its own process group and ends with this process
        (`rbroker.base.children.spawn(new_group=True)`, what `ProcessGroup.adopt` expects).

        Raises:
            CoordinatorError: already running; or the process exited or did not answer
                within `timeout_s` (then it is stopped).
        """
        if self.proc is not None and self.proc.poll() is None:
            raise CoordinatorError("the coordinator is already running")
        cmd = [
            *self.prefix, sys.executable, "-m", "rbroker_server", "serve",
            "--data-dir", str(self.data_dir), "--host", "0.0.0.0" if self.prefix else self.host,
            "--port", str(self.port), "--log-level", log_level,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            out: dict[str, Any] = {"stdout": log, "stderr": subprocess.STDOUT, "env": self.env}
            self.proc = spawn(cmd, new_group=True, **out) if bind else subprocess.Popen(cmd, **out)
        if wait and not self.prefix:
            try:
                self.wait_healthy(timeout_s)
            except CoordinatorError:
                self.stop()  # never leave a half-started coordinator behind
                raise

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """One `GET /healthz`: True on 200 within `timeout_s` (a cold server on a busy
        machine may take over a second for its first answer)."""
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(self.url + "/healthz", timeout=timeout_s, verify=self.verify)
            return r.status_code == 200
        return False

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Wait until `/healthz` answers 200.

        Raises:
            CoordinatorError: the process exited, or no answer within `timeout_s` (with
                the log's tail).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise CoordinatorError(f"coordinator exited:\n{self._log_tail()}")
            if self.healthy():
                return
            time.sleep(0.1)
        raise CoordinatorError(
            f"coordinator did not answer in {timeout_s:g} s:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM the serving process (SIGKILL after 15 s); nothing when not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def new_code(self) -> str:
        """A fresh one-time enrollment code for `group` (`rbroker-server enroll-code create`).

        Raises:
            CoordinatorError: the command failed.
        """
        done = server_cli(
            "enroll-code", "create", "--group", self.group, "--data-dir", str(self.data_dir),
            env=self.env,
        )  # fmt: skip
        match = re.search(r"\brbe_[A-Za-z0-9_-]+", done.stdout)
        if done.returncode != 0 or match is None:
            raise CoordinatorError(f"no enrollment code: {done.stderr.strip()[-500:]}")
        return match.group(0)

    def enroll(self, name: str, broker_data_dir: Path, code: str | None = None) -> str:
        """Enroll a broker data dir as computer `name` (key in a 0600 file, the CA pinned
        when set up with TLS), with `code` or a fresh one; returns the computer id.

        Raises:
            rbroker.uplink.enroll.EnrollError: the coordinator refused or did not answer.
        """
        from rbroker.uplink.enroll import enroll

        link = enroll(
            self.url, code or self.new_code(), name, broker_data_dir, ca_file=self.ca_file,
            key_file=True,
        )  # fmt: skip
        return link.computer_id

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        """`GET path` with the viewer token (or `token`)."""
        return httpx.get(
            self.url + path,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=10,
            verify=self.verify,
        )

    def fleet(self) -> dict[str, Any]:
        """`GET /api/v1/fleet` as the viewer.

        Raises:
            httpx.HTTPError: no answer or not 200.
        """
        r = self.get("/api/v1/fleet")
        r.raise_for_status()
        return dict(r.json())
