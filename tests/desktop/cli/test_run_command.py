"""`rbroker run --mib N -- CMD...` around a real child process (architecture.md §3).

The lease is held while CMD runs, CMD sees CUDA_VISIBLE_DEVICES set to the granted GPU's
UUID, the exit code passes through, and the lease is gone afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GPU0, WORKER, BrokerProcess, finish, wait_until
from tests.desktop.conftest import WorkerProcess

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

REPORT_ENV = str(Path(WORKER) / "report_env.py")


def _run_args(broker: BrokerProcess, mib: int, *cmd: str, wait: float = 0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rbroker",
        "run",
        "--socket",
        broker.socket,
        "--mib",
        str(mib),
        "--project",
        "tests",
        "--session",
        "run-wrapper",
        "--purpose",
        "rbroker run test",
        "--wait",
        str(wait),
        "--",
        *cmd,
    ]


def _env(broker: BrokerProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["RBROKER_SOCKET"] = broker.socket
    return env


def _run(
    broker: BrokerProcess, tmp_path: Path, mib: int, how: str
) -> tuple[int, dict[str, Any] | None]:
    out = tmp_path / "report.json"
    done = subprocess.run(
        _run_args(broker, mib, sys.executable, REPORT_ENV, str(out), how),
        env=_env(broker),
        capture_output=True,
        timeout=60,
    )
    report = json.loads(out.read_text()) if out.exists() else None
    return done.returncode, report


def _no_leases_left(broker: BrokerProcess) -> None:
    with broker.client() as c:
        view = c.leases(include_ended=True)
        assert view["leases"] == [] and view["queue"] == []
        assert view["ended"], "the run's lease should be in the ended list"
        assert all(x["state"] == "released" for x in view["ended"])


@pytest.mark.parametrize("code", [0, 3, 42])
def test_exit_code_passes_through_and_lease_is_released(
    broker: BrokerProcess, tmp_path: Path, code: int
) -> None:
    returncode, report = _run(broker, tmp_path, 4096, str(code))
    assert returncode == code
    assert report is not None
    assert report["cuda_visible_devices"] == "0"  # GPU0 by its index (test_cuda_devices.py)
    (held,) = report["active_leases"]
    assert held["lease_id"] == report["lease_id"]
    assert held["granted_mib"] == 4096
    assert held["gpu_uuid"] == GPU0
    assert held["session"] == "run-wrapper"
    _no_leases_left(broker)


@pytest.mark.skipif(
    sys.platform == "win32",
    reason="POSIX signals: Windows has no SIGKILL nor 128 + N codes (its cases: "
    "tests/windows/test_cli_windows.py)",
)
def test_child_killed_by_a_signal(broker: BrokerProcess, tmp_path: Path) -> None:
    returncode, report = _run(broker, tmp_path, 2048, "kill9")
    assert report is not None and report["cuda_visible_devices"] == "0"
    assert returncode == 128 + signal.SIGKILL
    _no_leases_left(broker)


@contextlib.contextmanager
def _sleeping_run(broker: BrokerProcess, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`rbroker run -- report_env.py OUT sleep`, once its command is ready; killed after."""
    proc = subprocess.Popen(
        _run_args(broker, 2048, sys.executable, "-u", REPORT_ENV, str(out), "sleep"),
        env=_env(broker),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.skipif(
    sys.platform == "win32",
    reason="POSIX signals: on Windows SIGTERM to a process is TerminateProcess, and Ctrl-Break "
    "reaches the command from the console itself (tests/windows/test_cli_windows.py)",
)
def test_signal_is_passed_to_the_child(broker: BrokerProcess, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    with _sleeping_run(broker, out) as proc:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 128 + signal.SIGTERM
    assert json.loads(out.read_text())["cuda_visible_devices"] == "0"
    with broker.client() as c:
        wait_until(lambda: c.leases()["leases"] == [])


def test_no_room_means_the_command_never_runs(
    broker: BrokerProcess, tmp_path: Path, worker: Callable[..., WorkerProcess]
) -> None:
    with broker.client() as c:
        # another process fills the GPU: behind this process's (its parent's) own lease the
        # run would be refused as infeasible (architecture.md §3)
        full = worker("hold_lease", broker.socket, "20000", "full", "0").read_line()
        assert full.startswith("granted "), full
        out = tmp_path / "report.json"
        done = subprocess.run(
            _run_args(broker, 8192, sys.executable, REPORT_ENV, str(out), "0"),
            env=_env(broker),
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 75  # EX_TEMPFAIL
        assert not out.exists()
        assert b"available" in done.stderr
        assert [x["session"] for x in c.leases()["leases"]] == ["full"]


def test_no_broker(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "rbroker", "run", "--socket", str(tmp_path / "none.sock")),
            *("--mib", "1024", "--", sys.executable, "-c", "pass"),
        ],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 69  # EX_UNAVAILABLE


def _run_cli(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rbroker", "run", "--socket", broker.socket, *args],
        env=_env(broker),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--mib", "0"), "--mib must be at least 1"),
        (("--mib", "99999999"), "--mib must be at most 16 777 216"),
        (("--mib", "64", "--wait", "-1"), "--wait must be at least 0 seconds (0, the default"),
        (("--mib", "64", "--ttl", "0.5"), "--ttl must be at least 1 second"),
        (("--mib", "64", "--gpus", "0"), "--gpus must be at least 1"),
        (("--mib", "64", "--gpu", "x"), "--gpu must have at least 4 characters"),
    ],
)
def test_bad_flags_are_named_in_the_users_words(
    broker: BrokerProcess, flags: tuple[str, ...], message: str
) -> None:
    done = _run_cli(broker, *flags, "--", sys.executable, "-c", "pass")
    assert done.returncode == 2
    assert f"rbroker run: {message}" in done.stderr, done.stderr
    for model_word in ("Input should", "ttl_s", "wait_s", "gpu_uuid", "mib:"):
        assert model_word not in done.stderr, done.stderr
    with broker.client() as c:
        assert c.leases()["leases"] == []


def test_a_bad_expected_duration_is_named_by_its_flag() -> None:
    from pydantic import ValidationError

    from rbroker.cli.run import flag_error
    from rbroker_protocol.localapi import AcquireParams

    base = {"mib": 64, "project": "p", "session": "s", "purpose": "x"}
    for value, message in (
        (0, "more than 0 seconds"),
        (31 * 86400, "at most 2 592 000 seconds"),
        (float("nan"), "a finite number of seconds"),
    ):
        with pytest.raises(ValidationError) as caught:
            AcquireParams.model_validate({**base, "expected_s": value})
        assert flag_error(caught.value) == f"--expected must be {message}"


def test_the_wait_line_says_when_it_will_likely_fit() -> None:
    import io

    from rich.console import Console

    from rbroker.cli.run import WaitDisplay

    out = io.StringIO()
    display = WaitDisplay(Console(file=out, force_terminal=False, width=300), 8192, 30)
    entry = {"reason": "waiting: GPU 0 has 3 347 MiB available", "ahead": 1, "eta_s": None}
    display.show({**entry, "eta_reason": "the leases ahead have no declared … duration yet"})
    display.show(
        {**entry, "eta_s": 40.0, "eta_reason": "1 lease of vision declared to end by then"}
    )
    first, second = out.getvalue().splitlines()
    assert first == (
        "rbroker run: waiting up to 30 s for 8 192 MiB: GPU 0 has 3 347 MiB available; "
        "1 request ahead"
    )
    assert second == first + "; likely in ~40 s (because 1 lease of vision declared to end by then)"


def test_every_flag_has_help_and_the_default_is_not_to_wait() -> None:
    from rbroker.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    run = sub.choices["run"]  # type: ignore[attr-defined]
    for action in run._actions:
        assert action.help, f"{action.option_strings or action.dest} has no help"
    text = run.format_help()
    assert "default 0: do not wait" in text and "does not wait" in text


def test_a_command_that_cannot_start_is_named(broker: BrokerProcess) -> None:
    done = _run_cli(broker, "--mib", "64", "--", "no-such-program-4f2a", "--flag")
    assert done.returncode == 127
    assert "cannot start the command 'no-such-program-4f2a'" in done.stderr, done.stderr
    assert "not found" in done.stderr


def test_waiting_says_what_it_waits_for_and_updates_the_reason(
    broker: BrokerProcess, worker: Callable[..., WorkerProcess]
) -> None:
    with broker.client() as c:
        # another process holds the lease (not this process, the run's parent: behind its
        # parent's own lease the run would be refused as infeasible, architecture.md §3)
        full = worker("hold_lease", broker.socket, "20000", "full", "0").read_line()
        assert full.startswith("granted "), full
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "rbroker", "run", "--socket", broker.socket),
                *("--mib", "8192", "--wait", "30", "--", sys.executable, "-c", "pass"),
            ],
            env=_env(broker),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith("rbroker run: waiting up to 30 s for 8 192 MiB: "), first
        assert "3 347 MiB available" in first and "8 192 requested" in first, first
        # a process without a lease allocates 1 000 MiB: the reason's figures change and a
        # new line says so
        with broker.client() as other:
            other.sim_allocate(1000, GPU0)
            second = proc.stderr.readline()
            assert second != first
            assert "1 000 in use" in second and "20 000 granted not yet" in second, second
            assert "2 347 MiB available" in second, second
            other.sim_free(gpu_uuid=GPU0)
        lease_id = c.leases()["leases"][0]["lease_id"]
        c.call("lease.release", lease_id=lease_id)
        _out, err = finish(proc, 30)
        assert proc.returncode == 0, err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_the_command_does_not_outlive_a_killed_run(broker: BrokerProcess, tmp_path: Path) -> None:
    """kill -9 of `rbroker run` frees its lease (the connection closes): the command must not
    go on using the GPU without one. Before: it ran on, unleased."""
    out = tmp_path / "report.json"
    with _sleeping_run(broker, out) as proc:
        child_pid = json.loads(out.read_text())["pid"]
        proc.kill()
        proc.wait(10)

        def gone() -> bool:
            try:
                os.kill(child_pid, 0)
            except ProcessLookupError:
                return True
            with open(f"/proc/{child_pid}/stat") as stat:  # a zombie is gone too
                return stat.read().split(") ", 1)[1].startswith("Z")

        wait_until(gone, timeout_s=5)
        with broker.client() as c:
            wait_until(lambda: c.leases()["leases"] == [])


