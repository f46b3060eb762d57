"""Several coordinators on one database (as behind a load balancer), concurrent reports."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from rbroker_protocol import signing
from tests.fakes.reports import payload, signed_body
from tests.server.conftest import Coordinator, EnrolledComputer

JSON = {"content-type": "application/json"}


def test_two_coordinators_share_one_database(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    one = coordinator_factory()
    two = coordinator_factory()  # starts on the already migrated database
    one.group("vision")
    two.tokens["vision"] = one.tokens["vision"]
    pc = one.enroll("vision")
    # Reports alternate between the two; ordering holds across them.
    for i in range(1, 7):
        target = one if i % 2 else two
        env = pc.envelope(seq=i)
        r = target.http.post("/api/v1/reports", content=signing.encode_envelope(env), headers=JSON)
        assert r.json()["applied"] is True
    replay = pc.envelope(seq=3)
    assert (
        two.http.post(
            "/api/v1/reports", content=signing.encode_envelope(replay), headers=JSON
        ).json()["applied"]
        is False
    )
    assert two.computer("vision", pc.id)["seq"] == 6
    # A signed request's nonce is spent on every coordinator, not just the one that saw it.
    headers = pc.signed_headers("GET", "/api/v1/fleet")
    assert one.http.get("/api/v1/fleet", headers=headers).status_code == 200
    assert two.http.get("/api/v1/fleet", headers=headers).status_code == 401


def test_concurrent_reports_keep_order_and_never_fail(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    computers = [coordinator.enroll("vision", f"pc-{i}") for i in range(4)]
    errors: list[str] = []
    per_computer = 15

    def hammer(pc: EnrolledComputer, offset: int) -> None:
        with httpx.Client(base_url=coordinator.url, timeout=30) as http:
            # Two threads per computer race with interleaved seqs.
            for seq in range(1 + offset, per_computer * 2 + 1, 2):
                body = signed_body(pc.key, pc.id, "run-1", seq, payload())
                r = http.post("/api/v1/reports", content=body, headers=JSON)
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text}")

    threads = [
        threading.Thread(target=hammer, args=(pc, offset)) for pc in computers for offset in (0, 1)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    for pc in computers:
        row = coordinator.row(pc.id)
        assert row.seq == per_computer * 2
        assert 1 <= row.reports_applied <= per_computer * 2
