"""Plain (stdlib `TypedDict`) mirrors of the params the SDK builds, so that `import rbroker`
loads no pydantic: `AcquireRequest` has the keys of `rbroker_protocol.localapi.AcquireParams`
(a test checks that they stay equal), each optional where the model has a default.
"""

from typing import Literal, Required, TypedDict


class AcquireRequest(TypedDict, total=False):
    """`lease.acquire`'s params (rules and defaults: `AcquireParams`). A key left out takes
    the model's default; `gpu_uuid`, `request_key`, `job_id`, `expected_s` and `booking_id`
    are left out rather than sent as null."""

    mib: Required[int]
    gpus: int
    gpu_uuid: str
    project: Required[str]
    session: Required[str]
    purpose: Required[str]
    ttl_s: float
    wait_s: float
    adopt: bool
    placement: Literal["pack", "spread"]
    request_key: str
    job_id: str
    notify_waiting: bool
    expected_s: float
    booking_id: str


MAX_UNIX_S: float = 4102444800.0
"""Latest time a booking may name, Unix seconds (2100-01-01 UTC): a bound on absurd input
(here, stdlib only, for the SDK; `rbroker_protocol.localapi` checks it)."""

__all__ = ["MAX_UNIX_S", "AcquireRequest"]
