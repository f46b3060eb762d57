"""Webhooks: events of a real coordinator delivered to a real HTTP receiver on 127.0.0.1,
signed, retried, bounded, once per event across coordinators sharing a database."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from rbroker_protocol.reports import BookingReport, JobSnapshot, LeaseReport, QueueEntry
from rbroker_server.admin.errors import AdminError
from rbroker_server.cli.main import main
from rbroker_server.db.engine import utcnow
from rbroker_server.db.tables import DELIVERIES
from rbroker_server.metrics import health
from rbroker_server.webhooks import admin, events
from rbroker_server.webhooks.sender import Webhooks, claim, signature
from tests.fakes.reports import GPU_A, payload
from tests.server.conftest import Coordinator, wait_until_true

FAST = {"stale_after_s": 0.2, "offline_after_s": 1.5, "webhook_interval_s": 3600.0}
OFFLINE_S = 1.6
"""Long enough for FAST's offline_after_s."""


class Receiver:
    """An HTTP server on 127.0.0.1 that records each POST and answers `status`."""

    def __init__(self, port: int = 0, status: int = 200) -> None:
        self.status = status
        self.got: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(outer.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(b) for _, b in self.got]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does: recompute the HMAC over timestamp "." body, compare in constant
    time, and refuse an old timestamp."""
    stamp = headers["x-rbroker-timestamp"]
    mac = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(stamp)) < 300
    return fresh and hmac.compare_digest(headers["x-rbroker-signature"], "sha256=" + mac)


def step(hooks: Webhooks) -> int:
    async def run() -> int:
        async with httpx.AsyncClient() as client:
            return await hooks.step(client)

    return asyncio.run(run())


def deliveries(c: Coordinator) -> list[Any]:
    with c.engine.connect() as conn:
        return list(conn.execute(sa.select(DELIVERIES).order_by(DELIVERIES.c.id)).all())


def add(c: Coordinator, url: str, evts: str = "computer_offline,computer_back", **kw: Any) -> Any:
    return admin.add_webhook(c.engine, c.settings, "vision", url, evts, **kw)


def test_offline_and_back_delivered_once_each_and_signed(
    coordinator_factory: Callable[..., Coordinator], receiver: Receiver
) -> None:
    c = coordinator_factory(**FAST)
    c.group("vision")
    pc = c.enroll("vision", "pc-<1>")
    assert pc.report().json()["applied"]
    hook = add(c, receiver.url)
    hooks = Webhooks(c.engine, c.settings)
    sent_before = _sent()
    assert step(hooks) == 0  # online: nothing
    time.sleep(OFFLINE_S)
    assert step(hooks) == 1
    assert step(hooks) == 0  # the same offline spell is one event
    assert pc.report(payload("pc-<1>")).json()["applied"]
    assert step(hooks) == 1
    assert step(hooks) == 0
    assert [b["event"] for b in receiver.bodies()] == ["computer_offline", "computer_back"]
    for headers, body in receiver.got:
        assert verified(hook.secret, headers, body)
        assert not verified("rbw_other", headers, body)
    off = receiver.bodies()[0]
    assert off["group"] == "vision" and off["computer"] == "pc-<1>"
    assert off["computer_id"] == pc.id
    assert "pc-&lt;1&gt;" in off["text"] and "offline" in off["text"]  # Slack-escaped
    assert [d.state for d in deliveries(c)] == ["delivered", "delivered"]
    assert _sent() - sent_before == 2  # on /metrics


def _sent() -> float:
    value = health.REGISTRY.get_sample_value(
        "rbroker_server_webhook_deliveries_total", {"outcome": "sent"}
    )
    return value or 0.0


def test_jobs_bookings_and_waiting_requests(
    coordinator_factory: Callable[..., Coordinator], receiver: Receiver
) -> None:
    c = coordinator_factory(webhook_interval_s=3600.0)
    c.group("vision")
    pc = c.enroll("vision")
    old = JobSnapshot(job_id="job-old", purpose="done before", state="succeeded")
    assert pc.report(payload(jobs=[old])).json()["applied"]
    add(c, receiver.url, ",".join(events.EVENTS), waiting_after_s=60)
    now = time.time()
    jobs = [
        old,
        JobSnapshot(job_id="job-1", purpose="sweep", state="failed", failed_items=3),
        JobSnapshot(job_id="job-2", purpose="train", state="succeeded", completed_items=9),
        JobSnapshot(job_id="job-3", state="running"),
    ]
    bookings = [
        BookingReport(
            booking_id="book-1",
            gpu_uuids=["GPU-5a1e0000-0000-0000-0000-000000000001"],
            mib=8192,
            start_at=now - 1,
            end_at=now + 3600,
            owner="ana",
            project="vision",
        ),
        BookingReport(
            booking_id="book-2",
            gpu_uuids=["GPU-5a1e0000-0000-0000-0000-000000000001"],
            mib=8192,
            start_at=now + 600,
            end_at=now + 3600,
        ),
    ]
    queue = [
        QueueEntry(mib=4096, owner="bo", project="nlp", waiting_s=120, reason="GPU 0 full"),
        QueueEntry(mib=2048, owner="cy", waiting_s=5),
    ]
    p = payload(jobs=jobs, bookings=bookings, queue=queue)
    assert pc.report(p).json()["applied"]
    hooks = Webhooks(c.engine, c.settings)
    assert step(hooks) == 4
    assert step(hooks) == 0
    got = {b["event"]: b for b in receiver.bodies()}
    assert sorted(got) == ["booking_starts", "job_failed", "job_finished", "request_waiting"]
    assert got["job_failed"]["job"]["job_id"] == "job-1"
    assert got["job_finished"]["job"]["job_id"] == "job-2"  # job-old was there before
    assert got["booking_starts"]["booking"]["booking_id"] == "book-1"
    assert got["request_waiting"]["request"]["owner"] == "bo"
    assert "GPU 0 full" in got["request_waiting"]["text"]
    for b in got.values():
        assert {"event", "group", "computer", "at", "text"} <= set(b)
        flat = json.dumps(b)
        assert "pid" not in flat and "env" not in flat and "command" not in flat


def test_one_owners_many_waiting_requests_and_idle_leases_are_one_message_each(
    coordinator_factory: Callable[..., Coordinator], receiver: Receiver
) -> None:
    """Before: one user with a hundred waiting requests (or tiny idle leases) sent a hundred
    messages to the group's channel and could fill its delivery queue."""
    c = coordinator_factory(webhook_interval_s=3600.0)
    c.group("vision")
    pc = c.enroll("vision")
    add(c, receiver.url, "request_waiting,lease_idle", waiting_after_s=60, idle_after_s=600)
    queue = [
        QueueEntry(mib=23000, owner="mallory", purpose=f"spam {i}", waiting_s=100.0 + i)
        for i in range(40)
    ]
    queue.append(QueueEntry(mib=4096, owner="bo", project="nlp", waiting_s=90))
    leases = [lease(f"m{i}", "mallory", "idle", 700.0 + i, granted_mib=16) for i in range(30)]
    leases.append(lease("b1", "bo", "idle", 5000.0))
    assert pc.report(payload(queue=queue, leases=leases)).json()["applied"]
    hooks = Webhooks(c.engine, c.settings)
    assert step(hooks) == 4
    assert step(hooks) == 0
    got = {
        (b["event"], b.get("request", b.get("lease", {})).get("owner")): b
        for b in receiver.bodies()
    }
    assert sorted(got) == [
        ("lease_idle", "bo"),
        ("lease_idle", "mallory"),
        ("request_waiting", "bo"),
        ("request_waiting", "mallory"),
    ]
    spam = got[("request_waiting", "mallory")]
    assert spam["request"]["purpose"] == "spam 39"  # the longest waiting of hers
    assert spam["request"]["more_waiting"] == 39
    assert spam["text"].endswith("(and 39 more of theirs waiting)"), spam["text"]
    idle = got[("lease_idle", "mallory")]
    assert idle["lease"]["lease_id"] == "m29" and idle["lease"]["more_idle"] == 29
    assert idle["text"].endswith("(and 29 more of theirs idle)"), idle["text"]
    assert got[("request_waiting", "bo")]["request"]["more_waiting"] == 0
    assert "more of theirs" not in got[("lease_idle", "bo")]["text"]


