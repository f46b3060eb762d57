"""The report payload is trimmed to the schema's list limits and to the size limit (§7),
keeping the newest entries and counting what was left out."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import nacl.signing
import pytest

from rbroker._version import __version__
from rbroker.uplink.payload import build_payload, max_payload_bytes
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


def _broker(jobs: list[dict[str, Any]]) -> Any:
    return SimpleNamespace(
        gpus_view=lambda: [],
        leases_view=lambda: {"leases": [], "queue": []},
        jobs=SimpleNamespace(view=lambda include_finished, live_lease_ids: jobs),
        leases={},
        gateway=SimpleNamespace(source="simulated"),
        clock=SimpleNamespace(wall=lambda: 1_700_000_000.0),
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


def _envelope_len(jobs: list[dict[str, Any]], run_id: str) -> int:
    """The size of the signed envelope of a payload carrying `jobs`, with the longest
    computer id and sequence number: written out without the code under test."""
    payload = ReportPayload(
        computer_name="lab-1",
        broker_version=__version__,
        telemetry_source="simulated",
        run_id=run_id,
        generated_at=1_700_000_000.0,
        jobs=jobs,  # type: ignore[arg-type]
    ).to_bytes()
    return len(encode_envelope(sign_report(KEY, LONGEST_ID, LONGEST_ID, MAX_SEQ, payload)))


def _largest_fitting(jobs: list[dict[str, Any]]) -> int:
    """The most newest jobs whose envelope fits 1 MiB: a step-by-one scan from an estimate
    (1 MiB over the envelope's size per job, base64 included)."""

    def fits(n: int) -> bool:
        return _envelope_len(jobs[len(jobs) - n :], LONGEST_ID) <= MAX_REPORT_BYTES

    n = min(len(jobs), MAX_REPORT_BYTES * len(jobs) // _envelope_len(jobs, LONGEST_ID))
    while n < len(jobs) and fits(n + 1):
        n += 1
    while n > 0 and not fits(n):
        n -= 1
    return n


def test_a_report_just_over_the_limit_keeps_the_largest_list_that_fits() -> None:
    many = [_huge_job(i) for i in range(400)]
    fit = _largest_fitting(many)
    assert 200 < fit < 400, fit  # the entries really are ~3.2 kB
    # exactly what fits: nothing is left out; one entry more: exactly one is left out
    for extra in (0, 1, 2, 37):
        jobs = many[: fit + extra]
        data, left_out = build_payload(_broker(jobs), "lab-1", LONGEST_ID)
        kept = ReportPayload.from_bytes(data).jobs
        assert len(kept) == fit, (extra, len(kept))
        assert left_out == ({"jobs": extra} if extra else {})
        assert [j.job_id for j in kept] == [j["job_id"] for j in jobs[-fit:]]  # newest kept
        envelope = encode_envelope(sign_report(KEY, LONGEST_ID, LONGEST_ID, MAX_SEQ, data))
        assert len(envelope) <= MAX_REPORT_BYTES
    # (a quarter of the list per step would have left out ceil((fit + 1) / 4) entries)


def test_the_payload_budget_is_exact() -> None:
    """`max_payload_bytes` is the largest payload whose envelope fits, to the byte."""
    budget = max_payload_bytes()
    for size, fits in ((budget, True), (budget + 1, False), (budget + 3, False)):
        envelope = encode_envelope(sign_report(KEY, LONGEST_ID, LONGEST_ID, MAX_SEQ, b"x" * size))
        assert (len(envelope) <= MAX_REPORT_BYTES) == fits, (size, len(envelope))
