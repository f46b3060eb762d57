"""`rbroker book`, `rbroker book cancel` and `rbroker bookings` (issue 41), and `rbroker run
--booking`, run as real `python -m rbroker` processes against a real broker: the wire paths.
A broker process runs on the real clock, so a claim at a booking's start is the broker
harness's (tests/desktop/broker/bookings); here a claim is refused before the start."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time

import pytest
from rich.console import Console

from rbroker.cli.bookings import bookings_table, can_print_blocks, clean
from rbroker.cli.views import print_view
from rbroker_protocol.results import BookingView
from tests.conftest import GPU0, BrokerProcess

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

BOOK = ["--project", "vision", "--purpose", "fine-tune ViT-B"]


def _cli(
    broker: BrokerProcess, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`rbroker ARGS... --socket <broker>` (for `run`, the socket before the command)."""
    if args[0] == "run":
        argv = ["run", "--socket", broker.socket, *args[1:]]
    else:
        argv = [*args, "--socket", broker.socket]
    return subprocess.run(
        [sys.executable, "-m", "rbroker", *argv],
        capture_output=True,
        encoding=(env or {}).get("PYTHONIOENCODING", "utf-8"),
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def _book(broker: BrokerProcess, *args: str) -> str:
    """Book with `args` through `--json`; the booking's id."""
    out = _cli(broker, "book", *args, "--json")
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["state"] == "booked"
    return str(view["booking_id"])


def _one_line(text: str) -> str:
    lines = text.strip("\n").splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def test_book_prints_one_line_and_bookings_lists_it(broker: BrokerProcess) -> None:
    out = _cli(broker, "book", "--mib", "16000", "--start", "+2h", "--for", "4h", *BOOK)
    assert out.returncode == 0, out.stderr
    line = _one_line(out.stdout)
    m = re.fullmatch(r"booked (book-[0-9a-f]+): 16 000 MiB on GPU 0, (\S.*–.+) \((\S+)\)", line)
    assert m, line
    booking_id = m.group(1)

    listed = _cli(broker, "bookings")
    assert listed.returncode == 0, listed.stderr
    row = next(ln for ln in listed.stdout.splitlines() if booking_id in ln)
    cells = re.split(r"\s{2,}", row.strip())
    # booking, owner, project, purpose, MiB (plain: whole), GPU, window, state
    assert cells[2:6] == ["vision", "fine-tune ViT-B", "16000", "0"]
    assert cells[6] == m.group(2)  # the window as `book` said it, in the same zone
    assert cells[7] == "booked"
    assert f"times in {m.group(3)}" in listed.stdout
    timeline = [ln for ln in listed.stdout.splitlines() if ln.startswith("GPU 0 ")]
    assert len(timeline) == 1 and len(timeline[0]) <= 80
    assert set(timeline[0][6:]) - {" "} == {"◕"}  # 16 000 of 23 347 usable MiB, mine

    raw = json.loads(_cli(broker, "bookings", "--json").stdout)
    assert [b["booking_id"] for b in raw["bookings"]] == [booking_id]
    (view,) = raw["bookings"]
    assert (view["mib"], view["gpu_uuids"], view["end_at"] - view["start_at"]) == (
        16000,
        [GPU0],
        4 * 3600.0,
    )
    assert raw["usable_mib"] == {GPU0: 24576 - 1229}
    assert raw["now_at"] < view["start_at"]


def test_a_conflict_prints_the_arithmetic_and_exits_2(broker: BrokerProcess) -> None:
    _book(broker, "--mib", "16000", "--start", "+2h", "--for", "4h", *BOOK)
    out = _cli(broker, "book", "--mib", "16000", "--start", "+3h", "--until", "+2h", *BOOK)
    assert out.returncode == 2
    assert out.stdout == ""
    line = _one_line(out.stderr)
    assert line.startswith("rbroker book: ")
    assert "24 576 − 1 229 headroom − 16 000 booked by 1 booking; 16 000 requested" in line
    assert "it fits" in line  # the nearest window


def test_cancel_ends_it_and_bookings_all_shows_it(broker: BrokerProcess) -> None:
    booking_id = _book(broker, "--mib", "8000", "--start", "+1h", "--for", "90m", *BOOK)
    out = _cli(broker, "book", "cancel", booking_id)
    assert out.returncode == 0, out.stderr
    assert _one_line(out.stdout).startswith(f"cancelled {booking_id}: ")
    assert _cli(broker, "bookings").stdout.startswith("no bookings")
    ended = _cli(broker, "bookings", "--all").stdout
    row = next(ln for ln in ended.splitlines() if booking_id in ln)
    assert row.rstrip().endswith("cancelled")
    # what it held is free again: the same window books
    _book(broker, "--mib", "20000", "--start", "+1h", "--for", "90m", *BOOK)

    unknown = _cli(broker, "book", "cancel", "book-00000000")
    assert unknown.returncode == 2
    assert _one_line(unknown.stderr).startswith("rbroker book: ")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((), "--mib, --start, --project, --purpose required"),
        (("--mib", "10", "--start", "+1h", *BOOK), "--for DURATION or --until WHEN"),
        (("--mib", "10", "--start", "soonish", "--for", "1h", *BOOK), '--start: "soonish"'),
        (("--mib", "10", "--start", "+1h", "--for", "90", *BOOK), '--for: "90": needs a unit'),
        (("--mib", "10", "--start", "+2h", "--until", "now", *BOOK), "end must come after"),
        (("cancel",), "give the booking to cancel"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    broker: BrokerProcess, args: tuple[str, ...], words: str
) -> None:
    out = _cli(broker, "book", *args)
    assert out.returncode == 2
    line = _one_line(out.stderr)
    assert line.startswith("rbroker book: ") and words in line, line


def test_run_with_a_booking_is_refused_before_its_start(broker: BrokerProcess) -> None:
    booking_id = _book(
        broker, "--mib", "6000", "--gpus", "1", "--start", "+2h", "--for", "1h", *BOOK
    )
    ran = "print('ran')"
    for sized in ((), ("--mib", "2000")):  # the booking's MiB, fetched first; or given
        out = _cli(broker, "run", "--booking", booking_id, *sized, "--", sys.executable, "-c", ran)
        assert out.returncode == 2, out.stderr
        assert "ran" not in out.stdout
        line = _one_line(out.stderr)
        assert line.startswith("rbroker run: ") and booking_id in line
        assert "starts in" in line, line  # booking_not_started, in words

    missing = _cli(broker, "run", "--booking", "book-00000000", "--", sys.executable, "-c", ran)
    assert missing.returncode == 2
    assert "no live booking 'book-00000000'" in _one_line(missing.stderr)
    no_size = _cli(broker, "run", "--", sys.executable, "-c", ran)
    assert no_size.returncode == 2
    assert "--mib" in _one_line(no_size.stderr)


def test_a_console_that_cannot_print_blocks_gets_the_ascii_timeline(
    broker: BrokerProcess,
) -> None:
    _book(broker, "--mib", "4000", "--start", "+2h", "--for", "2h", *BOOK)
    out = _cli(broker, "bookings", env={"PYTHONIOENCODING": "cp1252"})
    assert out.returncode == 0, out.stderr
    (row,) = [ln for ln in out.stdout.splitlines() if ln.startswith("GPU 0 ")]
    assert set(row[6:]) - {" "} == {"*"}
    assert "◔" not in out.stdout and "░" not in out.stdout


def test_block_characters_by_encoding() -> None:
    assert can_print_blocks("utf-8")
    assert not can_print_blocks("cp1252")
    assert not can_print_blocks("ascii")
    assert not can_print_blocks(None)
    assert not can_print_blocks("no-such-encoding")


def _view(**over: object) -> BookingView:
    view: dict[str, object] = {
        "booking_id": "book-1a2b3c4d",
        "owner": "ada",
        "project": "vision",
        "session": "s",
        "purpose": "eval [bold]shard 3[/bold] [/x]",
        "mib": 16000,
        "gpu_uuids": [GPU0],
        "start_at": 1_800_000_000.0,
        "end_at": 1_800_014_400.0,
        "created_at": 1_799_990_000.0,
        "state": "booked",
        "claims": [],
        "claimed_mib": 0,
        "claim_until": None,
        "ended_reason": "",
        "ended_at": 0.0,
    }
    view.update(over)
    return view  # type: ignore[return-value]


def test_user_text_reaches_a_terminal_as_written() -> None:
    """Brackets are characters, not rich markup; control characters never reach it."""
    gpus = [{"uuid": GPU0, "index": 0}]
    sheet = bookings_table(
        [_view(owner="ev\x1b[31mil")],
        gpus,
        1_799_990_000.0,
        None,  # type: ignore[list-item]
    )
    buf = io.StringIO()
    print_view(Console(file=buf, force_terminal=True, width=160, color_system=None), sheet)
    shown = buf.getvalue()
    assert "eval [bold]shard 3[/bold] [/x]" in shown
    assert "\x1b" not in shown and "ev [31mil" in shown
    assert clean("a\x1b\x07\u202eb") == "a   b"


def test_rbroker_run_says_on_stderr_that_its_lease_is_in_a_booking_s_way(
    broker: BrokerProcess,
) -> None:
    """A `booking_notice` for the wrapped command's lease is one line on `run`'s stderr."""
    run = subprocess.Popen(
        [sys.executable, "-m", "rbroker", "run", "--socket", broker.socket, "--mib", "20000",
         "--", sys.executable, "-c", "import time; time.sleep(4)"],
        stderr=subprocess.PIPE,
        encoding="utf-8",
    )  # fmt: skip
    try:
        with broker.client() as c:
            deadline = time.monotonic() + 20
            while not c.leases()["leases"] and time.monotonic() < deadline:
                time.sleep(0.05)
        _book(broker, "--mib", "16000", "--start", "+20m", "--for", "1h", *BOOK)
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    told = [line for line in err.splitlines() if "overlaps" in line]
    assert len(told) == 1, err
    assert told[0].startswith("rbroker: your lease lease-") and "(20 000 MiB on GPU 0)" in told[0]
    assert run.returncode == 0


def test_status_and_top_show_each_gpu_s_next_bookings(broker: BrokerProcess) -> None:
    first = _book(broker, "--mib", "8000", "--start", "+1h", "--for", "1h", *BOOK)
    second = _book(broker, "--mib", "4000", "--start", "+3h", "--for", "1h", *BOOK)
    third = _book(broker, "--mib", "4000", "--start", "+5h", "--for", "1h", *BOOK)
    for command in (["status"], ["top", "--once"]):
        out = _cli(broker, *command, env={"COLUMNS": "160"})
        assert out.returncode == 0, out.stderr
        assert "Next bookings per GPU (2)" in out.stdout, out.stdout
        assert first in out.stdout and second in out.stdout and third not in out.stdout
        assert "all of them: rbroker bookings" in out.stdout
        # the GPU's available figure says what the bookings hold back from a request of now
        assert (
            "GPU 0: 8 000 MiB booked within 4 h: a request that declares no end gets at most "
            "15 347 (rbroker bookings)"
        ) in " ".join(out.stdout.split()), out.stdout
    status = json.loads(_cli(broker, "status", "--json").stdout)
    assert [b["booking_id"] for b in status["bookings"]] == [first, second, third]


@pytest.mark.skipif(
    sys.platform == "win32", reason="TZ=Asia/Tokyo names a zone on POSIX only (Windows ignores it)"
)
def test_refusals_are_said_in_the_viewer_s_zone_and_short_ids_name_bookings(
    broker: BrokerProcess,
) -> None:
    """Found by a new user: the broker says its times in UTC; the command line says them
    again in the viewer's zone (Asia/Tokyo here, +09:00), and takes an id's unique prefix,
    as the narrow table shows it."""
    tokyo = {"TZ": "Asia/Tokyo"}
    first = _book(broker, "--mib", "16000", "--start", "+2h", "--for", "2h", *BOOK)
    out = _cli(broker, "book", "--mib", "10000", "--start", "+2h", "--for", "1h", *BOOK, env=tokyo)
    assert out.returncode == 2
    line = _one_line(out.stderr)
    assert "16 000 booked by 1 booking; 10 000 requested; it fits" in line, line
    assert line.endswith("(times in JST)"), line
    assert " UTC" not in line, line
    short = first.removeprefix("book-")[:6]
    cancelled = _cli(broker, "book", "cancel", short)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"cancelled {first}: ")


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell pipe into head(1)")
def test_an_ascii_output_or_a_reader_that_leaves_is_never_a_traceback(
    broker: BrokerProcess,
) -> None:
    """Found by a new user: `PYTHONIOENCODING=ascii rbroker bookings` and `rbroker bookings
    | head -1` ended in tracebacks (UnicodeEncodeError, BrokenPipeError)."""
    for hours in range(1, 7):
        _book(broker, "--mib", "1000", "--start", f"+{hours}h", "--for", "1h", *BOOK)
    for command in ("bookings", "status"):
        out = _cli(broker, command, env={"PYTHONIOENCODING": "ascii"})
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert "?" in out.stdout  # what ASCII cannot print is replaced, not fatal
        piped = subprocess.run(
            ["sh", "-c", f'"$0" -m rbroker {command} --socket "$1" | head -1', sys.executable,
             broker.socket],
            capture_output=True,
            encoding="utf-8",
            timeout=60,
        )  # fmt: skip
        assert piped.returncode == 0 and piped.stderr == "", piped.stderr
