"""The typed client (`rbroker.Client`) against peers that are not a healthy broker.

Whatever is on the other end, the client raises `BrokerUnavailable` (or the broker's typed
error) and leaks no socket: warnings are errors in this suite, so an unclosed socket fails.
"""

from __future__ import annotations

import gc
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import rbroker
from tests.conftest import short_tmp


@pytest.fixture
def fake_peer() -> Iterator[Callable[[bytes | None], str]]:
    """`fake_peer(reply)` → a socket path whose server reads one line, then answers `reply`
    (None: closes without answering; b"": never answers until the test ends)."""
    servers: list[tuple[socket.socket, threading.Thread, threading.Event]] = []
    roots: list[Path] = []

    def start(reply: bytes | None) -> str:
        roots.append(short_tmp())
        path = str(roots[-1] / "peer.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(4)
        done = threading.Event()

        def serve() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                if reply:
                    conn.sendall(reply)
                if reply == b"":
                    done.wait(10)

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        servers.append((srv, t, done))
        return path

    yield start
    for srv, t, done in servers:
        done.set()
        t.join(10)
        srv.close()
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


def _no_leak() -> None:
    gc.collect()  # an unclosed socket would now raise ResourceWarning (an error here)


def test_nothing_listening(tmp_path: Path) -> None:
    with pytest.raises(rbroker.BrokerUnavailable):
        rbroker.Client(str(tmp_path / "nothing.sock"))
    _no_leak()


def test_peer_closes_without_answering(fake_peer: Callable[[bytes | None], str]) -> None:
    with pytest.raises(rbroker.BrokerUnavailable):
        rbroker.Client(fake_peer(None))
    _no_leak()


def test_peer_answers_garbage(fake_peer: Callable[[bytes | None], str]) -> None:
    with pytest.raises(rbroker.BrokerUnavailable):
        rbroker.Client(fake_peer(b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    _no_leak()


def test_peer_never_answers(fake_peer: Callable[[bytes | None], str]) -> None:
    with pytest.raises(rbroker.BrokerUnavailable):
        rbroker.Client(fake_peer(b""), timeout_s=0.5)
    _no_leak()


def test_peer_refuses_the_protocol_version(fake_peer: Callable[[bytes | None], str]) -> None:
    refusal = (
        b'{"jsonrpc":"2.0","id":1,"error":{"code":-32050,"message":"too old",'
        b'"data":{"name":"protocol_version","min":9,"max":9}}}\n'
    )
    with pytest.raises(rbroker.ProtocolVersionError) as refused:
        rbroker.Client(fake_peer(refusal))
    assert refused.value.data == {"min": 9, "max": 9}
    _no_leak()


def test_closed_client_refuses_calls(fake_peer: Callable[[bytes | None], str]) -> None:
    hello = b'{"jsonrpc":"2.0","id":1,"result":{"protocol_version":1}}\n'
    c = rbroker.Client(fake_peer(hello))
    c.close()
    c.close()  # twice is fine
    with pytest.raises(rbroker.BrokerUnavailable):
        c.hello()


@pytest.mark.parametrize(
    "reply",
    [b"[1, 2]\n", b'"hello"\n', b"null\n", b'{"jsonrpc":"2.0","id":1}\n'],
    ids=["array", "string", "null", "neither-result-nor-error"],
)
def test_peer_answers_json_that_is_not_an_answer(
    fake_peer: Callable[[bytes | None], str], reply: bytes
) -> None:
    with pytest.raises(rbroker.BrokerUnavailable):
        rbroker.Client(fake_peer(reply), timeout_s=1.0)
    _no_leak()


def test_the_no_broker_hint_follows_how_the_address_was_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "or set RBROKER_SOCKET" only to a user who did not: one who set it is told to start a
    broker there or correct it, one who gave an address is told to start one there."""
    gone = str(tmp_path / "gone.sock")
    monkeypatch.setenv("RBROKER_SYSTEM_SOCKET", str(tmp_path / "system.sock"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("RBROKER_SOCKET", gone)
    with pytest.raises(rbroker.BrokerUnavailable) as by_env:
        rbroker.Client()
    assert str(by_env.value).endswith(
        "start one there (`rbroker broker` listens at $RBROKER_SOCKET), or unset or correct "
        "RBROKER_SOCKET"
    )
    with pytest.raises(rbroker.BrokerUnavailable) as by_option:
        rbroker.Client(gone)
    assert str(by_option.value).endswith(f"start one there with `rbroker broker --socket {gone}`")
    monkeypatch.delenv("RBROKER_SOCKET")
    with pytest.raises(rbroker.BrokerUnavailable) as by_default:
        rbroker.Client()
    assert str(by_default.value).endswith("start one with `rbroker broker` or set RBROKER_SOCKET")
