"""The reporter inside the broker: signed state snapshots to the coordinator (architecture.md §7).

- A snapshot every `report_interval_s` (5 s) and on change (debounced, at most one a
  second); each is signed as an envelope with this run's id and the next sequence number.
  A change is a change of what the report says, not of its clocks: the broker's periodic
  samples that find the same figures do not trigger a report.
- Every request has an overall deadline; failures back off exponentially with jitter
  (0.5 s doubling up to `RETRY_SHARE` of the report interval, so a coordinator that comes
  back sees the current state within one interval; up to 30 s when it answers 429); a
  connection dropped while idle gets one immediate retry.
- A 429 or 503 with `Retry-After` (seconds or an HTTP date, RFC 9110 §10.2.3) is obeyed:
  the next try comes that long after the answer, not sooner, at most `RETRY_AFTER_MAX_S`
  and at least `MIN_GAP_S` (a hint of 0, or a date already past, never makes the reporter
  send faster than one report a second).
- A retry sends the identical envelope (the coordinator acknowledges a duplicate and does
  not apply it), so a report that was stored before the connection dropped counts once.
- An acknowledged report whose run the coordinator retired (`run_retired`: another run of
  this computer, e.g. a replayed old one, replaced it) starts a new run id at once.
- Each run carries a run counter (`rbroker.uplink.runs`); a report refused because the
  coordinator's current run has a higher counter (`run_outdated`: e.g. a data dir restored
  from a backup) starts a new run with a counter above it, once, which is accepted.
- 4xx answers other than 429 are not retried: the link says `rejected: <reason>` with when
  it began and when the next try is due, and the next attempt is a fresh snapshot. After a
  refusal of the computer itself (401: unknown computer or bad signature, 403: revoked),
  which no snapshot can change, that is after `REJECTED_PAUSE_S`; after a refusal of the
  report (400, 413, ...), as soon as the reported state changes (debounced, at least
  `MIN_GAP_S` later), or after `REJECTED_PAUSE_S` when it does not. Every repeat of the
  same refusal doubles both pauses, up to `REJECTED_PAUSE_MAX_S` (and `REJECTED_PAUSE_S`
  for the gap), and is logged once: one line when the refusal begins or changes, one when
  a report is delivered again.
- A report too large for the coordinator's 1 MiB limit leaves out the oldest list entries
  (the largest length that fits, see `payload.build_payload`); the link state says how
  many of which (`left_out`, and `detail`).
- Nothing here touches leases: the reporter only reads the broker's views.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
import uuid
from datetime import UTC, datetime

import httpx
import nacl.signing
from pydantic import ValidationError

from rbroker.broker.service import Broker
from rbroker.uplink.config import UplinkConfig
from rbroker.uplink.enroll import http_verify
from rbroker.uplink.payload import build_payload
from rbroker.uplink.runs import RunCounter
from rbroker_protocol.reports import ReportAck
from rbroker_protocol.results import CoordinatorLink
from rbroker_protocol.signing import encode_envelope, sign_report

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
REJECTED_PAUSE_S = 60.0
"""After a 4xx (not 429): the next try when the state changes, else after this long."""
REJECTED_PAUSE_MAX_S = 900.0
"""Longest pause between tries while the same refusal repeats (the pause doubles each time)."""
CREDENTIAL_REFUSALS = frozenset({401, 403})
"""Refusals of the computer, not of the report: a changed snapshot cannot help, so only
the timer brings the next try."""
RETRY_AFTER_MAX_S = 600.0
"""Longest `Retry-After` obeyed; a larger one is cut to this (a misconfigured proxy must
not silence a computer for hours)."""
RETRY_SHARE = 0.8
"""Longest pause between tries, as a share of the report interval: room left for the
resend and the fresh snapshot that follows it to arrive within one interval."""
DEBOUNCE_S = 0.25
MIN_GAP_S = 1.0


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reporter:
    """Reports `broker`'s state as `config.computer_id`, signed with `key`.

    `status()` gives the link state for `broker.status` and `rbroker status`:
    `{link, url, computer_id, last_report_at, detail, left_out}` where `link` is `ok`,
    `retrying since <UTC time>`, `rejected: <reason>` or `connecting`, and `left_out`
    counts, per list (`leases`, `queue`, `jobs`), the oldest entries the last report left
    out to fit the size limit (empty when nothing was).
    """

    def __init__(
        self,
        broker: Broker,
        config: UplinkConfig,
        key: nacl.signing.SigningKey,
        deadline_s: float = 10.0,
        runs: RunCounter | None = None,
        run_counter: int | None = None,
    ) -> None:
        self.broker = broker
        self.config = config
        self.key = key
        self.deadline_s = deadline_s
        self.runs = runs
        self.run_id = uuid.uuid4().hex
        self.run_counter = run_counter if run_counter is not None or runs is None else runs.next()
        self.seq = 0
        self.link = "connecting"
        self.detail = ""
        self.last_report_at: float | None = None
        self.reports_sent = 0
        self.left_out: dict[str, int] = {}
        """List entries left out of the last report to fit the size limit, per list."""
        self._retry_after_s: float | None = None
        self._refusal: tuple[int, str] | None = None
        """Status and reason of the refusal now repeating (None: the last report got through)."""
        self._refusals = 0
        self._refused_since = 0.0
        self.rejected_pause_s = (0.0, 0.0)
        """After a refusal: (the least wait, the longest wait) before the next try."""
        self._sent_state = ""
        self._changed = asyncio.Event()
        self._unsubscribe = broker.subscribe(lambda kind, data: self._changed.set())

    def status(self) -> CoordinatorLink:
        """The link state (see the class docstring)."""
        return {
            "link": self.link,
            "url": self.config.url,
            "computer_id": self.config.computer_id,
            "group": self.config.group,
            "last_report_at": self.last_report_at,
            "reports_sent": self.reports_sent,
            "detail": self.detail,
            "left_out": dict(self.left_out),
        }

    def _envelope(self, stopping: bool = False) -> bytes:
        payload, left_out = build_payload(
            self.broker,
            self.config.name,
            self.run_id,
            run_counter=self.run_counter,
            stopping=stopping,
        )
        self._sent_state = _state_key(payload)
        self.seq += 1
        changed, self.left_out = left_out != self.left_out, left_out
        if left_out:
            what = ", ".join(f"{n} {name}" for name, n in left_out.items())
            self.detail = f"report trimmed to fit the size limit: left out the oldest {what}"
            if changed:
                log.warning("%s", self.detail)
        elif self.detail.startswith("report trimmed"):
            self.detail = ""
        return encode_envelope(
            sign_report(self.key, self.config.computer_id, self.run_id, self.seq, payload)
        )

    def _state_changed(self) -> bool:
        try:
            payload, _ = build_payload(
                self.broker, self.config.name, self.run_id, run_counter=self.run_counter
            )
        except Exception:  # `_envelope` says why
            return True
        return _state_key(payload) != self._sent_state

    async def _wait_trigger(self, pause_s: float, due_s: float | None = None) -> None:
        """Until the next snapshot is due: `due_s` (default `report_interval_s`) after the
        last one, or earlier (after `pause_s`) once the reported state changed."""
        loop = asyncio.get_running_loop()
        due = loop.time() + max(pause_s, self.config.report_interval_s if due_s is None else due_s)
        await asyncio.sleep(pause_s)
        while (left := due - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                break
            await asyncio.sleep(DEBOUNCE_S)
            self._changed.clear()
            if self._state_changed():
                break

    async def _post(self, client: httpx.AsyncClient, body: bytes) -> httpx.Response:
        return await asyncio.wait_for(
            client.post(
                "/api/v1/reports", content=body, headers={"content-type": "application/json"}
            ),
            self.deadline_s,
        )

    async def _send(self, client: httpx.AsyncClient, body: bytes) -> str:
        """One delivery attempt (with the idle-drop retry): `ok`, `retry`, `throttled`
        (429) or `rejected`; after a 429 or 503, `_retry_after_s` holds the server's
        `Retry-After` (bounded), else None."""
        self._retry_after_s = None
        for attempt in (1, 2):
            try:
                response = await self._post(client, body)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if attempt == 1:
                    log.info("connection dropped (%s); resending the same report", exc)
                    continue
                return self._retrying(f"connection dropped: {exc}")
            except (httpx.TransportError, TimeoutError) as exc:
                return self._retrying(
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                )
            if response.is_success:
                ack = _ack(response)
                if ack is not None and ack.code == "run_retired":
                    # another run of this computer replaced ours (e.g. a replayed old run):
                    # start a new run; the next snapshot goes out at once under it
                    self._new_run()
                    log.warning("coordinator retired this run; reporting under a new run id")
                elif ack is not None and ack.code == "run_outdated":
                    current = ack.current_run_counter
                    self._new_run(above=current)
                    log.warning(
                        "coordinator's current run has run counter %s, above ours; "
                        "reporting under a new run with counter %s",
                        current,
                        self.run_counter,
                    )
                if self.link.startswith(("retrying", "rejected")):
                    url = self.config.url
                    log.warning("coordinator reachable again: report delivered to %s", url)
                self.link = "ok"
                self._refusal, self._refusals = None, 0
                self.last_report_at = time.time()
                self.reports_sent += 1
                if not self.detail.startswith("report trimmed"):
                    self.detail = ""
                return "ok"
            reason = _reason(response)
            if response.status_code in (429, 503):
                self._retry_after_s = retry_after_s(response)
                if self._retry_after_s is not None:
                    reason += f" (retry after {self._retry_after_s:g} s)"
            if response.status_code == 429:
                self._retrying(f"{response.status_code} {reason}")
                return "throttled"
            if response.status_code >= 500:
                return self._retrying(f"{response.status_code} {reason}")
            return self._rejected(response.status_code, reason)
        return "retry"  # pragma: no cover - the loop always returns

    def _new_run(self, above: int | None = None) -> None:
        """Report under a new run id (and the next run counter) from now on."""
        self.run_id, self.seq = uuid.uuid4().hex, 0
        if self.runs is not None:
            self.run_counter = self.runs.next(above)
        self._changed.set()

    def _rejected(self, status: int, reason: str) -> str:
        """A 4xx (not 429): the link says so with the next try, which backs off while the
        same refusal repeats; logged when a refusal begins or changes, never per repeat."""
        now = time.time()
        if self._refusal != (status, reason):
            self._refusal, self._refusals, self._refused_since = (status, reason), 0, now
        self._refusals += 1
        factor = 2 ** min(self._refusals - 1, 16)
        longest = min(REJECTED_PAUSE_MAX_S, REJECTED_PAUSE_S * factor)
        least = (
            longest if status in CREDENTIAL_REFUSALS else min(REJECTED_PAUSE_S, MIN_GAP_S * factor)
        )
        self.rejected_pause_s = (least, longest)
        on_change = least < longest  # a refusal of the report: a changed one may pass
        when = "next try on a change, at the latest" if on_change else "next try"
        self.link = (
            f"rejected: {status} {reason} (since {_iso(self._refused_since)}, "
            f"{when} {_iso(now + longest)})"
        )
        self.detail = reason
        if self._refusals == 1:
            log.error(
                "coordinator rejected the report: %s %s; next try %sin %g s, then less and "
                "less often while it is refused",
                status,
                reason,
                "when the report changes or " if on_change else "",
                longest,
            )
        else:
            log.debug("refused again (%d times): %s %s", self._refusals, status, reason)
        return "rejected"

    def _retrying(self, detail: str) -> str:
        if not self.link.startswith("retrying"):
            self.link = f"retrying since {_iso(time.time())}"
            log.warning("coordinator unreachable: %s", detail)
        self.detail = detail
        return "retry"

    async def run(self) -> None:
        """Report until cancelled.

        Raises:
            Exception: the HTTP client cannot be made (e.g. the pinned CA file is gone).
        """
        try:
            async with httpx.AsyncClient(
                base_url=self.config.url,
                verify=http_verify(self.config.ca_file),
                timeout=httpx.Timeout(self.deadline_s, connect=min(3.0, self.deadline_s)),
            ) as client:
                try:
                    await self._loop(client)
                except asyncio.CancelledError:
                    if self.broker.is_shutting_down():
                        await self._last_report(client)
                    raise
        finally:
            self._unsubscribe()

    async def _last_report(self, client: httpx.AsyncClient) -> None:
        """The broker is stopping: one report that says so (the coordinator shows the
        computer offline at once), one attempt within `LAST_REPORT_S`, never an error."""
        try:
            body = self._envelope(stopping=True)
            response = await asyncio.wait_for(self._post(client, body), LAST_REPORT_S)
            log.info("last report (stopping) sent: HTTP %d", response.status_code)
        except Exception as exc:  # the broker stops either way; the fleet then goes stale
            log.info("last report (stopping) not delivered: %s", exc)

    async def _loop(self, client: httpx.AsyncClient) -> None:
        body: bytes | None = None
        made_at = 0.0
        backoff = BACKOFF_MIN_S
        pause = 0.0
        due: float | None = None
        while True:
            if body is None:
                await self._wait_trigger(pause, due)
                due = None
                try:
                    body, made_at = self._envelope(), time.monotonic()
                except Exception as exc:  # never end reporting over one bad snapshot
                    log.exception("cannot build the report")
                    self.link = f"error: cannot build the report: {exc}"[:300]
                    pause = self.config.report_interval_s
                    continue
            outcome = await self._send(client, body)
            if outcome == "ok":
                stale = time.monotonic() - made_at > self.config.report_interval_s
                body, backoff, pause = None, BACKOFF_MIN_S, MIN_GAP_S
                if stale:  # delivered after an outage: send the current state now
                    self._changed.set()
                    pause = 0.0
            elif outcome == "rejected":
                # the next snapshot when what it says changes (the rejected one may have
                # carried what the coordinator refused), at the latest after the longer
                # pause; a refusal of the computer itself waits that long (see _rejected)
                body = None
                pause, due = self.rejected_pause_s
            elif self._retry_after_s is not None:
                await asyncio.sleep(self._retry_after_s)  # the server said when
            else:
                await asyncio.sleep(backoff / 2 + random.uniform(0, backoff / 2))
                cap = BACKOFF_MAX_S
                if outcome != "throttled":
                    cap = min(cap, max(BACKOFF_MIN_S, RETRY_SHARE * self.config.report_interval_s))
                backoff = min(cap, backoff * 2)


LAST_REPORT_S = 2.0
"""Time a stopping broker gives its last report."""


def _state_key(payload: bytes) -> str:
    """What a payload says, without its clocks (generation time, lease expiry countdown,
    queue waiting time): equal keys mean nothing changed worth an early report."""
    state = json.loads(payload)
    state.pop("generated_at", None)
    for lease in state.get("leases", []):
        lease.pop("expires_in_s", None)
    for entry in state.get("queue", []):
        entry.pop("waiting_s", None)
    return json.dumps(state, sort_keys=True)


def retry_after_s(response: httpx.Response, now: float | None = None) -> float | None:
    """The response's `Retry-After` in seconds (delay-seconds or an HTTP date, RFC 9110
    §10.2.3), cut to `MIN_GAP_S`..`RETRY_AFTER_MAX_S` (1..600 s: `0` or a date already past
    is 1 s, the reports' minimum gap); None when absent or unreadable. `now`: Unix time
    (default: the clock)."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(RETRY_AFTER_MAX_S, max(MIN_GAP_S, seconds))


def _ack(response: httpx.Response) -> ReportAck | None:
    """The coordinator's `ReportAck`; None when a successful answer's body is not one (a
    proxy's page, an older coordinator): the report counts as delivered, as HTTP says."""
    try:
        return ReportAck.model_validate_json(response.content)
    except ValidationError:
        log.debug("report answer is not a ReportAck: %.200r", response.content)
        return None


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.reason_phrase or "error"
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("message") or response.reason_phrase)[:200]
    return response.reason_phrase or "error"
