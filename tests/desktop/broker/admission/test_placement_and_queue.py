"""Placement, multi-GPU requests and the per-GPU FIFO queue (architecture.md §3), on two simulated
GPUs.

Two empty 24 576 MiB GPUs with 1 024 MiB headroom: 23 552 MiB usable on each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import rbroker
from rbroker.base.display import short_uuid
from tests.conftest import GPU0, GPU1, BrokerProcess, wait_until
from tests.desktop.conftest import RawConnection, WorkerProcess
from tests.fakes.gpu_scenarios import gpu, scenario

Worker = Callable[..., WorkerProcess]

TWO_GPUS = scenario(gpu(GPU0), gpu(GPU1))


def _params(mib: int, session: str, **extra: Any) -> dict[str, Any]:
    return {"mib": mib, "project": "tests", "session": session, "purpose": "placement", **extra}


@pytest.fixture
def two(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(TWO_GPUS, headroom_mib=1024)


def _available(c: rbroker.Client) -> dict[str, int]:
    return {g["uuid"]: g["available_mib"] for g in c.gpus()}


def _held_elsewhere(worker: Worker, broker: BrokerProcess, mib: int, session: str) -> str:
    """A lease on GPU0 held by another process (not this test's process nor an ancestor of
    it: a request that fits only once its own process's leases end is refused at once,
    architecture.md §3); its id, for `lease.release` from this process."""
    line = worker("hold_lease", broker.socket, str(mib), session, "0", "30", GPU0).read_line()
    assert line.startswith("granted "), line
    return line.split()[1]


def test_pack_takes_the_fullest_gpu_that_fits_and_spread_the_emptiest(two: BrokerProcess) -> None:
    with two.client() as c:
        c.call("lease.acquire", **_params(10000, "first", gpu_uuid=GPU1))
        assert _available(c) == {GPU0: 23552, GPU1: 13552}
        packed = c.call("lease.acquire", **_params(8000, "packed"))["lease"]
        assert packed["gpu_uuid"] == GPU1
        spread = c.call("lease.acquire", **_params(2000, "spread", placement="spread"))["lease"]
        assert spread["gpu_uuid"] == GPU0
        # Too big for the fuller GPU: pack falls back to the one where it fits.
        big = c.call("lease.acquire", **_params(20000, "big"))["lease"]
        assert big["gpu_uuid"] == GPU0


def test_multi_gpu_request_is_all_or_nothing(
    two: BrokerProcess, raw_connect: Callable[[str], RawConnection], worker: Worker
) -> None:
    with two.client() as c:
        blocker = _held_elsewhere(worker, two, 10000, "blocker")
        waiting = raw_connect(two.socket)
        request_id = waiting.send_request(
            "lease.acquire", _params(16000, "pair", gpus=2, wait_s=30)
        )

        def queued() -> dict[str, Any] | None:
            for q in c.leases()["queue"]:
                if q["session"] == "pair" and q["reason_kind"] == "capacity":
                    return dict(q)
            return None

        entry = wait_until(queued)
        assert isinstance(entry, dict)
        assert "2 GPUs needed at once, 1 with room" in entry["reason"]
        # the reason names the GPU that blocks (GPU0, 13 552 MiB left), not the one with room
        assert entry["reason_data"]["gpu_uuid"] == GPU0, entry
        assert entry["reason"].startswith(f"waiting: {short_uuid(GPU0)} has 13 552 MiB"), entry
        # Nothing is held on GPU1 while GPU0 has no room: no partial grant.
        assert [x["session"] for x in c.leases()["leases"]] == ["blocker"]
        assert _available(c) == {GPU0: 13552, GPU1: 23552}

        c.call("lease.release", lease_id=blocker)
        answer = waiting.read_answer(request_id)["result"]
        assert sorted(answer["lease"]["gpu_uuids"]) == [GPU0, GPU1]
        assert sorted(answer["cuda_visible_devices"].split(",")) == [GPU0, GPU1]
        assert answer["lease"]["granted_mib"] == 16000
        assert _available(c) == {GPU0: 23552 - 16000, GPU1: 23552 - 16000}


def test_more_gpus_than_the_computer_has_is_infeasible(two: BrokerProcess) -> None:
    with two.client() as c, pytest.raises(rbroker.Infeasible) as refused:
        c.call("lease.acquire", **_params(1024, "three", gpus=3, wait_s=30))
    assert refused.value.data == {"requested_gpus": 3, "gpu_count": 2}
    assert "3" in refused.value.message and "2" in refused.value.message


def test_a_waiter_on_one_gpu_does_not_block_another_gpu(
    two: BrokerProcess, raw_connect: Callable[[str], RawConnection], worker: Worker
) -> None:
    with two.client() as c:
        _held_elsewhere(worker, two, 20000, "full0")
        waiting = raw_connect(two.socket)
        waiting.send_request("lease.acquire", _params(8000, "wait0", gpu_uuid=GPU0, wait_s=30))
        wait_until(lambda: any(q["session"] == "wait0" for q in c.leases()["queue"]))

        other = c.call("lease.acquire", **_params(8000, "gpu1", gpu_uuid=GPU1))["lease"]
        assert other["gpu_uuid"] == GPU1
        # ...but a small request for GPU0 queues behind the earlier waiter there (FIFO).
        with pytest.raises(rbroker.CapacityUnavailable) as behind:
            c.call("lease.acquire", **_params(1000, "small0", gpu_uuid=GPU0))
        assert behind.value.data["ahead"] == 1


def test_fifo_order_is_kept_when_room_appears(two: BrokerProcess, worker: Worker) -> None:
    with two.client() as c:
        blocker = _held_elsewhere(worker, two, 20000, "blocker")
        raws: list[RawConnection] = []
        try:
            for i, mib in enumerate((12000, 15000, 1000)):
                raws.append(RawConnection(two.socket))
                raws[-1].send_request(
                    "lease.acquire", _params(mib, f"w{i}", gpu_uuid=GPU0, wait_s=30)
                )
                wait_until(lambda: any(q["session"] == f"w{i}" for q in c.leases()["queue"]))  # noqa: B023
            assert [q["ahead"] for q in c.leases()["queue"]] == [0, 1, 2]
            c.call("lease.release", lease_id=blocker)
            wait_until(lambda: [x["session"] for x in c.leases()["leases"]] == ["w0"])
            # w2 (1 000 MiB) would fit in the 11 552 left, but w1 (15 000) came first.
            time.sleep(0.5)
            assert [q["session"] for q in c.leases()["queue"]] == ["w1", "w2"]
        finally:
            for r in raws:
                r.close()


def test_wait_timeout_carries_the_numbers_and_leaves_nothing_behind(
    two: BrokerProcess, worker: Worker
) -> None:
    with two.client() as c:
        _held_elsewhere(worker, two, 20000, "full0")
        started = time.monotonic()
        with pytest.raises(rbroker.WaitTimeout) as timed_out:
            c.call("lease.acquire", **_params(8000, "late", gpu_uuid=GPU0, wait_s=1))
        waited = time.monotonic() - started
        assert 1.0 <= waited < 3.0
        assert timed_out.value.code == "wait_timeout"
        assert timed_out.value.data["available_mib"] == 3552
        assert timed_out.value.data["requested_mib"] == 8000
        assert "3 552" in timed_out.value.message
        assert c.leases()["queue"] == []
