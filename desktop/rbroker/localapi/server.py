"""JSON-RPC 2.0 dispatch of the local API onto a `Broker` (architecture.md §5).

One UTF-8 JSON object per line. Requests on one connection run concurrently (a waiting
`lease.acquire` does not hold up a `lease.renew` behind it); answers carry the request id.
Requests that cannot wait (renew, release, attach, hello, the lists, an acquire granted at
once, every refusal) are answered inline as the line is read, without a task of their own;
only a request that has to wait (a queued acquire, a job write) gets one.
Lines over 64 KiB, bad JSON, unknown methods and bad params get JSON-RPC errors with the
stable names of `rbroker_protocol.errors`, and the connection stays usable.

Methods (params → result; the results' shapes are `rbroker_protocol.results`):
    hello {protocol_version, client}          → {protocol_version, broker_version, simulated,
                                                  telemetry_source, owner}
    gpus.list {}                              → {gpus: [...capacity split per GPU...]}
    lease.acquire AcquireParams               → {lease: {...}, token, cuda_visible_devices,
                                                  gpus, cuda_indices}
                                                (with notify_waiting: `event` notifications
                                                of kind `waiting` while it queues)
    lease.renew {lease_id}                    → {lease: {...}}
    lease.attach {lease_id, token}            → {lease: {...}, token}  (new token)
    lease.release {lease_id}                  → {lease: {...}}  (admins: anyone's lease)
    request.cancel {request_id}               → {request: {...}}  (a waiting request; admins:
                                                anyone's)
    lease.resize {lease_id, mib, wait_s}      → {lease: {...}}  (architecture.md §3)
    leases.list {include_ended}               → {leases: [...], queue: [...], ended?: [...]}
    broker.status {}                          → {version, uptime_s, telemetry_source, ...}
    job.declare {project, purpose, handler, total_items?, workers}  → {job: {...}}
    job.update {job_id, state?, reason?, workers?}                  → {job: {...}}
    job.report {job_id, chunk_id, completed, failed}  → {job: {...}, duplicate: bool}
    jobs.list {include_finished}              → {jobs: [...]}
    booking.create BookParams                 → {booking: {...}}  (architecture.md §2a)
    booking.cancel {booking_id}               → {booking: {...}}  (admins: anyone's)
    bookings.list {include_ended}             → {bookings: [...], now_at, usable_mib}
    room.check {mib, gpus, gpu_uuid?, expected_s?} → {fits, gpus, reason, ...}  (nothing taken)
    broker.pause {paused}                     → {paused}   (pause/resume new admissions)
    audit.list {limit, before_seq?}           → {entries: [...], verified, problem}
                                                (administrators: the audit trail)
    events.subscribe {}                       → {subscribed: true}; then `event`
                                                notifications {kind, data}
    sim.allocate {mib, gpu_uuid?}             → {gpu_uuid, pid_mib}   (simulation only)
    sim.free {mib?, gpu_uuid?}                → {gpu_uuid, pid_mib}   (simulation only)
    sim.set {gpu_uuid, ...scenario fields}    → {gpu: {...}}          (simulation only)
    sim.stall {seconds}                       → {stalled_s}  blocks the event loop (simulation
                                                only: what a stalled broker looks like)
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from pydantic import BaseModel

from rbroker.base.version import __version__
from rbroker.broker.config import BrokerConfig
from rbroker.broker.leases import Lease, Waiter
from rbroker.broker.service import Broker
from rbroker.localapi import holder_events
from rbroker.localapi.access import connect_refusal, is_admin
from rbroker.localapi.connection import (
    LINE_TIMEOUT_S,
    MAX_EVENT_BACKLOG,
    MAX_IN_FLIGHT,
    MAX_UNSENT_BYTES,
    UNSENT_DROP_AFTER_S,
    Connection,
)
from rbroker.localapi.internal_errors import InternalErrors
from rbroker.localapi.limits import (
    MAX_CONNECTIONS_PER_USER,
    PerUserLimit,
    Turns,
    UnsentBudget,
    raise_open_file_limit,
)
from rbroker.localapi.requests import Refused, decode, granted, lease_result, method_of
from rbroker.transport import serve
from rbroker.transport.base import ListeningServer, PeerOf, account_of
from rbroker_protocol import jsonrpc
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import (
    AcquireParams,
    AttachParams,
    AuditListParams,
    BookingRef,
    BookingsListParams,
    BookParams,
    EmptyParams,
    HelloParams,
    JobDeclareParams,
    JobReportParams,
    JobsListParams,
    JobUpdateParams,
    LeaseRef,
    LeasesListParams,
    PauseParams,
    RequestRef,
    ResizeParams,
    RoomCheckParams,
    SimAllocateParams,
    SimFreeParams,
    SimSetParams,
    SimStallParams,
)
from rbroker_protocol.results import (
    AcquireResult,
    AttachResult,
    AuditListResult,
    BookingResult,
    BookingsListResult,
    BookResult,
    BrokerStatus,
    CancelResult,
    GpusListResult,
    HelloResult,
    JobReportResult,
    JobResult,
    JobsListResult,
    LeaseResult,
    LeasesListResult,
    PauseResult,
    RoomCheckResult,
    SimMemoryResult,
    SimSetResult,
    SimStallResult,
    SubscribeResult,
)
from rbroker_protocol.versions import PROTOCOL_VERSION, PROTOCOL_VERSION_MIN

__all__ = [
    "LINE_TIMEOUT_S",
    "MAX_CONNECTIONS_PER_USER",
    "MAX_EVENT_BACKLOG",
    "MAX_IN_FLIGHT",
    "MAX_UNSENT_BYTES",
    "UNSENT_DROP_AFTER_S",
    "LocalApi",
    "raise_open_file_limit",
]

log = logging.getLogger(__name__)

_VIEWS = frozenset(
    {
        "hello",
        "gpus.list",
        "leases.list",
        "broker.status",
        "jobs.list",
        "bookings.list",
        "room.check",
        "audit.list",
    }
)
"""Methods whose answer is a view of the broker's state: built only when it can be written,
and not at all for a peer that is gone (`Connection.peer_gone`): they change nothing, so a
view nobody will read is skipped (`LocalApi.views_skipped`)."""

_BOOKINGS = frozenset({"booking.create", "booking.cancel"})
"""Methods that change bookings: answered inline (one SQLite commit, no wait), binding
nothing to the connection (a booking outlives it)."""

_INLINE = (
    frozenset({"lease.renew", "lease.release", "lease.attach", "request.cancel", "broker.pause"})
    | _VIEWS
    | _BOOKINGS
)
"""Methods answered synchronously, as their line is read (their handlers never wait)."""

PAST_THE_CAP = frozenset({"lease.renew", "lease.release", "request.cancel"})
"""Methods served past a connection's in-flight cap (`MAX_IN_FLIGHT`): the renewal that keeps
a granted lease and the ends of a lease or a waiting request. All are `_INLINE`, so they add
no waiting request; a cap meant to protect the broker never costs its user a lease or the
way out of a queue."""


_BINDS_NOTHING = (
    _VIEWS | _BOOKINGS | {"lease.renew", "lease.release", "request.cancel", "broker.pause"}
)
"""Methods that leave nothing on their connection (no lease, waiting request, job or
simulated memory is bound to it): a connection that sent only these is closed without the
broker's look for what it held (`Broker.connection_closed`, which goes through every job,
lease and waiting request), so a user opening and closing connections in a loop costs the
broker the same whatever it holds."""


Method = Callable[[Connection, Any], Any]
"""A handler: returns the result, or (methods outside `_INLINE`) an awaitable of it."""


class LocalApi:
    """Serves a `Broker` over the local transport. `await start()`, `await close()`."""

    def __init__(self, broker: Broker, address: str) -> None:
        self.broker = broker
        self.address = address
        self._server: ListeningServer | None = None
        self._connections: set[Connection] = set()
        self._per_user = PerUserLimit(MAX_CONNECTIONS_PER_USER)
        self._turns = Turns()
        self.unsent = UnsentBudget(0)  # its cap comes from the broker's config at start()
        self.internal_errors = InternalErrors()
        self.views_skipped = 0
        """Views (`_VIEWS`) not built because their peer was gone when their turn came."""
        self.admin_methods = frozenset({"broker.pause", "audit.list", "sim.set", "sim.stall"})
        self.methods: dict[str, tuple[type[BaseModel], Method]] = {
            "hello": (HelloParams, self._hello),
            "gpus.list": (EmptyParams, self._gpus_list),
            "lease.acquire": (AcquireParams, self._begin_acquire),
            "lease.renew": (LeaseRef, self._renew),
            "lease.release": (LeaseRef, self._release),
            "request.cancel": (RequestRef, self._cancel),
            "lease.attach": (AttachParams, self._attach),
            "lease.resize": (ResizeParams, self._resize),
            "leases.list": (LeasesListParams, self._leases_list),
            "broker.status": (EmptyParams, self._status),
            "job.declare": (JobDeclareParams, self._job_declare),
            "job.update": (JobUpdateParams, self._job_update),
            "job.report": (JobReportParams, self._job_report),
            "jobs.list": (JobsListParams, self._jobs_list),
            "booking.create": (BookParams, self._book),
            "booking.cancel": (BookingRef, self._cancel_booking),
            "bookings.list": (BookingsListParams, self._bookings_list),
            "room.check": (RoomCheckParams, self._check_room),
            "broker.pause": (PauseParams, self._pause),
            "audit.list": (AuditListParams, self._audit_list),
            "events.subscribe": (EmptyParams, self._subscribe),
            "sim.allocate": (SimAllocateParams, self._sim_allocate),
            "sim.free": (SimFreeParams, self._sim_free),
            "sim.set": (SimSetParams, self._sim_set),
            "sim.stall": (SimStallParams, self._sim_stall),
        }

    @property
    def config(self) -> BrokerConfig:
        """The broker's settings (the local API's own are among them)."""
        return self.broker.config

    async def start(self) -> None:
        """Listen. Raises `BrokerAlreadyRunning` or `OSError` (see `transport.serve`)."""
        raise_open_file_limit()
        self._unroute = holder_events.route(self.broker, self._connections)
        cfg, limit = self.config, jsonrpc.MAX_LINE_BYTES
        self.unsent.per_user_bytes = cfg.max_unsent_bytes_per_user
        shared, group = cfg.shared_socket, cfg.allowed_group
        self._server = await serve(self.address, self._accept, limit, shared=shared, group=group)

    async def close(self, leases_kept: bool | None = None) -> None:
        """Stop listening and close every connection. With `leases_kept` set, first tell
        every connection that the broker is going away: a `broker.stopping` notification
        `{leases_kept}` (True: leases stay for the restarted broker, re-attach then)."""
        if self._server is not None:
            await self._server.close()
        if leases_kept is not None:
            notice = {
                "jsonrpc": "2.0",
                "method": "broker.stopping",
                "params": {"leases_kept": leases_kept},
            }
            sends = [conn.send(notice) for conn in list(self._connections)]
            if sends:
                await asyncio.wait([asyncio.ensure_future(s) for s in sends], timeout=1.0)
        for conn in list(self._connections):
            conn.transport.close()

    # -- connections ---------------------------------------------------------------------
    def _accept(self, peer_of: PeerOf, limit: int) -> Connection:
        """The protocol of a new connection (`rbroker.transport.base.Handler`)."""
        cap = self.config.max_unsent_bytes
        return Connection(self, peer_of, limit, cap, self.unsent, self._turns)

    def admit(self, conn: Connection) -> bool:
        """Admit `conn` (its peer read), or refuse it (`too_many_connections`, or a user
        outside the allowed group) and close it: False."""
        allowed = self.config.allowed_group
        refused = self._per_user.over(conn) or connect_refusal(conn.peer, allowed, self.address)
        if refused is not None:
            self._per_user.refuse(conn, refused)
            return False
        self._per_user.count_in(conn)
        self._connections.add(conn)
        return True

    def serve_line(self, conn: Connection, line: bytes) -> Coroutine[Any, Any, None] | None:
        """Serve one request line of `conn` (see `_serve_inline`)."""
        return self._serve_inline(conn, line)

    def serves_past_cap(self, line: bytes) -> bool:
        """Whether `line` is one of `PAST_THE_CAP` (read by its method alone)."""
        return method_of(line) in PAST_THE_CAP

    def forget(self, conn: Connection) -> None:
        """`conn` closed (its tasks cancelled): count it out and end what it held."""
        self._connections.discard(conn)
        self._per_user.forget(conn)
        self.unsent.forget(conn)
        if conn.unsubscribe is not None:
            conn.unsubscribe()
        if conn.bound:
            self.broker.connection_closed(conn.id)

    def _serve_inline(self, conn: Connection, line: bytes) -> Coroutine[Any, Any, None] | None:
        """Answer `line` now when nothing has to wait (see the module docstring); else the
        coroutine that serves it (the caller runs it as a task)."""
        request_id: Any = None
        method: str | None = None
        answer: dict[str, Any]
        try:
            request_id, answered, method, params = decode(
                line, self.methods, self.admin_methods, conn.peer, self.config.admin_group
            )
            if method not in _BINDS_NOTHING:
                conn.bound = True
            elif method in _VIEWS and conn.peer_gone():
                self.views_skipped += 1  # asked and closed at once: nobody reads it
                return None
            if method == "lease.acquire":
                started = self._begin_acquire(conn, params)
                if not isinstance(started, dict):
                    return self._finish(conn, request_id, answered, method, started)
                value = started
            elif method in _INLINE and conn.can_write_now():
                value = self.methods[method][1](conn, params)
            elif method in _VIEWS and answered:
                return self._send_view(conn, request_id, method, params)
            else:
                pending = self._call(method, conn, params)
                return self._finish(conn, request_id, answered, method, pending)
            if not answered:
                return None
            answer = jsonrpc.result(request_id, value)
        except Refused as refused:
            answer = jsonrpc.error(refused.request_id, refused.error.to_wire())
        except RpcError as err:
            answer = jsonrpc.error(request_id, err.to_wire())
        except Exception as exc:
            answer = self._internal_error(conn, request_id, method, exc)
        if conn.can_write_now():
            conn.write_now(answer)
            return None
        return conn.send(answer)

    async def _send_view(self, conn: Connection, request_id: Any, method: str, params: Any) -> None:
        """Answer a view once it can be written, building it only then, and only when its
        peer is still there; the time it takes counts in its user's turn (`Turns.charge`)."""

        async def build() -> dict[str, Any] | None:
            if conn.peer_gone():
                self.views_skipped += 1
                return None
            started_s = self._turns.clock()
            try:
                return jsonrpc.result(request_id, self.methods[method][1](conn, params))
            except RpcError as err:
                return jsonrpc.error(request_id, err.to_wire())
            except Exception as exc:
                return self._internal_error(conn, request_id, method, exc)
            finally:
                self._turns.charge(conn, self._turns.clock() - started_s)

        await conn.send(build)

    def _internal_error(
        self, conn: Connection, request_id: Any, method: str | None, exc: Exception
    ) -> dict[str, Any]:
        """The `internal_error` answer to a request that failed inside the broker; its
        traceback logged as `InternalErrors` allows (at most once a minute per user, method
        and exception type)."""
        self.internal_errors.report(conn.peer.user, method, exc)
        error = RpcError(ErrorCode.INTERNAL_ERROR, "internal error")
        return jsonrpc.error(request_id, error.to_wire())

    async def _call(self, method: str, conn: Connection, params: Any) -> Any:
        value = self.methods[method][1](conn, params)
        if inspect.isawaitable(value):
            value = await value
        return value

    async def _finish(
        self,
        conn: Connection,
        request_id: Any,
        answered: bool,
        method: str,
        pending: Awaitable[Any],
    ) -> None:
        """Await what a request of `method` waits for and send its answer (when it has an
        id)."""
        try:
            value = await pending
            if answered:
                await conn.send(jsonrpc.result(request_id, value))
        except RpcError as err:
            await conn.send(jsonrpc.error(request_id, err.to_wire()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await conn.send(self._internal_error(conn, request_id, method, exc))

    # -- methods ---------------------------------------------------------------------------
    def _hello(self, conn: Connection, p: HelloParams) -> HelloResult:
        if p.protocol_version < PROTOCOL_VERSION_MIN:
            raise RpcError(
                ErrorCode.PROTOCOL_VERSION,
                f"protocol version {p.protocol_version} is too old; this broker speaks "
                f"{PROTOCOL_VERSION_MIN}..{PROTOCOL_VERSION}",
                min=PROTOCOL_VERSION_MIN,
                max=PROTOCOL_VERSION,
            )
        return {
            "protocol_version": min(p.protocol_version, PROTOCOL_VERSION),
            "broker_version": __version__,
            "simulated": self.broker.simulated(),
            "telemetry_source": self.broker.telemetry_source(),
            "owner": conn.peer.user,
        }

    def _gpus_list(self, conn: Connection, p: EmptyParams) -> GpusListResult:
        return {"gpus": self.broker.gpus_view()}

    def _begin_acquire(
        self, conn: Connection, p: AcquireParams
    ) -> AcquireResult | Awaitable[AcquireResult]:
        """The answer of an acquire granted at once, else an awaitable of it."""
        started = self.broker.begin_acquire(
            p,
            conn.peer.user,
            conn.holder,
            conn.id,
            lambda: self._is_admin(conn),
            account_of(conn.peer),
        )
        if isinstance(started, Lease):
            return granted(started, self.broker)
        return self._wait_for_grant(conn, p, started)

    async def _wait_for_grant(
        self, conn: Connection, p: AcquireParams, waiter: Waiter
    ) -> AcquireResult:
        watch = None
        if p.notify_waiting and p.wait_s > 0 and p.request_key:
            watch = asyncio.create_task(holder_events.tell_waiting(conn, self.broker, waiter))
        try:
            return granted(await self.broker.await_waiter(waiter), self.broker)
        finally:
            if watch is not None:
                watch.cancel()

    def _renew(self, conn: Connection, p: LeaseRef) -> LeaseResult:
        return lease_result(self.broker.renew(p.lease_id, conn.peer.user))

    def _attach(self, conn: Connection, p: AttachParams) -> AttachResult:
        lease = self.broker.attach(p.lease_id, p.token, conn.peer.user, conn.id)
        return {"lease": lease.to_wire(), "token": lease.token}

    def _is_admin(self, conn: Connection) -> bool:
        """Whether the connection's OS user is an administrator of this broker (`is_admin`):
        for ending others' leases and requests, and asked by the broker only when it
        matters for a project kept to its members."""
        return is_admin(conn.peer, self.config.admin_group)

    def _release(self, conn: Connection, p: LeaseRef) -> LeaseResult:
        admin = self._is_admin(conn)
        lease = self.broker.release(p.lease_id, conn.peer.user, conn.id, conn.peer.pid, admin)
        return lease_result(lease)

    def _cancel(self, conn: Connection, p: RequestRef) -> CancelResult:
        admin = self._is_admin(conn)
        waiter = self.broker.cancel_request(p.request_id, conn.peer.user, admin)
        return {"request": self.broker.request_view(waiter)}

    async def _resize(self, conn: Connection, p: ResizeParams) -> LeaseResult:
        """`lease.resize` for the caller's OS user, on the caller's connection (closing it
        cancels a growth that still waits; architecture.md §3)."""
        lease = await self.broker.resize(p.lease_id, conn.peer.user, p.mib, p.wait_s, conn.id)
        return lease_result(lease)

    def _leases_list(self, conn: Connection, p: LeasesListParams) -> LeasesListResult:
        return self.broker.leases_view(p.include_ended, conn.peer.user)

    def _status(self, conn: Connection, p: EmptyParams) -> BrokerStatus:
        return self.broker.status()

    async def _job_declare(self, conn: Connection, p: JobDeclareParams) -> JobResult:
        job = self.broker.declare_job(
            conn.peer.user,
            p.project,
            p.purpose,
            p.handler,
            p.total_items,
            p.workers,
            conn.id,
            lambda: self._is_admin(conn),
            account_of(conn.peer),
        )
        return {"job": job}

    async def _job_update(self, conn: Connection, p: JobUpdateParams) -> JobResult:
        job = self.broker.update_job(
            p.job_id, conn.peer.user, p.state, p.reason, p.workers, conn.id, account_of(conn.peer)
        )
        return {"job": job}

    async def _job_report(self, conn: Connection, p: JobReportParams) -> JobReportResult:
        job, duplicate = self.broker.report_job(
            p.job_id,
            conn.peer.user,
            p.chunk_id,
            p.completed,
            p.failed,
            conn.id,
            account_of(conn.peer),
        )
        return {"job": job, "duplicate": duplicate}

    def _jobs_list(self, conn: Connection, p: JobsListParams) -> JobsListResult:
        return self.broker.jobs_list(p.include_finished, conn.peer.user)

    def _book(self, conn: Connection, p: BookParams) -> BookResult:
        booking = self.broker.book(p, conn.peer.user, lambda: self._is_admin(conn))
        return {"booking": booking}

    def _cancel_booking(self, conn: Connection, p: BookingRef) -> BookingResult:
        admin = self._is_admin(conn)
        return {"booking": self.broker.cancel_booking(p.booking_id, conn.peer.user, admin)}

    def _bookings_list(self, conn: Connection, p: BookingsListParams) -> BookingsListResult:
        return self.broker.bookings_list(conn.peer.user, p.include_ended)

    def _check_room(self, conn: Connection, p: RoomCheckParams) -> RoomCheckResult:
        return self.broker.check_room(p, conn.peer.user)

    def _pause(self, conn: Connection, p: PauseParams) -> PauseResult:
        paused = self.broker.set_paused(p.paused, conn.peer.user)
        log.info("new admissions %s by %s", "paused" if p.paused else "resumed", conn.peer.user)
        return {"paused": paused}

    def _audit_list(self, conn: Connection, p: AuditListParams) -> AuditListResult:
        return self.broker.audit_list(p.limit, p.before_seq)

    async def _subscribe(self, conn: Connection, p: EmptyParams) -> SubscribeResult:
        holder_events.subscribe(self.broker, conn)
        return {"subscribed": True}

    async def _sim_allocate(self, conn: Connection, p: SimAllocateParams) -> SimMemoryResult:
        return self.broker.sim().allocate(p.gpu_uuid, conn.id, conn.peer.pid, p.mib)

    async def _sim_free(self, conn: Connection, p: SimFreeParams) -> SimMemoryResult:
        return self.broker.sim().free(p.gpu_uuid, conn.id, conn.peer.pid, p.mib)

    async def _sim_set(self, conn: Connection, p: SimSetParams) -> SimSetResult:
        changes = p.model_dump(exclude_none=True, exclude={"gpu_uuid"})
        return self.broker.sim().set(p.gpu_uuid, conn.id, conn.peer.pid, **changes)

    async def _sim_stall(self, conn: Connection, p: SimStallParams) -> SimStallResult:
        return self.broker.sim().stall(p.seconds)
