"""`[members]` with real OS users on a broker process: the caller is the user the kernel
reports for the connection (SO_PEERCRED), a listed `@group` is read from the group database
at each request (a user added to it passes at the next request, no restart), the refusal
reaches the SDK as `NotAllowed` (`not_a_member`) and `rbroker run` as one line, exit 2.
The rule itself: tests/desktop/broker/test_members.py."""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import rbroker
from rbroker.cli.main import main
from tests.conftest import SINGLE_24G, BrokerProcess
from tests.os_users import OsUser, open_to_everyone, run_as

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


def _lease(socket: str, project: str) -> tuple[str, str]:
    """Take and release a lease for `project`: ("granted", its owner) or (code, message)."""
    try:
        with rbroker.lease(500, project=project, session="s", purpose="p", socket=socket) as held:
            with rbroker.Client(socket) as c:
                mine = c.call("leases.list")["leases"]
            return "granted", next(x["owner"] for x in mine if x["lease_id"] == held.lease_id)
    except rbroker.RBrokerError as exc:
        return exc.code, exc.message


def _run(socket: str, project: str) -> tuple[int, str]:
    """`rbroker run --project PROJECT -- true`: its exit code and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", "--socket", socket, "--mib", "500", "--project", project, "--", "true"])
    return code, err.getvalue()


def test_only_members_and_their_group_lease_for_a_kept_project(
    broker_factory: Callable[..., BrokerProcess], other_user: OsUser, tmp_path: Path
) -> None:
    from tests.os_users import create_group

    group = create_group(f"{other_user.name}-ml")
    try:
        config = tmp_path / "broker.toml"
        config.write_text(f'[shares]\nvision = 3\n[members]\nvision = ["nobody", "@{group}"]\n')
        bp = broker_factory(SINGLE_24G, extra_args=["--config", str(config)])
        open_to_everyone(Path(bp.socket).parent, bp.socket)

        code, message = run_as(other_user, _lease, bp.socket, "vision")
        assert code == "not_a_member", message
        assert (
            f"project 'vision' is open only to its members on this broker, and user "
            f"{other_user.name} is not one" in message
        )
        exit_code, err = run_as(other_user, _run, bp.socket, "vision")
        assert exit_code == 2 and err.count("\n") == 1, err
        assert err.startswith("rbroker run: project 'vision'") and "[members]" in err, err
        # a project without a members list stays open to everyone
        assert run_as(other_user, _lease, bp.socket, "nlp") == ("granted", other_user.name)
        # the broker's own user (root here) is an administrator: it passes
        assert _lease(bp.socket, "vision") == ("granted", "root")

        # added to the group: the next request passes, without a restart
        subprocess.run(["usermod", "-aG", group, other_user.name], check=True)
        assert run_as(other_user, _lease, bp.socket, "vision") == ("granted", other_user.name)
        assert run_as(other_user, _run, bp.socket, "vision")[0] == 0
        assert "projects kept to their [members]: vision" in bp.log()
    finally:
        subprocess.run(["groupdel", group], capture_output=True)
