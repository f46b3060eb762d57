"""The tray's event thread blocks in `Client.wait_event` while the tray's shutdown closes
that client from the GUI thread: the wait ends at once as `BrokerUnavailable("client is
closed")`, never as a bare OSError from the closed socket (which killed the thread with a
traceback), and never stays blocked (on Windows closing a pipe's handle does not end a
synchronous read on it: the client's reads are overlapped and `close()` cancels them).
A wait with a timeout ends with None and leaves the connection usable, on a socket and on
a pipe. A real broker process, real connections."""

from __future__ import annotations

import threading
import time

import pytest

import rbroker
from tests.conftest import BrokerProcess


def test_closing_a_client_under_a_waiting_reader_ends_the_wait_quietly(
    broker: BrokerProcess,
) -> None:
    for _ in range(5):  # the close lands before, and during, the wait
        client = broker.client(timeout_s=10)
        client.subscribe()
        ended: list[BaseException] = []

        def wait(c: rbroker.Client = client, ended: list[BaseException] = ended) -> None:
            try:
                c.wait_event(None)
            except BaseException as exc:
                ended.append(exc)

        reader = threading.Thread(target=wait)
        reader.start()
        time.sleep(0.05)
        closed_at = time.monotonic()
        client.close()
        reader.join(5)
        assert not reader.is_alive()
        assert time.monotonic() - closed_at < 2.0  # at once, not after a join's timeout
        assert len(ended) == 1 and isinstance(ended[0], rbroker.BrokerUnavailable), ended
        assert "client is closed" in str(ended[0])


def test_a_closed_client_refuses_to_wait(broker: BrokerProcess) -> None:
    client = broker.client(timeout_s=10)
    client.close()
    with pytest.raises(rbroker.BrokerUnavailable, match="client is closed"):
        client.wait_event(1)
    assert client.wait_until_closed(0.5) is False


def test_a_wait_with_a_timeout_ends_with_none_and_the_connection_stays_usable(
    broker: BrokerProcess,
) -> None:
    client = broker.client(timeout_s=10)
    try:
        client.subscribe()
        while client.next_event(0) is not None:
            pass
        started = time.monotonic()
        assert client.wait_event(0.5) is None
        waited_s = time.monotonic() - started
        assert 0.4 <= waited_s < 5.0, waited_s
        assert client.status()  # the same connection answers the next call
    finally:
        client.close()


def test_a_blocked_call_on_another_thread_ends_when_the_client_is_closed(
    broker: BrokerProcess,
) -> None:
    client = broker.client(timeout_s=None)
    client.subscribe()
    ended: list[BaseException] = []

    def wait() -> None:
        try:
            client.wait_until_closed(60)
            client.wait_event(None)
        except BaseException as exc:
            ended.append(exc)

    reader = threading.Thread(target=wait)
    reader.start()
    time.sleep(0.3)
    client.close()
    reader.join(5)
    assert not reader.is_alive()
    assert len(ended) == 1 and "client is closed" in str(ended[0]), ended
