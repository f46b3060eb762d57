"""A refused administrative method says why it is kept to administrators in words true of it:
a method that changes the broker says so, the audit trail's listing says what it shows."""

from __future__ import annotations

import pytest

from rbroker.localapi.access import check_admin
from rbroker.transport.base import Peer
from rbroker_protocol.errors import RpcError


def _refusal(method: str) -> str:
    with pytest.raises(RpcError) as caught:
        check_admin(Peer(pid=1, user="mallory", uid=54321), method, None)
    return str(caught.value)


def test_reading_the_audit_is_not_called_a_change() -> None:
    said = _refusal("audit.list")
    assert "changes the broker" not in said
    assert said.startswith("audit.list shows what users did") and "not mallory" in said


def test_a_change_still_says_it_changes_the_broker() -> None:
    assert _refusal("broker.pause").startswith("broker.pause changes the broker for everyone")
