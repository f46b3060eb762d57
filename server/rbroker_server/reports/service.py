"""Ingest one signed report: the hot path (prebuilt SQLAlchemy Core statements: one read,
then one short write transaction whose conditional UPDATE decides).

Order of checks: envelope structure → computer known → signature over the exact payload
bytes → computer not revoked → payload schema → (run, seq) order and run counter order →
write. Nothing of the
payload is parsed before its signature holds.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy.engine import Engine

from rbroker_protocol.reports import ReportPayload
from rbroker_protocol.signing import Envelope, EnvelopeError, parse_envelope, verify_report
from rbroker_server.db import utcnow, write_lock
from rbroker_server.reports import statements as st
from rbroker_server.reports.redact import checked_name, checked_text, redacted_state
from rbroker_server.reports.schema import AckCode, ReportAck
from rbroker_server.settings import Settings

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


class _NotApplied(Exception):
    def __init__(self, code: AckCode, reason: str, current_run_counter: int | None = None) -> None:
        self.code = code
        self.reason = reason
        self.current_run_counter = current_run_counter


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


def ingest(
    engine: Engine, settings: Settings, body: bytes, received_at: datetime | None = None
) -> ReportAck:
    """Verify and apply one report envelope (`body`, the exact bytes received).

    Raises:
        ReportTooLarge, ReportUnauthenticated, ComputerRevoked, ReportInvalid
        (PayloadNestedTooDeeply for a payload nested deeper than pydantic's JSON parser
        reads, 200 levels).
    """
    if len(body) > settings.max_body_bytes:
        raise ReportTooLarge
    now = received_at or utcnow()
    try:
        env = parse_envelope(body)
    except EnvelopeError as exc:
        raise ReportUnauthenticated(str(exc)) from exc
    try:
        return _apply(engine, settings, env, now)
    except _NotApplied as exc:
        # Nothing was written (the transaction rolled back); the computer treats it as delivered.
        return ReportAck(
            applied=False,
            code=exc.code,
            reason=exc.reason,
            computer_id=env.computer_id,
            run_id=env.run_id,
            seq=env.seq,
            current_run_counter=exc.current_run_counter,
        )


def _apply(engine: Engine, settings: Settings, env: Envelope, now: datetime) -> ReportAck:
    # Read and verify outside any write transaction; the conditional UPDATE below is what
    # decides, so a report racing this one can never be overwritten by an older seq.
    with engine.connect() as conn:
        row = conn.execute(st.SELECT_COMPUTER, {"w_id": env.computer_id}).first()
    if row is None:
        raise ReportUnauthenticated("unknown computer")
    try:
        payload = verify_report(env, row.public_key)
    except EnvelopeError as exc:
        raise ReportUnauthenticated(str(exc)) from exc
    if row.revoked_at is not None:
        raise ComputerRevoked
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
    if report.run_id != env.run_id:
        raise ReportInvalid("payload run_id differs from the envelope's")

    same_run = row.run_id == env.run_id
    if same_run and env.seq <= row.seq:
        raise _NotApplied("not_newer", f"not applied: seq {env.seq} is not newer than {row.seq}")
    if (
        not same_run
        and report.run_counter is not None
        and row.run_counter is not None
        and report.run_counter < row.run_counter
    ):
        # a run older than the current one (e.g. its report was delivered late) never
        # replaces it; the conditional UPDATE below re-checks that the current run is the
        # one read here, and a run's counter never changes
        raise _NotApplied(
            "run_outdated",
            f"not applied: run counter {report.run_counter} is older than the current run's "
            f"{row.run_counter}; a live broker continues with a run counter above "
            f"{row.run_counter}",
            current_run_counter=row.run_counter,
        )

    state, flags = redacted_state(report)
    name, name_flag = checked_name(report.computer_name)
    text, text_flags = checked_text(report)
    flags[:0] = ([name_flag] if name_flag else []) + text_flags
    generated = _from_unix(report.generated_at)
    params: dict[str, Any] = {
        "w_id": env.computer_id,
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
        params.update(v_flagged_at=now, v_flags=flags)
        log.warning(
            "computer %s sent text the description rules reject (stored redacted): %s",
            env.computer_id,
            ", ".join(f"{f['field']} ({f['rule']})" for f in flags),
        )
    bucket = history_bucket(now, settings.history_step_s)
    new_bucket = row.history_at is None or bucket > row.history_at
    if new_bucket:
        params["v_history_at"] = bucket
    if same_run:
        params.update(w_run=env.run_id, w_seq=env.seq)
    else:
        params["v_run_id"] = env.run_id
        params["v_run_counter"] = report.run_counter
        if row.run_id is not None:
            params["w_old_run"] = row.run_id
    update = st.update_computer(
        same_run=same_run,
        old_run_null=row.run_id is None,
        flagged=bool(flags),
        new_bucket=new_bucket,
    )

    with write_lock(engine), engine.begin() as conn:
        dialect = conn.dialect.name
        if not same_run:
            run = {"computer_id": env.computer_id, "run_id": env.run_id, "first_seen_at": now}
            if conn.execute(st.insert_run(dialect), run).first() is None:
                raise _NotApplied(
                    "run_retired", f"not applied: run {env.run_id} was replaced by another run"
                )
        if conn.execute(update, params).rowcount != 1:
            raise _NotApplied("superseded", "not applied: a newer report was applied meanwhile")
        if new_bucket:
            point = {"computer_id": env.computer_id, "at": bucket, "data": history_data(state, now)}
            conn.execute(st.insert_history(dialect), point)
    return ReportAck(
        applied=True,
        code="applied" if same_run else "new_run",
        reason="applied" if same_run else "applied (new run)",
        computer_id=env.computer_id,
        run_id=env.run_id,
        seq=env.seq,
        flagged_fields=[f["field"] for f in flags],
    )
