"""docs/architecture.md matches the code it describes: its numbered sections (code refers
to them as `docs/architecture.md §N`), every local-API method and error code with its
number, the per-connection limits, the scenario file's fields and values, the report
signature's context and the description length limits."""

from __future__ import annotations

import re
from pathlib import Path

from rbroker.gpu import scenario
from rbroker.localapi import server
from rbroker_protocol import jsonrpc, signing
from rbroker_protocol.descriptions import MAX_LENGTHS
from rbroker_protocol.errors import ERROR_CODES

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
TEXT = DOC.read_text(encoding="utf-8")


def _section(number: str) -> str:
    start = re.search(rf"^## {re.escape(number)}\. .+$", TEXT, re.M)
    assert start is not None, f"no section {number}"
    end = re.search(r"^## ", TEXT[start.end() :], re.M)
    return TEXT[start.end() : start.end() + end.start() if end else len(TEXT)]


def test_sections_keep_their_numbers() -> None:
    numbers = re.findall(r"^## (\d+a?)\. ", TEXT, re.M)
    assert numbers == ["1", "2", "2a", "3", "4", "5", "6", "6a", "7", "8", "9", "10"]


def test_every_method_and_error_code_is_in_section_5() -> None:
    api = _section("5")
    methods = server.LocalApi(None, "unused").methods  # type: ignore[arg-type]
    assert len(methods) >= 18
    for method in methods:
        assert f"| `{method}` |" in api, f"method {method} is not in §5's table"
    for code, number in ERROR_CODES.items():
        row = re.search(rf"^\| `{code.value}` \| (\S+) \|", api, re.M)
        assert row is not None, f"error {code.value} is not in §5's table"
        assert row.group(1).replace("−", "-") == str(number), code.value


def test_per_connection_limits_match_the_code() -> None:
    api = _section("5")
    assert jsonrpc.MAX_LINE_BYTES == 64 * 1024 and "64 KiB" in api
    assert f"{server.MAX_IN_FLIGHT:,}".replace(",", " ") in api
    assert f"{server.MAX_EVENT_BACKLOG:,}".replace(",", " ") in api
    assert f"at most {server.MAX_CONNECTIONS_PER_USER} open connections" in api
    assert server.MAX_UNSENT_BYTES == 4 * 1024 * 1024 and "less than 4 MiB" in api
    assert f"within {server.LINE_TIMEOUT_S:g} s" in api
    assert f"for {server.UNSENT_DROP_AFTER_S:g} s" in api
    for method in sorted(server.LocalApi(None, "unused").admin_methods):  # type: ignore[arg-type]
        assert f"`{method}`" in api.split("**Administrative methods.**")[1].split("\n\n")[0]


def test_scenario_format_matches_the_parser() -> None:
    gpus = _section("6")
    fields = set(scenario.SimGpu.__dataclass_fields__) - {"processes"}
    for field in fields:
        assert re.search(rf"^#? ?{field} = ", gpus, re.M), f"scenario field {field} missing"
    for value in scenario.MEMORY_APIS + tuple(e for e in scenario.ERRORS if e):
        assert f'"{value}"' in gpus, f"scenario value {value} missing"


def test_signature_context_and_description_limits() -> None:
    reports = _section("7")
    assert signing.REPORT_CONTEXT.decode().replace("\x00", "\\0") in reports
    assert signing.REQUEST_CONTEXT.decode().replace("\x00", "\\0") in reports
    privacy = _section("8")
    for field, limit in MAX_LENGTHS.items():
        assert f"{field} {limit}" in privacy, f"{field}'s limit {limit} is not in §8"
