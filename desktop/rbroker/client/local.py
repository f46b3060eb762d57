"""The one typed, blocking client of the local API, used by the SDK, the CLI and the tray.

Thread-safe: one request at a time per connection (a lock), so a heartbeat thread and the
caller's thread can share it. Event notifications (`events.subscribe`, and `over_grant` on a
lease's own connection) are queued for `next_event()` and passed to `on_event` if set.
A request sent with `call_nowait` (pipelined: a heartbeat's `lease.renew`) is not waited
for; its answer is read with whatever is read next on the connection, and an error in it is
passed to `on_failed` as soon as it is read and raised by the next call.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import socket
import sys
import threading
import time

from rbroker.base.exceptions import (
    BrokerUnavailable,
    InvalidParams,
    MethodNotFound,
    RBrokerError,
    from_rpc_error,
)
from rbroker.base.lazy import Logger, is_quick
from rbroker.client.paths import ENV_SOCKET, FOUND_ENV, FOUND_OPTION, discovery_order
from rbroker.transport import connect
from rbroker_protocol import framing
from rbroker_protocol.versions import PROTOCOL_VERSION

# In a quick start (`rbroker.base.lazy`: a short command-line client) what a call that goes
# well needs is all a client loads (start-up, docs/architecture.md §10): the wire's error
# codes load with the first error read, no orjson; the result types are for type checkers
# alone, and no `typing` either: the idiom type checkers read as typing.TYPE_CHECKING.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from rbroker.client.paths import Candidate
    from rbroker.transport.base import Stream
    from rbroker_protocol.params import AcquireRequest
    from rbroker_protocol.results import (
        AcquireResult,
        AttachResult,
        AuditListResult,
        BookingResult,
        BookingsListResult,
        BookingView,
        BookResult,
        BrokerStatus,
        CancelResult,
        GpusListResult,
        GpuView,
        HelloResult,
        JobReportResult,
        JobResult,
        JobsListResult,
        JobView,
        LeaseResult,
        LeasesListResult,
        PauseResult,
        RoomCheckResult,
        SimMemoryResult,
        SimSetResult,
    )

log = Logger(__name__)  # logging.getLogger(__name__) (in a quick start: once it says something)

if not is_quick():  # a job, the tray: loaded with the client (rbroker.base.lazy)
    import rbroker_protocol.errors
    import rbroker_protocol.jsonrpc  # noqa: F401 - for `_codec`

if sys.platform != "win32":
    import grp  # here, not when needed: a client dropped to another user may not reach it


RENEW = "lease.renew"
"""The method name `on_failed` gets for a refused pipelined renewal (`Client.renew_nowait`)."""


def _codec() -> tuple[Callable[[dict[str, Any]], bytes], Callable[[bytes], Any]]:
    """`(encode, decode)` of a new client: orjson's (`rbroker_protocol.jsonrpc`), or in a
    quick start (`rbroker.base.lazy.quick_start`, a short command-line client) the standard
    library's (`rbroker_protocol.framing`). Both read the same values and give the same
    errors (jsonrpc's contract); orjson is faster per message, json loads faster: for a
    command that sends a few requests and exits, orjson and the modules it imports
    (dataclasses, inspect, uuid, datetime) cost more than all its messages (start-up,
    docs/architecture.md §10)."""
    if is_quick():
        return framing.encode, _too_deep_is_not_json(framing.decode)
    from rbroker_protocol import jsonrpc

    return jsonrpc.encode, _too_deep_is_not_json(jsonrpc.decode)


def _too_deep_is_not_json(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`decode`, raising ValueError (an answer the client cannot read: "lost the broker",
    one line) where the line is nested deeper than the interpreter reads. A peer at the
    socket that is not a broker gave a RecursionError traceback with it (json reads about
    990 levels, orjson 1 024)."""

    def read(line: bytes) -> Any:
        try:
            return decode(line)
        except RecursionError:
            raise ValueError("the answer is nested too deeply to read") from None

    return read


def _group_of(address: str) -> str | None:
    """The OS group of the socket (or of its directory), when it can be read."""
    if sys.platform == "win32":
        return None
    else:
        for path in (address, os.path.dirname(address)):
            try:
                return grp.getgrgid(os.stat(path).st_gid).gr_name
            except (OSError, KeyError):
                continue
        return None


def not_allowed_text(address: str, detail: str) -> str:
    """`not allowed to use the broker at ADDRESS (DETAIL)`, with the socket's group."""
    group = _group_of(address)
    hint = (
        f"; it is open to the members of the group {group!r}: ask its administrator to add you"
        if group and group != "root"
        else "; ask its administrator for access"
    )
    return f"not allowed to use the broker at {address} ({detail}){hint}"


def _connect(candidates: list[Candidate], timeout_s: float | None) -> tuple[Candidate, Stream]:
    """Open the first candidate that accepts a connection.

    Raises:
        BrokerUnavailable: none answers (code `broker_unavailable`), or one refuses this user
            (code `not_allowed`: permission denied on its socket; nothing after it is tried).
    """
    failures: list[str] = []
    for candidate in candidates:
        try:
            return candidate, connect(candidate.address, timeout_s)
        except PermissionError as exc:
            text = not_allowed_text(candidate.address, exc.strerror or str(exc))
            raise BrokerUnavailable(text, "not_allowed", address=candidate.address) from None
        except OSError as exc:
            failures.append(f"{candidate.address} ({exc.strerror or exc})")
    running = _system_broker_without_socket()
    raise BrokerUnavailable(
        f"no rbroker broker at {' or at '.join(failures)}; " + (running or _start_hint(candidates)),
        "broker_unavailable",
        address=candidates[-1].address,
    )


def _start_hint(candidates: list[Candidate]) -> str:
    """What to do when no candidate answered, by how the address was found: an address the
    user gave is kept (never "set RBROKER_SOCKET" to someone who did)."""
    found_by = candidates[0].found_by if len(candidates) == 1 else ""
    if found_by == FOUND_ENV:
        return (
            f"start one there (`rbroker broker` listens at ${ENV_SOCKET}), or unset or correct "
            f"{ENV_SOCKET}"
        )
    if found_by == FOUND_OPTION:
        return f"start one there with `rbroker broker --socket {candidates[0].address}`"
    return f"start one with `rbroker broker` or set {ENV_SOCKET}"


def _system_broker_without_socket() -> str | None:
    """When the system broker's authority is held by a live process although its socket did
    not answer (its socket file was removed): what to do, in words; else None."""
    if sys.platform == "win32" or not sys.platform.startswith("linux"):
        return None
    try:
        from rbroker.transport import system_holder

        holder = system_holder.read_system_holder()
    except Exception:  # nothing to add: the plain message stands
        return None
    if holder is None:
        return None
    return (
        f"but the system broker runs ({holder.describe()}): it puts a removed socket file "
        f"back within 2 s, so try again; connect with --socket {holder.socket} (or "
        "RBROKER_SOCKET) if it listens elsewhere, and if the socket stays missing ask its "
        "administrator to restart it (systemctl restart rbroker-broker); do not start "
        "another broker"
    )


def _wire_error(error: Any) -> RBrokerError:
    """The SDK exception of an error object the broker sent (the wire's error codes load
    here, with the first error a process reads).

    Raises:
        Exception: what `RpcError.from_wire` raises for an error object it cannot read.
    """
    from rbroker_protocol.errors import RpcError

    return from_rpc_error(RpcError.from_wire(error))


def _raise_refusal(error: dict[str, Any], address: str) -> None:
    """The broker answered a connection-level error (id null) and closes the connection."""
    from rbroker_protocol.errors import ErrorCode, RpcError

    try:
        err = RpcError.from_wire(error)
    except Exception:
        raise BrokerUnavailable(
            f"the broker at {address} refused the connection", "broker_unavailable"
        ) from None
    if err.name is ErrorCode.NOT_ALLOWED:
        raise BrokerUnavailable(err.message, "not_allowed", address=address)
    raise from_rpc_error(err)


def _at(params: dict[str, Any], path: str) -> Any:
    value: Any = params
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list | tuple) else value[key]
    return value


