"""What the hot commands load before they talk to the broker (issue 44, start-up;
docs/architecture.md §10): `rbroker status --json` (scripts, monitors) loads no rich, no
pydantic and no asyncio; `rbroker run` (one per wrapped job) no pydantic, no asyncio and no
rich (it loads rich only to say something: a wait, a refusal, a lost lease). A
fresh interpreter shows it; the names kept out are what the import graph must not grow
back. As they run against a broker, neither loads argparse (a plain command line), logging,
typing, dataclasses, orjson, uuid, datetime or pathlib either."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import BrokerProcess

pytestmark = pytest.mark.contract  # a fresh interpreter: nothing loaded before

PROBE = """
import json, sys
import rbroker.cli.main, rbroker.cli.status
status = sorted(sys.modules)
import rbroker.cli.run
print(json.dumps({"status": status, "run": sorted(sys.modules)}))
"""


def _banned(modules: list[str], banned: tuple[str, ...]) -> list[str]:
    return sorted({m for m in modules for b in banned if m == b or m.startswith(b + ".")})


def test_status_json_and_run_load_no_pydantic_asyncio_or_rich() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    heavy = ("pydantic", "asyncio", "PySide6", "psutil", "rbroker.broker", "rbroker_server")
    assert _banned(loaded["status"], (*heavy, "rich", "rbroker.cli.bookings")) == []
    assert _banned(loaded["run"], (*heavy, "rich")) == []
    assert "rbroker.cli.run" in loaded["run"]


# -- the commands as they run (issue 44's second round) ----------------------------------------
NOT_ON_A_QUICK_START = (
    "argparse",  # quick_args reads a plain command line
    "gettext",
    "shutil",
    "logging",  # rbroker.base.lazy: loaded with the first message
    "typing",
    "dataclasses",
    "inspect",
    "orjson",  # the standard library's json for the short client commands
    "msgspec",
    "uuid",
    "datetime",
    "pathlib",
    "platformdirs",
    "pydantic",
    "rich",
    "asyncio",
    "rbroker_protocol.errors",  # the wire's error codes: with the first error read
    "rbroker_protocol.jsonrpc",
    "rbroker_protocol.results",
    "rbroker.base.when",
    "rbroker.cli.bookings",
    "rbroker.cli.install_system",
    "rbroker.cli.service_cmd",
    "rbroker.tray",
    "rbroker.broker",
    "rbroker_server",
)
"""What `rbroker status --json` and `rbroker run -- CMD` must not load when all goes well, as
the commands run (`python -X importtime`), beyond what a bare interpreter loads."""


def _loaded_by(args: list[str]) -> set[str]:
    """The modules `python -I -X importtime ARGS` imports, from its stderr."""
    done = subprocess.run(
        [sys.executable, "-I", "-X", "importtime", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize(
    "command",
    [["status", "--json"], ["run", "--mib", "64", "--", sys.executable, "-I", "-c", "pass"]],
    ids=["status --json", "run"],
)
def test_status_json_and_run_load_only_what_their_path_needs(
    broker: BrokerProcess, command: list[str]
) -> None:
    bare = _loaded_by(["-c", "pass"])
    loaded = _loaded_by(["-m", "rbroker", command[0], "--socket", broker.socket, *command[1:]])
    # it did talk to the broker (importtime names what `import` statements load: not what
    # `rbroker`'s names load through importlib, but what those import)
    assert "rbroker.transport.unix" in loaded
    assert _banned(sorted(loaded - bare), NOT_ON_A_QUICK_START) == []
