"""Property test of the job state machine against a real broker (issue 6): random
sequences of declare / report / update / connection loss on three connections, checked
step by step against a model. Invariants: counts are exactly the sum of distinct accepted
chunks; each error is the one the model predicts and changes nothing; a finished job never
changes; every observed transition is legal; a job with no attached connection and no
lease becomes `stalled`, never silently done."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

import rbroker
from tests.conftest import SINGLE_24G, BrokerProcess, start_broker

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

FINISHED = {"succeeded", "failed", "cancelled"}
LEGAL = {
    ("queued", "running"),
    ("queued", "stalled"),
    ("running", "stalled"),
    ("stalled", "running"),
    *((a, b) for a in ("queued", "running", "stalled") for b in FINISHED),
}
SLOTS = 3
SEEN_TRANSITIONS: Counter[tuple[str, str]] = Counter()


@dataclass
class Model:
    """What the broker must say about one job."""

    total: int | None
    state: str = "queued"
    reason: str = ""
    workers: int = 1
    chunks: dict[str, tuple[int, int]] = field(default_factory=dict)
    attached: set[int] = field(default_factory=set)  # connection generations

    @property
    def completed(self) -> int:
        return sum(c for c, _ in self.chunks.values())

    @property
    def failed(self) -> int:
        return sum(f for _, f in self.chunks.values())


_BROKER: BrokerProcess | None = None


class JobMachine(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        assert _BROKER is not None
        self.broker = _BROKER
        self.generation = 0
        self.clients: list[tuple[int, rbroker.Client]] = [self._connect() for _ in range(SLOTS)]
        self.model: dict[str, Model] = {}
        self.seen: dict[str, str] = {}

    def _connect(self) -> tuple[int, rbroker.Client]:
        self.generation += 1
        return self.generation, self.broker.client()

    def _call(self, slot: int, method: str, **params: Any) -> tuple[str | None, Any]:
        client = self.clients[slot][1]
        try:
            return None, client.call(method, **params)
        except rbroker.RBrokerError as exc:
            return exc.code, None

    @rule(
        target=jobs,
        slot=st.integers(0, SLOTS - 1),
        total=st.none() | st.integers(1, 40),
        workers=st.integers(1, 4),
    )
    def declare(self, slot: int, total: int | None, workers: int) -> str:
        params: dict[str, Any] = {
            "project": "props",
            "purpose": "random job operations",
            "handler": "props.step",
            "workers": workers,
        }
        if total is not None:
            params["total_items"] = total
        err, result = self._call(slot, "job.declare", **params)
        assert err is None
        job = result["job"]
        assert job["state"] == "queued" and job["completed_items"] == 0
        self.model[job["job_id"]] = Model(
            total=total, workers=workers, attached={self.clients[slot][0]}
        )
        self.seen[job["job_id"]] = "queued"
        return str(job["job_id"])

    @rule(
        job_id=jobs,
        slot=st.integers(0, SLOTS - 1),
        chunk=st.sampled_from(["c0", "c1", "c2", "c3", "c4", "c5"]),
        completed=st.integers(-1, 9),
        failed=st.integers(-1, 3),
    )
    def report(self, job_id: str, slot: int, chunk: str, completed: int, failed: int) -> None:
        m = self.model[job_id]
        gen = self.clients[slot][0]
        want_err: str | None = None
        duplicate = False
        if completed < 0 or failed < 0:
            want_err = "invalid_params"
        elif chunk in m.chunks:
            if m.chunks[chunk] == (completed, failed):
                duplicate = True
            else:
                want_err = "invalid_params"
        elif m.state in FINISHED:
            want_err = "job_finished"
        elif completed + failed == 0 or (
            m.total is not None and m.completed + m.failed + completed + failed > m.total
        ):
            want_err = "invalid_params"  # nothing to count, or beyond total_items
        err, result = self._call(
            slot, "job.report", job_id=job_id, chunk_id=chunk, completed=completed, failed=failed
        )
        assert err == want_err, (err, want_err, m)
        if err is not None:
            return
        assert result["duplicate"] is duplicate
        if m.state not in FINISHED:
            m.attached.add(gen)
        if not duplicate:
            m.chunks[chunk] = (completed, failed)
            if m.state in ("queued", "stalled"):
                m.state = "running"

    @rule(
        job_id=jobs,
        slot=st.integers(0, SLOTS - 1),
        state=st.sampled_from([None, "running", "succeeded", "failed", "cancelled"]),
        reason=st.sampled_from([None, "stopped by the property test"]),
        workers=st.none() | st.integers(1, 8),
    )
    def update(
        self, job_id: str, slot: int, state: str | None, reason: str | None, workers: int | None
    ) -> None:
        m = self.model[job_id]
        want_err = None
        if m.state in FINISHED:
            want_err = "job_finished"
        elif state in ("failed", "cancelled") and reason is None:
            want_err = "invalid_params"
        params: dict[str, Any] = {"job_id": job_id}
        for key, value in (("state", state), ("reason", reason), ("workers", workers)):
            if value is not None:
                params[key] = value
        err, _ = self._call(slot, "job.update", **params)
        assert err == want_err, (err, want_err, m)
        if err is not None:
            return
        m.attached.add(self.clients[slot][0])
        if workers is not None:
            m.workers = workers
        if state is not None:
            m.state, m.reason = state, reason or ""

    @rule(slot=st.integers(0, SLOTS - 1))
    def lose_connection(self, slot: int) -> None:
        """The connection in `slot` goes (a crashed worker or declarer); a new one comes."""
        gen, client = self.clients[slot]
        client.close()
        self.clients[slot] = self._connect()
        orphans = []
        for job_id, m in self.model.items():
            m.attached.discard(gen)
            if not m.attached and m.state in ("queued", "running"):
                m.state = "stalled"
                orphans.append(job_id)

        deadline = time.monotonic() + 5
        while orphans and time.monotonic() < deadline:
            states = self._states()
            orphans = [j for j in orphans if states[j]["state"] != "stalled"]
            time.sleep(0.05)
        assert not orphans, f"not stalled: {orphans}"

    @rule(job_id=consumes(jobs), slot=st.integers(0, SLOTS - 1))
    def unknown_job(self, job_id: str, slot: int) -> None:
        bogus = "job-ffff" + job_id[-8:]
        for method, params in (
            ("job.report", {"chunk_id": "c0", "completed": 1}),
            ("job.update", {"state": "succeeded"}),
        ):
            assert self._call(slot, method, job_id=bogus, **params)[0] == "job_not_found"

    def _states(self) -> dict[str, dict[str, Any]]:
        jobs = self.clients[0][1].call("jobs.list", include_finished=True)["jobs"]
        return {j["job_id"]: j for j in jobs if j["job_id"] in self.model}

    @invariant()
    def broker_agrees_with_the_model(self) -> None:
        for job_id, j in self._states().items():
            m = self.model[job_id]
            assert j["state"] == m.state, (job_id, j, m)
            assert j["reason"] == m.reason
            assert (j["completed_items"], j["failed_items"]) == (m.completed, m.failed)
            assert j["chunks_reported"] == len(m.chunks)
            assert j["workers"] == m.workers
            if m.total is not None:
                assert j["completed_items"] + j["failed_items"] <= m.total
            assert (j["finished_at"] is not None) == (m.state in FINISHED)
            before = self.seen[job_id]
            if j["state"] != before:
                assert (before, j["state"]) in LEGAL, (before, j["state"])
                SEEN_TRANSITIONS[(before, j["state"])] += 1
                self.seen[job_id] = j["state"]

    def teardown(self) -> None:
        for _, client in self.clients:
            client.close()


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    global _BROKER
    bp = start_broker(SINGLE_24G)
    _BROKER = bp
    yield bp
    _BROKER = None
    bp.stop(signal.SIGKILL)


def test_random_job_operations_keep_exact_counts_and_legal_states(broker: BrokerProcess) -> None:
    run_state_machine_as_test(
        JobMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            database=None,
        ),
    )
    assert broker.proc.poll() is None
    # the run went through the interesting paths, not only refusals
    assert SEEN_TRANSITIONS[("queued", "running")] > 0
    assert SEEN_TRANSITIONS[("queued", "stalled")] + SEEN_TRANSITIONS[("running", "stalled")] > 0
    assert sum(n for (_, b), n in SEEN_TRANSITIONS.items() if b in FINISHED) > 0
