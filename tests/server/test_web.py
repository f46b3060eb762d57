"""The web view over real HTTP (no browser): sessions, CSRF, safety headers, rate limits,
escaping, and `/metrics` against `/api/v1/fleet`. The browser tests are in tests/e2e."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rbroker_protocol.reports import BookingReport, GpuReport, JobSnapshot, LeaseReport
from rbroker_server.admin import operations as admin
from rbroker_server.edge.ratelimit import RateLimiter
from rbroker_server.web.controller import SESSION_COOKIE, SIGNIN_ATTEMPTS
from tests.fakes.reports import GPU_A, gpu_report, payload
from tests.server.conftest import Coordinator

MIB = 1024 * 1024


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def sign_in(coordinator: Coordinator, token: str) -> tuple[httpx.Client, httpx.Response]:
    """A fresh browser-like client that signs in with `token`."""
    client = httpx.Client(base_url=coordinator.url, timeout=30)
    form = client.get("/signin")
    assert form.status_code == 200
    r = client.post("/signin", data={"token": token, "csrf_token": _csrf(form.text)})
    return client, r


def test_sign_in_session_cookie_and_sign_out(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    assert coordinator.http.get("/fleet").status_code == 303  # to /signin
    assert coordinator.http.get("/").headers["location"] == "/signin"
    client, r = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        assert r.status_code == 303 and r.headers["location"] == "/fleet", r.text
        cookie = next(
            v for k, v in r.headers.multi_items() if k == "set-cookie" and SESSION_COOKIE in v
        )
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower(), cookie
        assert "Secure" not in cookie  # plain HTTP here; over HTTPS the cookie is Secure
        assert client.get("/").headers["location"] == "/fleet"
        assert client.get("/signin").headers["location"] == "/fleet"  # already signed in
        page = client.get("/fleet")
        assert page.status_code == 200 and "group <strong>alpha</strong>" in page.text
        assert page.headers["cache-control"] == "no-store"
        # sign-out needs the session's CSRF token
        assert client.post("/signout", data={"csrf_token": "nope"}).status_code == 403
        assert client.get("/fleet").status_code == 200
        out = client.post("/signout", data={"csrf_token": _csrf(page.text)})
        assert out.status_code == 303 and out.headers["location"] == "/signin"
        assert client.get("/fleet").status_code == 303
        assert client.get("/fleet/live").status_code == 401


def test_wrong_token_and_missing_csrf_are_refused(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    client, r = sign_in(coordinator, "rbv_abc_notarealsecret")
    with contextlib.closing(client):
        assert r.status_code == 401 and "unknown or revoked" in r.text
        assert SESSION_COOKIE not in client.cookies
        r = client.post("/signin", data={"token": coordinator.tokens["alpha"]})
        assert r.status_code == 403 and SESSION_COOKIE not in client.cookies


def test_revoking_the_token_ends_the_session(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        assert client.get("/fleet").status_code == 200
        assert admin.revoke_token(coordinator.engine, "alpha", coordinator.tokens["alpha"])
        assert client.get("/fleet/live").status_code == 401
        assert client.get("/fleet").headers["location"] == "/signin"


def test_safety_headers(coordinator: Coordinator) -> None:
    for path in ("/signin", "/static/app.js", "/api/v1/fleet", "/healthz"):
        r = coordinator.http.get(path)
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "unsafe-inline" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
    page = coordinator.http.get("/signin").text
    assert "<script>" not in page and "<script src=" in page  # no inline script at all
    assert " style=" not in page


def test_sign_in_is_rate_limited_per_address(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    with httpx.Client(base_url=coordinator.url, timeout=30) as client:
        csrf = _csrf(client.get("/signin").text)
        codes = []
        for _ in range(SIGNIN_ATTEMPTS):  # each answer carries a fresh form, as in a browser
            r = client.post("/signin", data={"token": "rbv_x_y", "csrf_token": csrf})
            codes.append(r.status_code)
            csrf = _csrf(r.text)
        assert codes == [401] * SIGNIN_ATTEMPTS
        r = client.post("/signin", data={"token": coordinator.tokens["alpha"], "csrf_token": csrf})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert SESSION_COOKIE not in client.cookies


def test_csrf_masking_round_trips_and_rejects_garbage() -> None:
    from rbroker_server.web import sessions

    token = "a" * 43
    masked = {sessions.mask_token(token) for _ in range(5)}
    assert len(masked) == 5
    assert all(sessions.csrf_matches(token, m) for m in masked)
    assert not sessions.csrf_matches(token, token)  # the bare token is not a masked value
    for bad in ("", "!!!", "YWJj", "x" * 600, sessions.mask_token("b" * 43)):
        assert not sessions.csrf_matches(token, bad), bad


def test_rate_limiter_refills_and_bounds_its_keys() -> None:
    now = [0.0]
    limiter = RateLimiter(3, 60.0, clock=lambda: now[0], max_keys=2)
    assert [limiter.hit("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.hit("a") == pytest.approx(20.0)  # one token per 20 s
    now[0] = 20.0
    assert limiter.hit("a") == 0.0
    assert limiter.hit("a") == pytest.approx(20.0)
    limiter.hit("b")
    limiter.hit("c")  # over max_keys: the oldest bucket goes
    assert len(limiter._buckets) == 2
    with pytest.raises(ValueError):
        RateLimiter(0, 1.0)


def _report_with_everything(coordinator: Coordinator, group: str, name: str) -> str:
    computer = coordinator.enroll(group, name)
    gpu = gpu_report(leased_in_use_mib=15000, other_in_use_mib=5000, outstanding_mib=3347)
    lease = LeaseReport(
        lease_id="l1", gpu_uuids=[GPU_A], granted_mib=17000, owner="ana",
        project="<script>alert(1)</script>", session="s-1", purpose="<b>bold</b> & more",
    )  # fmt: skip
    job = JobSnapshot(
        job_id="j1", project="p", purpose="embed", handler="h.x", total_items=1000,
        completed_items=250, failed_items=5, workers=2,
    )  # fmt: skip
    now = time.time()
    bookings = [  # held now (2 000 protected), claimed now (500 of 1 500), one to come
        BookingReport(
            booking_id="book-held", gpu_uuids=[GPU_A], mib=2000, start_at=now - 600,
            end_at=now + 3000, owner="cy", project="nlp", purpose="eval", state="held",
        ),
        BookingReport(
            booking_id="book-claimed", gpu_uuids=[GPU_A], mib=1500, start_at=now - 60,
            end_at=now + 1800, owner="ana", project="p", purpose="tune", state="claimed",
            claimed_mib=1000,
        ),
        BookingReport(
            booking_id="book-later", gpu_uuids=[GPU_A], mib=4000, start_at=now + 7200,
            end_at=now + 3 * 3600, owner="bea", project="<i>vision</i>",
            purpose="<u>sweep</u> & co", state="booked",
        ),
    ]  # fmt: skip
    r = computer.report(payload(name, gpus=[gpu], leases=[lease], jobs=[job], bookings=bookings))
    assert r.status_code == 200 and r.json()["applied"], r.text
    return computer.id


def test_descriptions_are_escaped(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    cid = _report_with_everything(coordinator, "alpha", "lab-x")
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        for path in ("/fleet", f"/computers/{cid}", f"/computers/{cid}/live", "/fleet/live"):
            html = client.get(path).text
            assert "<script>alert(1)</script>" not in html and "<b>bold</b>" not in html
            if "/computers/" in path:  # the fleet page counts leases, never lists them
                assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
                assert "&lt;b&gt;bold&lt;/b&gt; &amp; more" in html


def test_computer_pages_are_group_scoped(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    coordinator.group("beta")
    mine = _report_with_everything(coordinator, "alpha", "lab-a")
    theirs = _report_with_everything(coordinator, "beta", "lab-b")
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        assert client.get(f"/computers/{mine}").status_code == 200
        assert client.get(f"/computers/{theirs}").status_code == 404
        assert client.get(f"/computers/{theirs}/history.json").status_code == 404
        assert client.get(f"/computers/{mine}/history.json").json()["computer_id"] == mine
        assert "lab-b" not in client.get("/fleet").text


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_match_the_fleet(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    coordinator.group("beta")
    cid = _report_with_everything(coordinator, "alpha", "lab-a")
    _report_with_everything(coordinator, "beta", "lab-b")
    assert coordinator.http.get("/metrics").status_code == 401
    before = coordinator.fleet("alpha")
    r = coordinator.http.get("/metrics", headers=coordinator.viewer("alpha"))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fleet = coordinator.fleet("alpha")
    assert before["computers"][0]["seq"] == fleet["computers"][0]["seq"]  # nothing in between
    samples = _samples(r.text)
    assert "lab-b" not in r.text
    (c,) = fleet["computers"]
    g = c["gpus"][0]
    gl = (("computer", "lab-a"), ("computer_id", cid), ("gpu_index", "0"), ("gpu_uuid", GPU_A))
    for metric, field in [
        ("rbroker_gpu_total_bytes", "total_mib"),
        ("rbroker_gpu_headroom_bytes", "headroom_mib"),
        ("rbroker_gpu_in_use_bytes", "device_used_mib"),
        ("rbroker_gpu_outstanding_bytes", "outstanding_mib"),
        ("rbroker_gpu_available_bytes", "available_mib"),
    ]:
        assert samples[(metric, gl)] == g[field] * MIB, metric
    assert g["state"] == "full"
    assert samples[("rbroker_gpu_state", tuple(sorted((*gl, ("state", "full")))))] == 1.0
    assert samples[("rbroker_gpu_state", tuple(sorted((*gl, ("state", "busy")))))] == 0.0
    cl = (("computer", "lab-a"), ("computer_id", cid))
    assert samples[("rbroker_computer_leases", cl)] == len(c["leases"]) == 1
    assert samples[("rbroker_computer_waiting_requests", cl)] == len(c["queue"]) == 0
    age = samples[("rbroker_computer_last_report_age_seconds", cl)]
    assert before["computers"][0]["freshness"]["age_s"] <= age <= c["freshness"]["age_s"]
    assert samples[("rbroker_gpu_info", tuple(sorted((*gl, ("gpu_name", g["name"])))))] == 1
    jl = (*cl, ("job_id", "j1"))
    assert samples[("rbroker_job_items_completed_total", jl)] == 250
    assert samples[("rbroker_job_items_failed_total", jl)] == 5
    assert samples[("rbroker_job_items", jl)] == 1000
    info = (("handler", "h.x"), ("project", "p"), ("purpose", "embed"), ("state", "running"))
    assert samples[("rbroker_job_info", tuple(sorted((*jl, *info))))] == 1
    # bookings: what they protect on the GPU now (2 000 held + 1 500 claimed less 1 000
    # held by its claim), and how many are live by state
    assert samples[("rbroker_gpu_booked_bytes", gl)] == g["booked_mib"] * MIB == 2500 * MIB
    for state, count in (("booked", 1), ("held", 1), ("claimed", 1)):
        assert samples[("rbroker_computer_bookings", (*cl, ("state", state)))] == count
    for name, _ in samples:
        assert re.fullmatch(r"rbroker_[a-z_]+", name), name


def test_pages_are_compressed_with_csrf_tokens_masked_afresh(coordinator: Coordinator) -> None:
    """Pages, live fragments and metrics are gzipped; a page's CSRF token differs in every
    response (masked, so compression never repeats it), and any of them is accepted."""
    coordinator.group("alpha")
    for i in range(3):
        _report_with_everything(coordinator, "alpha", f"lab-{i}")
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        gz = {"accept-encoding": "gzip"}
        assert client.get("/fleet/live", headers=gz).headers.get("content-encoding") == "gzip"
        first, second = client.get("/fleet", headers=gz), client.get("/fleet", headers=gz)
        assert first.headers.get("content-encoding") == "gzip"
        assert _csrf(first.text) != _csrf(second.text)
        r = client.get("/metrics", headers={**gz, **coordinator.viewer("alpha")})
        assert r.headers.get("content-encoding") == "gzip"
        assert client.post("/signout", data={"csrf_token": _csrf(first.text)}).status_code == 303
        assert client.get("/fleet/live").status_code == 401


def test_computer_page_shows_flags_never_the_secret(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    computer = coordinator.enroll("alpha", "lab-f")
    secret = "AKIA" + "IOSFODNN7EXAMPLE"
    lease = LeaseReport(
        lease_id="l1", gpu_uuids=[GPU_A], granted_mib=1024, owner="ana", project="vision",
        session="s", purpose=f"sync with {secret}",
    )  # fmt: skip
    assert computer.report(payload("lab-f", leases=[lease])).json()["flagged_fields"] == [
        "leases[0].purpose"
    ]
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        html = client.get(f"/computers/{computer.id}").text
        fleet_html = client.get("/fleet").text
    assert "<code>leases[0].purpose</code>" in html and "secret:" in html
    assert secret not in html and secret not in fleet_html
    assert "flagged" in fleet_html


def test_capacity_bars_use_the_trays_split_and_colours() -> None:
    pytest.importorskip("PySide6")
    from rbroker.tray import widgets
    from rbroker_server.web import page_models as pages
    from rbroker_server.web.controller import COLOURS, TEMPLATES

    assert [(k, label) for k, label, _ in widgets.SEGMENTS] == [
        (k, label) for k, label, _ in pages.SEGMENTS
    ]
    base = (TEMPLATES / "base.html").read_text()
    for key, _, colour in widgets.SEGMENTS:
        web = COLOURS[key]
        if web.startswith("url(#"):  # hatched like the tray: the pattern's ground colour
            pattern = re.search(rf'id="{web[5:-1]}".*?fill="(#[0-9a-f]{{6}})"', base, re.S)
            assert pattern is not None, key
            web = pattern.group(1)
        assert web == colour.name(), key


def test_a_gpu_without_telemetry_shows_unknown_figures(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    computer = coordinator.enroll("alpha", "lab-t")
    gpu = GpuReport(uuid=GPU_A, index=0, name="Lost GPU", telemetry="unavailable")
    assert computer.report(payload("lab-t", gpus=[gpu])).status_code == 200
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        html = client.get("/fleet").text
        page = client.get(f"/computers/{computer.id}").text
    assert "telemetry unavailable" in html and "? used · ? free of ?" in html
    assert "available ? MiB" in page and "? MiB total" in page
    assert "available 0 MiB" not in page


def test_web_view_behind_a_proxy_prefix(coordinator_factory: Callable[..., Coordinator]) -> None:
    """Under `external_url = https://…/rbroker/` (TLS ended at the proxy): links, redirects
    and cookie paths carry the prefix, and cookies are Secure."""
    coordinator = coordinator_factory(external_url="https://lab.example.org/rbroker/")
    coordinator.group("alpha")
    with httpx.Client(base_url=coordinator.url, timeout=30) as client:
        form = client.get("/rbroker/signin")
        assert form.status_code == 200
        assert 'src="/rbroker/static/app.js"' in form.text
        assert 'action="/rbroker/signin"' in form.text
        csrf_cookie = form.headers["set-cookie"]
        assert "secure" in csrf_cookie.lower() and "path=/rbroker" in csrf_cookie.lower()
        r = client.post(  # a browser sends the Secure cookie over https; httpx here needs help
            "/rbroker/signin",
            data={"token": coordinator.tokens["alpha"], "csrf_token": _csrf(form.text)},
            headers={"cookie": csrf_cookie.split(";")[0]},
        )
        assert r.status_code == 303 and r.headers["location"] == "/rbroker/fleet", r.text
        session = next(
            v for k, v in r.headers.multi_items() if k == "set-cookie" and SESSION_COOKIE in v
        )
        attrs = {a.strip().lower() for a in session.split(";")}
        assert {"secure", "path=/rbroker", "httponly", "samesite=strict"} <= attrs, session
        assert client.get("/rbroker/static/app.css").status_code == 200


def test_a_trimmed_report_says_how_many_jobs_are_not_shown(coordinator: Coordinator) -> None:
    """A computer whose report left jobs out (to fit 1 MiB, trimmed fairly by owner) says
    so on the fleet and computer pages: "3 200 jobs not shown"."""
    coordinator.group("alpha")
    computer = coordinator.enroll("alpha", "lab-full")
    job = JobSnapshot(job_id="j1", project="p", purpose="embed", handler="h.x", workers=1)
    report = payload("lab-full", jobs=[job], left_out={"jobs": 3200, "queue": 1})
    r = computer.report(report)
    assert r.status_code == 200 and r.json()["applied"], r.text
    other = coordinator.enroll("alpha", "lab-whole")
    assert other.report(payload("lab-whole", jobs=[job])).json()["applied"]
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        for path in (f"/computers/{computer.id}", f"/computers/{computer.id}/live"):
            html = client.get(path).text
            assert "3\u202f200 jobs not shown" in html, path
            assert "1 waiting request not shown" in html, path
            assert html.count("not shown") == 2, path
        for path in ("/fleet", "/fleet/live"):  # counted in the computer's row
            html = client.get(path).text
            assert "+3\u202f200 jobs not in the report" in html, path
            assert "+1 not in the report" in html, path
            assert html.count("not in the report") == 2, path  # lab-whole's left none out
        fleet = coordinator.http.get("/api/v1/fleet", headers=coordinator.viewer("alpha")).json()
        by_name = {c["name"]: c for c in fleet["computers"]}
        assert by_name["lab-full"]["left_out"] == {"jobs": 3200, "queue": 1}
        assert by_name["lab-whole"]["left_out"] == {}


def test_pages_draw_the_bookings_on_a_timeline(coordinator: Coordinator) -> None:
    """The computer page and the fleet page draw each GPU's bookings of the next 24 hours as
    bars (overlapping ones in lanes of their own), their descriptions as text, never markup;
    the computer page lists them too. Another group's bookings are never on them."""
    coordinator.group("alpha")
    coordinator.group("beta")
    cid = _report_with_everything(coordinator, "alpha", "lab-a")
    theirs = coordinator.enroll("beta", "lab-b")
    now = time.time()
    other = BookingReport(
        booking_id="book-beta", gpu_uuids=[GPU_A], mib=1000, start_at=now + 60,
        end_at=now + 3600, owner="zed", project="zeta", purpose="beta only plan",
    )  # fmt: skip
    assert theirs.report(payload("lab-b", bookings=[other])).status_code == 200
    escaped = "&lt;u&gt;sweep&lt;/u&gt; &amp; co"
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        for path in (f"/computers/{cid}", f"/computers/{cid}/live", "/fleet", "/fleet/live"):
            html = client.get(path).text
            assert "beta only plan" not in html and "zed" not in html, path
            assert "<u>sweep</u>" not in html and "<i>vision</i>" not in html, path
            svg = re.search(r'<svg class="tl-bars"[^>]*>(.*?)</svg>', html, re.S)
            assert svg is not None, path
            bars = re.findall(r'<rect class="tl-book book-(\w+)" x="([\d.]+)" y="(\d+)"', svg[1])
            # held and claimed overlap now: two lanes; the one to come fits the first again
            assert sorted((s, y) for s, _, y in bars) == [
                ("booked", "1"), ("claimed", "11"), ("held", "1"),
            ], path  # fmt: skip
            later = next(float(x) for s, x, _ in bars if s == "booked")
            assert 100 * 7200 / 86400 <= later <= 100 * (7200 + 3600) / 86400
            assert f"bea · &lt;i&gt;vision&lt;/i&gt; · {escaped}: 4\u202f000 MiB" in svg[1]
            assert 'aria-label="GPU 0: 3 bookings in the next 24 hours' in html
        page = client.get(f"/computers/{cid}").text
        table = page.split('<table class="data bookings">')[1].split("</table>")[0]
        assert escaped in table and "1\u202f000 claimed" in table and "held" in table
        assert table.count("<tr>") == 4  # the head and three bookings


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # /metrics reads no SQL of its own
def test_metrics_leave_out_offline_figures_and_jobs_finished_over_an_hour_ago(
    coordinator: Coordinator,
) -> None:
    from datetime import UTC, datetime, timedelta

    import sqlalchemy as sa

    from rbroker_server.db.tables import HISTORY
    from rbroker_server.reports.service import history_data

    coordinator.group("alpha")
    computer = coordinator.enroll("alpha", "lab-a")
    jobs = [
        JobSnapshot(job_id="running", completed_items=1),
        JobSnapshot(job_id="done-long-ago", state="succeeded", completed_items=2),
        JobSnapshot(job_id="done-lately", state="failed", failed_items=3),
        JobSnapshot(job_id="declared-and-done-lately", state="cancelled"),
    ]
    r = computer.report(payload("lab-a", jobs=jobs))
    assert r.status_code == 200 and r.json()["applied"], r.text
    # the computer's point of 50 minutes ago: one job already finished, one running
    then = [jobs[0], jobs[1], JobSnapshot(job_id="done-lately")]
    data = history_data(
        {"gpus": [], "leases": [], "queue": [], "jobs": [j.model_dump() for j in then]}
    )
    with coordinator.engine.begin() as conn:
        conn.execute(
            sa.insert(HISTORY).values(
                computer_id=computer.id, at=datetime.now(UTC) - timedelta(minutes=50), data=data
            )
        )

    def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        r = coordinator.http.get("/metrics", headers=coordinator.viewer("alpha"))
        assert r.status_code == 200, r.text
        return _samples(r.text)

    samples = scrape()
    exported = {dict(labels)["job_id"] for name, labels in samples if name == "rbroker_job_info"}
    assert exported == {"running", "done-lately", "declared-and-done-lately"}
    assert any(name == "rbroker_computer_leases" for name, _ in samples)
    # a stopped broker: offline at once; its last-known figures leave the exposition, its
    # freshness and age stay
    r = computer.report(payload("lab-a", jobs=jobs, stopping=True))
    assert r.status_code == 200 and r.json()["applied"], r.text
    names = {name for name, _ in scrape()}
    samples = scrape()
    cl = (("computer", "lab-a"), ("computer_id", computer.id))
    assert samples[("rbroker_computer_freshness", (*cl, ("state", "offline")))] == 1
    assert ("rbroker_computer_last_report_age_seconds", cl) in samples
    assert "rbroker_gpu_info" in names
    for gone in (
        "rbroker_computer_leases",
        "rbroker_computer_waiting_requests",
        "rbroker_computer_bookings",
        "rbroker_gpu_available_bytes",
        "rbroker_gpu_state",
        "rbroker_job_info",  # its jobs may have ended with it
        "rbroker_job_items_completed_total",
    ):
        assert gone not in names, gone


def test_metrics_keep_running_jobs_of_a_computer_without_an_hour_of_history(
    coordinator: Coordinator,
) -> None:
    """No history point of the last hour says when its finished jobs finished (a short
    history window, a long history step): its finished jobs are left out, its running ones
    stay (they all went, until the next point)."""
    import sqlalchemy as sa

    from rbroker_server.db.tables import HISTORY

    coordinator.group("alpha")
    computer = coordinator.enroll("alpha", "lab-a")
    jobs = [
        JobSnapshot(job_id="running", completed_items=1),
        JobSnapshot(job_id="done", state="succeeded", completed_items=2),
    ]
    r = computer.report(payload("lab-a", jobs=jobs))
    assert r.status_code == 200 and r.json()["applied"], r.text
    with coordinator.engine.begin() as conn:
        conn.execute(sa.delete(HISTORY).where(HISTORY.c.computer_id == computer.id))
    r = coordinator.http.get("/metrics", headers=coordinator.viewer("alpha"))
    assert r.status_code == 200, r.text
    samples = _samples(r.text)
    exported = {dict(labels)["job_id"] for name, labels in samples if name == "rbroker_job_info"}
    assert exported == {"running"}
