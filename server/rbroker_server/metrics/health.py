"""The coordinator process's own health on `/metrics`, beside the group's fleet: reports
applied and refused by reason, how long a report takes, the report writer's queue, database
faults, rate-limit refusals and webhook deliveries.

Only a group named in `Settings.health_groups` reads them (they count every group's reports,
refusals and connections; other groups see their own queued deliveries alone). Counters
count in this process since it started (each coordinator process sharing a
database has its own: Prometheus tells them apart by `instance`); the webhook deliveries
queued are read from the database for the caller's group. The names:

- `rbroker_server_reports_applied_total`: reports applied.
- `rbroker_server_reports_refused_total{reason}`: reports not applied: an acknowledged one
  by its answer's code (`not_newer`, `run_retired`, `run_outdated`, `superseded`), a
  refused one by `REFUSAL_REASONS` of its HTTP status
  (`unauthenticated`, `revoked`, `invalid`, `too_large`, `malformed`, `media_type`,
  `unavailable`, `internal`).
- `rbroker_server_report_ingest_seconds`: a histogram of the time from a report's whole
  body to its answer.
- `rbroker_server_report_writer_queued_reports`: reports waiting for the writer's next
  transaction.
- `rbroker_server_database_errors_total`: requests answered 503 for a database fault.
- `rbroker_server_rate_limit_refusals_total{limit}`: requests answered 429 by a rate limit
  (`signin`, `enroll`, `credentials`: per network; `credential`: per credential).
- `rbroker_server_webhook_deliveries_total{outcome}`: delivery attempts, `sent` (a 2xx),
  `retry` (failed, tried again later) or `failed` (given up).
- `rbroker_server_webhook_queued_deliveries`: the caller's group's deliveries waiting (a
  figure of the database, the same from every process: take `max`, not `sum`, over them).
- `rbroker_server_open_connections`: connections open to this process (the ones its
  connection guard admitted, `rbroker_server.edge.slow_clients`).
- `rbroker_server_connections_refused_total{limit}`: connections refused with a 503:
  `total` (over the open connections in all), `per_address`, `reserved` (the last ones,
  kept for light clients).
- `rbroker_server_connections_cut_total{deadline}`: connections closed past the `head` or
  `body` deadline.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# no `*_created` series beside every counter and histogram (prometheus_client's default, which
# the operator guide does not list and a dashboard never reads)
disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)
"""This process's health metrics (not `prometheus_client.REGISTRY`: nothing else of the
process is exported)."""

REFUSAL_REASONS = {
    400: "malformed",
    401: "unauthenticated",
    403: "revoked",
    413: "too_large",
    415: "media_type",
    422: "invalid",
    500: "internal",
    503: "unavailable",
}
"""A refused report's reason by the HTTP status of its answer."""

REPORTS_APPLIED = Counter(
    "rbroker_server_reports_applied",
    "Reports applied by this coordinator process.",
    registry=REGISTRY,
)
REPORTS_REFUSED = Counter(
    "rbroker_server_reports_refused",
    "Reports not applied, by reason: the answer's code, or the HTTP refusal.",
    ["reason"],
    registry=REGISTRY,
)
INGEST_SECONDS = Histogram(
    "rbroker_server_report_ingest_seconds",
    "Seconds from a report's whole body to its answer.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
WRITER_QUEUED = Gauge(
    "rbroker_server_report_writer_queued_reports",
    "Reports waiting for the report writer's next transaction.",
    registry=REGISTRY,
)
DATABASE_ERRORS = Counter(
    "rbroker_server_database_errors",
    "Requests answered 503 because the database could not be reached or written.",
    registry=REGISTRY,
)
RATE_LIMIT_REFUSALS = Counter(
    "rbroker_server_rate_limit_refusals",
    "Requests answered 429 by a rate limit, by limit.",
    ["limit"],
    registry=REGISTRY,
)
WEBHOOK_DELIVERIES = Counter(
    "rbroker_server_webhook_deliveries",
    "Webhook delivery attempts by outcome (sent, retry, failed).",
    ["outcome"],
    registry=REGISTRY,
)
OPEN_CONNECTIONS = Gauge(
    "rbroker_server_open_connections",
    "Connections open to this coordinator process.",
    registry=REGISTRY,
)
CONNECTIONS_REFUSED = Counter(
    "rbroker_server_connections_refused",
    "Connections refused with a 503, by limit (total, per_address, reserved).",
    ["limit"],
    registry=REGISTRY,
)
CONNECTIONS_CUT = Counter(
    "rbroker_server_connections_cut",
    "Connections closed past a deadline (head, body).",
    ["deadline"],
    registry=REGISTRY,
)
WEBHOOK_OUTCOMES = {"delivered": "sent", "queued": "retry", "failed": "failed"}
"""A delivery's state after an attempt, as the outcome label."""

for _reason in ("not_newer", "run_retired", "run_outdated", "superseded"):
    REPORTS_REFUSED.labels(_reason)
for _reason in REFUSAL_REASONS.values():
    REPORTS_REFUSED.labels(_reason)
for _limit in ("signin", "enroll", "credentials", "credential"):
    RATE_LIMIT_REFUSALS.labels(_limit)
for _outcome in WEBHOOK_OUTCOMES.values():
    WEBHOOK_DELIVERIES.labels(_outcome)
for _limit in ("total", "per_address", "reserved"):
    CONNECTIONS_REFUSED.labels(_limit)
for _deadline in ("head", "body"):
    CONNECTIONS_CUT.labels(_deadline)


def connection_refused(refusal: str) -> None:
    """Count a connection refused with `refusal` (`ConnectionGuard.admit`'s words)."""
    if "per address" in refusal:
        limit = "per_address"
    elif "kept for light clients" in refusal:
        limit = "reserved"
    else:
        limit = "total"
    CONNECTIONS_REFUSED.labels(limit).inc()


def report_answered(applied: bool, code: str) -> None:
    """Count an acknowledged report: applied, or not by its answer's code."""
    if applied:
        REPORTS_APPLIED.inc()
    else:
        REPORTS_REFUSED.labels(code).inc()


def report_refused(status: int) -> None:
    """Count a report refused with HTTP `status`."""
    REPORTS_REFUSED.labels(REFUSAL_REASONS.get(status, str(status))).inc()


def webhook_attempted(state: str) -> None:
    """Count a delivery attempt by the delivery's state after it."""
    WEBHOOK_DELIVERIES.labels(WEBHOOK_OUTCOMES.get(state, state)).inc()


def exposition(queued_deliveries: int, process: bool = True) -> bytes:
    """The caller's group's queued deliveries and, with `process`, this process's health
    metrics (every group's: for the operators' groups only, `Settings.health_groups`)."""
    group = CollectorRegistry(auto_describe=True)
    Gauge(
        "rbroker_server_webhook_queued_deliveries",
        "The group's webhook deliveries waiting to be sent.",
        registry=group,
    ).set(queued_deliveries)
    return (generate_latest(REGISTRY) if process else b"") + generate_latest(group)
