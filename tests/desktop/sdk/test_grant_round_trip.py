"""A grant takes one round trip (issue 40): the acquire answer carries each granted GPU's
index, NVML total and memory API (`GrantedGpu`) and the CUDA indices, which the SDK used to
ask for with a second call (`gpus.list`) after every grant.

A real broker process shows what the answer carries; a scripted peer on a real Unix socket
counts what the SDK sends (and that against a broker whose answer lacks the figures, the SDK
still asks for them).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rbroker
from tests.conftest import GPU0, GPU1, BrokerProcess, short_tmp
from tests.fakes.gpu_scenarios import gpu, scenario

LEASE_ARGS: dict[str, Any] = {"project": "tests", "session": "grant", "purpose": "one trip"}


def test_the_grant_answer_carries_the_granted_gpus(broker_factory: Any) -> None:
    two_gpus: BrokerProcess = broker_factory(scenario(gpu(GPU0), gpu(GPU1, total_mib=8192)))
    with two_gpus.client() as c:
        answer = c.acquire({"mib": 1024, "gpus": 2, **LEASE_ARGS})
        listed = {g["uuid"]: g for g in c.gpus()}
    assert answer["lease"]["gpu_uuids"] == [g["uuid"] for g in answer["gpus"]]
    for granted in answer["gpus"]:
        shown = listed[granted["uuid"]]
        assert granted == {
            "uuid": shown["uuid"],
            "index": shown["index"],
            "total_mib": shown["total_mib"],
            "memory_api": shown["memory_api"],
        }
    assert answer["cuda_indices"] == [listed[u]["index"] for u in answer["lease"]["gpu_uuids"]]
    assert sorted(answer["cuda_indices"] or []) == [0, 1]


class ScriptedBroker:
    """A peer on a Unix socket that answers `hello` and the lease methods the way a broker
    does, with or without the granted GPUs in the acquire answer, and records each method."""

    def __init__(self, path: Path, carries_gpus: bool) -> None:
        self.methods: list[str] = []
        self.carries_gpus = carries_gpus
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _answer(self, method: str) -> Any:
        lease = {
            "lease_id": "lease-0123456789ab",
            "gpu_uuid": GPU1,
            "gpu_uuids": [GPU1],
            "granted_mib": 1024,
            "state": "active",
        }
        if method == "hello":
            return {"protocol_version": 1, "broker_version": "test", "simulated": True}
        if method == "lease.acquire":
            answer = {"lease": lease, "token": "t", "cuda_visible_devices": GPU1}
            if self.carries_gpus:
                answer["gpus"] = [
                    {"uuid": GPU1, "index": 1, "total_mib": 24576, "memory_api": "v2"}
                ]
                answer["cuda_indices"] = [1]
            return answer
        if method == "gpus.list":
            return {
                "gpus": [
                    {"uuid": GPU0, "index": 0, "total_mib": 8192, "memory_api": "v2"},
                    {"uuid": GPU1, "index": 1, "total_mib": 24576, "memory_api": "v2"},
                ]
            }
        return {"lease": lease}

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn, conn.makefile("rwb") as stream:
                for line in stream:
                    msg = json.loads(line)
                    self.methods.append(msg["method"])
                    reply = {
                        "jsonrpc": "2.0",
                        "id": msg["id"],
                        "result": self._answer(msg["method"]),
                    }
                    stream.write(json.dumps(reply).encode() + b"\n")
                    stream.flush()

    def close(self) -> None:
        self.server.close()


@pytest.fixture(params=[True, False], ids=["carries-gpus", "older-broker"])
def scripted(request: pytest.FixtureRequest) -> Iterator[tuple[ScriptedBroker, Path]]:
    if sys.platform == "win32":
        pytest.skip("a Unix socket peer; the named-pipe path sends the same requests")
    root = short_tmp()
    path = root / "broker.sock"
    broker = ScriptedBroker(path, carries_gpus=request.param)
    try:
        yield broker, path
    finally:
        broker.close()


def test_a_grant_is_one_round_trip(scripted: tuple[ScriptedBroker, Path]) -> None:
    broker, path = scripted
    with rbroker.lease(1024, socket=str(path), ttl_s=600, **LEASE_ARGS) as lease:
        sent = list(broker.methods)
        assert lease.gpu_indices == [1]
        assert lease.gpu_total_mib == [24576]
        assert lease.gpu_total_override == []
    if broker.carries_gpus:
        assert sent == ["hello", "lease.acquire"]
    else:  # a broker whose answer lacks the figures: asked for them, as before
        assert sent == ["hello", "lease.acquire", "gpus.list"]
