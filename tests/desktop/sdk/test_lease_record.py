"""`rbroker.Lease` is written out rather than made by `@dataclass` (start-up, issue 44): its
constructor, `repr`, `==`, hash and `__match_args__` stay what the dataclass it was gave, and a
new request's key stays a random version-4 UUID in hex."""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from typing import Any

import pytest

from rbroker._lease import request_key
from rbroker._lease_record import Lease
from rbroker.base.exceptions import LeaseExpired, OverGrantWarning, RBrokerError


@dataclasses.dataclass
class DataclassLease:
    """The fields of `Lease` as the dataclass declared them."""

    lease_id: str
    gpu_uuid: str
    gpu_uuids: list[str]
    granted_mib: int
    cuda_visible_devices: str
    info: dict[str, Any]
    token: str = dataclasses.field(repr=False, default="")
    lost: bool = False
    error: RBrokerError | None = None
    gpu_indices: list[int] | None = None
    gpu_total_mib: list[int] | None = None
    gpu_total_override: list[str] = dataclasses.field(default_factory=list)
    over_grant: dict[str, Any] | None = None
    over_grant_error: OverGrantWarning | None = dataclasses.field(repr=False, default=None)
    socket: str | None = dataclasses.field(repr=False, default=None)


GIVEN: list[dict[str, Any]] = [
    {},
    {"token": "secret-token", "socket": "/run/b.sock", "lost": True},
    {"error": LeaseExpired("gone", "lease_expired"), "gpu_indices": [0, 1]},
    {"gpu_total_mib": [24576], "gpu_total_override": ["GPU-b"], "over_grant": {"over_mib": 5}},
    {"over_grant_error": OverGrantWarning("over", {"over_mib": 5})},
]


def _both(**given: Any) -> tuple[Lease, DataclassLease]:
    required: dict[str, Any] = {
        "lease_id": "lease-3f2a1b",
        "gpu_uuid": "GPU-a",
        "gpu_uuids": ["GPU-a", "GPU-b"],
        "granted_mib": 8192,
        "cuda_visible_devices": "GPU-a,GPU-b",
        "info": {"lease_id": "lease-3f2a1b", "project": "p"},
    }
    return Lease(**required, **given), DataclassLease(**required, **given)


@pytest.mark.parametrize("given", GIVEN)
def test_a_lease_shows_and_compares_as_the_dataclass_did(given: dict[str, Any]) -> None:
    lease, reference = _both(**given)
    assert repr(lease) == repr(reference).replace("DataclassLease(", "Lease(", 1)
    assert "secret-token" not in repr(lease)
    assert lease == _both(**given)[0] and lease != reference  # another class: not equal
    changed = _both(**given)[0]
    changed.granted_mib += 1
    assert lease != changed
    assert [getattr(lease, f.name) for f in dataclasses.fields(reference)] == [
        getattr(reference, f.name) for f in dataclasses.fields(reference)
    ]


def test_the_constructor_takes_what_the_dataclass_took() -> None:
    ours = inspect.signature(Lease).parameters
    theirs = inspect.signature(DataclassLease).parameters
    assert [(p.name, p.kind) for p in ours.values()] == [(p.name, p.kind) for p in theirs.values()]
    for name, parameter in theirs.items():
        if name != "gpu_total_override":  # the dataclass's default is a factory: a new list
            assert ours[name].default == parameter.default, name
    first, second = _both()[0], _both()[0]
    assert first.gpu_total_override == [] and first.gpu_total_override is not (
        second.gpu_total_override
    )
    positional = Lease("l", "g", ["g"], 1, "g", {}, "tok", True)
    assert (positional.token, positional.lost) == ("tok", True)


def test_a_lease_has_no_hash_and_matches_as_the_dataclass_did() -> None:
    lease = _both()[0]
    with pytest.raises(TypeError, match="unhashable"):
        hash(lease)
    assert Lease.__match_args__ == DataclassLease.__match_args__  # type: ignore[attr-defined]
    match lease:
        case Lease(lease_id, gpu_uuid):
            assert (lease_id, gpu_uuid) == ("lease-3f2a1b", "GPU-a")
    assert Lease.lost is False and Lease.token == ""  # class defaults, as the dataclass left


def test_a_request_key_is_a_random_uuid4_in_hex() -> None:
    keys = {request_key() for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        parsed = uuid.UUID(hex=key)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert parsed.hex == key  # 32 lowercase hex digits, as uuid4().hex
