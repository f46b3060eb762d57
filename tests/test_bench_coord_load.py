"""The coordinator benchmark's load plan (bench/_coord_load.py): each connection owns its own
computers, each computer's reports go out in seq order, the raw requests are well formed,
and the load generator is chosen as documented (wrk when installed, else httpx)."""

from __future__ import annotations

import importlib.util
import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("litestar") is None, reason="the benchmark needs rbroker[server]"
)


@pytest.fixture(scope="module")
def load() -> Iterator[Any]:
    sys.path.insert(0, str(BENCH))
    try:
        import _coord_load

        yield _coord_load
    finally:
        sys.path.remove(str(BENCH))


def _computers(n: int) -> list[Any]:
    from _coord_fixture import Computer

    return [Computer(f"c_{i:03d}", f"bench-{i:03d}", secrets.token_bytes(32)) for i in range(n)]


def test_lanes_own_disjoint_computers_in_seq_order(load: Any) -> None:
    servers = [SimpleNamespace(port=41001), SimpleNamespace(port=41002)]
    computers = _computers(7)
    lanes = load.plan_lanes(servers, computers, 3, range(5, 9))
    assert [ln.port for ln in lanes] == [41001, 41002, 41001]
    owners: dict[str, int] = {}
    for i, lane in enumerate(lanes):
        seqs: dict[str, list[int]] = {}
        for body in lane.bodies:
            env = json.loads(body)
            seqs.setdefault(env["computer_id"], []).append(env["seq"])
        for cid, got in seqs.items():
            assert got == [5, 6, 7, 8], (cid, got)
            assert owners.setdefault(cid, i) == i, f"{cid} on two connections"
    assert len(owners) == 7
    assert sum(len(ln.bodies) for ln in lanes) == 7 * 4


def test_more_connections_than_computers_gives_one_lane_each(load: Any) -> None:
    lanes = load.plan_lanes([SimpleNamespace(port=1)], _computers(2), 8, range(1, 3))
    assert len(lanes) == 2


def test_empty_plan_is_refused_in_words(load: Any) -> None:
    with pytest.raises(ValueError, match="needs a server, a computer and a connection"):
        load.plan_lanes([], _computers(1), 1, range(1, 2))


def test_raw_request_and_plan_file(load: Any, tmp_path: Path) -> None:
    body = b'{"v":1}'
    raw = load.raw_request(8787, body)
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /api/v1/reports HTTP/1.1\r\nHost: 127.0.0.1:8787\r\n")
    assert b"Content-Length: 7" in head and rest == body
    lane = load.Lane(8787, [body, b'{"v":22}'])
    plan = load.write_plan([lane], tmp_path)
    port, total, path = plan.read_text().split()
    assert (port, total) == ("8787", "2")
    data = Path(path).read_bytes()
    first = load.raw_request(8787, body)
    assert data.startswith(b"%d\n" % len(first) + first)


def test_generator_choice(load: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RBROKER_BENCH_WRK", raising=False)
    monkeypatch.setenv("PATH", "")
    assert load.pick_generator("auto")[0] == "httpx"
    with pytest.raises(ValueError, match="wrk is not installed"):
        load.pick_generator("wrk")
    monkeypatch.setenv("RBROKER_BENCH_WRK", "/opt/wrk/bin/wrk")
    assert load.pick_generator("auto") == ("wrk", "wrk at /opt/wrk/bin/wrk")
    assert load.pick_generator("httpx")[0] == "httpx"
    with pytest.raises(ValueError, match="unknown load generator"):
        load.pick_generator("ab")
