"""`rbroker.lease()`: hold GPU memory for a block of code (architecture.md §6a).

The lease lives on its own connection (a crash or kill of the process closes it, and the
broker frees the lease within a second). Heartbeats run on a daemon thread every ttl/3,
never on the caller's thread, so a CPU-bound main thread cannot starve them.
"""

from __future__ import annotations

import contextlib
import os
import socket as _socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from rbroker._lease_record import Lease, note_over_grant
from rbroker.base.cuda import cuda_indices
from rbroker.base.display import fmt_mib
from rbroker.base.exceptions import (
    BrokerUnavailable,
    Cancelled,
    InvalidParams,
    LeaseExpired,
    RBrokerError,
    StorageUnavailable,
)
from rbroker.base.lazy import Logger
from rbroker.client.local import RENEW, Client

# `rbroker.lease` starts without asyncio (loaded by `alease` alone), `typing`, `uuid` or the
# wire's result types (start-up, docs/architecture.md §10); the idiom type checkers read as
# typing.TYPE_CHECKING (PEP 484's constant, never true at run time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from typing import Any, TypeVar

    from rbroker_protocol.params import AcquireRequest
    from rbroker_protocol.results import AcquireResult, GrantedGpu

    T = TypeVar("T")

log = Logger(__name__)  # logging.getLogger("rbroker._lease") once it says something
LEASE_LOST = "rbroker_lease_lost"
"""Attribute set (True) on the log record that says a lease was lost: a caller that tells
its user itself (`rbroker run`) filters that record out instead of saying it twice."""
BOOKING_NOTICE = "rbroker_booking_notice"
"""Set (True) on the log record of a booking notice to a lease (`booking_notice` events)."""
IDLE_NOTICE = "rbroker_idle_notice"
"""Set (True) on the log record of an idle notice to a lease (`idle_notice` events)."""


DEFAULT_PROJECT = "default"
"""The project of a lease that names none (as `rbroker run --project`'s default)."""

_PROGRAM_NAME_MAX = 64


