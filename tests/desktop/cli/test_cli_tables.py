"""`rbroker status`, `top`, `jobs` and the demo's view at 80 and 120 columns, and as plain rows.

A real simulated broker holds leases with long descriptions, a queued request and jobs; the
views are rendered by rich at 80 and 120 columns and must keep every number whole (grouped
as `24 576`, never broken across lines or cut), every header whole, every line within the
width, and lease ids whole or as a unique prefix that `rbroker release` accepts. Through a
real CLI subprocess (stdout is a pipe, not a terminal) the rows are plain and untruncated.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

import rbroker
from rbroker.base.display import fmt_mib
from rbroker.cli.main import main
from rbroker.cli.sheet import resolve_prefix, unique_prefixes
from rbroker.cli.top import Source, frame, lost_line
from rbroker.cli.views import broker_view, eta_words, gpu_labels, jobs_table
from tests.conftest import GPU0, GPU1, BrokerProcess, start_broker, wait_until
from tests.desktop.jobhelp import declare
from tests.fakes.gpu_scenarios import gpu, scenario

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

TWO_GPUS = scenario(gpu(GPU0, name="Simulated RTX 4090"), gpu(GPU1, name="Simulated RTX 4090"))

LONG = {
    "project": "computer-vision-experiments",
    "session": "sweep-learning-rate-2026-11-30",
    "purpose": "fine-tune a vision transformer on the archive photographs",
}


#: The two leases, held by a process of their own: a request that fits only once its own
#: process's (or a parent's) leases end is refused at once (architecture.md §3), so the
#: queued request comes from this process, which is not the holder nor a child of it.
HOLDER = """
import sys
import time
import rbroker
with rbroker.Client(sys.argv[1]) as holder:
    long = dict(zip(("project", "session", "purpose"), sys.argv[4:7]))
    holder.call("lease.acquire", mib=20480, gpu_uuid=sys.argv[2], **long)
    holder.call(
        "lease.acquire", mib=12345, gpu_uuid=sys.argv[3], project="p", session="s", purpose="x"
    )
    print("held", flush=True)
    time.sleep(3600)
