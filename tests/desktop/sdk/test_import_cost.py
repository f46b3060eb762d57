"""What `import rbroker` and the SDK's lease load (issue 44, start-up; docs/architecture.md
§10): a job that imports rbroker must not pay for asyncio, pydantic, rich, Qt, NVML or the
broker before it asks for anything, so the import graph is kept from growing back here by
naming what each step must not load (a fresh interpreter: nothing loaded before). In a quick
start (a short command-line client) the lease loads no logging, typing, dataclasses, uuid or
orjson either; in a job it loads what its calls may need with itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
import rbroker
after_import = sorted(sys.modules)
rbroker.lease, rbroker.RBrokerError, rbroker.Client, rbroker.book, rbroker.job
after_lease = sorted(sys.modules)
print(json.dumps({"import": after_import, "lease": after_lease}))
"""

NEVER = ("pydantic", "rich", "PySide6", "pynvml", "psutil", "httpx", "rbroker_server")
"""Never loaded by the SDK's lease, booking and job (the broker validates the requests)."""

NOT_ON_IMPORT = (*NEVER, "asyncio", "typing", "rbroker._lease", "rbroker.client", "socket")
"""Not loaded by `import rbroker` alone: its names load on first use."""

NOT_FOR_A_LEASE = (*NEVER, "asyncio", "rbroker.broker", "rbroker.tray", "rbroker.cli")
"""Not loaded by `rbroker.lease` and friends: asyncio only for `alease`."""


def _top(modules: list[str], banned: tuple[str, ...]) -> list[str]:
    return sorted({m for m in modules for b in banned if m == b or m.startswith(b + ".")})


@pytest.mark.contract  # a fresh interpreter: nothing loaded before
def test_import_rbroker_loads_only_itself_and_a_lease_no_asyncio_pydantic_or_rich() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert _top(loaded["import"], NOT_ON_IMPORT) == []
    assert [m for m in loaded["import"] if m.startswith("rbroker")] == ["rbroker"]
    assert _top(loaded["lease"], NOT_FOR_A_LEASE) == []
    assert "rbroker._lease" in loaded["lease"]  # the probe did reach the SDK


def test_every_name_of_the_sdk_resolves_and_unknown_ones_are_attribute_errors() -> None:
    import rbroker

    for name in rbroker.__all__:
        assert getattr(rbroker, name) is not None, name
    assert set(rbroker.__all__) <= set(dir(rbroker))
    try:
        rbroker.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no attribute 'no_such_name'" in str(exc)
    else:
        raise AssertionError("an unknown name must be an AttributeError")


LEASE_PROBE = """
import json, sys
import rbroker
if sys.argv[1] == "quick":
    import rbroker.base.lazy
    rbroker.base.lazy.quick_start()
rbroker.lease, rbroker.Lease, rbroker.RBrokerError, rbroker.Client
print(json.dumps(sorted(sys.modules)))
"""

LOADED_WITH_THE_LEASE = ("logging", "orjson", "rbroker_protocol.errors", "rbroker_protocol.jsonrpc")
"""What the SDK's lease loads with itself in a job (no quick start) though only some calls
use it: a job that imports the SDK and then drops its privileges imports nothing after."""

NOT_IN_A_QUICK_START = (
    *NOT_FOR_A_LEASE,
    *LOADED_WITH_THE_LEASE,  # on first use there
    "typing",
    "dataclasses",  # rbroker.Lease is written out
    "inspect",
    "uuid",  # a request's key from os.urandom
    "datetime",
    "pathlib",
    "platformdirs",
    "rbroker_protocol.results",
)
"""Not loaded by `rbroker.lease` (and `Lease`, the errors, `Client`) in a quick start, as the
short command-line clients make it (`rbroker.base.lazy`, issue 44)."""


def _loaded(mode: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-I", "-c", LEASE_PROBE, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout)
    assert "rbroker._lease" in loaded and "rbroker.client.local" in loaded
    return loaded


@pytest.mark.contract  # a fresh interpreter: nothing loaded before
def test_a_jobs_lease_loads_what_its_calls_need_and_a_quick_start_does_not() -> None:
    job = _loaded("job")
    assert [m for m in LOADED_WITH_THE_LEASE if m not in job] == []
    assert _top(job, NOT_FOR_A_LEASE) == []
    assert _top(_loaded("quick"), NOT_IN_A_QUICK_START) == []