def program_name() -> str:
    """The running program's name, for the default session and purpose of a lease.

    `python train.py` → `train.py`; `python -m pkg.train` → `pkg.train`; `python -c`, an
    interactive interpreter or a notebook → `python`. Only the name, never the path or the
    arguments (they stay in this process, as with `rbroker run`); at most 64 characters.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = ""
    spec_name = str(getattr(spec, "name", None) or "")
    if spec_name:
        name = spec_name.removesuffix(".__main__")
    elif sys.argv and sys.argv[0] not in ("", "-c", "-"):
        name = os.path.basename(sys.argv[0])
    return (name.strip() or "python")[:_PROGRAM_NAME_MAX]


def request_key() -> str:
    """A new request's key (for the broker to know it again after a reconnect): a random UUID
    of version 4 in hex, as `uuid.uuid4().hex` writes it (`uuid` is not imported: it loads
    `platform` and more on a command's start, issue 44)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # the version, 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # the variant, RFC 4122's
    return raw.hex()


def _descriptions(project: str, session: str | None, purpose: str | None) -> tuple[str, str, str]:
    """Fill in the defaults `rbroker run` uses: session = the program's name, purpose =
    `run <program name>`."""
    if session is None or purpose is None:
        program = program_name()
        session = program if session is None else session
        purpose = f"run {program}" if purpose is None else purpose
    return project, session, purpose


RECONNECT_WINDOW_S = 30.0
"""How long the SDK keeps trying to reach a broker that went away (e.g. restarting)."""

ANSWER_GRACE_S = 30.0
"""How long past its wait `lease.acquire`'s answer may take: a peer silent for longer does
not answer (one line, `BrokerUnavailable`), and with the wait and `RECONNECT_WINDOW_S` past,
the request is not sent again."""


def _reconnect(socket: str | None, give_up_at: float, stop: threading.Event | None) -> Client:
    """Connect again, backing off from 50 ms to 1 s, until `give_up_at` (monotonic).

    Raises:
        BrokerUnavailable: the broker did not come back in time (or `stop` was set).
    """
    delay = 0.05
    while True:
        try:
            return Client(socket)
        except BrokerUnavailable:
            if time.monotonic() + delay > give_up_at or (stop is not None and stop.is_set()):
                raise
        if stop is not None:
            if stop.wait(delay):
                raise BrokerUnavailable("stopped while reconnecting", "broker_unavailable")
        else:
            time.sleep(delay)
        delay = min(1.0, delay * 2)


def _warn_notice(data: dict[str, Any], marker: str) -> None:
    """A notice the broker sent this lease's holder, as one warning of this logger (one
    stderr line under `rbroker run`): its `message` on one line, nothing a terminal obeys;
    the record carries `marker` (True) for callers that tell it themselves."""
    words = "".join(ch for ch in str(data.get("message", "")) if ch.isprintable())
    log.warning("rbroker: %s", words, extra={marker: True})


class _Holder:
    """Owns the connection, the heartbeat thread and the release of one lease.

    When the connection breaks (broker restart), the heartbeat thread reconnects and
    re-attaches the lease with its token; the lease is marked lost only when the broker
    says it is gone or does not come back within the TTL.
    """

    def __init__(
        self,
        client: Client,
        lease: Lease,
        ttl_s: float,
        socket: str | None,
        on_idle: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.client = client
        self.on_idle = on_idle
        self.lease = lease
        self.ttl_s = ttl_s
        self.socket = socket
        self.interval_s = max(0.2, ttl_s / 3)
        self._stop = threading.Event()
        client.on_event = self._on_event
        client.on_failed = self._on_failed
        # written to on release: wakes the heartbeat thread out of its wait at once
        self._wake_r, self._wake_w = _socket.socketpair()
        self._thread = threading.Thread(
            target=self._beat, name=f"rbroker-heartbeat-{lease.lease_id}", daemon=True
        )
        self._thread.start()

    def _on_event(self, params: dict[str, Any]) -> None:
        data = params.get("data") or {}
        if params.get("kind") == "over_grant" and data.get("lease_id") == self.lease.lease_id:
            note_over_grant(self.lease, data)
        if params.get("kind") == "booking_notice" and data.get("lease_id") == self.lease.lease_id:
            # a booking this lease may be in the way of, or that it claims, ends soon
            # (docs/architecture.md §2a): said once, as a warning of this logger
            _warn_notice(data, BOOKING_NOTICE)
        if params.get("kind") == "idle_notice" and data.get("lease_id") == self.lease.lease_id:
            # once per idle episode (docs/architecture.md §3 "Idle"): a warning of this
            # logger (one stderr line under `rbroker run`), then the caller's `on_idle`
            _warn_notice(data, IDLE_NOTICE)
            if self.on_idle is not None:
                try:
                    self.on_idle(dict(data))
                except Exception:  # the caller's handler never breaks the heartbeat
                    log.exception("on_idle callback failed")
        if params.get("kind") == "lease_ended" and data.get("lease_id") == self.lease.lease_id:
            # ended by someone else (an admin, another process of this user): lost now
            state, reason = data.get("state"), data.get("ended_reason")
            why = f"lease {self.lease.lease_id} ended: {state} ({reason})"
            self._lose(LeaseExpired(why, "lease_expired", **data))

    def _on_failed(self, method: str, exc: RBrokerError) -> None:
        # a pipelined renewal was refused (the lease expired or was ended): lost, whichever
        # thread read the answer
        if method == RENEW and not self._stop.is_set():
            self._lose(exc)

    def _lose(self, exc: RBrokerError) -> None:
        if self.lease.lost:
            return
        log.error("lease %s lost: %s", self.lease.lease_id, exc, extra={LEASE_LOST: True})
        self.lease.lost, self.lease.error = True, exc

    def _beat(self) -> None:
        try:
            self._beat_until_stopped()
        finally:
            self._wake_r.close()

    def _beat_until_stopped(self) -> None:
        while not self._stop.is_set():
            # Between heartbeats, watch the connection: a broker that stops (restart,
            # crash) is noticed at once and the lease re-attached within about a second,
            # well inside the grace a restarted broker gives restored leases.
            if self.client.wait_until_closed(self.interval_s, self._wake_r):
                if self._stop.is_set() or not self._reattach():
                    return
                continue
            if self._stop.is_set() or self.lease.lost:
                return
            try:
                # Pipelined: the renewal is sent and not waited for. Its answer is read while
                # the thread watches the connection (or by the next call on it); a refusal
                # reaches `_on_failed`, which marks the lease lost. A slow answer is a
                # stalled broker (it grants a TTL of grace), not a lost one: nothing here
                # gives up on it; a broker that dies closes the connection, and that is what
                # starts a re-attach.
                self.client.renew_nowait(self.lease.lease_id)
            except BrokerUnavailable:
                if self._stop.is_set() or not self._reattach():
                    return
            except RBrokerError as exc:
                if not self._stop.is_set():
                    self._lose(exc)
                return

    def _reattach(self) -> bool:
        self.client.close()
        give_up_at = time.monotonic() + max(self.ttl_s, RECONNECT_WINDOW_S)
        while not self._stop.is_set():
            try:
                client = _reconnect(self.socket, give_up_at, self._stop)
            except BrokerUnavailable as exc:
                if not self._stop.is_set():
                    self._lose(exc)
                return False
            try:
                result = client.attach(self.lease.lease_id, self.lease.token)
            except BrokerUnavailable:
                client.close()
                continue
            except StorageUnavailable as exc:
                # the broker cannot write the fresh token (a full disk): the lease lives on
                # there with its old token, try again until the window closes
                client.close()
                if time.monotonic() + STORAGE_RETRY_S > give_up_at:
                    self._lose(exc)
                    return False
                self._stop.wait(STORAGE_RETRY_S)
                continue
            except RBrokerError as exc:
                client.close()
                self._lose(exc)
                return False
            self.lease.token = result["token"]
            client.on_event = self._on_event
            client.on_failed = self._on_failed  # a refused renewal marks the lease lost
            self.client = client
            log.info("lease %s re-attached after a reconnect", self.lease.lease_id)
            return True
        return False

    def release(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=self.interval_s + 2.0)
        self._wake_w.close()
        if self._thread.is_alive() or not self.client.settle(RENEWAL_ANSWER_WAIT_S):
            # its heartbeat is not answered: the broker is stalled. Do not wait behind it;
            # closing the connection releases the lease as soon as the broker runs again
            log.warning("lease %s: broker not answering; released by closing", self.lease.lease_id)
            self.client.close()
            return
        try:
            self.client.release(self.lease.lease_id, timeout_s=5.0)
        except BrokerUnavailable as exc:
            # The broker is down (restarting): a release is never lost. Deliver it, with the
            # lease's token, as soon as a broker answers again.
            log.warning(
                "release of %s: %s; it will be delivered when the broker is back",
                self.lease.lease_id,
                exc,
            )
            _deliver_later(self.lease, self.socket)
        except RBrokerError as exc:
            if not self.lease.lost:
                log.warning("release of %s: %s", self.lease.lease_id, exc)
        finally:
            self.client.close()


STORAGE_RETRY_S = 0.5
"""How long a re-attach the broker could not write (`storage_unavailable`) waits before it
tries again."""

RENEWAL_ANSWER_WAIT_S = 1.0
"""How long a release waits for the answer to the last (pipelined) renewal; past it the broker
is taken as stalled and the lease released by closing its connection."""

RELEASE_DELIVERY_WINDOW_S = 600.0
"""How long a release that could not be delivered (broker down) keeps being retried."""

_pending_releases: set[threading.Thread] = set()


def _deliver_later(lease: Lease, socket: str | None) -> threading.Thread:
    """Start a daemon thread that releases `lease` once a broker answers again.

    It re-attaches with the lease's token (proving possession after a restart), then
    releases. A lease the broker already ended (expired, or ended because its holder did not
    come back in time) needs nothing more. Gives up after `RELEASE_DELIVERY_WINDOW_S`, or
    when this process exits (the broker then sees its holder gone).
    """

    def deliver() -> None:
        give_up_at = time.monotonic() + RELEASE_DELIVERY_WINDOW_S
        try:
            while True:
                try:
                    client = _reconnect(socket, give_up_at, None)
                except BrokerUnavailable:
                    log.error("release of %s could not be delivered: no broker", lease.lease_id)
                    return
                try:
                    client.attach(lease.lease_id, lease.token)
                    client.release(lease.lease_id)
                    log.info("lease %s released now that the broker is back", lease.lease_id)
                    return
                except BrokerUnavailable:
                    continue  # it went away again: reconnect
                except RBrokerError as exc:
                    log.info("lease %s already ended at the broker: %s", lease.lease_id, exc)
                    return
                finally:
                    client.close()
        finally:
            _pending_releases.discard(threading.current_thread())

    thread = threading.Thread(target=deliver, name=f"rbroker-release-{lease.lease_id}", daemon=True)
    _pending_releases.add(thread)
    thread.start()
    return thread


def _withdrawn() -> Cancelled:
    return Cancelled("request withdrawn: its task was cancelled", "cancelled")


class _Withdrawal:
    """Lets another thread withdraw a request that waits in the broker's queue.

    The request waits on its own connection, read by a thread blocked in `Client.call`.
    `withdraw()` closes that connection: the blocked read ends at once on both transports
    (`rbroker.transport.base.Stream.close`), and the broker drops the connection's waiting
    request, so the requests behind it move up and nothing is granted to it later; a grant
    that raced with the close is freed by the close too (a lease is bound to the connection
    it was granted on). Once the request is granted and handed over (`hand_over`),
    `withdraw()` does nothing: the lease's holder releases it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._handed_over = False
        self.withdrawn = threading.Event()
        """Set by `withdraw()` before the request was handed over."""

    def watch(self, client: Client) -> None:
        """`client` is the request's connection now (the first one, or one after a reconnect).

        Raises:
            Cancelled: the request was withdrawn already (`client` is then closed).
        """
        with self._lock:
            self._client = client
        if self.withdrawn.is_set():
            client.close()
            raise _withdrawn()

    def hand_over(self) -> None:
        """The request is granted and its lease about to be held: later `withdraw()` calls do
        nothing.

        Raises:
            Cancelled: the request was withdrawn first (its connection is then closed, which
                frees the grant).
        """
        with self._lock:
            if not self.withdrawn.is_set():
                self._handed_over, self._client = True, None
                return
            client = self._client
        if client is not None:
            client.close()
        raise _withdrawn()

    def withdraw(self) -> None:
        """Withdraw the request, from any thread, without waiting for the thread that waits
        on it: its connection (if one is open yet) is closed now; a connection opened later is
        closed as soon as `watch` sees it. Nothing once the request was handed over."""
        with self._lock:
            if self._handed_over:
                return
            self.withdrawn.set()
            client = self._client
        if client is not None:
            client.close()


def _acquire(
    mib: int | None,
    project: str,
    session: str,
    purpose: str,
    wait_s: float,
    gpus: int | None,
    gpu_uuid: str | None,
    ttl_s: float,
    adopt: bool,
    socket: str | None,
    job_id: str | None = None,
    on_wait: Callable[[dict[str, Any]], None] | None = None,
    expected_s: float | None = None,
    withdrawal: _Withdrawal | None = None,
    booking_id: str | None = None,
    on_idle: Callable[[dict[str, Any]], None] | None = None,
) -> _Holder:
    """Connect, ask for the lease (waiting up to `wait_s` s), and hold what is granted.

    `mib` and `gpus` may be None when `booking_id` is given: the booking's unclaimed MiB
    and its GPU count then (`_claim_size`); else `mib` is needed and `gpus` defaults to 1.
    `withdrawal` (optional) lets another thread withdraw the request while it waits
    (`_Withdrawal`); it is then not sent again after a broker restart.

    Raises:
        RBrokerError: as `lease()`; Cancelled: withdrawn through `withdrawal`.
    """
    if mib is None and booking_id is None:
        raise InvalidParams(
            "mib: give the MiB to lease on each GPU (or a booking to claim)",
            "invalid_params",
            field="mib",
        )
    if not 0 <= wait_s < float("inf"):  # NaN too: the wait's deadline is computed here
        raise InvalidParams(
            f"wait_s: must be at least 0 seconds and finite, not {wait_s!r}",
            "invalid_params",
            field="wait_s",
        )
    client = Client(socket)
    if withdrawal is not None:
        withdrawal.watch(client)
    socket = client.address  # the broker found holds the lease: reconnect to it, no other
    if mib is None or gpus is None:
        try:
            mib, gpus = _claim_size(client, mib, gpus, booking_id)
        except BaseException:
            client.close()
            raise
    params: AcquireRequest = {
        "mib": mib,
        "gpus": gpus,
        "project": project,
        "session": session,
        "purpose": purpose,
        "ttl_s": ttl_s,
        "adopt": adopt,
        "request_key": request_key(),
    }
    if gpu_uuid is not None:
        params["gpu_uuid"] = gpu_uuid
    if job_id is not None:
        params["job_id"] = job_id
    if expected_s is not None:
        params["expected_s"] = expected_s
    if booking_id is not None:
        params["booking_id"] = booking_id
    done = threading.Event()
    watcher = None
    if on_wait is not None and wait_s > 0:
        params["notify_waiting"] = True
        watcher = threading.Thread(
            target=_relay_waiting, args=(lambda: client, on_wait, done), daemon=True
        )
        watcher.start()
    wait_until = time.monotonic() + wait_s
    result: AcquireResult
    try:
        while True:
            remaining = max(0.0, wait_until - time.monotonic())
            try:
                params["wait_s"] = remaining
                result = client.acquire(params, timeout_s=remaining + ANSWER_GRACE_S)
                break
            except BrokerUnavailable:
                client.close()
                if withdrawal is not None and withdrawal.withdrawn.is_set():
                    # its connection was closed to withdraw it: not a broker that went away
                    raise _withdrawn() from None
                if time.monotonic() >= wait_until + RECONNECT_WINDOW_S:
                    # past the wait and the reconnect window: a peer that takes requests
                    # and never answers them (or drops each connection) is no restart
                    raise
                # the broker went away mid-wait (restart): come back with the same request_key
                stop = withdrawal.withdrawn if withdrawal is not None else None
                client = _reconnect(socket, time.monotonic() + RECONNECT_WINDOW_S, stop)
                if withdrawal is not None:
                    withdrawal.watch(client)
    except BaseException:
        client.close()
        raise
    finally:
        done.set()
        if watcher is not None:
            watcher.join()
    info = result["lease"]
    gpu_uuids = list(info["gpu_uuids"])
    granted = result.get("gpus")
    indices = result.get("cuda_indices")
    if granted is None:  # a broker whose grant does not carry its GPUs: ask for them
        try:
            listed = client.gpus()
        except RBrokerError:  # granted: without the list, the UUID form still works
            listed = []
        except BaseException:
            client.close()  # the connection closing frees the grant
            raise
        indices = cuda_indices(gpu_uuids, listed) if listed else None
        granted = [
            {
                "uuid": g["uuid"],
                "index": g["index"],
                "total_mib": g.get("total_mib"),
                "memory_api": g.get("memory_api"),
            }
            for g in listed
            if g.get("uuid") in gpu_uuids
        ]
    if withdrawal is not None:
        withdrawal.hand_over()  # withdrawn while granted: its connection closed, grant freed
    lease = Lease(
        lease_id=info["lease_id"],
        gpu_uuid=info["gpu_uuid"],
        gpu_uuids=gpu_uuids,
        granted_mib=info["granted_mib"],
        cuda_visible_devices=result["cuda_visible_devices"],
        info=dict(info),
        token=result.get("token", ""),
        gpu_indices=indices,
        gpu_total_mib=_totals(gpu_uuids, granted),
        gpu_total_override=[g["uuid"] for g in granted if g["memory_api"] == "override"],
        socket=socket,
    )
    return _Holder(client, lease, ttl_s, socket, on_idle)


def _claim_size(
    client: Client, mib: int | None, gpus: int | None, booking_id: str | None
) -> tuple[int, int]:
    """`mib` and `gpus` as given, a missing one from the booking `booking_id` (as `rbroker
    run --booking` does): the MiB it has unclaimed on each of its GPUs, its GPU count.
    Without a booking `gpus` is 1. A booking not listed is left to the broker's refusal
    (no such booking, or one that ended).

    Raises:
        InvalidParams: `mib` missing and the booking claimed in full.
    """
    found = None
    if booking_id is not None:
        listed = client.bookings()["bookings"]
        found = next((b for b in listed if b["booking_id"] == booking_id), None)
    if found is None:
        # the broker refuses it (`mib` is missing only with a booking)
        return (1 if mib is None else mib), (1 if gpus is None else gpus)
    left = int(found["mib"]) - int(found.get("claimed_mib") or 0)
    if mib is None and left <= 0:
        raise InvalidParams(
            f"booking {booking_id} is claimed in full ({fmt_mib(int(found['mib']))} MiB)",
            "invalid_params",
            field="mib",
        )
    return (left if mib is None else mib), (len(found["gpu_uuids"]) if gpus is None else gpus)


def _totals(gpu_uuids: list[str], granted: list[GrantedGpu]) -> list[int] | None:
    """Each granted GPU's `total_mib`, in order; None if any is unknown."""
    by_uuid = {g["uuid"]: g["total_mib"] for g in granted}
    totals = [by_uuid.get(u) for u in gpu_uuids]
    if not all(isinstance(t, int) and t > 0 for t in totals):
        return None
    return [int(t) for t in totals if t is not None]


def _relay_waiting(
    client: Callable[[], Client],
    on_wait: Callable[[dict[str, Any]], None],
    done: threading.Event,
) -> None:
    """Pass each `waiting` event of the acquiring connection to `on_wait` until `done`."""
    while not done.is_set():
        event = client().next_event(0.1)
        if event and event.get("kind") == "waiting":
            try:
                on_wait(dict(event.get("data") or {}))
            except Exception:  # the caller's display never breaks the wait
                log.exception("on_wait callback failed")


@contextlib.contextmanager
def lease(
    mib: int | None = None,
    *,
    project: str = DEFAULT_PROJECT,
    session: str | None = None,
    purpose: str | None = None,
    wait_s: float = 0.0,
    gpus: int | None = None,
    gpu_uuid: str | None = None,
    ttl_s: float = 30.0,
    adopt: bool = False,
    socket: str | None = None,
    on_wait: Callable[[dict[str, Any]], None] | None = None,
    expected_s: float | None = None,
    booking: str | None = None,
    on_idle: Callable[[dict[str, Any]], None] | None = None,
) -> Iterator[Lease]:
    """Hold `mib` MiB on `gpus` GPU(s) for the `with` block.

    Blocks up to `wait_s` seconds for the grant (0: fail at once if there is no room),
    renews every `ttl_s`/3 from a background thread, releases on exit (also on
    exceptions; a crash or kill frees it through the closed connection). While the request
    waits in the queue, `on_wait` (optional) is called from a helper thread with the queue
    entry each time its reason changes: `{"reason": "waiting: GPU-3f2a… has 6 144 MiB
    available …", "reason_kind", "reason_data", "ahead", "waiting_s", "request_id", "eta_s",
    "eta_reason", ...}`.

    `on_idle` (optional) is called on the heartbeat thread once per idle episode of the
    lease (the broker saw no GPU use by its processes and no chunk for `[idle]
    idle_after_s`) and when the broker warns of or does a reclaim, with the event's data:
    `{"lease_id", "owner", "project", "notice": "idle" | "reclaim_soon" | "reclaimed",
    "idle_s", "message"}`; each is also logged as a warning of this logger (docs/architecture.md
    §3 "Idle"). A reclaim ends the lease as an admin's revoke does (`lease.lost`).

    `expected_s` (optional, seconds, > 0, at most 30 days) declares how long the block will
    likely hold the lease: requests waiting behind it are told they will likely fit when it
    ends ("1 lease of nlp declared to end by then") rather than judged from how long earlier
    leases lived. A hint only: nothing ends the lease when the block runs longer.

    `booking` (optional, a booking id from `rbroker.book()`) claims that booking of yours:
    from its start until its end the lease is granted on its GPUs ahead of the queue, out of
    the MiB it holds (docs/architecture.md §2a). Without `mib` the lease takes what the
    booking has unclaimed on each of its GPUs, and without `gpus` its number of GPUs (as
    `rbroker run --booking`); else `mib` is needed and `gpus` is 1.

    The descriptions default as in `rbroker run`: `project="default"`, `session` the
    program's name (`program_name()`), `purpose="run <program name>"`.

    With PyTorch (or any CUDA library), take the lease before CUDA initialises and set
    `os.environ["CUDA_VISIBLE_DEVICES"] = lease.cuda_visible_devices` first: the granted
    GPU is then `cuda:0` inside the process (docs/architecture.md §6a).

    Raises:
        CapacityUnavailable / WaitTimeout: no room now / within `wait_s`.
        Infeasible: can never fit here. DescriptionRejected: a description broke a rule.
        TelemetryUnavailable: the GPU's telemetry is failing. BrokerUnavailable: no broker.
        BookingNotClaimable: `booking` has not started (`booking_not_started`) or is over
        (`booking_ended`). BookingNotFound, NotBookingOwner: no such booking of yours.
        InvalidParams: no `mib` and no `booking`, or no `mib` and the booking claimed in
        full.
    """
    project, session, purpose = _descriptions(project, session, purpose)
    holder = _acquire(
        mib,
        project,
        session,
        purpose,
        wait_s,
        gpus,
        gpu_uuid,
        ttl_s,
        adopt,
        socket,
        on_wait=on_wait,
        expected_s=expected_s,
        booking_id=booking,
        on_idle=on_idle,
    )
    try:
        yield holder.lease
    finally:
        holder.release()
    _raise_over_grant(holder.lease)


@contextlib.asynccontextmanager
async def alease(
    mib: int | None = None,
    *,
    project: str = DEFAULT_PROJECT,
    session: str | None = None,
    purpose: str | None = None,
    wait_s: float = 0.0,
    gpus: int | None = None,
    gpu_uuid: str | None = None,
    ttl_s: float = 30.0,
    adopt: bool = False,
    socket: str | None = None,
    expected_s: float | None = None,
    booking: str | None = None,
    on_idle: Callable[[dict[str, Any]], Awaitable[object] | None] | None = None,
) -> AsyncIterator[Lease]:
    """`async with rbroker.alease(...)`: `lease()` for asyncio code.

    Each wait happens on a thread of its own (`_on_own_thread`), never on the event loop's
    default executor, whose few threads (min(32, CPUs + 4)) would let only that many
    requests of a process wait at once while the others stalled behind them; heartbeats run
    on their own thread, so a busy event loop cannot let the lease expire. A task cancelled
    while its request waits withdraws it at once: the request's connection is closed (from
    the event loop's thread), so the broker drops it from its queue, the requests behind it
    move up and nothing is granted to it later; a grant that came just before is released.
    Defaults and errors as for `lease()`.

    `on_idle` (optional) gets the idle notices `lease()`'s does, with the same data, on the
    event loop's thread: a function is called there, an async function's coroutine runs
    there as a task; an exception of either is logged, as `lease()` logs its callback's.
    """
    import asyncio

    project, session, purpose = _descriptions(project, session, purpose)
    withdrawal = _Withdrawal()
    idle = None if on_idle is None else _on_loop(on_idle, asyncio.get_running_loop(), "on_idle")
    granting = _on_own_thread(
        lambda: _acquire(
            mib, project, session, purpose, wait_s, gpus, gpu_uuid, ttl_s, adopt, socket,
            expected_s=expected_s, withdrawal=withdrawal, booking_id=booking, on_idle=idle,
        ),
        on_abandoned=lambda granted: granted.release(),
    )  # fmt: skip
    try:
        holder = await granting
    except asyncio.CancelledError:
        # Still waiting: out of the broker's queue now, not when it would have been granted
        # (closing a connection never blocks on the broker).
        withdrawal.withdraw()
        # Cancelled just as the grant came (handed over, so not withdrawn): nobody holds it.
        if granting.done() and not granting.cancelled() and granting.exception() is None:
            threading.Thread(target=granting.result().release, daemon=True).start()
        raise
    try:
        yield holder.lease
    finally:
        await _on_own_thread(holder.release)
    _raise_over_grant(holder.lease)


def _on_own_thread(
    work: Callable[[], T], on_abandoned: Callable[[T], object] | None = None
) -> asyncio.Future[T]:
    """Run `work` on a new daemon thread; its result or exception comes back as a future of
    the running loop. When that future is cancelled first (the awaiting task was), a result
    that still comes is passed to `on_abandoned` on that thread. A daemon thread, so that a
    wait still going on never holds up the interpreter's exit."""
    import asyncio

    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if future.cancelled():
            if error is None and on_abandoned is not None:  # not on the loop: it may block
                threading.Thread(target=on_abandoned, args=(value,), daemon=True).start()
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)  # type: ignore[arg-type]

    def run() -> None:
        try:
            value = work()
        except BaseException as exc:  # passed to the awaiting task
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, None, exc)
            return
        try:
            loop.call_soon_threadsafe(settle, value, None)
        except RuntimeError:  # the loop closed: nobody takes the result
            if on_abandoned is not None:
                on_abandoned(value)

    threading.Thread(target=run, name="rbroker-alease", daemon=True).start()
    return future


