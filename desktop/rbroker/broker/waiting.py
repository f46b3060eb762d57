"""The queue of waiting requests: FIFO order, request numbers, persistence of waiters that
survive a broker restart, lookup by request key, and the end of a wait (cancel, timeout).

Which waiter is granted, and why the others wait, is decided in `admission`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease, Waiter
from rbroker.broker.store import LeaseStore
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import AcquireParams

log = logging.getLogger(__name__)

Emit = Callable[[str, dict[str, Any]], None]


class WaitQueue:
    """The waiters in arrival order (`waiters`, a list the broker shares as `Broker.queue`)."""

    def __init__(self, store: LeaseStore | None, emit: Emit) -> None:
        self.store = store
        self.waiters: list[Waiter] = []
        self._emit = emit
        self._seq = 0
        self._on_gpu: dict[str, int] = {}  # waiters queued per candidate GPU
        self._of_owner: dict[str, int] = {}  # waiters queued per OS user
        self.version = 0
        """Changes whenever a waiter joins or leaves the queue or its GPUs change: what a
        view computed from the queue is cached against (`Broker.waiting_entry`)."""

    def waiting_on(self, uuid: str) -> int:
        """How many queued requests may take GPU `uuid`."""
        return self._on_gpu.get(uuid, 0)

    def waiting_of(self, owner: str) -> int:
        """How many queued requests OS user `owner` has."""
        return self._of_owner.get(owner, 0)

    def _count(self, waiter: Waiter, step: int) -> None:
        self.version += 1
        for u in waiter.candidates:
            self._on_gpu[u] = self._on_gpu.get(u, 0) + step
        left = self._of_owner.get(waiter.owner, 0) + step
        if left > 0:
            self._of_owner[waiter.owner] = left
        else:
            self._of_owner.pop(waiter.owner, None)

    def next_id(self) -> int:
        """The next request number (1, 2, ...; per broker run)."""
        self._seq += 1
        return self._seq

    def widen(self, candidates_for: Callable[[int], tuple[str, ...]]) -> None:
        """Give unpinned waiters every GPU known now (after GPUs were enumerated late)."""
        for waiter in self.waiters:
            if not waiter.pinned:
                self._count(waiter, -1)
                waiter.candidates = candidates_for(waiter.gpus)
                self._count(waiter, 1)

    def new_waiter(
        self,
        params: AcquireParams,
        candidates: tuple[str, ...],
        owner: str,
        holder: Holder,
        conn_id: int | None,
        now: float,
        wall: float,
        boot: float,
        numbered: bool = True,
    ) -> Waiter:
        """A waiter for a validated request (`now` monotonic, `wall` Unix seconds, `boot`
        `Clock.boottime()`); not queued. `numbered=False`: request id 0, no number used up
        (a probe that is never queued, `Broker.check_room`)."""
        return Waiter(
            request_id=self.next_id() if numbered else 0,
            asked_mib=params.mib,
            gpus=params.gpus,
            candidates=candidates,
            pinned=params.gpu_uuid is not None,
            owner=owner,
            project=params.project,
            session=params.session,
            purpose=params.purpose,
            ttl_s=params.ttl_s,
            adopt=params.adopt,
            placement=params.placement,
            holder=holder,
            conn_id=conn_id,
            enqueued_at=now,
            deadline=now + params.wait_s,
            wait_s=params.wait_s,
            future=new_future(),
            request_key=params.request_key or "",
            wait_until_wall=wall + params.wait_s,
            wait_until_boot=boot + params.wait_s,
            job_id=params.job_id,
            expected_s=params.expected_s,
            booking_id=params.booking_id,
        )

    def add(self, waiter: Waiter) -> None:
        """Queue `waiter` last."""
        self.waiters.append(waiter)
        self._count(waiter, 1)

    def persist(self, waiter: Waiter) -> None:
        """Keep a waiting request with a request key across a broker restart."""
        if self.store is not None and waiter.request_key:
            self.store.put_waiter(waiter.request_key, waiter.request_id, waiter.to_record())

    def remove(self, waiter: Waiter, error: RpcError | None = None) -> None:
        """Take `waiter` off the queue (and the store); fail its future with `error`."""
        if waiter in self.waiters:
            self.waiters.remove(waiter)
            self._count(waiter, -1)
        if self.store is not None and waiter.request_key:
            # never refused: a full disk keeps the removal in the store's reserve
            self.store.delete_waiter(waiter.request_key)
        if error is not None and not waiter.future.done():
            waiter.future.set_exception(error)
            if waiter.reattach_by is not None:  # restored, its client not back: nobody awaits
                waiter.future.exception()

    def find(self, request_key: str, owner: str, holder: Holder) -> Waiter | None:
        """A request still queued under `request_key` for this holder, whose client is gone
        (after a broker restart the SDK re-sends its request with the same key)."""
        for waiter in self.waiters:
            if (
                waiter.request_key == request_key
                and waiter.owner == owner
                and waiter.holder == holder
                and waiter.conn_id is None
            ):
                return waiter
        return None

    def leave(self, waiter: Waiter, error: RpcError | None = None) -> None:
        """`remove` a waiter that leaves without a grant, told as a `queue` event (the
        queue's views change: without it the tray kept showing a request that had left)."""
        self.remove(waiter, error)
        self._emit("queue", {"request_id": waiter.request_id})

    def connection_closed(self, conn_id: int) -> None:
        """Drop the waiters of a closed connection (`leave`)."""
        for waiter in [w for w in self.waiters if w.conn_id == conn_id]:
            self.leave(
                waiter, RpcError(ErrorCode.CANCELLED, "request cancelled: connection closed")
            )

    def reap(self, is_alive: Callable[[Holder], bool]) -> None:
        """Drop the waiters whose holder process exited (`leave`)."""
        for waiter in list(self.waiters):
            if not is_alive(waiter.holder):
                self.leave(
                    waiter, RpcError(ErrorCode.CANCELLED, "request cancelled: holder exited")
                )

    def expire(self, now: float, wait_error: Callable[[Waiter], RpcError]) -> None:
        """End the waits that are over (`leave`): restored waiters whose client did not come
        back within the reattach grace, and evaluated ones past their `wait_s` deadline (with
        `wait_error(waiter)`, which carries the last reason and its numbers)."""
        for waiter in list(self.waiters):
            if waiter.reattach_by is not None and now >= waiter.reattach_by:
                self.leave(waiter, RpcError(ErrorCode.CANCELLED, "its client did not come back"))
            elif now >= waiter.deadline and waiter.evaluated and not waiter.future.done():
                self.leave(waiter, wait_error(waiter))

    def fail_all(self, error: RpcError) -> None:
        """Fail every waiter (broker stopping); persisted ones stay in the store."""
        for w in self.waiters:
            if not w.future.done():
                w.future.set_exception(error)
                w.future.exception()  # retrieved: nobody may be awaiting a restored waiter
        self.waiters.clear()
        self.version += 1
        self._on_gpu.clear()
        self._of_owner.clear()

    def ahead(self, order: list[Waiter] | None = None) -> list[tuple[Waiter, int]]:
        """Each waiter with the number of requests queued before it on any of its GPUs, in
        `order` (the waiters in admission's order; None: arrival order)."""
        seen: dict[str, int] = {}
        out = []
        for w in self.waiters if order is None else order:
            out.append((w, max((seen.get(u, 0) for u in w.candidates), default=0)))
            for u in w.candidates:
                seen[u] = seen.get(u, 0) + 1
        return out


def new_future() -> asyncio.Future[Lease]:
    """A future for a waiter, on the running loop."""
    return asyncio.get_running_loop().create_future()
