"""Wire a broker to its local API and run it: used by `rbroker broker` and the tray."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from rbroker.base.startup import check_data_dir
from rbroker.broker.config import BrokerConfig
from rbroker.broker.service import Broker
from rbroker.broker.store import LeaseStore
from rbroker.gpu.scenario import scenario_timers
from rbroker.gpu.select import open_gateway
from rbroker.hosting.machine_lock import (
    DEFAULT_LOCK_NAME,
    ENV_LOCK,
    MachineLock,
    acquire_machine_lock,
    ignored_lock_variable,
    lock_name,
    sees_system_broker,
)
from rbroker.localapi.access import broker_user
from rbroker.localapi.server import LocalApi
from rbroker.transport.safe_paths import check_private_path, open_nofollow
from rbroker.uplink.runner import run_uplink
from rbroker_protocol.files import private_dir, set_mode

log = logging.getLogger(__name__)


KEEP_LOCK_EVERY_S = 1.0
"""How often the system broker checks that its authority's files are still in place (two
`stat` calls; the socket file is checked as often by the transport, `rbroker.transport.unix`)."""


async def _keep_every(keep: Callable[[], None], every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        try:
            keep()
        except Exception:  # logged, and tried again at the next turn
            log.exception("cannot check the system broker's lock")


class DataDirLocked(RuntimeError):
    """Another broker uses this data directory."""


class DataDirLock:
    """An exclusive advisory lock on `<data dir>/broker.lock` (mode 0600 whatever the umask)
    held while the broker runs.

    Raises:
        DataDirLocked: another live process holds it.
        OSError: the file cannot be opened; ELOOP: it is a symbolic link.
    """

    def __init__(self, data_dir: Path) -> None:
        fd = open_nofollow(data_dir / "broker.lock", os.O_RDWR | os.O_CREAT | os.O_APPEND)
        set_mode(fd)  # 0600: the umask may have taken bits from it
        self._file = os.fdopen(fd, "a+b")  # held open; a symlink is refused (ELOOP)
        try:
            if sys.platform == "win32":
                import msvcrt

                msvcrt.locking(self._file.fileno(), msvcrt.LK_NBLCK, 1)
            else:
                import fcntl

                fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise DataDirLocked(f"another broker uses the data directory {data_dir}") from None

    def release(self) -> None:
        """Unlock (closing the file releases the lock)."""
        self._file.close()


class BrokerHost:
    """A broker plus its local API on one event loop.

    `await start()` enumerates GPUs and starts listening; `await stop()` undoes it.

    Raises (from `start`):
        ScenarioError: invalid scenario file. TelemetryError: no GPU could be enumerated.
        BrokerAlreadyRunning: a live broker already listens on the address.
    """

    def __init__(self, config: BrokerConfig) -> None:
        gateway, fake = open_gateway(config.simulate, config.scenario)
        if config.simulate:  # a scenario's `[timers]` (never read for real GPUs)
            timers = scenario_timers(config.scenario)
            if timers:
                config = dataclasses.replace(config, **timers)  # type: ignore[arg-type]
                log.info("simulated broker on the scenario's timers: %s", timers)
        self.config = config
        self._gateway, self._fake = gateway, fake
        self.broker: Broker | None = None
        self.api: LocalApi | None = None
        self._uplink: asyncio.Task[None] | None = None
        self._lock: DataDirLock | None = None
        self._machine_lock: MachineLock | None = None
        self._keeper: asyncio.Task[None] | None = None

    @property
    def simulated(self) -> bool:
        return self._fake is not None

    async def start(self) -> None:
        """Take the machine-wide broker lock, lock the data dir, open the lease store, start
        the broker, then listen.

        Raises:
            MachineLockHeld: another broker runs on this computer (any user); raised before
                the data dir is looked at.
            OSError: the data dir cannot be made or written (named as `filename`).
        """
        socket_path = str(self.config.socket_path)
        simulated = self.config.simulate
        ignored = ignored_lock_variable(simulated)
        if ignored is not None:
            log.warning(
                "ignoring %s=%s: a broker on real GPUs always takes the computer's lock %s "
                "(other names are for --simulate only)",
                ENV_LOCK,
                ignored,
                DEFAULT_LOCK_NAME,
            )
        name = lock_name(self.config.machine_lock, socket_path, simulated=simulated)
        sees = sees_system_broker(self.config.machine_lock, simulated=simulated)
        machine_lock = acquire_machine_lock(
            name,
            socket_path,
            broker_user(),
            system=sees and self.config.shared_socket,  # the system broker's authority
            check_system=sees,  # a per-user broker refuses while the system broker runs
        )
        self._machine_lock = machine_lock
        try:  # every data-dir check after the lock: a second broker is told of the first
            check_private_path(self.config.data_dir)  # as root: nobody else may swap names
            check_data_dir(self.config.data_dir)
            private_dir(self.config.data_dir)
            self._lock = lock = DataDirLock(self.config.data_dir)
        except BaseException:
            machine_lock.release()
            raise
        try:
            store = LeaseStore(self.config.data_dir / "broker.sqlite3")
        except BaseException:
            lock.release()
            machine_lock.release()
            raise
        self.broker = Broker(self.config, self._gateway, self._fake, store=store)
        self.api = LocalApi(self.broker, str(self.config.socket_path))
        try:
            await self.broker.start()
            await self.api.start()
            self._uplink = asyncio.create_task(run_uplink(self.broker, self.config.data_dir))
            keep = getattr(machine_lock, "keep", None)
            if keep is not None:
                self._keeper = asyncio.create_task(_keep_every(keep, KEEP_LOCK_EVERY_S))
        except BaseException:
            await self.broker.stop()
            lock.release()
            machine_lock.release()
            raise

    async def stop(self) -> None:
        """Stop listening, stop the reporter and the broker, unlock the data dir. Live leases
        stay in the store for the next start unless `release_all_on_exit` is set."""
        if self.broker is not None:
            self.broker.mark_shutting_down()  # the reporter sends its last report
        if self._keeper is not None:
            self._keeper.cancel()
        if self._uplink is not None:
            self._uplink.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._uplink
        kept = self.broker.begin_stop() if self.broker is not None else None
        if self.api is not None:
            await self.api.close(leases_kept=kept)
        if self.broker is not None:
            await self.broker.stop()
        if self._lock is not None:
            self._lock.release()
        if self._machine_lock is not None:
            self._machine_lock.release()

    async def run_forever(self, ready: asyncio.Event | None = None) -> None:
        """Start, then run until SIGINT/SIGTERM (or cancellation), then stop."""
        await self.start()
        if ready is not None:
            ready.set()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        if sys.platform != "win32":
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await self.stop()


def make_config(
    socket_path: str,
    data_dir: Path,
    simulate: bool,
    scenario: Path | None,
    headroom_mib: int | None,
) -> BrokerConfig:
    """A `BrokerConfig` from CLI-level arguments."""
    return BrokerConfig(
        socket_path=Path(socket_path),
        data_dir=data_dir,
        simulate=simulate,
        scenario=scenario,
        headroom_mib=headroom_mib,
    )
