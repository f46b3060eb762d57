"""JSON-RPC 2.0 dispatch of the local API onto a `Broker` (DESIGN §5).

One UTF-8 JSON object per line. Requests on one connection run concurrently (a waiting
`lease.acquire` does not hold up a `lease.renew` behind it); answers carry the request id.
Lines over 64 KiB, bad JSON, unknown methods and bad params get JSON-RPC errors with the
stable names of `rbroker_protocol.errors`, and the connection stays usable.

Methods (params → result):
    hello {protocol_version, client}          → {protocol_version, broker_version, simulated,
                                                  telemetry_source, owner}
    gpus.list {}                              → {gpus: [...capacity split per GPU...]}
    lease.acquire AcquireParams               → {lease: {...}, token, cuda_visible_devices}
    lease.renew {lease_id}                    → {lease: {...}}
    lease.attach {lease_id, token}            → {lease: {...}, token}  (new token)
    lease.release {lease_id}                  → {lease: {...}}
    leases.list {include_ended}               → {leases: [...], queue: [...], ended?: [...]}
    broker.status {}                          → {version, uptime_s, telemetry_source, ...}
    job.declare {project, purpose, handler, total_items?, workers}  → {job: {...}}
    job.update {job_id, state?, reason?, workers?}                  → {job: {...}}
    job.report {job_id, chunk_id, completed, failed}  → {job: {...}, duplicate: bool}
    jobs.list {include_finished}              → {jobs: [...]}
    broker.pause {paused}                     → {paused}   (pause/resume new admissions)
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
import contextlib
import itertools
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rbroker._version import __version__
from rbroker.broker.holders import Holder
from rbroker.broker.service import Broker
from rbroker.gpu.scenario import ScenarioError
from rbroker.localapi.access import admin_description, is_admin
from rbroker.localapi.transport import ListeningServer, Peer, serve
from rbroker_protocol import jsonrpc
from rbroker_protocol.descriptions import DescriptionRejected, check_description
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import (
    AcquireParams,
    AttachParams,
    EmptyParams,
    HelloParams,
    JobDeclareParams,
    JobReportParams,
    JobsListParams,
    JobUpdateParams,
    LeaseRef,
    LeasesListParams,
    SimAllocateParams,
    SimFreeParams,
    SimSetParams,
    SimStallParams,
)
from rbroker_protocol.versions import PROTOCOL_VERSION, PROTOCOL_VERSION_MIN

log = logging.getLogger(__name__)

_TOO_LONG = object()
_VIEWS = frozenset({"hello", "gpus.list", "leases.list", "broker.status", "jobs.list"})
"""Methods whose answer is a view of the broker's state: built only when it can be written."""
_conn_ids = itertools.count(1)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "params"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid params: " + "; ".join(parts)


def _parse(model: type[BaseModel], params: Any) -> Any:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(ErrorCode.INVALID_PARAMS, "params must be a JSON object")
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        fields = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})
        raise RpcError(ErrorCode.INVALID_PARAMS, _validation_message(exc), fields=fields) from None


def _check_descriptions(values: dict[str, str]) -> None:
    for field, value in values.items():
        try:
            check_description(field, value)
        except DescriptionRejected as exc:
            raise RpcError(
                ErrorCode.DESCRIPTION_REJECTED, str(exc), field=exc.field, rule=exc.rule
            ) from None


class PauseParams(BaseModel):
    """`broker.pause`: pause (true) or resume (false) new admissions."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    paused: bool


MAX_IN_FLIGHT = 1024
"""Requests of one connection served at once. Past this the connection is not read until
one finishes: a client that sends without reading its answers meets backpressure (its own
writes block) instead of growing the broker's memory without end."""

MAX_UNSENT_BYTES = 4 * 1024 * 1024
"""Answer and event bytes of one connection that the broker keeps unsent. Answers are built
only while less than this waits in the connection's write buffer, and the connection is not
read meanwhile: a client that sends without reading costs the broker at most about this much
(one client sending `leases.list` without reading grew the broker by about 1 GiB before)."""

UNSENT_DROP_AFTER_S = 10.0
"""A connection whose unsent bytes stay past `MAX_UNSENT_BYTES` this long is dropped."""

