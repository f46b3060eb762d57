"""`rbroker run --wait`'s line says how many requests are ahead once, whichever wording the
broker's reason takes: the reasons come from a broker on the in-process harness (manual
clock), as `leases.list` and the `waiting` events carry them."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from rbroker.cli.run import WaitDisplay
from tests.desktop.inprocess import InProcessBroker, SleeperPool


def _line(entry: Any) -> str:
    out = io.StringIO()
    display = WaitDisplay(Console(file=out, force_terminal=False, width=400), 8000, 60)
    display.show(dict(entry))
    return out.getvalue().strip()


def test_the_number_ahead_is_said_once_in_every_reason(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    h.acquire(pool.spawn()[1], mib=20000).result()  # another user fills the GPU
    _, holder = pool.spawn()
    for _ in range(3):
        h.acquire(holder, mib=8000, wait_s=60.0)
    seen = []
    # capacity: "waiting: GPU-… has … MiB available (…); 8 000 requested; 2 requests ahead"
    last = h.broker.leases_view()["queue"][-1]
    assert last["ahead"] == 2 and last["reason_kind"] == "capacity"
    seen.append(_line(last))
    # sampling: every GPU's last sample is too old to place a request on
    h.clock.advance(h.config.max_sample_age_s + 1)
    h.broker._admit()
    h.spin()
    entries = h.broker.leases_view()["queue"]
    sampling = [e for e in entries if e["ahead"]]
    assert all(e["reason"].startswith("waiting for a fresh GPU sample") for e in sampling)
    seen += [_line(e) for e in sampling]
    # paused: the broker's reason says nothing of the queue, the line adds it once
    h.broker.set_paused(True)
    h.sample()
    paused = h.broker.leases_view()["queue"][-1]
    assert paused["reason"] == "waiting: new admissions are paused" and paused["ahead"]
    seen.append(_line(paused))
    for line in seen:
        assert line.count("ahead") == 1, line
        assert "ahead)" not in line, line
    assert seen[0].endswith("8 000 requested; 2 requests ahead"), seen[0]
    assert seen[-1].endswith(f"new admissions are paused; {paused['ahead']} requests ahead")


def test_a_large_queue_is_counted_with_grouped_thousands() -> None:
    line = _line({"reason": "waiting: new admissions are paused", "ahead": 1024})
    assert line.endswith("paused; 1 024 requests ahead"), line
    one = _line({"reason": "waiting: new admissions are paused", "ahead": 1})
    assert one.endswith("paused; 1 request ahead"), one
