"""The audit trail on a broker process, with a real second OS user: `rbroker audit` as the
broker's own user shows the pause and resume it made; the file is
0600 in the 0700 data dir, so another user can neither read, write nor truncate it (even
with the directories above opened to everyone); and `audit.list` / `rbroker audit` from that
user are refused (`not_allowed`; one line, exit 2). The rules: test_audit_trail.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import sys
from pathlib import Path

import pytest

import rbroker
from rbroker.cli.main import main
from tests.conftest import BrokerProcess
from tests.os_users import OsUser, open_to_everyone, run_as

pytestmark = [
    pytest.mark.contract,  # it starts processes of its own
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes and OS users"),
]


def _audit_cli(socket: str, *extra: str) -> tuple[int, str, str]:
    """`rbroker audit --socket SOCKET ...`: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["audit", "--socket", socket, *extra])
    return code, out.getvalue(), err.getvalue()


def _audit_list(socket: str) -> str:
    try:
        with rbroker.Client(socket) as c:
            c.call("audit.list")
    except rbroker.RBrokerError as exc:
        return exc.code
    return "answered"


def _touch(path: str) -> list[str]:
    """What another user's attempts on `path` end with: read, append, truncate."""
    tries = {"read": os.O_RDONLY, "append": os.O_WRONLY | os.O_APPEND, "truncate": os.O_TRUNC}
    got = []
    for name, flags in tries.items():
        try:
            os.close(os.open(path, flags | (os.O_WRONLY if name == "truncate" else 0)))
            got.append(f"{name}: allowed")
        except PermissionError:
            got.append(f"{name}: refused")
    return got


def test_admins_read_the_audit_and_another_user_cannot_touch_it(
    broker: BrokerProcess, other_user: OsUser
) -> None:
    open_to_everyone(Path(broker.socket).parent, broker.socket)
    with broker.client() as c:
        c.call("broker.pause", paused=True)
        c.call("broker.pause", paused=False)

    code, out, err = _audit_cli(broker.socket)
    assert code == 0, err
    assert "admissions_paused" in out and "admissions_resumed" in out
    assert "new admissions paused by root" in out
    code, out, _err = _audit_cli(broker.socket, "--json", "--limit", "1")
    answer = json.loads(out)
    assert answer["verified"] is True and answer["problem"] is None
    (entry,) = answer["entries"]
    assert entry["action"] == "admissions_resumed" and entry["actor"] == "root"
    assert _audit_cli(broker.socket, "--limit", "0")[0] == 2

    audit = broker.data_dir / "audit.jsonl"
    assert stat.S_IMODE(audit.stat().st_mode) == 0o600
    assert stat.S_IMODE(broker.data_dir.stat().st_mode) == 0o700
    assert run_as(other_user, _touch, str(audit)) == [
        "read: refused",
        "append: refused",
        "truncate: refused",
    ]
    # past the data dir's mode too: the file's own mode keeps the other user out
    os.chmod(broker.data_dir, 0o755)
    try:
        assert run_as(other_user, _touch, str(audit)) == [
            "read: refused",
            "append: refused",
            "truncate: refused",
        ]
    finally:
        os.chmod(broker.data_dir, 0o700)

    assert run_as(other_user, _audit_list, broker.socket) == "not_allowed"
    code, out, err = run_as(other_user, _audit_cli, broker.socket)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("rbroker audit: ") and "audit.list" in err, err
    assert audit.read_bytes().count(b"\n") == 2  # a refused reader adds nothing


def test_a_record_that_does_not_verify_is_said_and_exits_1(broker: BrokerProcess) -> None:
    """Before: `rbroker audit` exited 0 over an edited record, so a script could not notice."""
    with broker.client() as c:
        c.call("broker.pause", paused=True)
        c.call("broker.pause", paused=False)
    audit = broker.data_dir / "audit.jsonl"
    audit.write_bytes(audit.read_bytes().replace(b"paused by root", b"paused by bob!", 1))
    code, out, err = _audit_cli(broker.socket)
    assert code == 1, err
    assert "the audit record does not verify" in out
    code, out, _err = _audit_cli(broker.socket, "--json")
    assert code == 1 and json.loads(out)["verified"] is False
