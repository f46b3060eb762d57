"""The broker's event loop (`rbroker.base.eventloop`, docs/architecture.md §5): uvloop where it is
installed, the standard asyncio loop elsewhere or when asked, a clear refusal for a loop
that does not exist. The local API's hostile-input tests run on both loops."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rbroker.base import eventloop
from tests.conftest import SINGLE_24G, start_broker
from tests.desktop.conftest import start_simulated_broker

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


def test_the_factory_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    assert eventloop.loop_factory() is None
    monkeypatch.setenv(eventloop.ENV, "tokio")
    with pytest.raises(ValueError, match="tokio"):
        eventloop.loop_factory()
    monkeypatch.delenv(eventloop.ENV)
    factory = eventloop.loop_factory()
    if sys.platform == "win32":
        assert factory is None
        return
    import uvloop

    assert factory is uvloop.new_event_loop
    loop = factory()
    try:
        assert eventloop.loop_name(loop) == "uvloop"
    finally:
        loop.close()


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop does not exist on Windows")
@pytest.mark.parametrize(("wanted", "expected"), [("auto", "uvloop"), ("asyncio", "asyncio")])
def test_a_broker_runs_on_uvloop_by_default_and_on_asyncio_when_asked(
    wanted: str, expected: str
) -> None:
    bp = start_broker(SINGLE_24G, env={eventloop.ENV: wanted})
    try:
        with bp.client() as c:
            assert c.status()["event_loop"] == expected
            lease = c.call("lease.acquire", mib=64, project="t", session="s", purpose="p")
            c.call("lease.release", lease_id=lease["lease"]["lease_id"])
    finally:
        bp.stop()


def test_an_unknown_loop_is_refused_at_start(tmp_path: Path) -> None:
    proc = start_simulated_broker(tmp_path, env={eventloop.ENV: "tokio"})
    assert proc.returncode == 2, proc.stderr
    assert "RBROKER_EVENT_LOOP='tokio'" in proc.stderr and "Traceback" not in proc.stderr
