"""The tray's event thread blocks in `Client.wait_event` while the tray's shutdown closes
that client from the GUI thread: the wait ends as `BrokerUnavailable("client is closed")`,
never as a bare OSError from the closed socket (which killed the thread with a traceback).
A real broker process, real connections."""

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
        client.close()
        reader.join(5)
        assert not reader.is_alive()
        assert len(ended) == 1 and isinstance(ended[0], rbroker.BrokerUnavailable), ended
        assert "client is closed" in str(ended[0])


def test_a_closed_client_refuses_to_wait(broker: BrokerProcess) -> None:
    client = broker.client(timeout_s=10)
    client.close()
    with pytest.raises(rbroker.BrokerUnavailable, match="client is closed"):
        client.wait_event(1)
    assert client.wait_until_closed(0.5) is False