LINE_TIMEOUT_S = 10.0
"""Time a started request line may take to end with its newline. A connection that sends
half a line and stalls is answered `invalid_request` and closed (1 030 such connections
used to exhaust the broker's file handles). An idle connection between lines is fine."""

MAX_CONNECTIONS_PER_USER = 512
"""Open connections per OS user (by uid). One more is answered `too_many_connections` and
closed, so one user cannot take every file handle of a broker that others share."""

MAX_EVENT_BACKLOG = 10_000
"""Events queued for one subscriber that is not reading them. Past this the connection is
dropped (as Redis drops pub/sub clients over their output buffer limit): without a bound, a
local client that subscribes and never reads grows the broker's memory without end."""


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise this process's soft limit of open files to its hard limit (Unix).

    Each connection takes one file handle; the usual soft limit of 1 024 would let a few
    hundred idle clients of several users starve everyone else. Returns the (soft, hard)
    limits now in force, or None where the OS has no such limit (Windows).
    """
    if sys.platform == "win32":
        return None
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft, hard


class Connection:
    """One client connection: its peer, its writer and its in-flight request tasks."""

    def __init__(self, writer: asyncio.StreamWriter, peer: Peer) -> None:
        self.id = next(_conn_ids)
        self.writer = writer
        self.peer = peer
        self.tasks: set[asyncio.Task[None]] = set()
        self.requests: set[asyncio.Task[None]] = set()
        self.lock = asyncio.Lock()
        self.unsubscribe: Callable[[], None] | None = None
        self.closed = False
        self.event_backlog = 0
        self._holder: Holder | None = None
        # drain() waits only past the bound: answers are written without a round of waiting
        writer.transport.set_write_buffer_limits(high=MAX_UNSENT_BYTES)

    def holder(self) -> Holder:
        """The peer process's identity (pid + start time), read once per connection: the
        process on the other end of a socket never changes.

        Raises:
            ProcessLookupError: the peer has exited.
        """
        if self._holder is None:
            self._holder = Holder.of(self.peer.pid)
        return self._holder

    async def send(self, message: dict[str, Any] | Callable[[], Awaitable[dict[str, Any]]]) -> None:
        """Write one message, or build it with `message()` and write it, once fewer than
        `MAX_UNSENT_BYTES` wait unsent on this connection (so a client that does not read
        holds up only its own answers, and no answer is built before it can be written)."""
        async with self.lock:
            if self.closed:
                return
            try:
                await self.writer.drain()
                if self.closed:
                    return
                if callable(message):
                    message = await message()
                self.writer.write(jsonrpc.encode(message))
            except (ConnectionError, RuntimeError):
                self.closed = True

    def unsent_bytes(self) -> int:
        """Bytes written to this connection that the peer has not taken yet."""
        return self.writer.transport.get_write_buffer_size()

    def drop(self, why: str) -> None:
        """Close at once, discarding unsent bytes; the reader loop then cleans up."""
        if not self.closed:
            log.warning("dropping connection %d of %s: %s", self.id, self.peer.user, why)
        self.closed = True
        self.writer.transport.abort()


Method = Callable[[Connection, Any], Awaitable[Any]]


class LocalApi:
    """Serves a `Broker` over the local transport. `await start()`, `await close()`."""

    def __init__(self, broker: Broker, address: str) -> None:
        self.broker = broker
        self.address = address
        self._server: ListeningServer | None = None
        self._connections: set[Connection] = set()
        self._per_user: dict[int | str, int] = {}
        self._warned_cap: dict[str, bool] = {}
        self.admin_methods = frozenset({"broker.pause", "sim.set", "sim.stall"})
        self.methods: dict[str, tuple[type[BaseModel], Method]] = {
            "hello": (HelloParams, self._hello),
            "gpus.list": (EmptyParams, self._gpus_list),
            "lease.acquire": (AcquireParams, self._acquire),
            "lease.renew": (LeaseRef, self._renew),
            "lease.release": (LeaseRef, self._release),
            "lease.attach": (AttachParams, self._attach),
            "leases.list": (LeasesListParams, self._leases_list),
            "broker.status": (EmptyParams, self._status),
            "job.declare": (JobDeclareParams, self._job_declare),
            "job.update": (JobUpdateParams, self._job_update),
            "job.report": (JobReportParams, self._job_report),
            "jobs.list": (JobsListParams, self._jobs_list),
            "broker.pause": (PauseParams, self._pause),
            "events.subscribe": (EmptyParams, self._subscribe),
            "sim.allocate": (SimAllocateParams, self._sim_allocate),
            "sim.free": (SimFreeParams, self._sim_free),
            "sim.set": (SimSetParams, self._sim_set),
            "sim.stall": (SimStallParams, self._sim_stall),
        }

    async def start(self) -> None:
        """Listen. Raises `BrokerAlreadyRunning` or `OSError` (see `transport.serve`)."""
        raise_open_file_limit()
        self._server = await serve(self.address, self._handle, limit=2 * jsonrpc.MAX_LINE_BYTES)

    async def close(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            await self._server.close()
        for conn in list(self._connections):
            conn.writer.close()

    # -- connection loop -----------------------------------------------------------------
    async def _read_line(
        self, conn: Connection, reader: asyncio.StreamReader
    ) -> bytes | object | None:
        """The next request line, `_TOO_LONG`, or None at the end of the stream.

        Waiting for a line to start has no limit (an idle client is fine); once it has
        started, it must end within `LINE_TIMEOUT_S` or the connection is closed.
        """
        try:
            first = await reader.readexactly(1)
        except asyncio.IncompleteReadError:
            return None
        if first == b"\n":
            return first
        loop = asyncio.get_running_loop()
        timer = loop.call_later(LINE_TIMEOUT_S, self._line_timed_out, conn)
        try:
            too_long = False
            while True:
                try:
                    line = first + await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as exc:
                    if too_long or not (first + exc.partial).strip():
                        return None
                    rest = first + exc.partial
                    return rest if len(rest) <= jsonrpc.MAX_LINE_BYTES else None
                except asyncio.LimitOverrunError as exc:
                    too_long = True
                    await reader.readexactly(max(1, exc.consumed))
                    continue
                if too_long or len(line) - 1 > jsonrpc.MAX_LINE_BYTES:
                    return _TOO_LONG
                return line
        finally:
            timer.cancel()

    def _line_timed_out(self, conn: Connection) -> None:
        if conn.closed:
            return
        err = RpcError(
            ErrorCode.INVALID_REQUEST,
            f"incomplete request line: no newline within {LINE_TIMEOUT_S:g} s; closing",
            timeout_s=LINE_TIMEOUT_S,
        )
        with contextlib.suppress(Exception):
            conn.writer.write(jsonrpc.encode(jsonrpc.error(None, err.to_wire())))
        conn.drop(f"incomplete request line for {LINE_TIMEOUT_S:g} s")

    async def _wait_until_written(self, conn: Connection) -> bool:
        """Stop reading while answers pile up unsent; False when the connection was dropped
        because they stayed past `MAX_UNSENT_BYTES` for `UNSENT_DROP_AFTER_S`."""
        if conn.unsent_bytes() <= MAX_UNSENT_BYTES:
            return True
        try:
            await asyncio.wait_for(conn.writer.drain(), UNSENT_DROP_AFTER_S)
        except TimeoutError:
            conn.drop(
                f"{conn.unsent_bytes()} answer bytes unsent for {UNSENT_DROP_AFTER_S:g} s "
                f"(the client does not read; at most {MAX_UNSENT_BYTES} are kept)"
            )
            return False
        except (ConnectionError, RuntimeError):
            return False
        return not conn.closed

    def _admit_connection(self, conn: Connection) -> RpcError | None:
        key = conn.peer.uid if conn.peer.uid is not None else conn.peer.user
        count = self._per_user.get(key, 0)
        if count >= MAX_CONNECTIONS_PER_USER:
            return RpcError(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"user {conn.peer.user} already has {count} connections to this broker "
                f"({MAX_CONNECTIONS_PER_USER} at most); close some and try again",
                limit=MAX_CONNECTIONS_PER_USER,
            )
        self._per_user[key] = count + 1
        return None

    def _forget_connection(self, conn: Connection) -> None:
        key = conn.peer.uid if conn.peer.uid is not None else conn.peer.user
        left = self._per_user.get(key, 0) - 1
        if left > 0:
            self._per_user[key] = left
        else:
            self._per_user.pop(key, None)

    async def _handle(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> None:
        conn = Connection(writer, peer)
        refused = self._admit_connection(conn)
        if refused is not None:
            with contextlib.suppress(Exception):
                writer.write(jsonrpc.encode(jsonrpc.error(None, refused.to_wire())))
                await asyncio.wait_for(writer.drain(), 1.0)
            if not self._warned_cap.get(peer.user):
                log.warning("refusing connections of %s: %s", peer.user, refused.message)
                self._warned_cap[peer.user] = True
            with contextlib.suppress(Exception):
                writer.close()
            return
        self._warned_cap.pop(peer.user, None)
        self._connections.add(conn)
        try:
            while True:
                if not await self._wait_until_written(conn):
                    break
                line = await self._read_line(conn, reader)
                if line is None or conn.closed:
                    break
                if line is _TOO_LONG:
                    await conn.send(
                        jsonrpc.error(
                            None,
                            RpcError(
                                ErrorCode.REQUEST_TOO_LARGE,
                                f"request line longer than {jsonrpc.MAX_LINE_BYTES} bytes",
                                limit_bytes=jsonrpc.MAX_LINE_BYTES,
                            ).to_wire(),
                        )
                    )
                    continue
                assert isinstance(line, bytes)
                if not line.strip():
                    continue
                task = asyncio.create_task(self._serve_line(conn, line))
                conn.tasks.add(task)
                conn.requests.add(task)
                task.add_done_callback(conn.tasks.discard)
                task.add_done_callback(conn.requests.discard)
                if len(conn.requests) >= MAX_IN_FLIGHT:
                    await asyncio.wait(conn.requests, return_when=asyncio.FIRST_COMPLETED)
        except (ConnectionError, OSError):
            pass
        finally:
            conn.closed = True
            self._connections.discard(conn)
            self._forget_connection(conn)
            if conn.unsubscribe is not None:
                conn.unsubscribe()
            for task in list(conn.tasks):
                task.cancel()
            self.broker.connection_closed(conn.id)
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve_line(self, conn: Connection, line: bytes) -> None:
        request_id: Any = None
        try:
            try:
                msg = json.loads(line)
            except (ValueError, UnicodeDecodeError) as exc:
                raise RpcError(ErrorCode.PARSE_ERROR, f"not valid JSON: {exc}") from None
            except RecursionError:
                raise RpcError(
                    ErrorCode.PARSE_ERROR,
                    f"JSON nested too deeply ({sys.getrecursionlimit()} levels at most)",
                ) from None
            if not isinstance(msg, dict):
                raise RpcError(ErrorCode.INVALID_REQUEST, "a request must be a JSON object")
            request_id = msg.get("id")
            if not isinstance(request_id, int | str | None) or isinstance(request_id, bool):
                request_id = None
                raise RpcError(ErrorCode.INVALID_REQUEST, "id must be a string or an integer")
            method = msg.get("method")
            if msg.get("jsonrpc") != "2.0" or not isinstance(method, str):
                raise RpcError(
                    ErrorCode.INVALID_REQUEST, 'need "jsonrpc": "2.0" and a string "method"'
                )
            entry = self.methods.get(method)
            if entry is None:
                raise RpcError(
                    ErrorCode.METHOD_NOT_FOUND,
                    f"unknown method {method[:64]!r}",
                    method=method[:64],
                )
            model, fn = entry
            params = _parse(model, msg.get("params"))
            if method in self.admin_methods:
                self._check_admin(conn, method)
            if method in _VIEWS and "id" in msg:
                rid = request_id

                async def build() -> dict[str, Any]:
                    try:
                        return jsonrpc.result(rid, await fn(conn, params))
                    except RpcError as err:
                        return jsonrpc.error(rid, err.to_wire())

                await conn.send(build)
                return
            value = await fn(conn, params)
            if "id" in msg:
                await conn.send(jsonrpc.result(request_id, value))
        except RpcError as err:
            await conn.send(jsonrpc.error(request_id, err.to_wire()))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("internal error serving a request")
            await conn.send(
                jsonrpc.error(
                    request_id, RpcError(ErrorCode.INTERNAL_ERROR, "internal error").to_wire()
                )
            )

    def _check_admin(self, conn: Connection, method: str) -> None:
        """Refuse `method` unless the caller is the broker's user or in its admin group.

        Raises:
            RpcError: `not_allowed`, naming who may use it.
        """
        group = self.broker.config.admin_group
        if is_admin(conn.peer, group):
            return
        raise RpcError(
            ErrorCode.NOT_ALLOWED,
            f"{method} changes the broker for everyone: only {admin_description(group)} "
            f"may use it, not {conn.peer.user}",
            method=method,
        )

    # -- methods ---------------------------------------------------------------------------
    async def _hello(self, conn: Connection, p: HelloParams) -> dict[str, Any]:
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
            "simulated": self.broker.fake is not None,
            "telemetry_source": self.broker.gateway.source,
            "owner": conn.peer.user,
        }

    async def _gpus_list(self, conn: Connection, p: EmptyParams) -> dict[str, Any]:
        return {"gpus": self.broker.gpus_view()}

    async def _acquire(self, conn: Connection, p: AcquireParams) -> dict[str, Any]:
        _check_descriptions({"project": p.project, "session": p.session, "purpose": p.purpose})
        p = p.model_copy(
            update={
                "project": p.project.strip(),
                "session": p.session.strip(),
                "purpose": p.purpose.strip(),
            }
        )
        try:
            holder = conn.holder()
        except ProcessLookupError:
            raise RpcError(ErrorCode.CANCELLED, "the requesting process has exited") from None
        if p.job_id is not None:
            self.broker.jobs.get_open(p.job_id, conn.peer.user)  # no workers for a finished job
        lease = await self.broker.acquire(p, conn.peer.user, holder, conn.id)
        return {
            "lease": lease.to_wire(),
            "token": lease.token,
            "cuda_visible_devices": ",".join(lease.gpu_uuids),
        }

    async def _renew(self, conn: Connection, p: LeaseRef) -> dict[str, Any]:
        return {"lease": self.broker.renew(p.lease_id, conn.peer.user).to_wire()}

    async def _attach(self, conn: Connection, p: AttachParams) -> dict[str, Any]:
        lease = self.broker.attach(p.lease_id, p.token, conn.peer.user, conn.id)
        return {"lease": lease.to_wire(), "token": lease.token}

    async def _release(self, conn: Connection, p: LeaseRef) -> dict[str, Any]:
        return {"lease": self.broker.release(p.lease_id, conn.peer.user).to_wire()}

    async def _leases_list(self, conn: Connection, p: LeasesListParams) -> dict[str, Any]:
        return self.broker.leases_view(p.include_ended)

    async def _status(self, conn: Connection, p: EmptyParams) -> dict[str, Any]:
        return self.broker.status()

    def _job_wire(self, job: Any) -> dict[str, Any]:
        live = set(self.broker.leases)
        return dict(job.to_wire([lid for lid in job.lease_ids if lid in live]))

    async def _job_declare(self, conn: Connection, p: JobDeclareParams) -> dict[str, Any]:
        _check_descriptions({"project": p.project, "purpose": p.purpose, "handler": p.handler})
        job = self.broker.jobs.declare(
            conn.peer.user,
            p.project.strip(),
            p.purpose.strip(),
            p.handler.strip(),
            p.total_items,
            p.workers,
            conn.id,
        )
        self.broker.emit("job", {"job_id": job.job_id, "state": job.state})
        return {"job": self._job_wire(job)}

    async def _job_update(self, conn: Connection, p: JobUpdateParams) -> dict[str, Any]:
        if p.reason is not None:
            _check_descriptions({"reason": p.reason})
        job = self.broker.jobs.update(
            p.job_id, conn.peer.user, p.state, p.reason and p.reason.strip(), p.workers, conn.id
        )
        self.broker.emit("job", {"job_id": job.job_id, "state": job.state})
        return {"job": self._job_wire(job)}

    async def _job_report(self, conn: Connection, p: JobReportParams) -> dict[str, Any]:
        job, duplicate = self.broker.jobs.report(
            p.job_id, conn.peer.user, p.chunk_id, p.completed, p.failed, conn.id
        )
        if not duplicate:
            self.broker.emit("job", {"job_id": job.job_id, "state": job.state})
        return {"job": self._job_wire(job), "duplicate": duplicate}

    async def _jobs_list(self, conn: Connection, p: JobsListParams) -> dict[str, Any]:
        return {"jobs": self.broker.jobs.view(p.include_finished, set(self.broker.leases))}

    async def _pause(self, conn: Connection, p: PauseParams) -> dict[str, Any]:
        self.broker.set_paused(p.paused)
        log.info("new admissions %s by %s", "paused" if p.paused else "resumed", conn.peer.user)
        return {"paused": self.broker.paused}

    async def _subscribe(self, conn: Connection, p: EmptyParams) -> dict[str, Any]:
        if conn.unsubscribe is None:

            def push(kind: str, data: dict[str, Any]) -> None:
                if conn.closed:
                    return
                if conn.event_backlog >= MAX_EVENT_BACKLOG:
                    log.warning(
                        "connection %d does not read its events (%d queued): dropping it",
                        conn.id,
                        conn.event_backlog,
                    )
                    conn.closed = True
                    conn.writer.transport.abort()  # its reader loop then cleans up
                    return
                msg = {"jsonrpc": "2.0", "method": "event", "params": {"kind": kind, "data": data}}
                conn.event_backlog += 1
                task = asyncio.get_running_loop().create_task(conn.send(msg))
                conn.tasks.add(task)
                task.add_done_callback(conn.tasks.discard)
                task.add_done_callback(_event_sent)

            def _event_sent(_task: asyncio.Task[None]) -> None:
                conn.event_backlog -= 1

            conn.unsubscribe = self.broker.subscribe(push)
        return {"subscribed": True}

    def _sim_gpu(self, conn: Connection, gpu_uuid: str | None) -> str:
        if self.broker.fake is None:
            raise RpcError(ErrorCode.NOT_SIMULATED, "sim.* methods need a simulated broker")
        if gpu_uuid is not None:
            if gpu_uuid not in self.broker.slots:
                raise RpcError(ErrorCode.INVALID_PARAMS, f"no GPU {gpu_uuid}", field="gpu_uuid")
            return gpu_uuid
        for lease in self.broker.leases.values():
            if lease.conn_id == conn.id or lease.holder.pid == conn.peer.pid:
                return lease.gpu_uuid
        return min(self.broker.slots.values(), key=lambda s: s.info.index).uuid

    async def _sim_allocate(self, conn: Connection, p: SimAllocateParams) -> dict[str, Any]:
        uuid = self._sim_gpu(conn, p.gpu_uuid)
        assert self.broker.fake is not None
        try:
            total = self.broker.fake.allocate(uuid, conn.peer.pid, p.mib)
        except ProcessLookupError:
            raise RpcError(ErrorCode.CANCELLED, "the calling process has exited") from None
        self.broker.memory_changed(uuid)
        return {"gpu_uuid": uuid, "pid_mib": total}

    async def _sim_free(self, conn: Connection, p: SimFreeParams) -> dict[str, Any]:
        uuid = self._sim_gpu(conn, p.gpu_uuid)
        assert self.broker.fake is not None
        left = self.broker.fake.free(uuid, conn.peer.pid, p.mib)
        self.broker.memory_changed(uuid)
        return {"gpu_uuid": uuid, "pid_mib": left}

    async def _sim_set(self, conn: Connection, p: SimSetParams) -> dict[str, Any]:
        uuid = self._sim_gpu(conn, p.gpu_uuid)
        assert self.broker.fake is not None
        changes = p.model_dump(exclude_none=True, exclude={"gpu_uuid"})
        try:
            gpu = self.broker.fake.set_gpu(uuid, **changes)
        except (ScenarioError, KeyError) as exc:
            raise RpcError(ErrorCode.INVALID_PARAMS, f"sim.set refused: {exc}") from None
        self.broker.memory_changed(uuid)
        return {"gpu": {"uuid": gpu.uuid, **changes}}

    async def _sim_stall(self, conn: Connection, p: SimStallParams) -> dict[str, Any]:
        if self.broker.fake is None:
            raise RpcError(ErrorCode.NOT_SIMULATED, "sim.* methods need a simulated broker")
        log.warning("sim.stall: blocking the event loop for %.1f s", p.seconds)
        time.sleep(p.seconds)  # deliberately on the loop thread
        return {"stalled_s": p.seconds}
