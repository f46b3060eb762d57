"""The fleet page of a big group over real HTTP: one row per computer (lists only on the
computer page, capped), one render per group per refresh interval shared by its viewers and
never by another group, ETag/304, and the page's refresh backing off in a real browser."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from typing import Any

import pytest

from rbroker_protocol.reports import GpuReport, JobSnapshot, LeaseReport, QueueEntry
from rbroker_server.web import renders
from rbroker_server.web.page_models import LIST_CAP
from rbroker_server.web.renders import SharedRenders
from tests.fakes.reports import GPU_A, GPU_B, gpu_report, payload
from tests.server.conftest import Coordinator
from tests.server.test_web import sign_in


def _shared(coordinator: Coordinator) -> SharedRenders:
    """The app's shared renders (the coordinator runs in this process)."""
    assert coordinator._server is not None
    return coordinator._server.config.app.state[renders.STATE_KEY]  # type: ignore[no-any-return]


def _gpu(uuid: str, index: int, used_mib: int) -> GpuReport:
    return gpu_report(
        uuid, index, name="Simulated A100", total_mib=40960, headroom_mib=2048,
        leased_in_use_mib=used_mib,
    )  # fmt: skip


def _big_report(name: str, leases: int) -> Any:
    return payload(
        name,
        gpus=[_gpu(GPU_A, 0, 30000), _gpu(GPU_B, 1, 1000)],
        leases=[
            LeaseReport(
                lease_id=f"l{i}",
                gpu_uuids=[GPU_A],
                granted_mib=10,
                owner=f"owner{i}",
                project="vision",
                session=f"sess-{i}",
                purpose=f"purpose-{i}",
                granted_at=time.time() - 30,
            )
            for i in range(leases)
        ],
        queue=[
            QueueEntry(
                mib=4096,
                owner="bob",
                reason=f"reason-{i}",
                eta_s=420.0 if i == 0 else None,
                eta_reason="1 lease of vision likely ends by then" if i == 0 else "",
            )
            for i in range(3)
        ],
        jobs=[
            JobSnapshot(
                job_id="j1", state="running", total_items=1000, completed_items=300, failed_items=10
            ),
            JobSnapshot(job_id="j2", state="succeeded", total_items=1000, completed_items=1000),
            JobSnapshot(job_id="j3", state="running"),
        ],
    )


