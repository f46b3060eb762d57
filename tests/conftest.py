"""Shared fixtures: a real broker process on a simulated GPU scenario, and clients for it.

The only thing simulated is the GPU (through the fake NVML library feeding the production
adapter). Brokers run as real processes listening on real Unix sockets (named pipes on
Windows).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _pytest.nodeid import coerce_node_id
from hypothesis import settings

import rbroker
from rbroker.base.children import HARD_KILL
from rbroker.demo.processes import SimulatedBroker
from rbroker.hosting.machine_lock import ENV_LOCK, PER_SOCKET
from tests.fakes.gpu_scenarios import GPU0 as GPU0
from tests.fakes.gpu_scenarios import GPU1 as GPU1
from tests.fakes.gpu_scenarios import gpu, scenario
from tests.windows.wine import UNDER_WINE

pytest_plugins = [
    "tests.os_users",  # the `other_user` fixture (a real second OS account)
    "tests.flaky",  # the FLAKY list: tests that failed once and passed on their rerun
    "tests.leftovers",  # the run fails when a test leaves a process, account, mount or socket
]

# Bytecode is written, whatever PYTHONDONTWRITEBYTECODE says (container images often set it):
# the suite starts several hundred Python processes (brokers, coordinators, trays, the command
# line), and without the checkout's __pycache__ (ignored by git) each compiled rbroker's sources
# again and every xdist worker rewrote every test module's asserts again (about 4 s of CPU per
# worker). The virtual environment's packages are compiled by `uv sync` (pyproject's [tool.uv]).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Every broker the suite starts, in this process or as a child, takes a machine lock named
# after its socket instead of the computer's one (`rbroker.hosting.machine_lock`): the suite
# runs many simulated brokers at once, and beside any real broker of this computer. The
# lock's own tests name a shared lock explicitly.
os.environ[ENV_LOCK] = PER_SOCKET


# Property tests (hypothesis) draw the same examples on every CI run (`CI` set, as `.ci/run`
# and GitHub Actions have it): a change goes red for what it changed, never for an example the
# search happened to reach that day, and a red run fails again when rerun. Elsewhere the search
# is random and keeps what it finds in .hypothesis/, so developers' runs go on finding new
# cases, which become fixed examples or mended rules.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(UnitStartsNothing(), "rbroker-unit-starts-nothing")
    config.pluginmanager.register(GroupIds(), "rbroker-group-ids")
    config.addinivalue_line(
        "markers",
        "wine_gap(reason): fails under Wine only, because Wine lacks what the reason names; "
        "an expected failure there (never a skip), a plain test on real Windows and Linux",
    )


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (the suite's addopts): `$RBROKER_TEST_WORKERS`, else twice the cores, at
    least 4 and at most 16. Most tests wait on real processes, sockets and timers rather than
    compute, so more workers than cores shortens the run; the benchmarks' smoke tests, which
    compare timings, run one after another in one worker (`ALONE`)."""
    given = os.environ.get("RBROKER_TEST_WORKERS", "")
    if given.isdigit():
        return int(given)
    return min(16, max(4, 2 * (os.cpu_count() or 1)))


ALONE = {
    "tests/test_bench_smoke.py": "benchmarks",
    "tests/test_wheel_install.py": "wheel",
    "tests/test_release.py": "release",
}
"""Test files whose tests share one xdist worker (`--dist loadgroup`), by group name: the
benchmarks' smoke tests compare timings; the wheel's tests share one built wheel and its
virtual environments, the release's tests one release (module fixtures, built once per
worker)."""


PROCESS_FIXTURES = frozenset(
    {
        "broker",
        "broker_factory",
        "worker",
        "raw_connect",
        "other_user",
        "system_broker",
        "coordinator",
        "coordinator_factory",
        "qtbot",
        "rbroker_cli",
        "pool",  # tests/desktop: real sleeping processes that hold leases on the harness
    }
)
"""Fixtures that start a process, a server or a Qt event loop: a test using one is `contract`."""


