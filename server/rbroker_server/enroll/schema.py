"""Wire schema of `POST /api/v1/enroll`: `EnrollRequest` and `EnrollResponse`
(`rbroker_protocol.enroll`)."""

from __future__ import annotations

from rbroker_protocol.enroll import EnrollRequest, EnrollResponse

__all__ = ["EnrollRequest", "EnrollResponse"]
