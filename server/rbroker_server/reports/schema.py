"""Wire schema of `POST /api/v1/reports`: the request is the signed envelope of §7
(`rbroker_protocol.signing`), the answer a `ReportAck` (`rbroker_protocol.reports`)."""

from __future__ import annotations

from rbroker_protocol.reports import AckCode, ReportAck

__all__ = ["AckCode", "ReportAck"]
