"""One signed report, step by step: parse the envelope, verify it against the sender's
key, decode and redact the payload, decide from a view of the computer's row what to write
(`plan`), and write it (`write`: prebuilt SQLAlchemy Core statements whose conditional
UPDATE decides). `rbroker_server.reports.ingest` puts the steps together.

Order of checks: envelope structure → computer known → signature over the exact payload
bytes → computer not revoked → payload schema → (run, seq) order and run counter order →
write. Nothing of the payload is parsed before its signature holds.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy.engine import Connection

from rbroker_protocol.reports import ReportPayload
from rbroker_protocol.signing import Envelope, EnvelopeError, parse_envelope, verify_report
from rbroker_server.reports import statements as st
from rbroker_server.reports.cache import ComputerView
from rbroker_server.reports.payload import Payload
from rbroker_server.reports.payload import read as read_payload
from rbroker_server.reports.redact import (
    checked_name,
    checked_text,
    redacted_lists,
    redacted_state,
)
from rbroker_server.reports.schema import Ack, AckCode
from rbroker_server.settings import USAGE_NAMES_PER_DAY, Settings
from rbroker_server.usage.bound import UsageNames
from rbroker_server.usage.rollup import usage_rows

log = logging.getLogger(__name__)

_HISTORY_GPU_FIELDS = (
    "uuid",
    "index",
    "telemetry",
    "total_mib",
    "headroom_mib",
    "device_used_mib",
    "available_mib",
    "leased_in_use_mib",
    "other_in_use_mib",
    "outstanding_mib",
)


_HISTORY_JOB_FIELDS = (
    "job_id",
    "purpose",
    "state",
    "total_items",
    "completed_items",
    "failed_items",
)


class ReportUnauthenticated(Exception):
    """Malformed envelope, unknown computer or a signature that does not hold (401)."""


class ComputerRevoked(Exception):
    """An authentic report from a revoked computer (403)."""


class ReportInvalid(ValueError):
    """An authentic report whose payload does not fit the schema (422)."""


class PayloadNestedTooDeeply(ReportInvalid):
    """An authentic report whose payload nests deeper than its parser allows (400)."""


class ReportTooLarge(Exception):
    """The body is over `max_body_bytes` (413)."""


def _from_unix(seconds: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(seconds, UTC) if math.isfinite(seconds) else None
    except (OverflowError, OSError, ValueError):
        return None


def history_bucket(at: datetime, step_s: float) -> datetime:
    """Start of the history bucket holding `at`."""
    ts = at.timestamp()
    return datetime.fromtimestamp(ts - ts % step_s, UTC)


def history_data(state: dict[str, Any], received_at: datetime | None = None) -> dict[str, Any]:
    """The chart figures of one state: per GPU MiB figures, lease and queue counts, each
    job's cumulative counts, and the server receive time (Unix s) of the report they came
    from (a bucket's `at` is only its start; rates need the real time)."""
    data: dict[str, Any] = {
        "gpus": [{k: g.get(k) for k in _HISTORY_GPU_FIELDS} for g in state["gpus"]],
        "leases": len(state["leases"]),
        "queue": len(state["queue"]),
        "jobs": [{k: j.get(k) for k in _HISTORY_JOB_FIELDS} for j in state.get("jobs", [])],
    }
    if received_at is not None:
        data["received_at"] = received_at.timestamp()
    return data


Outcome = Literal["applied", "run_exists", "run_current", "not_updated"]
"""What `write` did: applied; nothing (the run was recorded before and the computer's
current run is another: the run is retired); nothing (the run was recorded before and is
the computer's current run, written earlier in the same transaction or by another process
after the view was read: decide again as a report of the current run); nothing (the
conditional UPDATE matched no row: a newer report, a revocation, a new key, or a stale
view)."""


def not_applied(
    env: Envelope, code: AckCode, reason: str, current_run_counter: int | None = None
) -> Ack:
    """The answer to an authentic report that is acknowledged but not applied."""
    return Ack(
        applied=False,
        code=code,
        reason=reason,
        computer_id=env.computer_id,
        run_id=env.run_id,
        seq=env.seq,
        current_run_counter=current_run_counter,
    )


@dataclass(frozen=True, slots=True)
class Checked:
    """An authentic report whose payload fits the schema: its envelope, payload (read by
    `payload.read`, or by pydantic where that does not take it: the same attributes),
    redacted state, flags and the values every write of it binds (`v_<column>`)."""

    env: Envelope
    report: ReportPayload | Payload
    state: dict[str, Any]
    flags: list[dict[str, str]]
    values: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Write:
    """What applying one report writes, decided from `view` (`plan`); call it with a
    connection inside a write transaction (`write`)."""

    checked: Checked
    view: ComputerView
    new_run: bool
    statement: Any
    params: dict[str, Any]
    bucket: datetime | None
    """A new history bucket to write (None: the current one was written already)."""
    now: datetime
    usage: list[dict[str, Any]] = field(default_factory=list)
    """The `daily_usage` increments since the previous report (`usage.rollup.usage_rows`)."""
    usage_names_per_day: int = USAGE_NAMES_PER_DAY
    """`Settings.usage_names_per_day`, for a write given no `UsageNames`."""

    def __call__(self, conn: Connection) -> Outcome:
        return write(conn, self)

    def answer(self) -> Ack:
        """The answer once applied."""
        env = self.checked.env
        return Ack(
            applied=True,
            code="new_run" if self.new_run else "applied",
            reason="applied (new run)" if self.new_run else "applied",
            computer_id=env.computer_id,
            run_id=env.run_id,
            seq=env.seq,
            flagged_fields=[f["field"] for f in self.checked.flags],
        )

    def applied_view(self) -> ComputerView:
        """`view` as the computer's row is once this write has committed."""
        env = self.checked.env
        counter = self.checked.report.run_counter if self.new_run else self.view.run_counter
        generated = self.checked.values["v_generated_at"]
        return self.view.after(
            env.run_id,
            env.seq,
            counter,
            self.bucket,
            generated,
            self.checked.values["v_last_seen_at"],
        )


def parse(body: bytes, settings: Settings) -> Envelope:
    """The envelope of `body` (the exact bytes received), its payload still unparsed.

    Raises:
        ReportTooLarge: over `settings.max_body_bytes`.
        ReportUnauthenticated: not a well-formed envelope.
    """
    if len(body) > settings.max_body_bytes:
        raise ReportTooLarge
    try:
        return parse_envelope(body)
    except EnvelopeError as exc:
        raise ReportUnauthenticated(str(exc)) from exc


def verify(env: Envelope, view: ComputerView) -> bytes:
    """The payload bytes, if the envelope's signature holds for `view`'s key.

    Raises:
        ReportUnauthenticated: it does not (or the stored key is malformed).
    """
    if view.verify_key is None:
        raise ReportUnauthenticated("the computer's stored key is malformed")
    try:
        return verify_report(env, view.verify_key)
    except EnvelopeError as exc:
        raise ReportUnauthenticated(str(exc)) from exc


def decode(env: Envelope, payload: bytes, now: datetime) -> Checked:
    """Decode an authentic payload and apply the description rules (§8) to its text.

    Raises:
        ReportInvalid: it does not fit the report schema, or its run_id is not the
            envelope's; PayloadNestedTooDeeply: nested deeper than pydantic's JSON parser
            reads (200 levels).
    """
    fast = read_payload(payload)
    if fast is not None:
        report: ReportPayload | Payload = fast[0]
        state, flags = redacted_lists(report, fast[1])
    else:
        report, (state, flags) = _pydantic_decode(payload)
    if report.run_id != env.run_id:
        raise ReportInvalid("payload run_id differs from the envelope's")
    name, name_flag = checked_name(report.computer_name)
    text, text_flags = checked_text(report)
    flags[:0] = ([name_flag] if name_flag else []) + text_flags
    generated = _from_unix(report.generated_at)
    values: dict[str, Any] = {
        "v_seq": env.seq,
        "v_last_seen_at": now,
        "v_generated_at": generated,
        "v_clock_skew_s": (generated - now).total_seconds() if generated else None,
        "v_reported_name": name,
        "v_broker_version": text["broker_version"],
        "v_telemetry_source": text["telemetry_source"],
        "v_state": state,
    }
    if flags:
        values.update(v_flagged_at=now, v_flags=flags)
        log.warning(
            "computer %s sent text the description rules reject (stored redacted): %s",
            env.computer_id,
            ", ".join(f"{f['field']} ({f['rule']})" for f in flags),
        )
    return Checked(env, report, state, flags, values)


def _pydantic_decode(
    payload: bytes,
) -> tuple[ReportPayload, tuple[dict[str, Any], list[dict[str, str]]]]:
    """`ReportPayload.from_bytes` of what `payload.read` does not take (it judges every
    refusal), with its redacted state and flags.

    Raises:
        ReportInvalid, PayloadNestedTooDeeply: as `decode`.
    """
    try:
        report = ReportPayload.from_bytes(payload)
    except ValidationError as exc:
        error = exc.errors()[0]
        if error["type"] == "json_invalid" and "recursion limit" in error["msg"]:
            raise PayloadNestedTooDeeply("report payload nested too deeply") from exc
        first = ".".join(str(p) for p in error["loc"])
        raise ReportInvalid(
            f"payload does not fit the report schema ({exc.error_count()} errors, "
            f"first at {first or 'top level'})"
        ) from exc
    return report, redacted_state(report)


def plan(checked: Checked, view: ComputerView, now: datetime, settings: Settings) -> Write | Ack:
    """What to write for `checked`, judged by `view` (the computer's row, or a cached
    copy): a `Write`, or the answer of a report not to apply (`not_newer`,
    `run_outdated`). The write's conditional UPDATE checks again whatever it relied on."""
    env, report = checked.env, checked.report
    same_run = view.run_id == env.run_id
    if same_run and view.seq is not None and env.seq <= view.seq:
        reason = f"not applied: seq {env.seq} is not newer than {view.seq}"
        return not_applied(env, "not_newer", reason)
    if (
        not same_run
        and report.run_counter is not None
        and view.run_counter is not None
        and report.run_counter < view.run_counter
    ):
        # a run older than the current one (e.g. its report was delivered late) never
        # replaces it; the conditional UPDATE re-checks that the current run is the one
        # judged here, and a run's counter never changes
        return not_applied(
            env,
            "run_outdated",
            f"not applied: run counter {report.run_counter} is older than the current run's "
            f"{view.run_counter}; a live broker continues with a run counter above "
            f"{view.run_counter}",
            current_run_counter=view.run_counter,
        )
    by_time = not same_run and _ordered_by_time(report.run_counter, view.run_counter)
    generated: datetime | None = checked.values["v_generated_at"]
    if by_time and generated is not None and view.generated_at and generated < view.generated_at:
        # a run with the current run's counter whose report was generated before the
        # current run's latest is an older run delivered late; the conditional UPDATE
        # checks the time again
        return not_applied(
            env,
            "run_outdated",
            f"not applied: run {env.run_id} reported a state generated "
            f"{(view.generated_at - generated).total_seconds():.3f} s before the current "
            "run's latest report",
            current_run_counter=view.run_counter,
        )
    params: dict[str, Any] = {"w_id": env.computer_id, "w_key": view.public_key, **checked.values}
    bucket: datetime | None = history_bucket(now, settings.history_step_s)
    if view.history_at is not None and bucket is not None and bucket <= view.history_at:
        bucket = None
    else:
        params["v_history_at"] = bucket
    usage: list[dict[str, Any]] = []
    if same_run:
        params.update(w_run=env.run_id, w_seq=env.seq)
        usage = usage_rows(
            env.computer_id, checked.state["leases"], view.last_seen_at, now, settings.stale_after_s
        )
        if usage:
            params["w_last_seen"] = view.last_seen_at
    else:
        params["v_run_id"] = env.run_id
        params["v_run_counter"] = report.run_counter
        if view.run_id is not None:
            params["w_old_run"] = view.run_id
    statement = st.update_computer(
        same_run=same_run,
        old_run_null=view.run_id is None,
        flagged=bool(checked.flags),
        new_bucket=bucket is not None,
        by_time=by_time and generated is not None,
        since=bool(usage),
    )
    return Write(
        checked,
        view,
        not same_run,
        statement,
        params,
        bucket,
        now,
        usage,
        settings.usage_names_per_day,
    )


def _ordered_by_time(report_counter: int | None, current_counter: int | None) -> bool:
    """Whether a new run is ordered against the current one by when their reports were
    generated (the same computer's clock): their run counters are equal (a broker that
    starts a new run after `run_retired` keeps its counter). Brokers that send no counter
    predate `run_outdated` and stay ordered by arrival: refused, they would never start a
    new run."""
    return report_counter is not None and report_counter == current_counter


def write(conn: Connection, w: Write, names: UsageNames | None = None) -> Outcome:
    """Apply `w` inside the caller's write transaction (a new run in a savepoint of its
    own: its run row is kept only with its UPDATE). Writes nothing unless it returns
    "applied". A new run whose row exists is told apart in the same transaction: the
    computer's current run is another ("run_exists": retired) or this one ("run_current":
    `w.view` predates the run's first report). Its usage rows are bounded by `names` (the
    writer's; None: a new one, which reads the computer's pairs).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database refused a statement.
    """
    env = w.checked.env
    dialect = conn.dialect.name
    if w.new_run:
        run = {"computer_id": env.computer_id, "run_id": env.run_id, "first_seen_at": w.now}
        with conn.begin_nested() as savepoint:
            if conn.execute(st.insert_run(dialect), run).first() is None:
                current = conn.execute(st.SELECT_RUN, {"w_id": env.computer_id}).scalar()
                return "run_current" if current == env.run_id else "run_exists"
            if conn.execute(w.statement, w.params).rowcount != 1:
                savepoint.rollback()
                return "not_updated"
    elif conn.execute(w.statement, w.params).rowcount != 1:
        return "not_updated"
    if w.bucket is not None:
        point = {
            "computer_id": env.computer_id,
            "at": w.bucket,
            "data": history_data(w.checked.state, w.now),
        }
        conn.execute(st.insert_history(dialect), point)
    if w.usage:
        bound = names if names is not None else UsageNames(w.usage_names_per_day)
        usage = bound.bounded(conn, w.usage)
        conn.execute(st.add_usage(dialect), usage)
    return "applied"


def write_many(conn: Connection, writes: list[Any], names: UsageNames | None = None) -> list[Any]:
    """Apply `writes` inside the caller's write transaction, in effect in their order;
    the outcome of each.

    Same-run writes of computers that appear once in `writes` share one executemany per
    statement (and one for their history points, one for their usage increments) in a
    savepoint: when fewer rows than writes were updated (a stale cached view), the savepoint
    is rolled back and that group is written one by one. New runs, and computers with
    several writes (their order matters), are written one by one (`write`); other works
    (not a `Write`) are called. Usage rows are bounded by `names` (see `write`).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database refused a statement.
    """
    outcomes: list[Any] = [None] * len(writes)
    seen: dict[str, int] = {}
    for w in writes:
        if isinstance(w, Write):
            cid = w.checked.env.computer_id
            seen[cid] = seen.get(cid, 0) + 1
    groups: dict[int, list[int]] = {}
    for i, w in enumerate(writes):
        if not isinstance(w, Write):
            outcomes[i] = w(conn)
        elif w.new_run or seen[w.checked.env.computer_id] > 1:
            outcomes[i] = write(conn, w, names)
        else:
            groups.setdefault(id(w.statement), []).append(i)
    for members in groups.values():
        group = [writes[i] for i in members]
        if len(group) > 1 and _write_group(conn, group, names):
            for i in members:
                outcomes[i] = "applied"
        else:
            for i, w in zip(members, group, strict=True):
                outcomes[i] = write(conn, w, names)
    return outcomes


def _write_group(conn: Connection, group: list[Write], names: UsageNames | None) -> bool:
    """One executemany of same-run writes sharing a statement (on the driver's cursor:
    `statements.prepared`); False (nothing written) unless every one of them applied."""
    dialect = conn.dialect.name
    with conn.begin_nested() as savepoint:
        update = st.prepared(conn, group[0].statement)
        if update.executemany(conn, [w.params for w in group]) != len(group):
            savepoint.rollback()
            return False
        points = [
            {
                "computer_id": w.checked.env.computer_id,
                "at": w.bucket,
                "data": history_data(w.checked.state, w.now),
            }
            for w in group
            if w.bucket is not None
        ]
        if points:
            st.prepared(conn, st.insert_history(dialect), st.HISTORY_KEYS).executemany(conn, points)
        usage = [row for w in group for row in w.usage]
        if usage:
            bound = names if names is not None else UsageNames(group[0].usage_names_per_day)
            usage = bound.bounded(conn, usage)
            st.prepared(conn, st.add_usage(dialect), st.USAGE_KEYS).executemany(conn, usage)
    return True
