"""A broker run in-process (the tray's own broker, the demo's): `BrokerHost` on its own
asyncio loop and thread.

No Qt here. Whoever starts it still talks to it only through the local API client, exactly as
to a broker started by someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from rbroker.broker.config import BrokerConfig

log = logging.getLogger(__name__)


class EmbeddedBroker:
    """Runs a broker on a daemon thread.

    `start()` returns at once; `wait_ready()` waits for the broker to listen or fail;
    `stop()` stops it cleanly (the socket file is removed, waiters are failed).

    Args:
        config: the broker's settings.
        on_failed: called (on the broker thread) with the exception when it cannot start
            (`BrokerAlreadyRunning`, `TelemetryError`, `ScenarioError`, `OSError`, ...).
    """

    def __init__(
        self, config: BrokerConfig, on_failed: Callable[[BaseException], None] | None = None
    ) -> None:
        self.config = config
        self.on_failed = on_failed
        self.error: BaseException | None = None
        self.simulated: bool | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="rbroker-broker", daemon=True)

    @property
    def running(self) -> bool:
        return self._ready.is_set() and self.error is None and self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """True once listening; False on timeout or failure (see `error`)."""
        return self._ready.wait(timeout_s) and self.error is None

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported, never raised on a daemon thread
            self.error = exc
            log.warning("in-process broker stopped: %s", exc)
            self._ready.set()
            if self.on_failed is not None:
                self.on_failed(exc)

    async def _main(self) -> None:
        from rbroker.hosting.host import BrokerHost  # builds the NVML gateway: keep it off the GUI

        host = BrokerHost(self.config)
        self.simulated = host.simulated
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await host.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await host.stop()  # undo what started before the failure
            raise
        log.info("in-process broker listening on %s", self.config.socket_path)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await host.stop()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the broker and wait for its thread (at most `timeout_s`)."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already finished
                loop.call_soon_threadsafe(stop.set)
        if self._thread.is_alive():
            self._thread.join(timeout_s)