def kind_of(item: pytest.Item, rel: str) -> str:
    """`unit`, `contract` or `e2e` (the markers of pyproject.toml) for one collected test that
    carries none itself (a test or its module marks itself `contract` when it starts a
    process, server or Qt loop of its own): e2e for tests/e2e and tests/windows; contract for
    tests/server (a real HTTP server) and for a test that uses a `PROCESS_FIXTURES` fixture;
    unit otherwise (the in-process harness, pure functions). What a test uses decides, not
    the text of its file; a `unit` test that starts a process all the same fails
    (`UnitStartsNothing`)."""
    if rel.startswith(("tests/e2e/", "tests/windows/")):
        return "e2e"
    if rel.startswith("tests/server/"):
        return "contract"
    return "contract" if set(getattr(item, "fixturenames", ())) & PROCESS_FIXTURES else "unit"


PROP_PROCESSES: set[tuple[str, ...]] = set()
"""Command lines a `unit` test may start: the in-process harness's sleeping lease holders
(`tests.desktop.inprocess.SLEEPER`), props of its subject, not the subject (registered there)."""

PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.exec", "os.spawn"}
)
"""The audit events (`sys.addaudithook`) of a process being started."""


class UnitStartsNothing:
    """Checks the `unit` mark against what a test does: while a `unit` test is set up, run
    and torn down, an audit hook notes each process it starts (`PROCESS_EVENTS`), and the
    test then fails naming it (mark the test or its module `contract`). One hook for the
    worker's life (audit hooks cannot be removed); it does nothing outside a unit test."""

    def __init__(self) -> None:
        self.watching = False
        self.started: list[str] = []
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple[object, ...]) -> None:
        if not self.watching or event not in PROCESS_EVENTS:
            return
        argv = args[1] if event == "subprocess.Popen" and len(args) > 1 else None
        if isinstance(argv, list | tuple) and tuple(map(str, argv)) in PROP_PROCESSES:
            return
        # on Windows the event carries the command line as one string
        if isinstance(argv, str) and any(
            argv == subprocess.list2cmdline(prop) for prop in PROP_PROCESSES
        ):
            return
        self.started.append(f"{event} {str(args[:2])[:160]}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> object:
        unit = item.get_closest_marker("unit") is not None
        self.watching, self.started = unit, []
        try:
            return (yield)
        finally:
            self.watching = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> object:
        result = yield
        if self.started:
            first = self.started[0]
            pytest.fail(
                f"marked unit, but it started a process ({first}): a test that starts a "
                "process is a contract test (mark it or its module `contract`)",
                pytrace=False,
            )
        return result


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its kind's marker (`kind_of`, unless it carries one; before `-m`
    selects by it), and tests of an `ALONE` file share one worker (`GroupIds`). Under Wine, a
    `wine_gap` test is an expected failure that names the gap; a pass is reported (XPASS) so
    a gap Wine closes is noticed."""
    root = Path(str(config.rootpath))
    kinds = {"unit", "contract", "e2e"}
    for item in items:
        path = Path(str(item.path))
        rel = path.relative_to(root).as_posix()
        group = ALONE.get(rel)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if not any(m.name in kinds for m in item.iter_markers()):
            item.add_marker(getattr(pytest.mark, kind_of(item, rel)))
    if not UNDER_WINE:
        return
    for item in items:
        gap = item.get_closest_marker("wine_gap")
        if gap is not None:
            why = gap.args[0] if gap.args else gap.kwargs.get("reason", "")
            item.add_marker(pytest.mark.xfail(reason=f"Wine gap: {why}", strict=False))


class GroupIds:
    """On an xdist worker with `--dist loadgroup`, gives each test with `xdist_group` marks
    the id `…@group` that the scheduler groups by. pytest-xdist does it by setting
    `item._nodeid`, which pytest 9.2's structured node ids no longer read
    (pytest-dev/pytest-xdist#1386): the groups were silently ignored. Here the id is set
    itself, after every mark is on (this hook runs last), and left alone where it already
    ends with the group (a pytest that still reads `_nodeid`)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if getattr(config.option, "loadgroup", False):
            _group_ids(items)


def _group_ids(items: list[pytest.Item]) -> None:
    for item in items:
        names = sorted(
            {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
        )
        if not names:
            continue
        suffix = "@" + "_".join(names)
        if item.nodeid.endswith(suffix):
            continue
        item._id = coerce_node_id(item.nodeid + suffix)  # type: ignore[attr-defined]


SINGLE_24G = scenario(gpu(GPU0, name="Simulated RTX 4090"))


@dataclass
class BrokerProcess(SimulatedBroker):
    """A running `rbroker broker --simulate` process and how to reach it."""

    extra_args: list[str] = field(default_factory=list)
    owns_root: bool = False

    def client(self, **kw: object) -> rbroker.Client:
        """A new connection to this broker."""
        return rbroker.Client(self.socket, **kw)  # type: ignore[arg-type]

    def write_scenario(self, text: str) -> None:
        """Rewrite the scenario file (the broker re-reads it on mtime change)."""
        tmp = self.scenario.with_suffix(".tmp")
        tmp.write_text(textwrap.dedent(text))
        st = self.scenario.stat()
        os.replace(tmp, self.scenario)
        # make sure the mtime moves even within the filesystem's timestamp granularity
        os.utime(
            self.scenario, ns=(st.st_atime_ns, max(st.st_mtime_ns + 1_000_000, time.time_ns()))
        )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.terminate(sig)
        return self.proc.returncode


def short_tmp() -> Path:
    """A short temporary directory (Unix socket paths are limited to ~100 bytes); a broker
    started in it listens at `rbroker.demo.processes.broker_address(it)` (on Windows a
    named pipe named after it)."""
    return Path(tempfile.mkdtemp(prefix="rbt-"))


def start_broker(
    scenario_text: str,
    headroom_mib: int | None = None,
    extra_args: list[str] | None = None,
    root: Path | None = None,
    env: dict[str, str] | None = None,
) -> BrokerProcess:
    """Start `python -m rbroker broker --simulate SCENARIO -v` and wait until it answers
    (through `rbroker.demo.processes.SimulatedBroker`, as the benchmarks do).

    Raises:
        RuntimeError: it exited or did not answer within 20 s (with its log).
    """
    owns_root = root is None
    args = ["-v"]
    if headroom_mib is not None:
        args += ["--headroom-mib", str(headroom_mib)]
    args += extra_args or []
    root = root or short_tmp()
    for attempt in (1, 2):
        try:
            bp: BrokerProcess = BrokerProcess.start(
                scenario_text,
                root,
                args,
                env=env,
                extra_args=extra_args or [],
                owns_root=owns_root,
            )
            return bp
        except OSError as e:
            # Wine 8's CreateProcess now and then fails with ERROR_INTERNAL_ERROR (1359) on
            # a loaded machine (once in about 1 500 Windows tests); one more try, under Wine
            # only: on Windows, and on any other error, the failure stands.
            if not (UNDER_WINE and getattr(e, "winerror", None) == 1359 and attempt == 1):
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def broker_factory() -> Iterator[Callable[..., BrokerProcess]]:
    """`broker_factory(scenario_toml, headroom_mib=None, extra_args=None)` → BrokerProcess;
    every broker started is stopped at teardown."""
    started: list[BrokerProcess] = []

    def factory(scenario_text: str = SINGLE_24G, **kw: object) -> BrokerProcess:
        bp = start_broker(scenario_text, **kw)  # type: ignore[arg-type]
        started.append(bp)
        return bp

    yield factory
    for bp in started:
        bp.stop(HARD_KILL)
        if bp.owns_root:
            shutil.rmtree(bp.scenario.parent, ignore_errors=True)


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    """One simulated, empty 24 576 MiB GPU (`GPU0`), default headroom (1 229 MiB)."""
    return broker_factory(SINGLE_24G)


def wait_until(
    predicate: Callable[[], object], timeout_s: float = 5.0, interval_s: float = 0.02
) -> object:
    """Poll `predicate` until truthy; return its value or raise AssertionError."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


def finish(proc: subprocess.Popen[str], timeout_s: float) -> tuple[str, str]:
    """`(stdout, stderr)` left of a process whose lines a test has read, once it ended.

    Read through the same file objects as the test's `readline()`s: `Popen.communicate`
    reads the pipes' descriptors when both are pipes, so whatever a `readline()` had already
    buffered past its line was lost (the demo's setup lines, at times, on a loaded machine).
    A pipe not opened reads as "". Raises subprocess.TimeoutExpired (the process killed)
    when it has not ended within `timeout_s`."""
    got: dict[str, str] = {}

    def drain(name: str, stream: object) -> None:
        got[name] = stream.read() if stream is not None else ""  # type: ignore[attr-defined]

    readers = [
        threading.Thread(target=drain, args=(name, stream), daemon=True)
        for name, stream in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    for reader in readers:
        reader.join(timeout_s)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()  # as communicate() does
    return got.get("out", ""), got.get("err", "")


WORKER = Path(__file__).parent / "workers"
"""Directory of small worker scripts run as real processes by the tests."""
