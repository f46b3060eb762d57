"""A lease's idle state (report version 7) in the fleet API's lease view and on the
computer page ("idle 2 h 10 min"), escaped; older reports show nothing."""

from __future__ import annotations

import contextlib

from rbroker_protocol.reports import LeaseReport
from rbroker_server.fleet.service import idle_text
from tests.fakes.reports import payload
from tests.server.conftest import Coordinator
from tests.server.test_web import sign_in


def lease(lease_id: str, owner: str, **fields: object) -> LeaseReport:
    return LeaseReport(
        lease_id=lease_id, gpu_uuids=["GPU-0"], granted_mib=1024, owner=owner, **fields
    )


def test_idle_leases_in_the_fleet_view_and_on_the_page(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    computer = coordinator.enroll("alpha", "lab-idle")
    leases = [
        lease("l-1", "ana", idle_state="idle", idle_s=7830.0, purpose="<b>train</b>"),
        lease("l-2", "ben", idle_state="active", idle_s=12.0),
        lease("l-3", "cho"),
    ]
    r = computer.report(payload("lab-idle", leases=leases))
    assert r.status_code == 200 and r.json()["applied"], r.text
    view = coordinator.computer("alpha", computer.id)
    got = {x["lease_id"]: (x["idle_state"], x["idle_s"]) for x in view["leases"]}
    assert got == {"l-1": ("idle", 7830.0), "l-2": ("active", 12.0), "l-3": ("unknown", None)}
    client, _ = sign_in(coordinator, coordinator.tokens["alpha"])
    with contextlib.closing(client):
        page = client.get(f"/computers/{computer.id}").text
    assert page.count('<span class="badge idle">idle 2 h 10 min</span>') == 1
    assert page.count("badge idle") == 1  # active and unknown leases say nothing
    assert "&lt;b&gt;train&lt;/b&gt;" in page and "<b>train</b>" not in page


def test_idle_text() -> None:
    assert idle_text(40.9) == "idle 40 s"
    assert idle_text(25 * 60 + 5) == "idle 25 min"
    assert idle_text(2 * 3600 + 10 * 60) == "idle 2 h 10 min"
    assert idle_text(3 * 86400 + 4 * 3600 + 59) == "idle 3 d 4 h"
    assert idle_text(-5) == "idle 0 s"
