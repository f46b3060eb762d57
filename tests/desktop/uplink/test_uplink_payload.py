"""The report payload is trimmed to the schema's list limits and to the size limit (§7),
fairly between owners (round-robin by owner, each owner's newest first), and says what it
left out. Before, the newest entries were kept: one user declaring 4 200 jobs pushed every
other user's jobs out of the coordinator's view."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import nacl.signing
import pytest

from rbroker.base.version import __version__
from rbroker.uplink.payload import build_payload, fair_order, keep_fairly, max_payload_bytes
from rbroker_protocol.reports import MAX_REPORT_BYTES, ReportPayload
from rbroker_protocol.signing import MAX_SEQ, encode_envelope, sign_report

KEY = nacl.signing.SigningKey(bytes(32))
LONGEST_ID = "c" * 64


def _job(i: int, long: bool) -> dict[str, Any]:
    return {
        "job_id": f"job-{i:06d}",
        "project": ("vision" * 11)[:64] if long else "vision",
        "purpose": ("embed the corpus " * 13)[:200] if long else "embed",
        "handler": ("embed.encode_batch." * 7)[:128] if long else "embed.encode_batch",
        "state": "succeeded",
        "workers": 4,
        "total_items": 1000,
        "completed_items": 1000,
        "failed_items": 0,
    }


def _broker(jobs: list[dict[str, Any]], bookings: list[dict[str, Any]] | None = None) -> Any:
    return SimpleNamespace(
        gpus_view=lambda: [],
        leases_view=lambda: {"leases": [], "queue": []},
        jobs_view=lambda include_finished: jobs,
        bookings_list=lambda asker, include_ended: {
            "bookings": bookings or [],
            "now_at": 1_700_000_000.0,
            "usable_mib": {},
        },
        telemetry_source=lambda: "simulated",
        now_wall=lambda: 1_700_000_000.0,
    )


@pytest.mark.parametrize(("count", "long"), [(10, True), (5000, False), (2000, True)])
def test_payload_fits_the_schema_and_the_size_limit(count: int, long: bool) -> None:
    jobs = [_job(i, long) for i in range(count)]
    data, left_out = build_payload(_broker(jobs), "lab-1", "run-1")
    payload = ReportPayload.from_bytes(data)
    trimmed = left_out.get("jobs", 0)
    assert set(left_out) <= {"jobs"}
    assert len(payload.jobs) + trimmed == count
    assert payload.jobs[-1].job_id == jobs[-1]["job_id"]  # the newest are kept
    assert (trimmed > 0) == (count > 1000)
    key = nacl.signing.SigningKey.generate()
    envelope = encode_envelope(sign_report(key, "c_1", "run-1", 1, data))
    assert len(envelope) <= MAX_REPORT_BYTES


def _huge_job(i: int) -> dict[str, Any]:
    """About 3.2 kB as JSON, so a few hundred of them pass 1 MiB as an envelope."""
    return {**_job(i, long=False), "purpose": f"{i:05d} " + "p" * (3000 + i % 7)}


def _envelope_len(jobs: list[dict[str, Any]], run_id: str, left: int = 0) -> int:
    """The size of the signed envelope of a payload carrying `jobs` (and saying `left` jobs
    were left out), with the longest computer id and sequence number: written out without
    the code under test."""
    payload = ReportPayload(
        computer_name="lab-1",
        broker_version=__version__,
        telemetry_source="simulated",
        run_id=run_id,
        generated_at=1_700_000_000.0,
        jobs=jobs,  # type: ignore[arg-type]
        left_out={"jobs": left} if left else {},
    ).to_bytes()
    return len(encode_envelope(sign_report(KEY, LONGEST_ID, LONGEST_ID, MAX_SEQ, payload)))


def _largest_fitting(jobs: list[dict[str, Any]]) -> int:
    """The most newest jobs whose envelope fits 1 MiB: a step-by-one scan from an estimate
    (1 MiB over the envelope's size per job, base64 included)."""

    def fits(n: int) -> bool:
        return _envelope_len(jobs[len(jobs) - n :], LONGEST_ID, len(jobs) - n) <= MAX_REPORT_BYTES

    n = min(len(jobs), MAX_REPORT_BYTES * len(jobs) // _envelope_len(jobs, LONGEST_ID))
    while n < len(jobs) and fits(n + 1):
        n += 1
    while n > 0 and not fits(n):
        n -= 1
    return n


def test_a_report_just_over_the_limit_keeps_the_largest_list_that_fits() -> None:
    many = [_huge_job(i) for i in range(400)]
    base = _largest_fitting(many)
    assert 200 < base < 400, base  # the entries really are ~3.2 kB
    # exactly what fits: nothing is left out; more: exactly the excess (or one more, for the
    # bytes of saying so) is left out, the newest kept
    for extra in (0, 1, 2, 37):
        jobs = many[: base + extra]
        fit = _largest_fitting(jobs)
        assert fit == base if extra == 0 else fit in (base - 1, base)
        data, left_out = build_payload(_broker(jobs), "lab-1", LONGEST_ID)
        payload = ReportPayload.from_bytes(data)
        kept = payload.jobs
        assert len(kept) == fit, (extra, len(kept))
        assert left_out == payload.left_out == ({"jobs": len(jobs) - fit} if extra else {})
        assert [j.job_id for j in kept] == [j["job_id"] for j in jobs[len(jobs) - fit :]]
        envelope = encode_envelope(sign_report(KEY, LONGEST_ID, LONGEST_ID, MAX_SEQ, data))
        assert len(envelope) <= MAX_REPORT_BYTES
    # (a quarter of the list per step would have left out ceil((fit + 1) / 4) entries)


def test_one_owner_with_thousands_of_jobs_does_not_push_the_others_out() -> None:
    flood = [{**_huge_job(i), "owner": "mallory"} for i in range(4200)]
    others = [
        {**_huge_job(10_000 + i), "owner": owner}
        for i, owner in enumerate(["alice"] * 10 + ["bob"] * 10)
    ]
    jobs = others[:5] + flood + others[5:]  # declared before and after the flood
    data, left_out = build_payload(_broker(jobs), "lab-1", LONGEST_ID)
    payload = ReportPayload.from_bytes(data)
    kept = [j.job_id for j in payload.jobs]
    assert {j["job_id"] for j in others} <= set(kept)  # every one of alice's and bob's
    assert left_out == payload.left_out == {"jobs": len(jobs) - len(kept)}
    assert 200 < len(kept) < 400 and left_out["jobs"] > 3800  # the size limit, not the schema's
    kept_flood = [k for k in kept if k.startswith("job-00")]
    assert kept_flood[-1] == flood[-1]["job_id"]  # mallory's newest are the ones kept
    assert kept == sorted(kept, key=[j["job_id"] for j in jobs].index)  # in their own order


def test_round_robin_by_owner_keeps_each_owners_newest() -> None:
    items = [{"owner": o, "n": i} for i, o in enumerate("aaaaabbc")]
    order = fair_order(items)
    assert [items[i]["owner"] + str(items[i]["n"]) for i in order] == [
        "a4", "b6", "c7", "a3", "b5", "a2", "a1", "a0",
    ]  # fmt: skip
    assert [x["n"] for x in keep_fairly(items, order, 4)] == [3, 4, 6, 7]
    assert keep_fairly(items, order, 99) is items


def test_the_payload_budget_is_exact() -> None:
    """`max_payload_bytes` is the largest payload whose envelope fits, to the byte."""
    budget = max_payload_bytes()
    for size, fits in ((budget, True), (budget + 1, False), (budget + 3, False)):
        envelope = encode_envelope(sign_report(KEY, LONGEST_ID, LONGEST_ID, MAX_SEQ, b"x" * size))
        assert (len(envelope) <= MAX_REPORT_BYTES) == fits, (size, len(envelope))


GPU = "GPU-5a1e0000-0000-0000-0000-000000000001"


def _booking(i: int, state: str = "booked", **fields: Any) -> dict[str, Any]:
    """A `BookingView` as `bookings.list` gives it: starting `i` hours after 1 700 000 000."""
    start = 1_700_000_000.0 + i * 3600
    return {
        "booking_id": f"book-{i:08x}",
        "owner": "alice",
        "project": "vision",
        "session": "sweep-3",
        "purpose": "fine-tune ViT-B",
        "mib": 10_000,
        "gpu_uuids": [GPU],
        "start_at": start,
        "end_at": start + 7200,
        "created_at": 1_699_990_000.0,
        "state": state,
        "claims": ["lease-0001"] if state == "claimed" else [],
        "claimed_mib": 4096 if state == "claimed" else 0,
        "claim_until": None,
        "ended_reason": "",
        "ended_at": 0.0,
        **fields,
    }


def test_the_report_carries_the_live_bookings_nearest_first() -> None:
    bookings = [
        _booking(3),
        _booking(1, "claimed"),
        _booking(2, "cancelled"),
        _booking(0, "held"),
        _booking(4, "lapsed"),
    ]
    data, left_out = build_payload(_broker([], bookings), "lab-1", "run-1")
    payload = ReportPayload.from_bytes(data)
    assert left_out == {} and payload.bookings_left_out == 0 and payload.left_out == {}
    assert [(b.booking_id, b.state) for b in payload.bookings] == [
        ("book-00000000", "held"), ("book-00000001", "claimed"), ("book-00000003", "booked"),
    ]  # fmt: skip
    claimed = payload.bookings[1]
    assert (claimed.mib, claimed.claimed_mib, claimed.gpu_uuids) == (10_000, 4096, [GPU])
    assert (claimed.owner, claimed.project, claimed.session, claimed.purpose) == (
        "alice", "vision", "sweep-3", "fine-tune ViT-B",
    )  # fmt: skip
    assert claimed.end_at - claimed.start_at == 7200
    # what the report never carries of a booking: its claims' lease ids, its creation time
    raw = data.decode()
    assert "lease-0001" not in raw and "1699990000" not in raw and "claims" not in raw


def test_a_report_carries_at_most_a_thousand_bookings_the_nearest() -> None:
    bookings = [_booking(i) for i in range(1234)][::-1]  # listed in any order
    data, left_out = build_payload(_broker([], bookings), "lab-1", "run-1")
    payload = ReportPayload.from_bytes(data)
    assert len(payload.bookings) == 1000
    assert [b.booking_id for b in payload.bookings] == [f"book-{i:08x}" for i in range(1000)]
    assert left_out == {"bookings": 234}
    # counted apart from `left_out`, whose keys a coordinator before report version 6 checks
    assert payload.bookings_left_out == 234 and payload.left_out == {}


def test_bookings_are_cut_to_fit_the_size_limit_furthest_first() -> None:
    long = "p" * 4000
    bookings = [_booking(i, purpose=f"{i:04d} {long}") for i in range(400)]
    data, left_out = build_payload(_broker([], bookings), "lab-1", LONGEST_ID)
    payload = ReportPayload.from_bytes(data)
    kept = len(payload.bookings)
    assert 100 < kept < 400 and left_out == {"bookings": 400 - kept}
    assert payload.bookings_left_out == 400 - kept
    assert [b.booking_id for b in payload.bookings] == [f"book-{i:08x}" for i in range(kept)]
    envelope = encode_envelope(sign_report(KEY, LONGEST_ID, LONGEST_ID, MAX_SEQ, data))
    assert len(envelope) <= MAX_REPORT_BYTES


def test_the_report_carries_each_leases_idle_state() -> None:
    leases = [
        {"lease_id": "lease-1", "gpu_uuids": [GPU], "granted_mib": 1024, "owner": "alice",
         "state": "active", "idle_state": "idle", "idle_s": 7800.0},
        {"lease_id": "lease-2", "gpu_uuids": [GPU], "granted_mib": 1024, "owner": "bob",
         "state": "active", "idle_state": "unknown", "idle_s": None},
    ]  # fmt: skip
    broker = _broker([])
    broker.leases_view = lambda: {"leases": leases, "queue": []}
    data, _ = build_payload(broker, "lab-1", "run-1")
    got = {x.lease_id: (x.idle_state, x.idle_s) for x in ReportPayload.from_bytes(data).leases}
    assert got == {"lease-1": ("idle", 7800.0), "lease-2": ("unknown", None)}