"""


@pytest.fixture(scope="module")
def state() -> Iterator[dict[str, Any]]:
    """Two leases (one with long descriptions), one request queued behind them, two jobs."""
    bp = start_broker(TWO_GPUS)
    holder = bp.client()
    waiter = bp.client(timeout_s=60)
    leases = subprocess.Popen(
        [sys.executable, "-c", HOLDER, bp.socket, GPU0, GPU1, *LONG.values()],
        stdout=subprocess.PIPE,
    )
    try:
        assert leases.stdout is not None and leases.stdout.readline() == b"held\n"
        queued = threading.Thread(
            target=lambda: _ignore(
                waiter.call,
                "lease.acquire",
                mib=20000,
                gpu_uuid=GPU1,
                wait_s=60,
                project="waiting-project",
                session="queued",
                purpose="wait for the second GPU to free up",
            ),
            daemon=True,
        )
        queued.start()
        wait_until(lambda: holder.leases()["queue"], timeout_s=10)
        job = declare(holder, purpose="embed the photograph archive", total_items=100000)
        holder.call("job.report", job_id=job["job_id"], chunk_id="a", completed=23456, failed=789)
        declare(holder, purpose="count without a total")
        yield {
            "broker": bp,
            "gpus": holder.gpus(),
            "leases": holder.leases(),
            "jobs": holder.call("jobs.list", include_finished=True)["jobs"],
        }
    finally:
        holder.close()
        waiter.close()
        leases.kill()
        leases.wait(10)
        if leases.stdout is not None:
            leases.stdout.close()
        bp.stop(signal.SIGKILL)


def _ignore(fn: Any, *args: Any, **kw: Any) -> None:
    with contextlib.suppress(rbroker.RBrokerError):
        fn(*args, **kw)


def _render(renderable: Any, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=True, color_system=None).print(renderable)
    return out.getvalue()


def _numbers(st: dict[str, Any]) -> set[int]:
    gpus, leases = st["gpus"], st["leases"]
    nums = {g[k] for g in gpus for k in ("total_mib", "available_mib", "outstanding_mib")}
    nums |= {x["granted_mib"] for x in leases["leases"]}
    nums |= {w["mib"] for w in leases["queue"]}
    return nums


@pytest.mark.parametrize("width", [80, 120])
def test_broker_view_keeps_every_number_and_header_whole(state: dict[str, Any], width: int) -> None:
    text = _render(broker_view(state["gpus"], state["leases"], "header"), width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), text
    for n in _numbers(state):
        assert fmt_mib(n) in text, (n, text)  # whole, on one line
    assert "20 480" in text and "12 345" in text and "20 000" in text
    for header in ("total", "available", "leases use", "granted", "others use", "MiB", "GPU"):
        assert re.search(rf"(^|\s){re.escape(header)}(\s|$)", text, re.M), (header, text)
    # the GPU table's header row uncut (the queue's reason also says "total", and where a
    # long owner name narrows its column, a GPU's abbreviated UUID can share its line)
    headers = [line for line in lines if line.startswith("GPU ") and "total" in line]
    assert headers and "…" not in "".join(headers), text
    assert "GPU 0" in text and "GPU 1" in text
    assert "tele…" not in text and "telemetry" in text if width >= 120 else True
    # lease ids: whole at 120, a unique prefix at 80 that resolves to the lease
    ids = [x["lease_id"] for x in state["leases"]["leases"]]
    for lease_id in ids:
        if lease_id in text:
            continue
        short = unique_prefixes(ids, strip="lease-")[lease_id]
        assert re.search(rf"^{short}\s", text, re.M), (short, text)
        assert resolve_prefix(short, ids, "lease-", "lease") == lease_id
    if width >= 120:
        assert all(lease_id in text for lease_id in ids)


@pytest.mark.parametrize("width", [80, 120])
def test_jobs_view_keeps_numbers_and_a_progress_bar(state: dict[str, Any], width: int) -> None:
    text = _render(jobs_table(state["jobs"]), width)
    assert all(len(line) <= width for line in text.splitlines()), text
    assert "23 456" in text and "789" in text
    assert " owner " in text and all(j["owner"] in text for j in state["jobs"]), text
    assert "24.2 %" in text and "█" in text  # 24 245 of 100 000 items
    assert "no total" in text


def test_empty_tables_say_so_instead_of_an_empty_box(state: dict[str, Any]) -> None:
    text = _render(broker_view(state["gpus"], {"leases": [], "queue": []}), 80)
    assert "no leases" in text and "no requests waiting" in text
    assert "Leases (0)" not in text and "Queue (0)" not in text
    assert _render(jobs_table([]), 80).strip() == "no jobs"


def test_gpu_labels_add_the_uuid_tail_only_where_an_index_repeats(
    state: dict[str, Any],
) -> None:
    gpus = state["gpus"]
    assert gpu_labels(gpus) == {GPU0: "GPU 0", GPU1: "GPU 1"}
    slices = [{**g, "index": 0} for g in gpus]  # MIG slices share their GPU's index
    assert gpu_labels(slices) == {GPU0: "GPU 0 …0001", GPU1: "GPU 0 …0002"}


def test_prefixes_are_unique_and_ambiguity_is_an_error() -> None:
    ids = ["lease-3f2a1b4c5d6e", "lease-3f2a1b9c5d6e", "lease-aaaaaa000000"]
    short = unique_prefixes(ids, strip="lease-")
    assert short == {ids[0]: "3f2a1b4", ids[1]: "3f2a1b9", ids[2]: "aaaaaa"}
    assert resolve_prefix("aaa", ids, "lease-", "lease") == ids[2]
    assert resolve_prefix("lease-3f2a1b4", ids, "lease-", "lease") == ids[0]
    with pytest.raises(LookupError) as ambiguous:
        resolve_prefix("3f2a", ids, "lease-", "lease")
    assert str(ambiguous.value) == (
        "'3f2a' is ambiguous: it names 2 leases (3f2a1b4, 3f2a1b9); give more characters"
    )
    for only_prefix in (ids, ids[:1]):  # `lease-` alone names no lease, even the only one
        with pytest.raises(ValueError, match="'lease-' is only the prefix every lease id has"):
            resolve_prefix("lease-", only_prefix, "lease-", "lease")
    assert resolve_prefix("lease-a", ids, "lease-", "lease") == ids[2]
    with pytest.raises(LookupError, match="no lease starts with 'zz'"):
        resolve_prefix("zz", ids, "lease-", "lease")
    for empty in ("", "  "):
        with pytest.raises(ValueError, match="empty lease id"):
            resolve_prefix(empty, ids, "lease-", "lease")
    # the start of `lease-` is part of every id, not of one: it names none, even the only one
    for start in ("l", "LE", "lease"):
        for some in (ids, ids[:1]):
            with pytest.raises(ValueError) as only_start:
                resolve_prefix(start, some, "lease-", "lease")
            assert str(only_start.value) == (
                f"{start!r} is only the start of 'lease-', the prefix every lease id has: give "
                "at least one character of the id after it"
            )
    # any case, as someone may type or copy it
    assert resolve_prefix("LEASE-3F2A1B4C5D6E", ids, "lease-", "lease") == ids[0]
    assert resolve_prefix("LEASE-3F2A1B9", ids, "lease-", "lease") == ids[1]
    assert resolve_prefix("AAA", ids, "lease-", "lease") == ids[2]
    with pytest.raises(ValueError, match="'LEASE-' is only the prefix every lease id has"):
        resolve_prefix("LEASE-", ids, "lease-", "lease")


def _cli(bp: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "rbroker", *args, "--socket", bp.socket],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_status_through_a_pipe_prints_plain_untruncated_rows(state: dict[str, Any]) -> None:
    done = _cli(state["broker"], "status")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "│" not in out and "━" not in out and "─" not in out and "\x1b[" not in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("lease-")}
    assert set(rows) == {x["lease_id"] for x in state["leases"]["leases"]}
    assert not any("…" in row for row in rows.values())
    long_row = next(r for r in rows.values() if LONG["purpose"] in r)
    cells = re.split(r"\s{2,}", long_row)
    assert cells[1:6] == ["root" if os.geteuid() == 0 else cells[1], *LONG.values(), "20480"]
    assert GPU0 in long_row  # the full UUID in plain output
    assert "wait for the second GPU to free up" in out and "20000" in out


def test_jobs_through_a_pipe_prints_plain_rows(state: dict[str, Any]) -> None:
    done = _cli(state["broker"], "jobs")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "photograph archive" in line)
    cells = re.split(r"\s{2,}", row)
    owner = next(j["owner"] for j in state["jobs"] if "photograph" in j["purpose"])
    assert cells[1:7] == [
        owner,  # the OS user who declared it, as `--json` says
        "embed the photograph archive",
        "running",
        "24.2 %",
        "23456",
        "789",
    ]
    header = next(line for line in done.stdout.splitlines() if line.startswith("job "))
    assert re.split(r"\s{2,}", header)[:3] == ["job", "owner", "purpose"]


def test_release_takes_a_unique_prefix_and_refuses_an_ambiguous_one() -> None:
    bp = start_broker(TWO_GPUS)
    try:
        with bp.client() as c:
            lease_id = c.call("lease.acquire", mib=1000, project="p", session="s", purpose="x")[
                "lease"
            ]["lease_id"]
            wrong = _cli(bp, "release", "zz9")
            assert wrong.returncode == 2 and "no active lease starts with 'zz9'" in wrong.stderr
            start = _cli(bp, "release", "l")
            assert start.returncode == 2, start.stderr
            assert "'l' is only the start of 'lease-', the prefix every" in start.stderr
            no_request = _cli(bp, "release", "REQ-7")
            assert no_request.returncode == 2, no_request.stderr
            assert "no waiting request req-7 (granted" in no_request.stderr
            other = c.call("lease.acquire", mib=1000, project="p", session="s", purpose="y")[
                "lease"
            ]["lease_id"]
            short = unique_prefixes([lease_id, other], strip="lease-")
            common = os.path.commonprefix([lease_id, other])  # noqa: RUF071 (strings, not paths)
            both = _cli(bp, "release", common)
            assert both.returncode == 2, both.stderr
            if common == "lease-":
                assert "'lease-' is only the prefix every active lease id has" in both.stderr
            else:
                assert f"{common!r} is ambiguous: it names 2 active leases" in both.stderr
                assert short[lease_id] in both.stderr and short[other] in both.stderr
            assert len(both.stderr.strip().splitlines()) == 1, both.stderr  # one line, unwrapped
            empty = _cli(bp, "release", "")
            assert empty.returncode == 2 and "empty active lease id" in empty.stderr
            assert len(c.leases()["leases"]) == 2  # nothing released
            c.call("lease.release", lease_id=other)
            alone = _cli(bp, "release", "lease-")  # the only lease is not named by `lease-`
            assert alone.returncode == 2 and "only the prefix" in alone.stderr, alone.stderr
            assert len(c.leases()["leases"]) == 1
            done = _cli(bp, "release", lease_id[len("lease-") :][:6].upper())
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith(f"released {lease_id} (1 000 MiB, p/s)"), done.stdout
            assert c.leases()["leases"] == []
    finally:
        bp.stop(signal.SIGKILL)


def _reason_column(text: str) -> str:
    """The queue's reason as `rbroker top` draws it: the words under the `reason` header,
    the last column, from its first line to the table's end (the next table's title), joined."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if re.search(r"\breason\s*$", line))
    x = lines[head].rindex("reason")
    words = []
    for line in lines[head + 2 :]:
        if not line.startswith((" ", "req-")):
            break
        words.append(line[x:].strip())
    return " ".join(w for w in words if w)


