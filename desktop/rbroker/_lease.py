"""`rbroker.lease()`: hold GPU memory for a block of code (DESIGN §6a).

The lease lives on its own connection (a crash or kill of the process closes it, and the
broker frees the lease within a second). Heartbeats run on a daemon thread every ttl/3,
never on the caller's thread, so a CPU-bound main thread cannot starve them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from rbroker._exceptions import BrokerUnavailable, LeaseExpired, RBrokerError
from rbroker.localapi.client import Client

log = logging.getLogger(__name__)


@dataclass
class Lease:
    """A granted lease, as the holder sees it.

    Attributes:
        lease_id: the broker's id.
        gpu_uuid: the granted GPU (the first one for multi-GPU leases).
        gpu_uuids: every granted GPU.
        granted_mib: MiB granted on each GPU.
        cuda_visible_devices: value for `CUDA_VISIBLE_DEVICES` (GPU UUIDs, comma separated).
        info: the broker's full lease record.
        lost: set when a heartbeat found the lease gone; `error` says why.
    """

    lease_id: str
    gpu_uuid: str
    gpu_uuids: list[str]
    granted_mib: int
    cuda_visible_devices: str
    info: dict[str, Any]
    token: str = field(repr=False, default="")
    lost: bool = False
    error: RBrokerError | None = None

    def check(self) -> None:
        """Raise the heartbeat's error if the lease was lost (expired, broker gone)."""
        if self.lost and self.error is not None:
            raise self.error


class _Holder:
    """Owns the connection, the heartbeat thread and the release of one lease."""

    def __init__(self, client: Client, lease: Lease, ttl_s: float) -> None:
        self.client = client
        self.lease = lease
        self.interval_s = max(0.2, ttl_s / 3)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"rbroker-heartbeat-{lease.lease_id}", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.client.call("lease.renew", lease_id=self.lease.lease_id)
            except (LeaseExpired, RBrokerError) as exc:
                if self._stop.is_set():
                    return
                log.error("lease %s lost: %s", self.lease.lease_id, exc)
                self.lease.lost, self.lease.error = True, exc
                return

    def release(self) -> None:
        self._stop.set()
        try:
            self.client.call("lease.release", lease_id=self.lease.lease_id, timeout_s=5.0)
        except RBrokerError as exc:
            if not self.lease.lost:
                log.warning("release of %s: %s", self.lease.lease_id, exc)
        finally:
            self.client.close()
            self._thread.join(timeout=2.0)


def _acquire(
    mib: int,
    project: str,
    session: str,
    purpose: str,
    wait_s: float,
    gpus: int,
    gpu_uuid: str | None,
    ttl_s: float,
    adopt: bool,
    socket: str | None,
) -> _Holder:
    client = Client(socket)
    params: dict[str, Any] = {
        "mib": mib,
        "gpus": gpus,
        "project": project,
        "session": session,
        "purpose": purpose,
        "ttl_s": ttl_s,
        "wait_s": wait_s,
        "adopt": adopt,
    }
    if gpu_uuid is not None:
        params["gpu_uuid"] = gpu_uuid
    try:
        result = client.call("lease.acquire", timeout_s=wait_s + 30.0, **params)
    except BaseException:
        client.close()
        raise
    info = result["lease"]
    lease = Lease(
        lease_id=info["lease_id"],
        gpu_uuid=info["gpu_uuid"],
        gpu_uuids=list(info["gpu_uuids"]),
        granted_mib=info["granted_mib"],
        cuda_visible_devices=result["cuda_visible_devices"],
        info=info,
        token=result.get("token", ""),
    )
    return _Holder(client, lease, ttl_s)


@contextlib.contextmanager
def lease(
    mib: int,
    *,
    project: str,
    session: str,
    purpose: str,
    wait_s: float = 0.0,
    gpus: int = 1,
    gpu_uuid: str | None = None,
    ttl_s: float = 30.0,
    adopt: bool = False,
    socket: str | None = None,
) -> Iterator[Lease]:
    """Hold `mib` MiB on `gpus` GPU(s) for the `with` block.

    Blocks up to `wait_s` seconds for the grant (0: fail at once if there is no room),
    renews every `ttl_s`/3 from a background thread, releases on exit (also on
    exceptions; a crash or kill frees it through the closed connection).

    Raises:
        CapacityUnavailable / WaitTimeout: no room now / within `wait_s`.
        Infeasible: can never fit here. DescriptionRejected: a description broke a rule.
        TelemetryUnavailable: the GPU's telemetry is failing. BrokerUnavailable: no broker.
    """
    holder = _acquire(mib, project, session, purpose, wait_s, gpus, gpu_uuid, ttl_s, adopt, socket)
    try:
        yield holder.lease
    finally:
        holder.release()


@contextlib.asynccontextmanager
async def alease(
    mib: int,
    *,
    project: str,
    session: str,
    purpose: str,
    wait_s: float = 0.0,
    gpus: int = 1,
    gpu_uuid: str | None = None,
    ttl_s: float = 30.0,
    adopt: bool = False,
    socket: str | None = None,
) -> AsyncIterator[Lease]:
    """`async with rbroker.alease(...)`: `lease()` for asyncio code.

    Waiting happens in a worker thread, heartbeats on their own thread, so a busy event loop
    cannot let the lease expire. Raises like `lease()`.
    """
    holder = await asyncio.to_thread(
        _acquire, mib, project, session, purpose, wait_s, gpus, gpu_uuid, ttl_s, adopt, socket
    )
    try:
        yield holder.lease
    finally:
        await asyncio.to_thread(holder.release)


__all__ = ["BrokerUnavailable", "Lease", "alease", "lease"]
