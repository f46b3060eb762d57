"""Wire schema of `POST /api/v1/reports`: the request is the signed envelope of §7
(`rbroker_protocol.signing`), the answer a `ReportAck` (`rbroker_protocol.reports`).

`Ack` is the answer as the ingest makes it: a msgspec struct with `ReportAck`'s fields in
its order, with its defaults, so that its JSON is the bytes of `ReportAck`'s
`model_dump_json` (a test holds them equal) without pydantic's validation and dump on the
hot path (2–3 % of the GIL's time under report load, bench/RESULTS.md).
"""

from __future__ import annotations

from typing import Final

import msgspec

from rbroker_protocol.reports import AckCode, ReportAck

__all__ = ["Ack", "AckCode", "ReportAck", "encode_ack"]


class Ack(msgspec.Struct, frozen=True, gc=False):
    """A `ReportAck` (see there for the fields), for `encode_ack`."""

    applied: bool
    code: AckCode
    reason: str
    computer_id: str
    run_id: str
    seq: int
    current_run_counter: int | None = None
    flagged_fields: list[str] = msgspec.field(default_factory=list)


_ENCODER: Final = msgspec.json.Encoder()

encode_ack = _ENCODER.encode
"""`Ack` → its JSON bytes (`ReportAck.model_dump_json()` of the same values, UTF-8)."""
