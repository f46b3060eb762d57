"""The broker's SQLite store writes only what changes (`rbroker.broker.store.LeaseStore`):
baselines that stay at 0 write nothing, yet the table always holds every baseline above 0 as
last put, across a reopen (a restarted broker); records are JSON that reads back as written."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rbroker.broker.store import LeaseStore, record_json

KEYS = [(101, 5.25, "GPU-a"), (101, 5.25, "GPU-b"), (202, 7.5, "GPU-a")]

PUT = st.tuples(st.sampled_from(KEYS), st.sampled_from([-1, 0, 0, 1, 500, 500, 2000]))
STEP = st.one_of(PUT, st.just("reopen"))


@settings(max_examples=60, deadline=None)
@given(st.lists(STEP, max_size=25))
def test_the_baselines_table_holds_every_baseline_above_0_as_last_put(
    steps: list[tuple[tuple[int, float, str], int] | str],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data" / "broker.sqlite3"
        store = LeaseStore(path)
        expected: dict[tuple[int, float, str], int] = {}
        try:
            for step in steps:
                if isinstance(step, str):
                    store.close()
                    store = LeaseStore(path)
                    continue
                key, mib = step
                store.put_baseline(*key, mib)
                if mib > 0:
                    expected[key] = mib
                else:
                    expected.pop(key, None)
                assert sorted(store.baselines()) == sorted((*k, m) for k, m in expected.items())
        finally:
            store.close()


def test_a_baseline_at_0_writes_nothing(tmp_path: Path) -> None:
    store = LeaseStore(tmp_path / "data" / "broker.sqlite3")
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)  # the SQL it runs
    try:
        store.put_baseline(101, 5.25, "GPU-a", 0)  # a quiet holder's grant
        store.put_baseline(101, 5.25, "GPU-a", 0)  # and its release
        assert statements == []
        store.put_baseline(101, 5.25, "GPU-a", 500)
        store.put_baseline(101, 5.25, "GPU-a", 500)
        store.put_baseline(101, 5.25, "GPU-a", 0)
        assert [s.split()[0] for s in statements] == ["INSERT", "DELETE"]
    finally:
        store.close()


def test_a_record_reads_back_as_written() -> None:
    record = {
        "lease_id": "lease-0a1b2c3d4e5f",
        "holder_start": 12345.67,
        "granted_at": 1765000000.123456,
        "gpu_uuids": ["GPU-a"],
        "admission": {"GPU-a": {"total_mib": 24576}},
        "job_id": None,
        "note": "é \ud800",  # a lone surrogate (JSON's \u escapes allow it): json writes it
        "big": 2**70,  # past 64 bits: json writes it
    }
    assert json.loads(record_json(record)) == record
    assert json.loads(record_json({**record, "note": "é", "big": 1})) == {
        **record,
        "note": "é",
        "big": 1,
    }
