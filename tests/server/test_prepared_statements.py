"""The report writer's statements on the driver's cursor (`statements.prepared`), on a real
database (SQLite file, or PostgreSQL with RBROKER_TEST_PG_URL): values bound as SQLAlchemy
binds them, a refused statement raised as SQLAlchemy raises it; and the JSON columns'
encoder."""

from __future__ import annotations

import json
from datetime import date

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_server.admin import operations as admin
from rbroker_server.db import engine as db
from rbroker_server.reports import statements as st


def _computer(engine: Engine) -> str:
    group = admin.create_group(engine, "vision")
    now = db.utcnow()
    row = {
        "id": "c_prepared",
        "group_id": group.id,
        "name": "lab-1",
        "public_key": "k" * 43,
        "enrolled_at": now,
        "reports_applied": 0,
        "flagged": False,
    }
    with engine.begin() as conn:
        conn.execute(sa.insert(st.COMPUTERS), row)
    return "c_prepared"


def test_usage_rows_add_up_and_times_compare_as_sqlalchemy_binds_them(engine: Engine) -> None:
    cid = _computer(engine)
    seen = db.utcnow()
    with engine.begin() as conn:  # written by SQLAlchemy
        conn.execute(sa.update(st.COMPUTERS).values(last_seen_at=seen, state={"a": 1}))
    row = {
        "computer_id": cid,
        "day": date(2026, 12, 5),
        "project": "vision",
        "owner": "alice",
        "granted_mib_hours": 1.5,
        "used_mib_hours": 0.5,
    }
    with db.write_transaction(engine) as conn:
        usage = st.prepared(conn, st.add_usage(conn.dialect.name), st.USAGE_KEYS)
        assert usage.executemany(conn, [row, row]) == 2
        touch = st.prepared(
            conn,
            sa.update(st.COMPUTERS)
            .where(st.COMPUTERS.c.last_seen_at == sa.bindparam("w_seen", type_=db.UtcDateTime()))
            .values(state=sa.bindparam("v_state", type_=st.COMPUTERS.c.state.type)),
        )
        assert touch.executemany(conn, [{"w_seen": seen, "v_state": {"b": [1, 2]}}]) == 1
    with engine.connect() as conn:
        got = conn.execute(sa.select(st.USAGE.c.granted_mib_hours, st.USAGE.c.used_mib_hours))
        assert got.one() == (3.0, 1.0)
        assert conn.execute(sa.select(st.COMPUTERS.c.state)).scalar() == {"b": [1, 2]}


def test_a_refused_statement_raises_as_sqlalchemy_does(engine: Engine) -> None:
    _computer(engine)
    row = {
        "computer_id": "c_nobody",  # no such computer: the foreign key refuses it
        "day": date(2026, 12, 5),
        "project": "vision",
        "owner": "alice",
        "granted_mib_hours": 1.0,
        "used_mib_hours": 1.0,
    }
    with pytest.raises(sa.exc.IntegrityError), db.write_transaction(engine) as conn:
        st.prepared(conn, st.add_usage(conn.dialect.name), st.USAGE_KEYS).executemany(conn, [row])


def test_json_columns_are_encoded_compactly_and_big_integers_still_fit() -> None:
    assert db.dumps_json({"a": [1, 2.5, None, "é"]}) == '{"a":[1,2.5,null,"é"]}'
    assert json.loads(db.dumps_json({"n": 2**70})) == {"n": 2**70}