def test_top_draws_one_frame_of_the_real_broker_within_80_columns(state: dict[str, Any]) -> None:
    with contextlib.closing(Source(state["broker"].socket)) as source:
        snapshot = source.read()
    assert snapshot is not None
    console = Console(file=io.StringIO(), width=80, record=True, force_terminal=True)
    console.print(frame(snapshot))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "GPU 0" in text and "GPU 1" in text and "█" in text  # the capacity bars
    assert "Leases (2)" in text and "20 480" in text and "12 345" in text
    assert "Queue (1)" in text and "20 000" in text
    waiting = snapshot.leases["queue"][0]
    reason = " — ".join(x for x in (eta_words(waiting), waiting["reason"]) if x)
    assert _reason_column(text) == " ".join(reason.split()), text  # whole, wrapped
    assert "Jobs (2)" in text and "24.2 %" in text and "no total" in text
    assert "q or Ctrl-C quits" in text and f"broker: {state['broker'].socket}" in text


def test_top_shows_an_eta_and_the_shares_where_the_broker_gives_them(state: dict[str, Any]) -> None:
    with contextlib.closing(Source(state["broker"].socket)) as source:
        snapshot = source.read()
    assert snapshot is not None
    queue = snapshot.leases["queue"]
    queue[0].update(eta_s=420.0, eta_reason="the lease ahead is held ~7 min in project p")
    queue.append({**queue[0], "request_id": 99, "eta_s": None, "eta_reason": "no history yet"})
    shares = [
        {"project": "vision", "weight": 2.0, "share": 0.75, "granted_mib": 20480, "waiting": 1}
    ]
    snapshot.status["shares"] = shares  # as a broker with [shares] answers
    console = Console(file=io.StringIO(), width=80, record=True, force_terminal=True)
    console.print(frame(snapshot))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    reason = " ".join(queue[0]["reason"].split())
    assert _reason_column(text) == (
        f"likely in ~7 min (because the lease ahead is held ~7 min in project p) — {reason} "
        f"no estimate yet (no history yet) — {reason}"
    ), text
    assert "Shares" in text and re.search(r"vision\s+2\s+75 %\s+20 480\s+1", text), text


