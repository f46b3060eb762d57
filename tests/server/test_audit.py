"""The coordinator's audit trail (issue 42): an entry per enrollment, enrollment code,
revocation, token, web sign-in and webhook change, with its actor and target, in the
change's transaction; refused sign-ins bounded per network; no secret in any entry;
`rbroker-server audit` lists them newest first."""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from rbroker_server.admin import audit
from rbroker_server.admin import operations as admin
from rbroker_server.admin.errors import AdminError
from rbroker_server.auth.credentials import parse_credential
from rbroker_server.cli.main import main
from rbroker_server.db.tables import AUDIT
from rbroker_server.webhooks import admin as hooks
from tests.server.conftest import Coordinator
from tests.server.test_web import sign_in

USER = f"cli:{getpass.getuser()}"


def rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.select(AUDIT).order_by(AUDIT.c.id)).all()


def assert_no_secret(engine: sa.Engine, secrets: list[str]) -> None:
    text = "\n".join(repr(tuple(r)) for r in rows(engine))
    for secret in secrets:
        assert secret not in text
        cred = parse_credential(secret.split("_")[0], secret)
        if cred is not None:
            assert cred.secret not in text  # nor its secret part alone


def test_each_action_writes_an_entry_with_its_actor_and_target(
    coordinator: Coordinator,
) -> None:
    c = coordinator
    c.group("vision")
    token = c.tokens["vision"]
    token_id = token.split("_")[1]
    code = admin.create_enroll_code(c.engine, "vision", 600)
    computer = c.enroll("vision", "lab-7")
    spare = admin.create_enroll_code(c.engine, "vision", 600)
    assert admin.revoke_enroll_code(c.engine, "vision", spare.id)
    client, r = sign_in(c, token)
    client.close()
    assert r.status_code == 303
    hook = hooks.add_webhook(
        c.engine, c.settings, "vision", "https://chat.example/hooks/T0/SECRETPATH", "job_failed"
    )
    assert hooks.remove_webhook(c.engine, hook.id)
    assert admin.revoke_computer(c.engine, computer.id)
    assert admin.revoke_computer(c.engine, computer.id)  # already revoked: no second entry
    assert admin.revoke_token(c.engine, "vision", token_id)

    got = [(r.actor, r.action, r.group_name, r.target) for r in rows(c.engine)]
    enrolled = next(g for g in got if g[1] == audit.ENROLLED)
    assert enrolled[0].startswith("enroll_code:") and enrolled[2:] == ("vision", computer.id)
    assert [g for g in got if g[1] != audit.ENROLLED] == [
        (USER, audit.GROUP_CREATED, "vision", "vision"),
        (USER, audit.TOKEN_CREATED, "vision", token_id),
        (USER, audit.CODE_CREATED, "vision", code.id),
        (USER, audit.CODE_CREATED, "vision", enrolled[0].split(":")[1]),
        (USER, audit.CODE_CREATED, "vision", spare.id),
        (USER, audit.CODE_REVOKED, "vision", spare.id),
        (f"token:{token_id}", audit.SIGNIN, "vision", token_id),
        (USER, audit.WEBHOOK_ADDED, "vision", f"webhook {hook.id}"),
        (USER, audit.WEBHOOK_REMOVED, "vision", f"webhook {hook.id}"),
        (USER, audit.COMPUTER_REVOKED, "vision", computer.id),
        (USER, audit.TOKEN_REVOKED, "vision", token_id),
    ]
    hook_rows = [r for r in rows(c.engine) if r.action == audit.WEBHOOK_ADDED]
    assert hook_rows[0].detail == "https://chat.example job_failed"
    assert_no_secret(c.engine, [token, code.text, spare.text, hook.secret, "SECRETPATH"])


def test_a_change_that_fails_writes_no_entry(coordinator: Coordinator) -> None:
    c = coordinator
    c.group("vision")
    before = len(rows(c.engine))
    with pytest.raises(AdminError):
        admin.create_group(c.engine, "vision")
    with pytest.raises(AdminError):
        hooks.add_webhook(c.engine, c.settings, "nobody", "https://chat.example/x", "job_failed")
    assert not hooks.remove_webhook(c.engine, 12345)
    assert not admin.revoke_token(c.engine, "vision", "000000000000")
    assert len(rows(c.engine)) == before


def test_refused_sign_ins_are_bounded_per_network(coordinator: Coordinator) -> None:
    c = coordinator
    c.group("vision")
    wrong = c.tokens["vision"][:-4] + "AAAA"
    for _ in range(3):
        client, r = sign_in(c, wrong)
        client.close()
        assert r.status_code == 401
    refused = [r for r in rows(c.engine) if r.action == audit.SIGNIN_REFUSED]
    assert len(refused) == 1
    assert refused[0].target == "127.0.0.0/24" and refused[0].group_name is None
    assert refused[0].detail == "1 refused sign-in"
    assert_no_secret(c.engine, [wrong, c.tokens["vision"]])


def test_refusal_bound_counts_what_it_held_back() -> None:
    now = [0.0]
    bound = audit.RefusalBound(clock=lambda: now[0])
    assert bound.admit("10.0.0.0/24") == ("10.0.0.0/24", 1)
    assert bound.admit("10.0.0.0/24") is None
    assert bound.admit("10.0.1.0/24") == ("10.0.1.0/24", 1)
    assert bound.admit("10.0.0.0/24") is None
    now[0] = 61.0
    assert bound.admit("10.0.0.0/24") == ("10.0.0.0/24", 3)
    assert bound.admit("10.0.0.0/24") is None


def test_refusal_bound_holds_a_bounded_number_of_networks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit, "REFUSAL_NETWORKS_MAX", 2)
    bound = audit.RefusalBound(clock=lambda: 0.0)
    assert bound.admit("a") == ("a", 1)
    assert bound.admit("b") == ("b", 1)
    assert bound.admit("c") == ("*", 1)
    assert bound.admit("d") is None


def test_client_network_and_url_origin() -> None:
    assert audit.client_network("192.0.2.77") == "192.0.2.0/24"
    assert audit.client_network("2001:db8::1") == "2001:db8::/64"
    assert audit.client_network("") == "unknown"
    assert audit.url_origin("https://u:p@chat.example:8443/hooks/T0?k=s") == (
        "https://chat.example:8443"
    )
    assert audit.url_origin("http://[::1]/x") == "http://[::1]"


def test_cli_lists_newest_first(
    tmp_path: Path, backend: str, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.server.test_cli import _setup_args

    data = tmp_path / "srv"
    assert main(_setup_args(data, backend, database_url)) == 0
    d = ["--data-dir", str(data)]
    assert main(["group", "create", "vision", *d]) == 0
    capsys.readouterr()
    assert main(["token", "create", "--group", "vision", "--name", "alice", *d]) == 0
    token = capsys.readouterr().out.strip()
    assert main(["audit", *d]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t")[1:5] == [USER, audit.TOKEN_CREATED, "vision", token.split("_")[1]]
    assert lines[0].endswith("name 'alice'")
    assert lines[1].split("\t")[1:5] == [USER, audit.GROUP_CREATED, "vision", "vision"]
    assert token not in "\n".join(lines)

    assert main(["audit", "--group", "vision", "--limit", "1", "--json", *d]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["action"] == audit.TOKEN_CREATED and entry["group"] == "vision"
    assert entry["actor"] == USER and entry["at"].endswith("+00:00")

    assert main(["audit", "--group", "nobody", *d]) == 1
    assert "no group named 'nobody'" in capsys.readouterr().err
    assert main(["audit", "--limit", "0", *d]) == 1