def _on_loop(
    callback: Callable[[dict[str, Any]], Awaitable[object] | None],
    loop: asyncio.AbstractEventLoop,
    name: str,
) -> Callable[[dict[str, Any]], None]:
    """`callback` (a function or an async function) as a callback of another thread: each
    call is passed to `loop`, where `callback` runs and an awaitable it returns runs as a
    task; an exception of either is logged (`name` says whose). Once the loop has closed,
    a call is dropped."""
    import asyncio
    import inspect

    tasks: set[asyncio.Future[object]] = set()  # held until done (a loop keeps weak ones)

    def finished(task: asyncio.Future[object]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s callback failed", name, exc_info=task.exception())

    def run(data: dict[str, Any]) -> None:
        try:
            result = callback(data)
            if result is not None and inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                tasks.add(task)
                task.add_done_callback(finished)
        except Exception:  # the caller's handler never breaks the loop
            log.exception("%s callback failed", name)

    def relay(data: dict[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is left to tell
            loop.call_soon_threadsafe(run, data)

    return relay


def _raise_over_grant(lease: Lease) -> None:
    """At the end of a `with` block that raised nothing: the over-grant warning a filter
    made an error, if `lease.check()` did not raise it already."""
    error, lease.over_grant_error = lease.over_grant_error, None
    if error is not None:
        raise error


__all__ = ["BrokerUnavailable", "Lease", "alease", "lease"]
