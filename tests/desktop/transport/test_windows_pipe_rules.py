"""The Windows named-pipe transport's rules (issue 13, item 3), tested on any OS: the
access list of the service pipe and of a per-user pipe, the server-account check clients
make before sending, the pool of listening instances and the client's busy-pipe retry.

The transport that applies them (`rbroker.transport.pipe_windows`, both ends) needs Windows; it
type-checks with `mypy --platform win32` (.ci/run).
"""

from __future__ import annotations

import pytest

from rbroker.transport.pipe_security import (
    CLIENT_OPEN_ACCESS,
    CLIENT_RIGHTS,
    ERROR_FILE_NOT_FOUND,
    ERROR_PIPE_BUSY,
    FILE_CREATE_PIPE_INSTANCE,
    LOCAL_SYSTEM_SID,
    SERVICE_PIPE,
    PoolPolicy,
    UntrustedPipeServer,
    check_server_account,
    expected_server_sid,
    listeners_to_add,
    pipe_sddl,
    plan_after,
    sddl_for,
)
from rbroker.transport.pipe_windows import PIPE_PREFIX, pipe_name_problem

ANA = "S-1-5-21-3623811015-3361044348-30300820-1013"
FILE_GENERIC_READ = 0x00120089  # what GENERIC_READ maps to for files and pipes
FILE_GENERIC_WRITE = 0x00120116  # what GENERIC_WRITE maps to: includes FILE_APPEND_DATA


def test_service_pipe_name() -> None:
    assert SERVICE_PIPE == "\\\\.\\pipe\\rbroker"


def test_service_pipe_access_list() -> None:
    assert sddl_for(SERVICE_PIPE, LOCAL_SYSTEM_SID) == (
        "O:S-1-5-18G:S-1-5-18D:P(D;;GA;;;NU)(A;;GA;;;SY)(A;;0x0012008b;;;AU)"
    )


def test_per_user_pipe_admits_its_user_alone() -> None:
    assert sddl_for("\\\\.\\pipe\\rbroker-ana", ANA) == (
        f"O:{ANA}G:{ANA}D:P(D;;GA;;;NU)(A;;GA;;;SY)(A;;GA;;;{ANA})"
    )


def test_clients_may_read_and_write_but_never_create_instances() -> None:
    assert CLIENT_RIGHTS == 0x0012008B
    assert not CLIENT_RIGHTS & FILE_CREATE_PIPE_INSTANCE
    # what a client asks for (GENERIC_READ | FILE_WRITE_DATA) is inside what it is granted
    asked = (FILE_GENERIC_READ if CLIENT_OPEN_ACCESS & 0x80000000 else 0) | (
        CLIENT_OPEN_ACCESS & 0xFFFF
    )
    assert asked & ~CLIENT_RIGHTS == 0
    # GENERIC_WRITE would ask for FILE_APPEND_DATA = FILE_CREATE_PIPE_INSTANCE: refused
    assert FILE_GENERIC_WRITE & FILE_CREATE_PIPE_INSTANCE
    assert FILE_GENERIC_WRITE & ~CLIENT_RIGHTS


@pytest.mark.parametrize("sid", ["", "S-1-5-18)(A;;GA;;;WD", "AU;", "S 1"])
def test_sids_that_would_change_the_access_list_are_refused(sid: str) -> None:
    with pytest.raises(ValueError, match="not a SID"):
        pipe_sddl(LOCAL_SYSTEM_SID, (sid,))


def test_clients_expect_localsystem_on_the_service_pipe_and_themselves_elsewhere() -> None:
    assert expected_server_sid(SERVICE_PIPE, ANA) == LOCAL_SYSTEM_SID
    assert expected_server_sid("\\\\.\\PIPE\\RBROKER", ANA) == LOCAL_SYSTEM_SID
    assert expected_server_sid("\\\\.\\pipe\\rbroker-ana", ANA) == ANA


