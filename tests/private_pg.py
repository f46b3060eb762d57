"""A private PostgreSQL cluster a test may stop and start: `initdb` and `pg_ctl` run as a
throwaway OS user in a temporary directory, listening on a free port of 127.0.0.1.

The shared server the rest of the suite uses is never touched. Needs root (to create the
user) and the server binaries (Debian: `/usr/lib/postgresql/<version>/bin`, package
`postgresql`); `private_postgres()` skips cleanly without them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.os_users import OsUser, create_user, remove_user
from tests.ports import free_port


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=os.path.getmtime)
    return Path(found[-1]).parent if found else None


@dataclass
class PrivateCluster:
    """A running (or stopped) cluster: `url` reaches its `postgres` database as `postgres`."""

    user: OsUser
    bindir: Path
    root: Path
    port: int
    running: bool = False

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        cmd = ["runuser", "-u", self.user.name, "--", str(self.bindir / "pg_ctl")]
        subprocess.run(
            [*cmd, "-D", str(self.root / "data"), "-w", "-t", "60", *args],
            check=True,
            capture_output=True,
            timeout=90,
            cwd="/",
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg_ctl("-l", str(self.root / "server.log"), "-o", options, "start")
        self.running = True

    def stop(self) -> None:
        """Stop the server for real (`pg_ctl stop -m fast`: sessions are ended)."""
        self._pg_ctl("-m", "fast", "stop")
        self.running = False


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivateCluster]:
    """A fresh cluster, started; stopped and removed afterwards, also when the body fails."""
    bindir = _bindir()
    if os.geteuid() != 0 or shutil.which("runuser") is None or shutil.which("useradd") is None:
        pytest.skip("a private PostgreSQL cluster needs root, runuser and useradd")
    if bindir is None:
        pytest.skip("a private PostgreSQL cluster needs the server binaries (initdb, pg_ctl)")
    user = create_user("rbpg")
    root = Path(tempfile.mkdtemp(prefix="rbpg-"))
    try:
        os.chown(root, user.uid, user.gid)
        subprocess.run(
            ["runuser", "-u", user.name, "--", str(bindir / "initdb"), "-D", str(root / "data"),
             "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
            check=True, capture_output=True, timeout=120, cwd="/",
        )  # fmt: skip
        cluster = PrivateCluster(user, bindir, root, free_port())
        cluster.start()
        try:
            yield cluster
        finally:
            if cluster.running:
                with contextlib.suppress(subprocess.SubprocessError):
                    cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        remove_user(user)
