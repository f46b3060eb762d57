"""Wire schema of `POST /api/v1/reports` (the request is the signed envelope of §7)."""

from __future__ import annotations

from pydantic import BaseModel


class ReportAck(BaseModel):
    """The answer to an authentic report. `applied=false` for a replay or an older seq,
    which the computer should treat as delivered (nothing to resend)."""

    applied: bool
    reason: str
    computer_id: str
    run_id: str
    seq: int
    flagged_fields: list[str] = []
    """Description fields that broke a rule: stored redacted (rule names, never values)."""
