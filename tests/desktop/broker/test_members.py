"""Members per project (`[members]`, `rbroker.broker.members`): a project with a members list
is refused (`not_a_member`, one line) to an OS user who is neither listed, nor in a listed
`@group`, nor an administrator; a project without one stays open to everyone. On the
in-process broker with a caller identity; the config file's errors are one line, exit 2.
The same rules with real OS users and a broker process: tests/desktop/localapi/
test_members_os_users.py."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rbroker.broker.config import BrokerConfig, read_config
from rbroker.broker.holders import Holder
from rbroker.broker.members import Members
from rbroker.cli.main import main
from rbroker.hosting.service_windows import ServiceOptions, service_config
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import AcquireParams
from rbroker_protocol.startup import EXIT_USAGE
from tests.conftest import SINGLE_24G
from tests.desktop.inprocess import InProcessBroker, SleeperPool

POSIX_ONLY = pytest.mark.skipif(sys.platform == "win32", reason="@group entries are POSIX-only")


def _acquire(
    h: InProcessBroker,
    holder: Holder,
    owner: str,
    project: str,
    admin: bool | Callable[[], bool] = False,
) -> Any:
    """A `lease.acquire` of 1 000 MiB for `project` by OS user `owner`, as the local API
    makes it; the lease, or the RpcError it was refused with."""
    p = AcquireParams(mib=1000, project=project, session="s", purpose="p")
    task = h.loop.create_task(h.broker.acquire(p, owner, holder, 1, admin))
    h.spin()
    return task.exception() or task.result()


def test_a_project_with_members_is_refused_to_others_in_one_line(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, persist=False, members={"vision": ("alice", "bob")})
    assert _acquire(h, pool.spawn()[1], "alice", "vision").owner == "alice"
    assert _acquire(h, pool.spawn()[1], "bob", " vision ").project == "vision"  # as stored
    refused = _acquire(h, pool.spawn()[1], "carol", "vision")
    assert isinstance(refused, RpcError) and refused.name is ErrorCode.NOT_A_MEMBER
    assert refused.data == {"project": "vision", "user": "carol"}
    assert "\n" not in refused.message
    assert "'vision'" in refused.message and "user carol is not one" in refused.message
    assert "add you to [members] vision" in refused.message and "broker.toml" in refused.message
    # nothing of the refused request stays behind
    assert len(h.broker.leases) == 2 and not h.broker.queue
    # a project without a members list stays open to everyone
    assert _acquire(h, pool.spawn()[1], "carol", "nlp").owner == "carol"
    # an administrator passes; the question is asked only of a user who is no member
    asked: list[str] = []

    def admin() -> bool:
        asked.append("asked")
        return True

    assert _acquire(h, pool.spawn()[1], "root-like", "vision", admin).owner == "root-like"
    assert _acquire(h, pool.spawn()[1], "alice", "vision", admin).owner == "alice"
    assert asked == ["asked"]


def test_a_job_declaring_a_kept_project_is_refused_to_others(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    h = make_inprocess(SINGLE_24G, persist=False, members={"vision": ("alice",)})
    job = h.broker.declare_job("alice", "vision", "train", "h", None, 1, None)
    assert job["project"] == "vision"
    with pytest.raises(RpcError) as refused:
        h.broker.declare_job("carol", "vision", "train", "h", None, 1, None)
    assert refused.value.name is ErrorCode.NOT_A_MEMBER
    assert h.broker.declare_job("carol", "vision", "t", "h", None, 1, None, admin=True)
    assert h.broker.declare_job("carol", "nlp", "train", "h", None, 1, None)["project"] == "nlp"
    assert len(h.broker.jobs_view(include_finished=True)) == 3


def test_a_restored_waiter_of_a_user_no_longer_listed_is_dropped(
    make_inprocess: Callable[..., InProcessBroker],
    pool: SleeperPool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A waiting request is granted after a restart before its client comes back: one queued
    while `vision` was open, by a user that the lists the broker restarts with leave out, is
    not restored (and leaves the store); a member's is. Leases are kept as granted."""
    h = make_inprocess(SINGLE_24G, members={})
    h.acquire(pool.spawn()[1], mib=20000, request_key="big")  # the GPU is taken

    def wait(owner: str, key: str) -> asyncio.Task[Any]:
        p = AcquireParams(
            mib=8192, project="vision", session="s", purpose="p", wait_s=60, request_key=key
        )
        task = h.loop.create_task(h.broker.acquire(p, owner, pool.spawn()[1], 1))
        h.spin()
        assert not task.done()
        return task

    tasks = [wait("alice", "alice-waits"), wait("carol", "carol-waits")]
    h.config = dataclasses.replace(h.config, members={"vision": ("alice",)})
    caplog.set_level(logging.WARNING)
    h.restart()
    assert [w.request_key for w in h.broker.queue] == ["alice-waits"]
    assert h.broker.store is not None
    assert [w["request_key"] for w in h.broker.store.waiters()] == ["alice-waits"]
    assert "waiting request of carol for project 'vision' not restored" in caplog.text
    assert len(h.broker.leases) == 1  # the lease is kept
    del tasks