class Client:
    """A connection to the local broker.

    Args:
        socket: socket path (or pipe name on Windows); default: the first that answers of
            `RBROKER_SOCKET`, the system broker's address, the per-user address
            (`rbroker.client.paths.discovery_order`; an empty `RBROKER_SOCKET` counts as
            unset).
        timeout_s: per-call timeout for answers (None: wait forever); `call()` may
            override it for long waits.
        hello: send `hello` on connect (checks the protocol version).

    Raises:
        ValueError: `socket` is empty (`""`): given, yet no address.
        BrokerUnavailable: nothing answers at the address; code `not_allowed` when the
            broker refuses this user (the socket's permissions or its allowed group).
        ProtocolVersionError: the broker does not speak this version.
    """

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        timeout_s: float | None = 30.0,
        hello: bool = True,
    ) -> None:
        self.timeout_s = timeout_s
        self._encode, self._decode = _codec()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._closed = False
        candidate, self._stream = _connect(
            discovery_order(os.fspath(socket) if socket is not None else None), timeout_s
        )
        self.address = candidate.address
        self.found_by = candidate.found_by
        """How the address was found: `--socket`, `RBROKER_SOCKET`, the system broker's
        address or the per-user address (`rbroker.client.paths.FOUND_*`)."""
        self.on_event: Callable[[dict[str, Any]], None] | None = None
        """Called with each event notification as it is read (on the reading thread)."""
        self.on_failed: Callable[[str, RBrokerError], None] | None = None
        """Called with `(method, error)` when the answer to a `call_nowait` request is an
        error, as it is read (on the reading thread)."""
        self._pipelined: dict[int, str] = {}  # request id → method, of call_nowait requests
        self._failed: list[RBrokerError] = []  # their errors, for the next call to raise
        self.server_info: dict[str, Any] = {}
        if hello:
            try:
                self.server_info = self.call(
                    "hello", protocol_version=PROTOCOL_VERSION, client="rbroker-python"
                )
            except BaseException:  # not a broker, or one we cannot talk to: no socket leaks
                self.close()
                raise

    def _queue_event(self, params: dict[str, Any]) -> None:
        self._events.put(params)
        if self.on_event is not None:
            try:
                self.on_event(params)
            except Exception:  # the hook never breaks the connection
                log.exception("event hook failed")

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the broker releases leases bound to it)."""
        if not self._closed:
            self._closed = True
            self._stream.close()

    def _request(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        bad = framing.non_finite_path(params)
        if bad is not None:
            raise InvalidParams(
                f"invalid params: {bad} must be a finite number, not {_at(params, bad)!r}",
                "invalid_params",
            )
        request_id = next(self._ids)
        return request_id, self._encode(framing.request(request_id, method, params))

    def _raise_failed(self) -> None:
        """Raise the first error a pipelined request got (the lock held)."""
        if self._failed:
            raise self._failed.pop(0)

    def _pipelined_answer(self, msg: dict[str, Any]) -> bool:
        """Take `msg` if it answers a `call_nowait` request: an error is kept for the next
        call and passed to `on_failed`. True when it was one and carried an error."""
        request_id = msg.get("id")
        method = self._pipelined.pop(request_id, None) if isinstance(request_id, int) else None
        if method is None or not isinstance(msg.get("error"), dict):
            return False
        try:
            exc = _wire_error(msg["error"])
        except Exception:  # an error we cannot read is still an error
            exc = RBrokerError(f"{method} failed: {msg['error']!r}", "internal_error")
        self._failed.append(exc)
        if self.on_failed is not None:
            try:
                self.on_failed(method, exc)
            except Exception:  # the hook never breaks the connection
                log.exception("on_failed hook failed")
        return True

    def call_nowait(self, method: str, **params: Any) -> None:
        """Send one request without waiting for its answer (pipelined): the answer is read
        with whatever is read next on this connection (`call`, `wait_until_closed`,
        `wait_event`); when it is an error, `on_failed` gets it as it is read and the next
        call raises it: the `call` that reads it (its own answer is then dropped), else the
        first to start after it was read. The broker answers a connection's requests that
        do not wait in order, so a `call` after it reads this answer first. The SDK
        pipelines a lease's renewals on the lease's own connection, where the next call is
        that lease's release or resize.

        Raises:
            RBrokerError: the error of an earlier pipelined request, not raised yet (this
                request is then not sent).
            InvalidParams: a parameter is NaN or infinite.
            BrokerUnavailable: the connection broke, or the write timed out.
        """
        request_id, data = self._request(method, params)
        with self._lock:
            if self._closed:
                raise BrokerUnavailable("client is closed", "broker_unavailable")
            self._raise_failed()
            try:
                self._stream.settimeout(self.timeout_s)
                self._stream.write(data)
            except OSError as exc:
                raise BrokerUnavailable(
                    f"lost the broker at {self.address}: {exc}", "broker_unavailable"
                ) from None
            self._pipelined[request_id] = method

    def call(self, method: str, timeout_s: float | None = -1.0, **params: Any) -> Any:
        """Send one request and return its `result`.

        Args:
            timeout_s: seconds to wait for the answer; -1 uses the client default,
                None waits forever.

        Raises:
            RBrokerError: the broker's error, as the exception class of its code; or the
                error of an earlier `call_nowait` request, not raised yet (read before this
                request was sent: it is not sent; read with its answer: that answer is
                dropped).
            InvalidParams: a parameter is NaN or infinite (JSON has no such number; it
                is refused here, never sent as `null`, which would mean "not given").
            BrokerUnavailable: the connection broke or timed out.
        """
        request_id, data = self._request(method, params)
        with self._lock:
            if self._closed:
                raise BrokerUnavailable("client is closed", "broker_unavailable")
            self._raise_failed()
            try:
                self._stream.settimeout(self.timeout_s if timeout_s == -1.0 else timeout_s)
                self._stream.write(data)
                while True:
                    line = self._stream.readline()
                    if not line:
                        raise BrokerUnavailable(
                            f"broker at {self.address} closed the connection",
                            "broker_unavailable",
                        )
                    msg = self._decode(line)
                    if not isinstance(msg, dict):
                        raise ValueError("the answer is not a JSON-RPC object")
                    if "id" not in msg and msg.get("method") == "event":
                        self._queue_event(msg.get("params") or {})
                        continue
                    if msg.get("id") is None and isinstance(msg.get("error"), dict):
                        _raise_refusal(msg["error"], self.address)  # refused at connect
                    if msg.get("id") != request_id:
                        # a pipelined request's answer, or one to an abandoned request
                        self._pipelined_answer(msg)
                        continue
                    break
                self._raise_failed()  # a pipelined request read meanwhile was refused
            except TimeoutError:
                raise BrokerUnavailable(
                    f"the broker at {self.address} did not answer {method} within "
                    f"{self._stream_timeout_words(timeout_s)}",
                    "broker_unavailable",
                ) from None
            except (OSError, ValueError) as exc:
                if isinstance(exc, OSError):  # refused at connect, closed before we wrote
                    self._raise_pending_refusal()
                raise BrokerUnavailable(
                    f"lost the broker at {self.address}: {exc}", "broker_unavailable"
                ) from None
        if isinstance(msg.get("error"), dict):
            raise _wire_error(msg["error"])
        if "result" not in msg:
            raise BrokerUnavailable(
                f"the peer at {self.address} sent neither a result nor an error",
                "broker_unavailable",
            )
        return msg["result"]

    def _stream_timeout_words(self, timeout_s: float | None) -> str:
        """`timeout_s` of `call` as words ("33 s")."""
        seconds = self.timeout_s if timeout_s == -1.0 else timeout_s
        return f"{seconds:.3g} s" if seconds is not None else "its time"

    def _raise_pending_refusal(self) -> None:
        """Raise the connection-level error the broker sent before closing, if it did."""
        try:
            self._stream.settimeout(0.5)
            msg = self._decode(self._stream.readline() or b"null")
        except (OSError, ValueError):
            return
        if isinstance(msg, dict) and msg.get("id") is None and isinstance(msg.get("error"), dict):
            _raise_refusal(msg["error"], self.address)

    def wait_until_closed(self, timeout_s: float, wake: socket.socket | None = None) -> bool:
        """Block up to `timeout_s` s; True as soon as the broker closes this connection.

        Returns False when the time passes, `wake` (a socket another thread writes to)
        becomes readable, this client is closed (by any thread), or the answer to a
        `call_nowait` request is an error (`on_failed` has it). Event notifications that
        arrive meanwhile are queued for `next_event`; answers to pipelined requests are taken.
        """
        end = time.monotonic() + timeout_s
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0 or self._closed:
                return False
            try:
                state = self._stream.wait_readable(remaining, wake)
            except (OSError, ValueError):  # closed by another thread under the wait
                return not self._closed
            if state == "closed":
                return True
            if state != "data":
                return False
            with self._lock:
                try:
                    if self._closed:
                        return False
                    self._stream.settimeout(1.0)
                    line = self._stream.readline()
                except TimeoutError:
                    continue
                except (OSError, ValueError):
                    return not self._closed  # closed here, by another thread: not the broker
                if not line:
                    return True
                with contextlib.suppress(ValueError):
                    msg = self._decode(line)
                    if isinstance(msg, dict) and msg.get("method") == "event":
                        self._queue_event(msg.get("params") or {})
                    elif isinstance(msg, dict) and self._pipelined_answer(msg):
                        return False  # a pipelined request failed: the caller looks

    def settle(self, timeout_s: float) -> bool:
        """Read the answers to this connection's `call_nowait` requests, for up to
        `timeout_s` s; True once none is unanswered (a refusal among them goes to
        `on_failed` and waits for the next call), False when the time passed first (the
        broker is stalled) or the connection broke. Events read meanwhile are queued."""
        end = time.monotonic() + timeout_s
        with self._lock:
            while self._pipelined:
                remaining = end - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False
                try:
                    self._stream.settimeout(remaining)
                    line = self._stream.readline()
                except (OSError, ValueError):  # TimeoutError among them
                    return False
                if not line:
                    return False
                with contextlib.suppress(ValueError):
                    msg = self._decode(line)
                    if isinstance(msg, dict) and msg.get("method") == "event":
                        self._queue_event(msg.get("params") or {})
                    elif isinstance(msg, dict):
                        self._pipelined_answer(msg)
            return True

    def next_event(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """The next queued event notification (after `subscribe()`), or None on timeout.

        Events arrive while another call is reading; call `wait_event` to read directly."""
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def wait_event(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """Block reading the connection until one event arrives (None on timeout).

        Raises:
            BrokerUnavailable: the broker closed the connection or went away, or this client
                was closed (by any thread, also while this call waits: "client is closed").
        """
        queued = self.next_event(0)
        if queued is not None:
            return queued
        with self._lock:
            try:
                if self._closed:
                    raise OSError("client is closed")
                self._stream.settimeout(timeout_s)
                line = self._stream.readline()
            except TimeoutError:
                return None
            except (OSError, ValueError) as exc:
                # `close()` from another thread (it never waits for this lock) ends the wait:
                # the stream is gone under the read, said as the client being closed
                if self._closed:
                    raise BrokerUnavailable("client is closed", "broker_unavailable") from None
                raise BrokerUnavailable(f"lost the broker: {exc}", "broker_unavailable") from None
        if not line:
            said = "client is closed" if self._closed else "broker closed the connection"
            raise BrokerUnavailable(said, "broker_unavailable")
        try:
            msg = self._decode(line)
        except ValueError as exc:
            raise BrokerUnavailable(f"lost the broker: {exc}", "broker_unavailable") from None
        if isinstance(msg, dict) and msg.get("method") == "event":
            return msg.get("params")
        if isinstance(msg, dict):
            with self._lock:
                self._pipelined_answer(msg)
        return None

    # -- typed helpers ---------------------------------------------------------------------
    def hello(self) -> HelloResult:
        """`hello`: protocol version, broker version, simulated or not, your user name."""
        result: HelloResult = self.call(
            "hello", protocol_version=PROTOCOL_VERSION, client="rbroker-python"
        )
        return result

    def gpus(self) -> list[GpuView]:
        """`gpus.list`: per GPU, the capacity split (MiB) and telemetry state."""
        result: GpusListResult = self.call("gpus.list")
        return result["gpus"]

    def leases(self, include_ended: bool = False) -> LeasesListResult:
        """`leases.list`: `{"leases": [...], "queue": [...]}` (+ `"ended"`)."""
        result: LeasesListResult = self.call("leases.list", include_ended=include_ended)
        return result

    def status(self) -> BrokerStatus:
        """`broker.status`."""
        result: BrokerStatus = self.call("broker.status")
        return result

    def jobs(self) -> list[JobView]:
        """`jobs.list` (parallel jobs; architecture.md §4), finished ones included."""
        return self.jobs_list()["jobs"]

    def jobs_list(self, include_finished: bool = True) -> JobsListResult:
        """`jobs.list`: the jobs (the asker's and the others' the list bound lets through),
        with how many were left out; `include_finished` adds the ended ones."""
        result: JobsListResult = self.call("jobs.list", include_finished=include_finished)
        return result

    # -- leases ------------------------------------------------------------------------------
    def acquire(self, request: AcquireRequest, timeout_s: float | None = -1.0) -> AcquireResult:
        """`lease.acquire` with `request` (the keys of `rbroker_protocol.localapi.
        AcquireParams`; a key left out takes the model's default). The lease is bound to
        this connection: closing it releases the lease.

        Args:
            timeout_s: how long to wait for the answer (past the request's `wait_s`): -1
                the client's default, None for ever.

        Raises:
            CapacityUnavailable, WaitTimeout, Infeasible, InvalidParams, DescriptionRejected
            and the other refusals of docs/architecture.md §5; BrokerUnavailable.
        """
        result: AcquireResult = self.call("lease.acquire", timeout_s=timeout_s, **request)
        return result

    def renew(self, lease_id: str) -> LeaseResult:
        """`lease.renew`: the lease's TTL starts again. Raises LeaseExpired, LeaseNotFound,
        NotLeaseOwner, BrokerUnavailable."""
        result: LeaseResult = self.call("lease.renew", lease_id=lease_id)
        return result

    def renew_nowait(self, lease_id: str) -> None:
        """`lease.renew`, pipelined (`call_nowait`): a refusal reaches `on_failed` with
        `RENEW` as the method and is raised by the next call."""
        self.call_nowait(RENEW, lease_id=lease_id)

    def attach(self, lease_id: str, token: str) -> AttachResult:
        """`lease.attach`: bind a lease to this connection with the token of its grant (after
        a reconnect); answers a fresh token. Raises LeaseNotFound, NotLeaseOwner (a wrong
        token), StorageUnavailable (the token could not be written), BrokerUnavailable."""
        result: AttachResult = self.call("lease.attach", lease_id=lease_id, token=token)
        return result

    def release(self, lease_id: str, timeout_s: float | None = -1.0) -> LeaseResult:
        """`lease.release`: the lease as it ended. Raises LeaseNotFound, NotLeaseOwner,
        BrokerUnavailable."""
        result: LeaseResult = self.call("lease.release", timeout_s=timeout_s, lease_id=lease_id)
        return result

    def resize(
        self, lease_id: str, mib: int, wait_s: float = 0.0, timeout_s: float | None = -1.0
    ) -> LeaseResult:
        """`lease.resize`: the lease's grant becomes `mib` MiB on each of its GPUs; a growth
        waits up to `wait_s`. Raises InvalidParams, CapacityUnavailable, WaitTimeout,
        Infeasible, LeaseExpired, LeaseNotFound, NotLeaseOwner, ResizePending."""
        result: LeaseResult = self.call(
            "lease.resize", timeout_s=timeout_s, lease_id=lease_id, mib=mib, wait_s=wait_s
        )
        return result

    def cancel_request(self, request_id: int) -> CancelResult:
        """`request.cancel`: withdraw a waiting request (its number in `leases.list`'s
        queue). Raises RequestNotFound, NotLeaseOwner."""
        result: CancelResult = self.call("request.cancel", request_id=request_id)
        return result

    def pause(self, paused: bool) -> PauseResult:
        """`broker.pause` (administrators): pause or resume new admissions."""
        result: PauseResult = self.call("broker.pause", paused=paused)
        return result

    def audit(self, limit: int = 200, before_seq: int | None = None) -> AuditListResult:
        """`audit.list` (administrators): the newest `limit` entries of the broker's audit
        trail (those before `before_seq` when given), oldest first, and whether it verifies
        (architecture.md §3, "Audit trail")."""
        params: dict[str, int] = {"limit": limit}
        if before_seq is not None:
            params["before_seq"] = before_seq
        result: AuditListResult = self.call("audit.list", **params)
        return result

    # -- bookings (docs/architecture.md §2a) --------------------------------------------------
    def book(
        self,
        *,
        mib: int,
        start_at: float,
        end_at: float,
        project: str,
        session: str,
        purpose: str,
        gpus: int = 1,
        gpu_uuid: str | None = None,
    ) -> BookingView:
        """`booking.create`: book `mib` MiB on each of `gpus` GPUs (or on the pinned
        `gpu_uuid`) for the wall-clock window [`start_at`, `end_at`), Unix seconds (UTC).
        Answers the booking accepted. Raises BookingRefused (does not fit: the message
        carries the arithmetic and the nearest window), InvalidParams, DescriptionRejected,
        a per-user bound's refusal, BrokerUnavailable."""
        params: dict[str, Any] = {
            "mib": mib,
            "gpus": gpus,
            "start_at": start_at,
            "end_at": end_at,
            "project": project,
            "session": session,
            "purpose": purpose,
        }
        if gpu_uuid:
            params["gpu_uuid"] = gpu_uuid
        result: BookResult = self.call("booking.create", **params)
        return result["booking"]

    def cancel_booking(self, booking_id: str) -> BookingView:
        """`booking.cancel`: the booking as it is after the cancel (the owner's, or anyone's
        for an administrator). Raises BookingNotFound, NotBookingOwner, BrokerUnavailable."""
        result: BookingResult = self.call("booking.cancel", booking_id=booking_id)
        return result["booking"]

    def check_room(
        self,
        mib: int,
        gpus: int = 1,
        gpu_uuid: str | None = None,
        expected_s: float | None = None,
    ) -> RoomCheckResult:
        """`room.check`: whether `mib` MiB on each of `gpus` GPUs (or on `gpu_uuid`) would be
        granted to this user now, nothing taken (`rbroker watch`). Raises Infeasible,
        InvalidParams, TelemetryUnavailable (what an acquire refuses at once),
        BrokerUnavailable."""
        params: dict[str, Any] = {"mib": mib, "gpus": gpus}
        if gpu_uuid is not None:
            params["gpu_uuid"] = gpu_uuid
        if expected_s is not None:
            params["expected_s"] = expected_s
        result: RoomCheckResult = self.call("room.check", **params)
        return result

    def bookings(self, include_ended: bool = False) -> BookingsListResult:
        """`bookings.list`: the asker's bookings first, then everyone's, each by start, with
        the broker's wall clock (`now_at`, Unix seconds) and each GPU's usable MiB by UUID;
        `include_ended` adds the ended, lapsed and cancelled ones kept."""
        result: BookingsListResult = self.call("bookings.list", include_ended=include_ended)
        return result

    def live_bookings(self) -> list[BookingView]:
        """The live bookings of `bookings()`; [] from a broker older than bookings (it has
        no such method), so that a view of leases still works against it."""
        try:
            return list(self.bookings()["bookings"])
        except MethodNotFound:
            return []

    # -- parallel jobs (docs/architecture.md §4) ---------------------------------------------
    def job_declare(
        self,
        *,
        project: str,
        purpose: str,
        handler: str,
        workers: int = 1,
        total_items: int | None = None,
    ) -> JobResult:
        """`job.declare`: a parallel job, owned by this connection's user. Raises
        DescriptionRejected, InvalidParams, a per-user bound's refusal."""
        params: dict[str, Any] = {
            "project": project,
            "purpose": purpose,
            "handler": handler,
            "workers": workers,
        }
        if total_items is not None:
            params["total_items"] = total_items
        result: JobResult = self.call("job.declare", **params)
        return result

    def job_update(
        self,
        job_id: str,
        state: str | None = None,
        reason: str | None = None,
        workers: int | None = None,
    ) -> JobResult:
        """`job.update`: the job's state or allocated workers (None: unchanged, not sent)."""
        params: dict[str, Any] = {"job_id": job_id}
        for name, value in (("state", state), ("reason", reason), ("workers", workers)):
            if value is not None:
                params[name] = value
        result: JobResult = self.call("job.update", **params)
        return result

    def job_report(
        self, job_id: str, chunk_id: str, completed: int = 0, failed: int = 0
    ) -> JobReportResult:
        """`job.report`: one chunk's counts (idempotent by `chunk_id`). Raises InvalidParams,
        JobFinished, JobNotFound."""
        result: JobReportResult = self.call(
            "job.report", job_id=job_id, chunk_id=chunk_id, completed=completed, failed=failed
        )
        return result

    def subscribe(self) -> None:
        """`events.subscribe`: lease/queue/capacity changes arrive as events."""
        self.call("events.subscribe")

    def sim_allocate(self, mib: int, gpu_uuid: str | None = None) -> SimMemoryResult:
        """Simulation only: make this process show `mib` more MiB on a GPU."""
        params: dict[str, Any] = {"mib": mib}
        if gpu_uuid:
            params["gpu_uuid"] = gpu_uuid
        result: SimMemoryResult = self.call("sim.allocate", **params)
        return result

    def sim_free(self, mib: int | None = None, gpu_uuid: str | None = None) -> SimMemoryResult:
        """Simulation only: undo simulated memory of this process."""
        params: dict[str, Any] = {}
        if mib is not None:
            params["mib"] = mib
        if gpu_uuid:
            params["gpu_uuid"] = gpu_uuid
        result: SimMemoryResult = self.call("sim.free", **params)
        return result

    def sim_set(self, gpu_uuid: str, **changes: Any) -> SimSetResult:
        """Simulation only: change a simulated GPU (scenario fields)."""
        result: SimSetResult = self.call("sim.set", gpu_uuid=gpu_uuid, **changes)
        return result


__all__ = ["Client", "RBrokerError"]