def lease(lease_id: str, owner: str, idle_state: str, idle_s: float | None, **kw: Any) -> Any:
    return LeaseReport(
        lease_id=lease_id,
        gpu_uuids=[GPU_A],
        granted_mib=kw.pop("granted_mib", 4096),
        owner=owner,
        idle_state=idle_state,  # type: ignore[arg-type]
        idle_s=idle_s,
        **kw,
    )


def test_lease_idle_once_per_episode_and_again_after_busy(
    coordinator_factory: Callable[..., Coordinator], receiver: Receiver
) -> None:
    c = coordinator_factory(webhook_interval_s=3600.0)
    c.group("vision")
    pc = c.enroll("vision", "lab-07")
    t0 = time.time()
    # already idle when the webhook is added: not news
    old_start = t0 - 29000

    def old(at: float) -> LeaseReport:
        return lease("l-old", "old", "idle", at - old_start)

    assert pc.report(payload("lab-07", generated_at=t0 - 20000, leases=[old(t0 - 20000)])).json()[
        "applied"
    ]
    hook = add(c, receiver.url, "lease_idle")  # --idle-after's default, 30 min
    assert hook.events == ("lease_idle",)
    hooks = Webhooks(c.engine, c.settings)
    span_s = events.idle_span_s(admin.IDLE_AFTER_S)
    # alice's lease went idle just before a span's edge (10 min), on the computer's clock
    went_idle = (t0 - 12000) // span_s * span_s - 0.2
    notebook = {"project": "vision", "purpose": "notebook", "granted_mib": 20000}

    def report(at: float, *leases: LeaseReport) -> None:
        r = pc.report(payload("lab-07", generated_at=at, leases=[old(at), *leases]))
        assert r.json()["applied"], r.text

    at = went_idle + 7800  # 2 h 10 min later
    report(
        at,
        lease("l-1", "alice", "idle", at - went_idle, **notebook),
        lease("l-2", "bob", "idle", 1700.0),  # below the threshold
        lease("l-3", "cy", "unknown", None),  # never idle
        lease("l-4", "dee", "unknown", 90000.0),  # unknown, whatever idle_s says
        lease("l-5", "eve", "active", 90000.0),  # the broker did not call it idle
    )
    assert step(hooks) == 1
    (body,) = receiver.bodies()
    assert body["event"] == "lease_idle" and body["computer"] == "lab-07"
    assert body["text"] == (
        ":zzz: alice's lease on lab-07 (project vision, 'notebook') idle 2 h 10 min, "
        "20 000 MiB on GPU 0"
    )
    assert body["lease"] == {
        "lease_id": "l-1",
        "owner": "alice",
        "project": "vision",
        "purpose": "notebook",
        "granted_mib": 20000,
        "gpus": [0],
        "gpu_uuids": [GPU_A],
        "idle_s": 7800.0,
        "idle_since": body["lease"]["idle_since"],
        "more_idle": 0,
    }
    since = datetime.fromisoformat(body["lease"]["idle_since"].replace("Z", "+00:00"))
    assert since.tzinfo == UTC  # the coordinator's clock: the report's arrival − idle_s
    headers, raw = receiver.got[0]
    assert verified(hook.secret, headers, raw) and headers["x-rbroker-event"] == "lease_idle"
    flat = json.dumps(body)
    assert "pid" not in flat and "env" not in flat and "command" not in flat

    # later reports of the same episode, its start now seen 0.5 s later (past the edge)
    at += 60
    report(at, lease("l-1", "alice", "idle", at - went_idle - 0.5, **notebook))
    assert step(hooks) == 0
    at += 600
    report(
        at,
        lease("l-1", "alice", "idle", at - went_idle, **notebook),
        lease("l-2", "bob", "idle", 1800.0),  # now at the threshold: its own episode
    )
    assert step(hooks) == 1
    assert receiver.bodies()[-1]["lease"]["owner"] == "bob"
    # busy, then idle again: a new episode
    at += 300
    report(at, lease("l-1", "alice", "active", 4.0, **notebook))
    assert step(hooks) == 0
    at += 2000
    report(at, lease("l-1", "alice", "idle", 1900.0, **notebook))
    assert step(hooks) == 1
    assert step(hooks) == 0
    again = receiver.bodies()[-1]
    assert again["lease"]["lease_id"] == "l-1" and "idle 31 min" in again["text"]
    assert [b["lease"]["owner"] for b in receiver.bodies()] == ["alice", "bob", "alice"]
    rows = deliveries(c)
    assert sorted(d.state for d in rows) == ["delivered"] * 3 + ["skipped"]
    assert len({d.event_key for d in rows}) == 4


