"""What the broker keeps of one connection's unread request lines: at most about the line
limit plus two reads, however many lines a client pipelines while it reads the answers.

Before, each turn of a busy user resumed reading before the lines already read were served:
a client pipelining renewals (each answered at once) grew its connection's buffer by a
read per turn while 16 lines were served, to the whole flood (15 MiB of buffer for 150 000
renewals; a broker's RSS from 50 to 148 MiB for a million, and to 635 MiB over several
connections). A served local API on a Unix socket, the buffer read on its loop. Not on
Windows: the named-pipe client stream (`transport.pipe_windows`) takes reads and writes in
turn under one lock, so one client cannot pipeline while it reads; the server side that this
test is about (`Connection`) is the same code on both."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from typing import Any

import pytest

from rbroker.localapi.connection import Connection
from rbroker_protocol import jsonrpc
from tests.desktop.localapi.served import served_api

pytestmark = pytest.mark.skipif(
    sys.platform == "win32",
    reason="the named-pipe client reads and writes in turn: it cannot pipeline while it reads",
)

RENEWALS = 100_000
READ_CHUNK_BYTES = 256 * 1024
"""The most one read hands the protocol (uvloop reads 256 KiB; asyncio's default less)."""


def _line(request_id: int, method: str, **params: Any) -> bytes:
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return json.dumps(body).encode() + b"\n"


def test_a_pipelining_client_s_unread_lines_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    most = [0]
    received = Connection.data_received

    def measured(self: Connection, data: bytes) -> None:
        received(self, data)
        most[0] = max(most[0], len(self._buf))

    monkeypatch.setattr(Connection, "data_received", measured)
    with served_api() as served, contextlib.closing(served.connect()) as c:
        c.write(_line(0, "hello", protocol_version=1))
        assert b'"result"' in c.readline()
        c.write(_line(1, "lease.acquire", mib=100, project="p", session="s", purpose="flood"))
        lease_id = json.loads(c.readline())["result"]["lease"]["lease_id"]
        renew = _line(2, "lease.renew", lease_id=lease_id)

        def send() -> None:
            for _ in range(RENEWALS // 1000):
                c.write(renew * 1000)

        sender = threading.Thread(target=send)
        sender.start()
        answered = 0
        for _ in range(RENEWALS):
            answer = json.loads(c.readline())
            assert answer["id"] == 2 and "result" in answer, answer
            answered += 1
        sender.join(60)
        assert answered == RENEWALS  # every line served, none refused or lost
        # a turn may end inside a read (its rest stays) and one more read comes before
        # reading pauses: the line limit plus two reads (354 808 bytes seen once; 9 MB before)
        assert most[0] <= jsonrpc.MAX_LINE_BYTES + 2 * READ_CHUNK_BYTES, most[0]
