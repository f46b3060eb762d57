"""Views: the dictionaries `gpus.list`, `leases.list` and `broker.status` return
(docs/architecture.md §5). Read-only over the broker's state; the wire shape lives here.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from rbroker._version import __version__
from rbroker.eventloop import loop_name
from rbroker.gpu.types import TelemetryState

if TYPE_CHECKING:
    from rbroker.broker.service import Broker


def gpus_view(broker: Broker) -> list[dict[str, Any]]:
    """Per GPU, by index: identity, telemetry (`stale` when the latest sample is older than
    `max_sample_age_s`), lease and queue counts, and the capacity split of
    docs/architecture.md §2 in MiB."""
    now = broker.clock.monotonic()
    table = broker.table
    out = []
    for slot in sorted(broker.slots.values(), key=lambda s: s.info.index):
        cap = table.capacity(slot.uuid)
        on = table.on(slot.uuid)
        leased = sum(lease.observed_mib.get(slot.uuid, 0) for lease in on)
        granted = sum(lease.granted_mib for lease in on)
        telemetry = slot.telemetry
        if (
            telemetry is TelemetryState.OK
            and slot.sample is not None
            and now - slot.sample.finished_at > broker.config.max_sample_age_s
        ):
            telemetry = TelemetryState.STALE
        entry: dict[str, Any] = {
            "uuid": slot.uuid,
            "index": slot.info.index,
            "name": slot.info.name,
            "telemetry": telemetry.value,
            "telemetry_reason": slot.telemetry_reason,
            "sample_age_s": round(now - slot.sample.finished_at, 3) if slot.sample else None,
            "memory_api": slot.sample.memory_api if slot.sample else None,
            "leases": len(on),
            "granted_mib": granted,
            "leased_in_use_mib": leased,
            "waiting": sum(1 for w in broker.queue if slot.uuid in w.candidates),
        }
        if cap is not None:
            entry.update(cap.as_dict())
            entry["other_in_use_mib"] = max(0, cap.device_used_mib - leased)
        out.append(entry)
    return out


def leases_view(broker: Broker, include_ended: bool = False) -> dict[str, Any]:
    """`{"leases": [...], "queue": [...]}` (plus `"ended"` when asked): active leases with
    the telemetry of their GPUs and flags, the queue with reasons and positions."""
    now = broker.clock.monotonic()
    queued = [w.to_wire(now, ahead) for w, ahead in broker.waiting.ahead()]
    leases = []
    for lease in broker.leases.values():
        item = lease.to_wire(now)
        item["gpu_telemetry"] = {
            u: broker.slots[u].telemetry.value if u in broker.slots else TelemetryState.LOST.value
            for u in lease.gpu_uuids
        }
        item["flags"] = sorted(
            {f"gpu_{state}" for state in item["gpu_telemetry"].values() if state != "ok"}
            | ({"over_grant"} if lease.over_grant else set())
        )
        leases.append(item)
    view: dict[str, Any] = {
        "leases": leases,
        "queue": queued,
    }
    if include_ended:
        view["ended"] = [lease.to_wire(now) for lease in broker.ended]
    return view


def status(broker: Broker) -> dict[str, Any]:
    """Version, uptime, telemetry source and states, counts, coordinator link, socket, and
    the kind of event loop the broker runs on."""
    return {
        "version": __version__,
        "uptime_s": round(broker.clock.monotonic() - broker.started_mono, 3),
        "started_at": broker.started_wall,
        "telemetry_source": broker.gateway.source,
        "simulated": broker.fake is not None,
        "driver_version": broker.driver_version,
        "nvml_problem": None
        if broker.nvml_problem is None
        else {
            "reason": broker.nvml_problem.reason,
            "words": broker.nvml_problem.words,
            "device_present": broker.nvml_problem.device_present,
        },
        "gpus": {u: s.telemetry.value for u, s in broker.slots.items()},
        "active_leases": len(broker.leases),
        "queued_requests": len(broker.queue),
        "leases_granted_total": broker.grant_count,
        "paused": broker.paused,
        "coordinator": broker.uplink_status()
        if broker.uplink_status is not None
        else {"link": "not enrolled", "last_report_at": None},
        "socket": str(broker.config.socket_path),
        "event_loop": _event_loop(),
    }


def _event_loop() -> str | None:
    """`uvloop` or `asyncio` (see `rbroker.eventloop`); None outside a running loop."""
    try:
        return loop_name(asyncio.get_running_loop())
    except RuntimeError:
        return None