def test_lease_idle_keys_span_the_episode() -> None:
    """The same episode's start seen a tenth of a span around a span's edge has one key or
    a neighbour; the next episode (at least the threshold later) is never a neighbour, down
    to a threshold of 1 s."""

    def key(threshold_s: float, start: float, idle_s: float) -> events.Event:
        made = datetime.fromtimestamp(start + idle_s, UTC)
        row = SimpleNamespace(id="c1", name="pc", last_seen_at=made, generated_at=made)
        hook = SimpleNamespace(idle_after_s=threshold_s)
        item = {"lease_id": "l-1", "idle_state": "idle", "idle_s": idle_s, "granted_mib": 1}
        found = events._lease_idle(row, "g", hook, {}, item)
        assert found is not None
        return found

    for threshold_s in (1.0, 60.0, 1800.0, 86400.0):
        span_s = events.idle_span_s(threshold_s)
        edge = 1_700_000_000 // span_s * span_s
        first = key(threshold_s, edge - span_s / 10, threshold_s)
        same = key(threshold_s, edge + span_s / 10, threshold_s + 60)
        assert same.key != first.key and first.key in same.near
        assert key(threshold_s, edge - span_s / 20, threshold_s * 5).key == first.key
        later = key(threshold_s, edge - span_s / 10 + threshold_s, threshold_s)
        assert later.key != first.key and first.key not in later.near
        assert first.key.startswith("lease_idle:c1:l-1:")
    below = SimpleNamespace(id="c1", name="pc", last_seen_at=None, generated_at=None)
    item = {"lease_id": "l-1", "idle_state": "idle", "idle_s": 59.0, "granted_mib": 1}
    assert events._lease_idle(below, "g", SimpleNamespace(idle_after_s=60.0), {}, item) is None