def test_a_computer_is_one_row_and_its_lists_are_on_its_page(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    leases = LIST_CAP + 20
    computer = coordinator.enroll("alpha", "lab-big")
    r = computer.report(_big_report("lab-big", leases))
    assert r.status_code == 200 and r.json()["applied"], r.text
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        live = client.get("/fleet/live")
        page = client.get(f"/computers/{computer.id}").text
    html = live.text
    row = re.search(r'<tr class="computer fresh-online">(.*?)</tr>', html, re.S)
    assert row is not None, html
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert len(cells) == 4, cells
    gpus, n_leases, waiting, jobs = cells
    assert "GPU 0" in gpus and "30\u202f000 used · 8\u202f912 free of 40\u202f960" in gpus
    assert "GPU 1" in gpus and "1\u202f000 used · 37\u202f912 free of 40\u202f960" in gpus
    assert n_leases.startswith("520") and f"{leases * 10:,}".replace(",", "\u202f") in n_leases
    assert waiting == "3"
    assert "3 jobs: 2 running, 1 succeeded" in jobs and 'max="2000" value="1310"' in jobs
    assert "1\u202f310 / 2\u202f000 items (65.5 %), 10 failed" in jobs
    # no list on the fleet page: owners, purposes and reasons are the computer page's
    assert "owner1" not in html and "purpose-1" not in html and "reason-0" not in html
    assert len(html) < 4000, len(html)
    # the computer page lists the first LIST_CAP leases and says how many more
    assert page.count("<td>owner") == LIST_CAP
    assert "20 more leases not listed here" in page
    assert "reason-2" in page
    # when a waiting request will likely fit, where its broker said (report version 4)
    assert "likely in ~7 min (because 1 lease of vision likely ends by then)" in page
    assert page.count('class="eta"') == 1


def test_one_render_per_group_shared_by_its_viewers_never_by_another_group(
    coordinator: Coordinator,
) -> None:
    coordinator.group("alpha")
    coordinator.group("beta")
    lab_a = coordinator.enroll("alpha", "lab-alpha")
    assert lab_a.report(payload("lab-alpha")).json()["applied"]
    lab_b = coordinator.enroll("beta", "lab-beta")
    assert lab_b.report(payload("lab-beta")).json()["applied"]
    shared = _shared(coordinator)
    shared.ttl_s = 3600.0  # one refresh interval that outlasts the test
    a1, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    a2, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    b1, _ = sign_in(coordinator, coordinator.tokens["beta"])
    with contextlib.closing(a1), contextlib.closing(a2), contextlib.closing(b1):
        before = shared.renders
        first, second = a1.get("/fleet/live"), a2.get("/fleet/live")
        assert shared.renders == before + 1  # the second viewer got the first one's render
        assert first.text == second.text and first.headers["etag"] == second.headers["etag"]
        assert "lab-alpha" in first.text and "lab-beta" not in first.text
        theirs = b1.get("/fleet/live")
        assert shared.renders == before + 2
        assert "lab-beta" in theirs.text and "lab-alpha" not in theirs.text
        assert theirs.headers["etag"] != first.headers["etag"]
        # the full page wraps the shared render with each session's own CSRF token
        p1, p2 = a1.get("/fleet").text, a2.get("/fleet").text
        assert shared.renders == before + 2 and "lab-alpha" in p1 and "lab-beta" not in p2
        # 304 to the tag of the render a viewer holds; another group's tag never matches
        etag = first.headers["etag"]
        unchanged = a2.get("/fleet/live", headers={"if-none-match": etag})
        assert unchanged.status_code == 304 and unchanged.content == b""
        assert unchanged.headers["etag"] == etag
        other = b1.get("/fleet/live", headers={"if-none-match": etag})
        assert other.status_code == 200 and "lab-alpha" not in other.text
        # within the interval a new report waits for the next render
        assert lab_a.report(payload("lab-alpha", queue=[QueueEntry(mib=64)])).json()["applied"]
        assert a1.get("/fleet/live").text == first.text
        shared.ttl_s = 0.0  # the interval is over
        again = a1.get("/fleet/live", headers={"if-none-match": etag})
        assert again.status_code == 200 and again.headers["etag"] != etag
        steady = a1.get("/fleet/live", headers={"if-none-match": again.headers["etag"]})
        assert steady.status_code == 304  # rendered again, nothing changed: the same tag
        # a signed-out viewer gets nothing from the shared render
        assert coordinator.http.get("/fleet/live").status_code == 401
        headers = {"if-none-match": etag}
        assert coordinator.http.get("/fleet/live", headers=headers).status_code == 401


def test_shared_renders_wait_for_one_render_expire_and_stay_bounded() -> None:
    now = [0.0]
    shared = SharedRenders(5.0, max_keys=2, clock=lambda: now[0])
    calls: list[str] = []
    gate = threading.Event()

    def slow() -> tuple[str, str, str, str]:
        calls.append("a")
        gate.wait(5)
        return "1", "alpha", "<p>head</p>", "<p>body</p>"

    got: list[renders.Render] = []
    threads = [threading.Thread(target=lambda: got.append(shared.get("a", slow)))]
    threads.append(threading.Thread(target=lambda: got.append(shared.get("a", slow))))
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(5)
    assert calls == ["a"] and len(got) == 2 and got[0] is got[1]
    assert got[0].html == "<p>head</p><p>body</p>" and got[0].etag.startswith('"')
    now[0] = 4.9
    assert shared.get("a", slow) is got[0]
    now[0] = 5.0
    fresh = shared.get("a", slow)
    assert fresh is not got[0] and fresh.etag == got[0].etag  # same body, same tag
    assert renders.etag_of("2", "<p>body</p>") != fresh.etag  # another group: another tag
    shared.get("b", slow)
    shared.get("c", slow)
    assert len(shared._entries) == 2 and "a" not in shared._entries


@pytest.mark.slow
def test_the_page_backs_off_while_refreshes_fail_or_are_slow(coordinator: Coordinator) -> None:
    """In chromium, with the refresh period cut to 300 ms: failing refreshes space out and
    the last known figures stay with a note; a slow one spaces them out too; quick ones bring
    the period back; a 304 keeps the figures."""
    from playwright.sync_api import expect

    from tests.e2e.browser import chromium
    from tests.e2e.browser import sign_in as browser_sign_in

    coordinator.group("alpha")
    lab = coordinator.enroll("alpha", "lab-refresh")
    assert lab.report(payload("lab-refresh")).json()["applied"]
    _shared(coordinator).ttl_s = 0.0
    mode = {"live": "ok"}
    seen: list[float] = []

    def fleet_page(route: Any) -> None:
        response = route.fetch(max_redirects=0)
        body = response.text().replace('data-refresh-ms="5000"', 'data-refresh-ms="300"')
        route.fulfill(response=response, body=body)

    def live(route: Any) -> None:
        seen.append(time.monotonic())
        if mode["live"] == "fail":
            route.fulfill(status=503, body="overloaded")
        elif mode["live"] == "slow":
            time.sleep(0.5)
            route.continue_()
        else:
            route.continue_()

    with chromium() as browser:
        page = browser.new_page()
        page.route(re.compile(r".*/fleet$"), fleet_page)
        page.route(re.compile(r".*/fleet/live$"), live)
        browser_sign_in(page, coordinator.url, coordinator.tokens["alpha"])
        page.goto(f"{coordinator.url}/fleet")  # a redirect's target is not routed: again
        main = page.locator("#main")
        expect(main).to_have_attribute("data-refresh-ms", "300")
        expect(main).to_have_attribute("data-refresh-delay-ms", "300", timeout=5000)
        mode["live"] = "fail"
        banner = page.locator("#unreachable")
        expect(banner).to_be_visible(timeout=5000)
        expect(banner).to_contain_text("last known")
        expect(banner).to_contain_text("HTTP 503")
        expect(main).to_have_attribute("data-refresh-delay-ms", "2400", timeout=8000)
        expect(page.get_by_role("link", name="lab-refresh")).to_be_visible()  # kept
        tries = len(seen)
        page.wait_for_timeout(1500)
        assert len(seen) - tries <= 1, seen  # spaced out, never every 300 ms
        mode["live"] = "ok"
        expect(banner).to_be_hidden(timeout=8000)
        expect(main).to_have_attribute("data-refresh-delay-ms", "300", timeout=5000)
        mode["live"] = "slow"
        slow = page.locator("#slow")
        expect(slow).to_be_visible(timeout=5000)
        expect(slow).to_contain_text("Refreshes are slow")
        mode["live"] = "ok"
        expect(slow).to_be_hidden(timeout=8000)
        # unchanged data: 304s, and the figures stay
        expect(page.get_by_role("link", name="lab-refresh")).to_be_visible()
