"""Wire schema of `POST /api/v1/reports` (the request is the signed envelope of §7)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

AckCode = Literal["applied", "new_run", "not_newer", "run_retired", "superseded"]


class ReportAck(BaseModel):
    """The answer to an authentic report. `applied=false` for a replay or an older seq,
    which the computer should treat as delivered (nothing to resend).

    `code`: `applied`; `new_run` (applied, first report of a run); `not_newer` (seq not
    above the last applied one of this run); `superseded` (a newer report won a race);
    `run_retired` (this run_id was replaced by another run: a broker that gets this for
    its own live run should start a new run_id, which the coordinator then accepts).
    """

    applied: bool
    code: AckCode
    reason: str
    computer_id: str
    run_id: str
    seq: int
    flagged_fields: list[str] = []
    """Description fields that broke a rule: stored redacted (rule names, never values)."""