def test_retried_after_the_receiver_was_down(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(**FAST)
    c.group("vision")
    pc = c.enroll("vision")
    pc.report()
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hook = add(c, f"http://127.0.0.1:{port}/hook")
    hooks = Webhooks(c.engine, c.settings)
    hooks.backoff_base_s = 0.2
    time.sleep(OFFLINE_S)
    assert step(hooks) == 1
    (d,) = deliveries(c)
    assert d.state == "queued" and d.attempts == 1 and d.last_error
    receiver = Receiver(port)
    try:
        wait_until_true(lambda: step(hooks) == 1, timeout_s=5)
        (d,) = deliveries(c)
        assert d.state == "delivered" and d.attempts == 2
        ((headers, body),) = receiver.got
        assert verified(hook.secret, headers, body)
    finally:
        receiver.close()


def test_bounded_when_the_receiver_never_answers(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(**FAST)
    c.group("vision")
    silent = socket.socket()  # accepts connections (the kernel's backlog), never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        pcs = [c.enroll("vision", f"pc-{i}") for i in range(5)]
        for pc in pcs:
            pc.report()
        add(c, f"http://127.0.0.1:{silent.getsockname()[1]}/hook", "computer_offline")
        hooks = Webhooks(c.engine, c.settings)
        hooks.max_queued = 3
        hooks.timeout_s = 0.2
        hooks.backoff_base_s = 0.05
        hooks.backoff_max_s = 0.1
        hooks.give_up_after_s = 1.0
        time.sleep(OFFLINE_S)
        step(hooks)
        assert hooks.drops.total == {"vision": 2}  # 5 offline, 3 queued at most
        assert len(deliveries(c)) == 3
        # the two dropped events are still true: queued once there is room again
        deadline = time.monotonic() + 20
        while len(rows := deliveries(c)) < 5 or any(d.state == "queued" for d in rows):
            assert sum(d.state == "queued" for d in rows) <= 3
            assert time.monotonic() < deadline
            step(hooks)
            time.sleep(0.05)
        rows = deliveries(c)
        assert {d.state for d in rows} == {"failed"}
        assert all("no answer" in d.last_error for d in rows)
        attempts = [d.attempts for d in rows]
        assert all(2 <= a <= 40 for a in attempts)
        step(hooks)  # given up: never attempted again
        assert [d.attempts for d in deliveries(c)] == attempts
    finally:
        silent.close()


def test_reports_go_on_while_a_receiver_never_answers(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        c = coordinator_factory(**{**FAST, "webhook_interval_s": 0.05})
        c.group("vision")
        for i in range(3):
            c.enroll("vision", f"gone-{i}").report()
        add(c, f"http://127.0.0.1:{silent.getsockname()[1]}/hook", "computer_offline")
        pc = c.enroll("vision", "busy")
        # the app's webhook task is waiting on its POSTs (10 s timeout) meanwhile
        wait_until_true(lambda: any(d.attempts for d in deliveries(c)), timeout_s=10)
        for _ in range(10):
            started = time.monotonic()
            assert pc.report().json()["applied"]
            assert time.monotonic() - started < 1.0
    finally:
        silent.close()


def test_rate_per_group(
    coordinator_factory: Callable[..., Coordinator], receiver: Receiver
) -> None:
    c = coordinator_factory(**FAST)
    c.group("vision")
    for i in range(4):
        c.enroll("vision", f"pc-{i}").report()
    add(c, receiver.url, "computer_offline")
    time.sleep(OFFLINE_S)
    hooks = Webhooks(c.engine, c.settings)
    hooks.per_minute = 3
    assert step(hooks) == 3
    assert step(hooks) == 0  # the fourth waits for the next minute
    assert [d.state for d in deliveries(c)].count("queued") == 1


def test_two_coordinators_deliver_each_event_once(
    coordinator_factory: Callable[..., Coordinator], receiver: Receiver
) -> None:
    one = coordinator_factory(**{**FAST, "webhook_interval_s": 0.05})
    coordinator_factory(**{**FAST, "webhook_interval_s": 0.05})  # a second process
    one.group("vision")
    pcs = [one.enroll("vision", f"pc-{i}") for i in range(6)]
    for pc in pcs:
        pc.report()
    add(one, receiver.url)
    # both coordinators' webhook tasks run their passes; each offline event goes out once
    wait_until_true(lambda: len(receiver.got) >= 6, timeout_s=10)
    for pc in pcs:
        pc.report(payload(pc.id))
    wait_until_true(lambda: len(receiver.got) >= 12, timeout_s=10)
    time.sleep(0.5)
    # an event is its computer and the report it follows (a later offline spell is another)
    keys = [
        (b["event"], b["computer_id"], b.get("offline_since") or b["last_seen_at"])
        for b in receiver.bodies()
    ]
    assert len(keys) >= 12 and len(set(keys)) == len(keys)
    ids = [h["x-rbroker-delivery"] for h, _ in receiver.got]
    assert len(set(ids)) == len(ids)
    assert {e for e, _, _ in keys} == {"computer_offline", "computer_back"}


def test_two_coordinators_send_each_idle_episode_once(
    coordinator_factory: Callable[..., Coordinator], receiver: Receiver
) -> None:
    one = coordinator_factory(webhook_interval_s=0.05)
    coordinator_factory(webhook_interval_s=0.05)  # a second process on the same database
    one.group("vision")
    pcs = [one.enroll("vision", f"lab-{i}") for i in range(3)]
    for pc in pcs:
        assert pc.report(payload(pc.id)).json()["applied"]
    add(one, receiver.url, "lease_idle", idle_after_s=60)
    went_idle = time.time() - 120

    def report_all() -> None:
        for pc in pcs:
            at = time.time()
            # two owners: one owner's idle leases on a computer are one message
            leases = [
                lease(f"l-{j}", ("ana", "bo")[j], "idle", at - went_idle - j) for j in range(2)
            ]
            assert pc.report(payload(pc.id, generated_at=at, leases=leases)).json()["applied"]

    def all_sent() -> bool:
        report_all()
        return len(receiver.got) >= 6

    # both coordinators' passes see every report of the same episodes
    wait_until_true(all_sent, timeout_s=10)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        report_all()
    time.sleep(0.5)
    got = [(b["computer_id"], b["lease"]["lease_id"]) for b in receiver.bodies()]
    assert sorted(got) == sorted((pc.id, f"l-{j}") for pc in pcs for j in range(2))
    ids = [h["x-rbroker-delivery"] for h, _ in receiver.got]
    assert len(set(ids)) == len(ids) == 6


def test_claims_never_overlap(coordinator_factory: Callable[..., Coordinator]) -> None:
    c = coordinator_factory(webhook_interval_s=3600.0)
    c.group("vision")
    for i in range(20):
        c.enroll("vision", f"pc-{i}").report()
    add(c, "http://127.0.0.1:9/hook", "computer_offline")
    later = utcnow() + timedelta(seconds=c.settings.offline_after_s + 1)
    assert events.watch(c.engine, c.settings, now=later).queued == 20
    taken: list[int] = []

    def grab() -> None:
        for _ in range(10):
            taken.extend(i.id for i in claim(c.engine, later, per_minute=1000, batch=3))

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == sorted(set(taken)) and len(taken) == 20


def test_signature_scheme() -> None:
    mac = hmac.new(b"s3", b"1700000000.{}", hashlib.sha256).hexdigest()
    assert signature("s3", "1700000000", b"{}") == f"sha256={mac}"


def test_admin_checks(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    for url, evts in [
        ("ftp://x/hook", "computer_offline"),
        ("file:///etc/passwd", "computer_offline"),
        ("https:///nohost", "computer_offline"),
        ("https://chat.example:99999/hook", "computer_offline"),
        ("https://chat.example:port/hook", "computer_offline"),
        ("http://[::1/hook", "computer_offline"),
        ("https://chat.example/hook", "computer_exploded"),
        ("https://chat.example/hook", " , "),
    ]:
        with pytest.raises(AdminError):
            admin.add_webhook(coordinator.engine, coordinator.settings, "vision", url, evts)
    with pytest.raises(AdminError, match="no group"):
        admin.add_webhook(
            coordinator.engine, coordinator.settings, "nope", "https://x/h", "job_failed"
        )
    with pytest.raises(AdminError, match="30 days"):
        admin.add_webhook(
            coordinator.engine,
            coordinator.settings,
            "vision",
            "https://x/h",
            "job_failed",
            waiting_after_s=0,
        )


def test_cli_add_list_remove(
    tmp_path: Path, backend: str, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.server.test_cli import _setup_args

    data = tmp_path / "srv"
    assert main(_setup_args(data, backend, database_url)) == 0
    d = ["--data-dir", str(data)]
    assert main(["group", "create", "vision", *d]) == 0
    capsys.readouterr()
    args = ["webhook", "add", "--group", "vision", "https://chat.example/hooks/T0"]
    thresholds = ["--waiting-after", "5m", "--idle-after", "2h"]
    assert main([*args, "--events", "computer_offline,lease_idle", *thresholds, *d]) == 0
    out = capsys.readouterr()
    hook_id, secret = out.out.strip().split("\t")
    assert secret.startswith("rbw_") and "shown once" in out.err
    assert main(["webhook", "list", "--group", "vision", *d]) == 0
    listed = capsys.readouterr().out
    # the URL's path may be the chat's credential: its origin is shown, never the path
    assert "\thttps://chat.example/…\t" in listed and "hooks/T0" not in listed
    assert secret not in listed
    assert "\twaiting>300s\tidle>7200s\t" in listed
    assert main(["webhook", "list", "--json", *d]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["events"] == ["computer_offline", "lease_idle"] and row["waiting_after_s"] == 300
    assert row["idle_after_s"] == 7200
    assert "secret" not in row and row["url"] == "https://chat.example/…"
    for bad, says in [
        (["webhook", "add", "--group", "vision", "ftp://x/h", "--events", "job_failed"], "http"),
        (["webhook", "add", "--group", "vision", "https://x/h", "--events", "nope"], "unknown"),
        (["webhook", "add", "--group", "nope", "https://x/h", "--events", "job_failed"], "group"),
        (["webhook", "list", "--group", "nope"], "no group"),
        (["webhook", "remove", "999"], "no webhook"),
        (["webhook", "remove", "99999999999999999999999"], "no webhook"),
        (
            ["webhook", "add", "--group", "vision", "https://x:99999/h", "--events", "job_failed"],
            "65535",
        ),
    ]:
        assert main([*bad, *d]) == 1
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        main(["webhook", "remove", "x", *d])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["webhook", "remove", hook_id, *d]) == 0
    assert main(["webhook", "list", *d]) == 0
    assert "chat.example" not in capsys.readouterr().out
