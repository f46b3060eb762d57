"""The report payload is trimmed to the schema's list limits and to the size limit (§7),
keeping the newest entries and counting what was left out."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import nacl.signing
import pytest

from rbroker.uplink.payload import build_payload
from rbroker_protocol.reports import MAX_REPORT_BYTES, ReportPayload
from rbroker_protocol.signing import encode_envelope, sign_report


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
    data, trimmed = build_payload(_broker(jobs), "lab-1", "run-1")
    payload = ReportPayload.from_bytes(data)
    assert len(payload.jobs) + trimmed == count
    assert payload.jobs[-1].job_id == jobs[-1]["job_id"]  # the newest are kept
    assert (trimmed > 0) == (count > 1000)
    key = nacl.signing.SigningKey.generate()
    envelope = encode_envelope(sign_report(key, "c_1", "run-1", 1, data))
    assert len(envelope) <= MAX_REPORT_BYTES