def test_top_once_prints_plain_rows_and_no_broker_is_one_line(
    state: dict[str, Any], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["top", "--once", "--socket", state["broker"].socket]) == 0
    out = capsys.readouterr().out
    assert "│" not in out and "\x1b[" not in out
    assert all(x["lease_id"] in out for x in state["leases"]["leases"])
    assert "wait for the second GPU to free up" in out and "read at " in out
    assert "q or Ctrl-C quits" not in out  # one frame, then it exits by itself
    gone = str(tmp_path / "gone.sock")
    assert main(["status", "--watch", "--socket", gone]) == 69
    err = capsys.readouterr().err
    assert err.startswith("rbroker top: ") and gone in err and "Traceback" not in err
    source = Source(gone)
    assert source.read() is None and source.lost is not None
    assert "trying again every 1 s" in lost_line(source.lost).plain


class _TopInPty:
    """`rbroker top` on the state's broker in a pseudo-terminal of `columns` × 60: what it
    wrote so far (`seen`), read with `read_for`; the terminal's modes before it started
    (`before`); killed and the terminal closed on the way out."""

    def __init__(self, state: dict[str, Any], columns: int) -> None:
        import fcntl
        import pty
        import struct
        import termios

        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, columns, 0, 0))
        self.before = termios.tcgetattr(self.slave)
        self.top = subprocess.Popen(
            [sys.executable, "-m", "rbroker", "top", "--socket", state["broker"].socket],
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env={**os.environ, "TERM": "xterm"},
        )
        self.seen = b""

    def read_for(self, done: Any, timeout_s: float) -> None:
        """Read what top writes until `done()` or `timeout_s` passed."""
        import select

        end = time.monotonic() + timeout_s
        while not done() and time.monotonic() < end:
            if select.select([self.master], [], [], 0.05)[0]:
                self.seen += os.read(self.master, 65536)

    def __enter__(self) -> _TopInPty:
        return self

    def __exit__(self, *exc: object) -> None:
        self.top.kill()
        self.top.wait(10)
        os.close(self.master)
        os.close(self.slave)


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal is POSIX")
def test_top_in_a_terminal_reads_on_a_change_not_every_second(state: dict[str, Any]) -> None:
    """Idle, the frame is not read again for seconds (it was read each second: 5 calls a
    second to an idle broker); a new lease is on screen well before the idle reading
    (`IDLE_REFRESH_S`) would bring it (released after: the module's broker is shared)."""
    from rbroker.cli.top import IDLE_REFRESH_S

    with _TopInPty(state, 120) as t:
        t.read_for(lambda: b"Queue (1)" in t.seen, 30)
        assert b"Queue (1)" in t.seen, t.seen[-2000:]
        # the first frame drawn whole, and the one a new subscriber's first samples bring
        t.read_for(lambda: False, 2.0)
        frames = t.seen.count(b"read at")
        t.read_for(lambda: False, 2.5)  # idle: nothing read again
        assert t.seen.count(b"read at") == frames, "read again while the broker was idle"
        with state["broker"].client() as c:
            told_at = time.monotonic()
            lease = c.call(
                "lease.acquire", mib=1, gpu_uuid=GPU0, project="p", session="tfw",
                purpose="seen at once",
            )  # fmt: skip
            try:
                t.read_for(lambda: b" tfw " in t.seen, IDLE_REFRESH_S)
                assert b" tfw " in t.seen, t.seen[-3000:]
                assert time.monotonic() - told_at < IDLE_REFRESH_S - 1, "read only when idle"
            finally:
                c.call("lease.release", lease_id=lease["lease"]["lease_id"])
        os.write(t.master, b"q")
        assert t.top.wait(10) == 0


def test_top_in_a_terminal_ends_on_q_and_gives_the_terminal_back(state: dict[str, Any]) -> None:
    import termios

    with _TopInPty(state, 80) as t:
        t.read_for(lambda: b"Queue (1)" in t.seen, 30)
        assert b"q or Ctrl-C quits" in t.seen and b"Queue (1)" in t.seen, t.seen[-2000:]
        os.write(t.master, b"q")
        assert t.top.wait(10) == 0
        t.read_for(lambda: False, 0.2)
        assert b"Traceback" not in t.seen
        assert t.seen.endswith(b"\x1b[?1049l")  # the alternate screen is left
        assert termios.tcgetattr(t.slave) == t.before  # echo and line mode are back