def test_server_account_check() -> None:
    check_server_account(SERVICE_PIPE, LOCAL_SYSTEM_SID, "s-1-5-18", 812)
    with pytest.raises(UntrustedPipeServer) as err:
        check_server_account(SERVICE_PIPE, LOCAL_SYSTEM_SID, ANA, 4242)
    text = str(err.value)
    assert SERVICE_PIPE in text and "pid 4242" in text and ANA in text
    assert "not S-1-5-18" in text and "nothing was sent" in text
    with pytest.raises(UntrustedPipeServer, match="cannot be read"):
        check_server_account(SERVICE_PIPE, LOCAL_SYSTEM_SID, None, None)
    assert issubclass(UntrustedPipeServer, OSError)  # the client's "no broker" path


def test_pool_keeps_instances_ahead_of_demand() -> None:
    p = PoolPolicy()
    assert listeners_to_add(0, 0, p) == 32
    assert listeners_to_add(32, 0, p) == 0
    assert listeners_to_add(31, 1, p) == 2  # 32 + ceil(1/4) waiting
    assert listeners_to_add(32, 200, p) == 50  # 32 + 50 for 200 connected
    assert listeners_to_add(10, 4090, p) == 0  # never past max_instances
    assert listeners_to_add(100, 0, p) == 0


def test_busy_pipe_plan() -> None:
    assert plan_after(ERROR_FILE_NOT_FOUND, 5.0).action == "absent"
    wait = plan_after(ERROR_PIPE_BUSY, 5.0)
    assert (wait.action, wait.wait_ms) == ("wait", 1000)
    assert plan_after(ERROR_PIPE_BUSY, 0.25).wait_ms == 250
    assert plan_after(ERROR_PIPE_BUSY, 0.0).action == "timeout"
    assert plan_after(5, 5.0).action == "error"  # access denied: raised, not retried


def test_200_simultaneous_clients_are_all_served() -> None:
    """The pool and the retry together, step by step: 200 clients open the pipe at the same
    instant; each accept refills the pool before the connection is served (as
    `PipeServer._accepted` does); a client that meets no waiting instance waits and tries
    again. Every client connects, none runs out of time, however the server is scheduled
    (it handles at most `per_step` accepts between client attempts)."""
    for per_step in (1, 4, 50):
        policy = PoolPolicy()
        listening = listeners_to_add(0, 0, policy)
        connected, pending, plans = 0, list(range(200)), []
        remaining_s = 30.0
        while pending:
            retry = []
            for n, client in enumerate(pending):
                if listening and n < per_step * 8:
                    listening -= 1
                    connected += 1
                    if n % per_step == 0:
                        listening += listeners_to_add(listening, connected, policy)
                else:
                    plan = plan_after(ERROR_PIPE_BUSY, remaining_s)
                    plans.append(plan.action)
                    retry.append(client)
            listening += listeners_to_add(listening, connected, policy)
            pending = retry
            remaining_s -= 0.001  # a WaitNamedPipe wakes as soon as an instance waits
        assert connected == 200
        assert "timeout" not in plans


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        (r"\\.\pipe\rbroker-ann", None),
        (r"\\.\PIPE\rbroker", None),  # the prefix in any case
        (r"C:\Users\ann\b.sock", r"C:\Users\ann\b.sock is not a named pipe"),
        ("/run/rbroker.sock", "/run/rbroker.sock is not a named pipe"),
        (PIPE_PREFIX, "names no pipe"),
        (r"\\.\pipe\a\b", "a pipe's NAME cannot contain a backslash"),
        (PIPE_PREFIX + "x" * 248, "is 257 characters long; a pipe name has at most 256"),
    ],
)
def test_which_addresses_a_pipe_broker_may_listen_on(address: str, problem: str | None) -> None:
    found = pipe_name_problem(address)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "\n" not in found
        if "characters long" not in found:
            assert found.endswith(r"give \\.\pipe\NAME")