@POSIX_ONLY
def test_a_listed_group_lets_its_members_in(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    """`@root`: the group database says who is in it (root is, by its primary group); a user
    this computer does not know is in no group."""
    h = make_inprocess(SINGLE_24G, persist=False, members={"vision": ("alice", "@root")})
    assert _acquire(h, pool.spawn()[1], "root", "vision").owner == "root"
    refused = _acquire(h, pool.spawn()[1], "no-such-user-rbt", "vision")
    assert isinstance(refused, RpcError) and refused.name is ErrorCode.NOT_A_MEMBER


def test_names_match_as_the_os_compares_them() -> None:
    """POSIX: exactly. Windows (the caller is `DOMAIN\\name` from the pipe client's token): a
    plain name matches the account in any domain, `DOMAIN\\name` only there, both without
    regard to case."""
    posix = Members({"vision": ["alice"]}, windows=False, in_group=lambda u, g: False)
    assert posix.is_member("vision", "alice") and not posix.is_member("vision", "Alice")
    assert not posix.is_member("vision", "WS\\alice") and posix.is_member("nlp", "anyone")
    win = Members({"vision": ["alice", "CORP\\Bob"]}, windows=True)
    assert win.is_member("vision", "WS01\\Alice") and win.is_member("vision", "alice")
    assert win.is_member("vision", "corp\\bob") and not win.is_member("vision", "WS01\\bob")
    assert not win.is_member("vision", "WS01\\carol") and win.is_member("nlp", "WS01\\carol")
    in_ml = lambda u, g: (u, g) == ("x", "ml")  # noqa: E731
    groups = Members({"vision": ["@ml"]}, windows=False, in_group=in_ml)
    assert groups.is_member("vision", "x") and not groups.is_member("vision", "y")


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"vision": "alice"}, "must be a list of OS user names"),
        ({"vision": []}, "must be a list of OS user names"),
        ({"vision": ["alice", 3]}, "3 is not a name in quotes"),
        ({"vision": [""]}, "'' has spaces around it or is empty"),
        ({"vision": [" bob"]}, "' bob' has spaces around it"),
        ({"vision": ["@"]}, "'@' names no group"),
        ({"": ["alice"]}, "a project name is empty"),
        ({"*": ["alice"]}, "'*' is not a project"),
    ],
)
def test_a_bad_members_list_is_refused_with_its_name(
    table: dict[str, object], words: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=r"^\[members\]") as exc:
        BrokerConfig(socket_path=tmp_path / "s", data_dir=tmp_path, members=table)  # type: ignore[arg-type]
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_a_group_is_refused_on_windows_never_ignored() -> None:
    with pytest.raises(ValueError, match="groups are read on Linux only") as exc:
        Members({"vision": ["alice", "@ml-team"]}, windows=True)
    assert "'@ml-team'" in str(exc.value) and "DOMAIN\\name" in str(exc.value)
    if sys.platform == "win32":  # a Windows broker does so by itself
        with pytest.raises(ValueError, match="groups are read on Linux only"):
            Members({"vision": ["@ml-team"]})


def test_the_config_file_gives_members_and_a_bad_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "broker.toml"
    good.write_text('[shares]\nvision = 3\n[members]\nvision = ["alice", "bob"]\n')
    settings = read_config(good)
    assert settings.members == {"vision": ("alice", "bob")}
    assert settings.shares == {"vision": 3.0}
    for text, words in (
        ('[members]\nvision = "alice"\n', "'vision' must be a list of OS user names"),
        ("[members]\nvision = [1]\n", "1 is not a name in quotes"),
        ('members = ["alice"]\n', "[members] must be a table"),
        (
            '[member]\nvision = ["alice"]\n',
            "unknown setting 'member' (known: [shares], [members], [bookings], [idle])",
        ),
    ):
        good.write_text(text)
        with pytest.raises(ValueError) as exc:
            read_config(good)
        assert words in str(exc.value) and str(good) in str(exc.value), exc.value
    # `rbroker broker` reads it from its data dir and says what is wrong in one line, exit 2
    socket = r"\\.\pipe\rbroker-members-test" if sys.platform == "win32" else "x.sock"
    code = main(["broker", "--simulate", "--data-dir", str(tmp_path), "--socket", socket])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and err.count("\n") == 1, err
    assert "unknown setting 'member'" in err and "Traceback" not in err


@POSIX_ONLY
def test_an_unknown_user_or_group_is_a_warning_at_start(
    make_inprocess: Callable[..., InProcessBroker],
    pool: SleeperPool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not a refusal to start: a directory service may be out of reach at boot, and an
    unknown name only keeps someone out (the request says so)."""
    table = {"vision": ("root", "no-such-user-rbt", "@no-such-group-rbt")}
    with caplog.at_level(logging.WARNING, logger="rbroker.broker.service"):
        h = make_inprocess(SINGLE_24G, persist=False, members=table)
    lines = [r.getMessage() for r in caplog.records]
    assert "[members] vision: no OS user named 'no-such-user-rbt'" in lines[0], lines
    assert "[members] vision: no OS group named 'no-such-group-rbt'" in lines[1], lines
    assert len(lines) == 2, lines
    assert _acquire(h, pool.spawn()[1], "root", "vision").owner == "root"


def test_the_windows_service_reads_members_from_its_data_dir(tmp_path: Path) -> None:
    """The service has no `--config`: it reads `broker.toml` in its data dir when there is
    one, and refuses a bad one with one line (the event log's, and `rbroker service run`'s
    exit 2)."""
    options = ServiceOptions(data_dir=tmp_path, simulate=True)
    assert service_config({}, options).members == {}
    (tmp_path / "broker.toml").write_text('[members]\nvision = ["alice", "CORP\\\\bob"]\n')
    assert service_config({}, options).members == {"vision": ("alice", "CORP\\bob")}
    (tmp_path / "broker.toml").write_text('[members]\nvision = "alice"\n')
    with pytest.raises(ValueError, match="must be a list of OS user names"):
        service_config({}, options)