def test_a_lease_released_from_another_shell_says_so_and_the_command_runs_on(
    broker: BrokerProcess,
) -> None:
    """Before: "lease ... lost: ... released (released by holder)" after `rbroker release`
    from another shell. Right: the reason names another process, and `rbroker run` says the
    command now runs without a lease; the command is not stopped and its code comes back."""
    script = "import time; time.sleep(5); print('done'); raise SystemExit(7)"
    args = _run_args(broker, 100, sys.executable, "-c", script)
    args[args.index("--") : args.index("--")] = ["--ttl", "3"]
    proc = subprocess.Popen(
        args, env=_env(broker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        with broker.client() as c:
            leases = wait_until(lambda: c.leases()["leases"], timeout_s=20)
            (lease_id,) = [x["lease_id"] for x in leases]  # type: ignore[attr-defined]
            (owner,) = [x["owner"] for x in leases]  # type: ignore[attr-defined]
            released = subprocess.run(
                [sys.executable, "-m", "rbroker", "release", "--socket", broker.socket, lease_id],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert released.returncode == 0, released.stderr
            out, err = proc.communicate(timeout=30)
            ended = [x for x in c.leases(include_ended=True)["ended"] if x["lease_id"] == lease_id]
        assert proc.returncode == 7, err
        assert out.strip() == "done"
        reason = f"released by another process of {owner}"  # DOMAIN\\user on Windows
        assert ended[0]["ended_reason"] == reason, ended  # no pid: views never carry one
        assert "released by holder" not in err
        assert reason in err
        assert f"lease {lease_id} lost" in err and "runs on WITHOUT a lease" in err
        assert err.count(f"lease {lease_id} lost") == 1, err  # said once, not by the SDK too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


def test_help_says_what_others_see_and_where_the_defaults_come_from() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rbroker", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "shown to every user of this computer" in text
    assert "sent to its coordinator" in text
    assert "('python' and 'run python' for 'python train.py')" in text


@pytest.mark.parametrize(
    ("exits_first", "words"), [(False, "runs on"), (True, "ran its last part")]
)
def test_a_lost_lease_is_told_also_when_the_command_ended_first(
    exits_first: bool, words: str
) -> None:
    """A loss seen only after the command ended is still told (a reclaim the SDK heard while
    the command was finishing went unsaid when the command ended inside the 0.25 s wait)."""
    import io
    import types

    from rich.console import Console

    from rbroker.cli.run import _wait_noting_loss

    code = "import sys; sys.exit(3)" if exits_first else "import time; time.sleep(1); exit(3)"
    child = subprocess.Popen([sys.executable, "-c", code])
    if exits_first:
        child.wait()
    lease = types.SimpleNamespace(lease_id="lease-1", lost=True, error="reclaimed: idle 4 s")
    out = io.StringIO()
    assert _wait_noting_loss(child, lease, Console(file=out, width=400)) == 3
    said = out.getvalue()
    assert said.startswith("rbroker run: lease lease-1 lost (reclaimed: idle 4 s); the command")
    assert f"the command {words} WITHOUT a lease" in said
