"""The web view in a real browser (chromium via Playwright) against a real coordinator
process fed by real brokers' signed reports.

Short freshness thresholds (stale after 8 s, offline after 16 s without a report; brokers
report every 5 s) let a stopped broker's computer turn stale and then offline while the page
refreshes itself, without a reload.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

import rbroker
from tests.conftest import wait_until
from tests.e2e.browser import chromium, sign_in
from tests.e2e.conftest import CoordinatorProcess, UplinkBroker, Worker, by_name
from tests.fakes.gpu_scenarios import gpu, scenario

pytestmark = pytest.mark.slow

FULL_GPU = scenario(
    gpu("GPU-f0000000-0000-0000-0000-000000000001", name="Simulated A100", used_mib=24000)
)

SCRIPT_PURPOSE = '<script>alert("x")</script> & <b>bold</b>'
BOOKED_PURPOSE = "<i>sweep</i> & more"


def _section(page: Any, name: str) -> Any:
    """The computer's row on the fleet page."""
    return page.locator("tr.computer", has=page.get_by_role("link", name=name, exact=True))


def _badge(section: Any) -> Any:
    return section.locator("th .badge[class*='fresh-']")


def test_fleet_in_a_browser(
    coordinator_factory: Callable[..., CoordinatorProcess],
    uplink_broker: Callable[..., UplinkBroker],
    lease_worker: Callable[..., Worker],
) -> None:
    from playwright.sync_api import expect

    coordinator = coordinator_factory(stale_after_s=8.0, offline_after_s=16.0, history_step_s=1.0)
    other = coordinator.new_group("other")
    lab_full = uplink_broker(coordinator, "lab-full", scenario=FULL_GPU)
    lab_job = uplink_broker(coordinator, "lab-job")
    lab_stop = uplink_broker(coordinator, "lab-stop")
    uplink_broker(other, "other-lab")
    lease_worker(lab_job.broker, 4096, "vision", "run-42", SCRIPT_PURPOSE, use_mib=1024)
    lease_worker(lab_stop.broker, 2048, "nlp", "eval-stop", "evaluate before stopping")
    with rbroker.job(
        project="search",
        purpose="embed corpus",
        handler="embed.encode_batch",
        total_items=1000,
        workers=2,
        socket=lab_job.broker.socket,
    ) as job:
        job.report("c0", completed=100)
        # a booking ahead on lab-job: on its GPU's timeline, its purpose as text
        ahead = time.time() + 3600
        with rbroker.Client(lab_job.broker.socket) as client:
            client.call(
                "booking.create", mib=2048, start_at=ahead, end_at=ahead + 7200,
                project="vision", session="ahead", purpose=BOOKED_PURPOSE,
            )  # fmt: skip
        wait_until(
            lambda: (
                len(coordinator.fleet()["computers"]) == 3
                and by_name(coordinator.fleet())["lab-full"]["gpus"]  # it has reported
                and by_name(coordinator.fleet())["lab-job"]["jobs"]
                and by_name(coordinator.fleet())["lab-job"]["bookings"]
                and by_name(coordinator.fleet())["lab-stop"]["leases"]
            ),
            timeout_s=30,
            interval_s=0.3,
        )
        with chromium() as browser:
            page = browser.new_page()
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

            # a wrong token and a revoked one are refused, on the sign-in page
            sign_in(page, coordinator.url, "rbv_0123456789ab_wrongwrongwrongwrong")
            expect(page.get_by_role("alert")).to_contain_text("unknown or revoked")
            assert page.url.endswith("/signin")
            assert not [c for c in page.context.cookies() if c["name"] == "rbroker_session"]

            # another group's token shows that group only
            sign_in(page, coordinator.url, other.token)
            expect(page.get_by_role("link", name="other-lab")).to_be_visible()
            assert page.get_by_role("link", name="lab-job").count() == 0
            page.get_by_role("button", name="Sign out").click()
            expect(page.get_by_label("Viewer token")).to_be_visible()

            sign_in(page, coordinator.url, coordinator.token)
            assert page.url.endswith("/fleet")
            cookie = next(c for c in page.context.cookies() if c["name"] == "rbroker_session")
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            page.evaluate("window.rbrokerNotReloaded = true")
            names = page.locator("tr.computer th a").all_inner_texts()
            assert names == ["lab-full", "lab-job", "lab-stop"]

            # keyboard: the first Tab reaches the skip link, Enter moves focus to the content
            page.keyboard.press("Tab")
            assert page.evaluate("document.activeElement.textContent") == "Skip to content"
            page.keyboard.press("Enter")
            assert page.evaluate("document.activeElement.id") == "main"

            # a full GPU says "full" and its computer is online, never offline
            full = _section(page, "lab-full")
            expect(full.locator(".badge.gpu-full")).to_have_text(re.compile(r"\bfull$"))
            expect(_badge(full)).to_have_text(re.compile("online"))
            figures = full.locator(".gpu-line .figures")
            expect(figures).to_contain_text("\u202f0 free of 24\u202f576")
            expect(full.locator("svg.bar")).to_be_visible()

            # the fleet page counts a computer's leases (the computer page lists them)
            job_section = _section(page, "lab-job")
            expect(job_section.locator("td.num").first).to_contain_text("4\u202f096 MiB")
            assert job_section.get_by_text(SCRIPT_PURPOSE).count() == 0

            # a job's progress advances while the page refreshes itself
            progress = job_section.locator("progress")
            expect(progress).to_have_attribute("value", "100")
            assert progress.get_attribute("max") == "1000"
            for n in range(1, 4):
                job.report(f"c{n}", completed=100, failed=0 if n < 3 else 10)
                time.sleep(1.2)
            expect(progress).to_have_attribute("value", "410", timeout=20_000)
            expect(job_section.locator(".progress-text")).to_contain_text("10 failed")

            # a stopped broker: stale, then offline, still with its last known values
            stop = _section(page, "lab-stop")
            expect(_badge(stop)).to_have_text(re.compile("online"))
            lab_stop.broker.stop(signal.SIGKILL)
            expect(_badge(stop)).to_have_text(
                re.compile(r"stale · last known, \d+ s ago"), timeout=30_000
            )
            leases = stop.locator("td.num").first
            expect(leases).to_contain_text("2\u202f048 MiB")
            expect(_badge(stop)).to_have_text(re.compile(r"offline; last known"), timeout=30_000)
            expect(leases).to_contain_text("2\u202f048 MiB")
            expect(stop.locator("svg.bar")).to_be_visible()
            expect(_badge(full)).to_have_text(re.compile("online"))  # the others still are

            # the coordinator goes away: an honest banner, and it clears when it is back
            banner = page.locator("#unreachable")
            expect(banner).to_be_hidden()
            coordinator.stop()
            expect(banner).to_be_visible(timeout=20_000)
            expect(banner).to_contain_text("The coordinator is unreachable")
            expect(banner).to_contain_text("last known")
            coordinator.start(wait=False)
            coordinator.wait_healthy(timeout_s=120)  # a slow start on a busy machine is fine
            expect(banner).to_be_hidden(timeout=45_000)  # failures back off up to 30 s
            assert page.evaluate("window.rbrokerNotReloaded") is True  # never reloaded

            # the computer page: figures, flags section and history charts
            job_section.get_by_role("link", name="lab-job").click()
            expect(page.get_by_role("heading", name="lab-job", level=1)).to_be_visible()
            expect(page.get_by_role("heading", name="Flags")).to_be_visible()
            expect(page.get_by_text("No flags")).to_be_visible()
            # the description shows as text, never as markup
            expect(page.get_by_text(SCRIPT_PURPOSE)).to_be_visible()
            assert page.locator("#live script, #live b").count() == 0
            # its booking: a bar on GPU 0's timeline (its title the booking in words) and a
            # row of the bookings table, the purpose as text
            expect(page.get_by_role("heading", name="Bookings")).to_be_visible()
            timeline = page.locator("#live svg.tl-bars").first
            expect(timeline).to_be_visible()
            expect(timeline).to_have_attribute("aria-label", re.compile(r"^GPU 0: 1 booking "))
            bar = timeline.locator("rect.tl-book.book-booked")
            expect(bar).to_have_count(1)
            assert BOOKED_PURPOSE in bar.locator("title").text_content()
            assert 0 < float(bar.get_attribute("x")) < 100 * 3 / 24
            row = page.locator("table.bookings tbody tr", has_text=BOOKED_PURPOSE)
            expect(row).to_contain_text("2\u202f048")
            assert page.locator("#live i").count() == 0
            assert dialogs == []
            rate = page.locator("table.jobs tbody td.num").first
            expect(rate).not_to_have_text("—", timeout=20_000)
            assert float(rate.inner_text()) > 0
            expect(page.locator("#charts canvas").first).to_be_visible(timeout=15_000)
            expect(page.get_by_text("Job progress (items done)").first).to_be_visible()
            assert page.locator("#charts figure").count() == 2  # one GPU, one for the jobs

            # the usage page: a row of day bars per project, drawn on the server (no script);
            # lab-job's "vision" lease has been held across many of its reports by now
            nav = page.get_by_role("navigation", name="Pages")
            nav.get_by_role("link", name="Usage").click()
            expect(page.get_by_role("heading", name="Usage", level=1)).to_be_visible()
            vision = page.locator(".usage-row", has_text="vision")
            bars = vision.locator("svg.usage-bars")
            expect(bars).to_have_attribute("aria-label", re.compile(r"^vision: .* MiB-hours"))
            expect(bars.locator("rect.granted").first).to_be_visible()
            expect(bars.locator("rect.used").first).to_be_visible()  # 1 024 MiB in use
            expect(page.locator("table.usage-totals")).to_contain_text("vision")
            expect(page.get_by_role("link", name="CSV")).to_be_visible()

            # sign out: the session is gone
            page.get_by_role("button", name="Sign out").click()
            expect(page.get_by_label("Viewer token")).to_be_visible()
            page.goto(f"{coordinator.url}/fleet")
            assert page.url.endswith("/signin")
            assert not [e for e in errors if "Content Security Policy" in e], errors
    _ = lab_full


def test_session_cookie_is_secure_over_https(
    coordinator_factory: Callable[..., CoordinatorProcess],
) -> None:
    import httpx

    coordinator = coordinator_factory(tls=True)
    with httpx.Client(base_url=coordinator.url, verify=coordinator.verify, timeout=30) as http:
        form = http.get("/signin")
        assert "Secure" in form.headers["set-cookie"]  # the sign-in form's CSRF cookie
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert csrf is not None
        r = http.post("/signin", data={"token": coordinator.token, "csrf_token": csrf.group(1)})
        assert r.status_code == 303, r.text
        session = next(
            v for k, v in r.headers.multi_items() if k == "set-cookie" and "rbroker_session=" in v
        )
        attrs = {a.strip().lower() for a in session.split(";")}
        assert {"secure", "httponly", "samesite=strict"} <= attrs, session
        assert http.get("/fleet").status_code == 200
