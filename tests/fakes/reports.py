"""Signed reports as a broker sends them, built from arguments: the coordinator's tests and the
benchmarks (bench/) build theirs here.

`payload()` is a report with one 24 GiB GPU (500 MiB used by another process) unless told
otherwise; `gpu_report()` is one GPU whose used and available MiB follow from the figures
given, as the broker's capacity split computes them (architecture.md §2);
`signed_body()` is the body of `POST /api/v1/reports` for a payload, signed with the
computer's Ed25519 key (`rbroker_protocol.signing`).
"""

from __future__ import annotations

import time
from typing import Any

import nacl.signing

from rbroker_protocol.reports import GpuReport, LeaseReport, ReportPayload, TelemetryStateName
from rbroker_protocol.signing import encode_envelope, sign_report

GPU_A = "GPU-5a1e0000-0000-0000-0000-000000000001"
GPU_B = "GPU-5a1e0000-0000-0000-0000-000000000002"


def gpu_report(
    uuid: str = GPU_A,
    index: int = 0,
    *,
    name: str = "Simulated RTX 4090",
    telemetry: TelemetryStateName = "ok",
    total_mib: int = 24576,
    headroom_mib: int = 1229,
    leased_in_use_mib: int = 0,
    other_in_use_mib: int = 0,
    outstanding_mib: int = 0,
    **figures: int | None,
) -> GpuReport:
    """One GPU's report. Unless given in `figures`, `device_used_mib` is the leased plus the
    other processes' MiB and `available_mib` is `total_mib - headroom_mib - device_used_mib -
    outstanding_mib`, at least 0; `figures` may set either (None: unknown) where a test needs
    figures that do not add up."""
    device_used_mib = leased_in_use_mib + other_in_use_mib
    derived: dict[str, int | None] = {
        "device_used_mib": device_used_mib,
        "available_mib": max(0, total_mib - headroom_mib - device_used_mib - outstanding_mib),
    }
    return GpuReport(
        uuid=uuid,
        index=index,
        name=name,
        telemetry=telemetry,
        total_mib=total_mib,
        headroom_mib=headroom_mib,
        outstanding_mib=outstanding_mib,
        leased_in_use_mib=leased_in_use_mib,
        other_in_use_mib=other_in_use_mib,
        **(derived | figures),
    )


def payload(
    name: str = "lab-1",
    run_id: str = "run-1",
    *,
    generated_at: float | None = None,
    gpus: list[GpuReport] | None = None,
    leases: list[LeaseReport] | None = None,
    **fields: Any,
) -> ReportPayload:
    """A report payload of computer `name` in run `run_id`, generated now unless
    `generated_at` (Unix seconds) says when; `gpus` defaults to one 24 GiB GPU with 500 MiB
    used by another process, `fields` are the payload's other fields (queue, jobs, …)."""
    return ReportPayload(
        computer_name=name,
        broker_version="0.1.0",
        telemetry_source="simulated",
        run_id=run_id,
        generated_at=time.time() if generated_at is None else generated_at,
        gpus=gpus if gpus is not None else [gpu_report(other_in_use_mib=500)],
        leases=leases or [],
        **fields,
    )


def signed_body(
    key: nacl.signing.SigningKey,
    computer_id: str,
    run_id: str,
    seq: int,
    report: ReportPayload | bytes,
) -> bytes:
    """The body of `POST /api/v1/reports`: `report` (or its exact JSON bytes) in an envelope
    signed by `key` as computer `computer_id`'s report `seq` of run `run_id`."""
    raw = report if isinstance(report, bytes) else report.to_bytes()
    return encode_envelope(sign_report(key, computer_id, run_id, seq, raw))
