"""`rbroker enroll` reads the coordinator's answer as the declared shape
(`rbroker_protocol.enroll.EnrollResponse`) and sends the declared request: an answer that is
not that shape (a proxy's page, another service on the port) is one line naming the problem,
and the key made for the enrollment is taken back. A real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from rbroker.uplink.enroll import EnrollError, enroll


class _Answers(BaseHTTPRequestHandler):
    answer: ClassVar[bytes] = b""
    seen: ClassVar[list[dict[str, object]]] = []
    url: ClassVar[str] = ""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        type(self).seen.append(json.loads(self.rfile.read(length)))
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def coordinator() -> Iterator[type[_Answers]]:
    handler = type("Answers", (_Answers,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"<html>a proxy's page</html>", "is not what rbroker expects"),
        (b"{}", "is not what rbroker expects"),
        (b'{"computer_id": 7, "group": "vision"}', "is not what rbroker expects"),
    ],
)
def test_an_answer_of_another_shape_is_one_line_and_the_key_goes(
    coordinator: type[_Answers], tmp_path: Path, answer: bytes, said: str
) -> None:
    coordinator.answer = answer
    with pytest.raises(EnrollError) as caught:
        enroll(coordinator.url, "CODE-1", "lab-1", tmp_path, key_file=True)
    text = str(caught.value)
    assert said in text and "\n" not in text, text
    assert not (tmp_path / "computer.key").exists()
    assert not (tmp_path / "uplink.json").exists()
    (sent,) = coordinator.seen
    assert set(sent) == {"code", "name", "public_key"}
    assert sent["code"] == "CODE-1" and sent["name"] == "lab-1"


def test_the_declared_answer_enrolls(coordinator: type[_Answers], tmp_path: Path) -> None:
    coordinator.answer = b'{"computer_id": "c_0123456789abcdef", "group": "vision"}'
    config = enroll(coordinator.url, "CODE-1", "lab-1", tmp_path, key_file=True)
    assert (config.computer_id, config.group) == ("c_0123456789abcdef", "vision")
    assert (tmp_path / "computer.key").exists()
