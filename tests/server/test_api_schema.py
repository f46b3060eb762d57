"""The OpenAPI schema against the running coordinator: schemathesis sends generated
requests to every operation over real HTTP and checks each answer against the schema
(status codes, content types, bodies, headers), that none is a server error and that
schema-invalid requests are refused.

Every default check runs but `positive_data_acceptance` (a schema-valid request must be
accepted): a schema cannot say that a report's signature must hold, that an enrollment
code must exist, or the description rules a computer name must pass, so schema-valid
requests are refused by design (401, 400); and `ignored_auth`, whose replay without
credentials still carries the viewer token this test's auth provider adds (that a fleet
read without credentials is a 401 is tests/server/test_fleet.py's and test_rate_limits.py's)."""

from __future__ import annotations

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import ignored_auth, positive_data_acceptance

from rbroker_server.settings import Settings
from tests.server.conftest import start_coordinator


def test_every_operation_conforms_to_the_schema(tmp_path: Path) -> None:
    c = start_coordinator(Settings(data_dir=tmp_path / "data"), "sqlite")
    try:
        c.group("vision")
        c.enroll("vision")
        schema = schemathesis.openapi.from_url(f"{c.url}/schema/openapi.json")
        token = c.tokens["vision"]

        @schema.auth()
        class ViewerToken:
            """The group's viewer token on every request that has no credentials of its own."""

            def get(self, case: schemathesis.Case, ctx: schemathesis.AuthContext) -> str:
                return token

            def set(
                self, case: schemathesis.Case, data: str, ctx: schemathesis.AuthContext
            ) -> None:
                case.headers = {**(case.headers or {}), "authorization": f"Bearer {data}"}

        failures: dict[str, str] = {}
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 7
        for operation in operations:

            @given(case=operation.as_strategy())
            @hypothesis_settings(
                max_examples=30, deadline=None, suppress_health_check=list(HealthCheck)
            )
            def run(case: schemathesis.Case) -> None:
                case.call_and_validate(excluded_checks=[positive_data_acceptance, ignored_auth])

            try:
                run()
            except Exception as exc:  # collect every operation's failure, then fail once
                failures[operation.label] = str(exc)[:3000]
        assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    finally:
        c.stop()
        c.engine.dispose()
