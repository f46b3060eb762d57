"""Three brokers (separate processes, data dirs and keys) report to one coordinator process.

The group's fleet shows the three computers with their GPUs and leases; `rbroker fleet`
prints it with a viewer token and signed by a computer's own key, and with `--room` where
there is room; nothing the workers
carry (command line, environment, pid, process name) reaches the coordinator (architecture.md §8).
"""

from __future__ import annotations

import io
import json
import os
import pwd
import re
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from rbroker.base.display import fmt_mib
from rbroker.cli.views import fleet_view
from rbroker_protocol.fleet import FleetView
from tests.conftest import wait_until
from tests.e2e.conftest import (
    CoordinatorProcess,
    UplinkBroker,
    Worker,
    by_name,
    py_env,
    rbroker_cli,
)
from tests.fakes.gpu_scenarios import gpu, scenario

PLANTED_CMDLINE = "PLANTED-CMDLINE-7f3a"
PLANTED_ENV = "PLANTED-ENV-91c2"

SCENARIOS = {
    "lab-a": scenario(gpu("GPU-a0000000-0000-0000-0000-000000000001", name="Simulated RTX 4090")),
    "lab-b": scenario(
        gpu("GPU-b0000000-0000-0000-0000-000000000001", name="Simulated RTX 4090"),
        gpu("GPU-b0000000-0000-0000-0000-000000000002", name="Simulated A6000", total_mib=49152),
    ),
    "lab-c": scenario(
        gpu("GPU-c0000000-0000-0000-0000-000000000001", name="Simulated RTX 3060", total_mib=12288)
    ),
}

# computer -> leases (MiB, project, session, purpose, MiB the worker really uses)
LEASES = {
    "lab-a": [
        (4096, "vision", "run-42", "fine-tune ViT-B", 1024),
        (2048, "nlp", "eval-7", "evaluate checkpoints", 0),
    ],
    "lab-b": [(8192, "speech", "sweep-3", "train conformer", 3000)],
    "lab-c": [(6000, "vision", "run-43", "embed corpus", 0)],
}

FORBIDDEN_KEYS = {"pid", "pids", "cmdline", "cmd", "env", "environ", "holder", "processes", "exe"}


def _walk(obj: Any, path: str = "") -> Iterator[tuple[str, str | None, Any]]:
    """(path, key, value) for every value in a JSON document."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{path}.{k}", k, v
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield f"{path}[{i}]", None, v
            yield from _walk(v, f"{path}[{i}]")


def _audit_json(doc: Any, where: str, pids: set[int]) -> None:
    """No forbidden key anywhere; inside lease, queue and job entries no value is a pid
    (MiB figures are checked against what was leased elsewhere)."""
    for path, key, value in _walk(doc):
        assert key is None or key.lower() not in FORBIDDEN_KEYS, f"{where}: key {path}"
        in_entry = any(f".{name}[" in path for name in ("leases", "queue", "jobs"))
        if in_entry and not (key or "").endswith("_mib") and "observed_mib" not in path:
            if isinstance(value, bool):
                continue
            if isinstance(value, int | float) and value in pids:
                raise AssertionError(f"{where}: pid {value} at {path}")
            if isinstance(value, str) and any(value == str(p) for p in pids):
                raise AssertionError(f"{where}: pid {value} at {path}")


def _planted(pids: set[int]) -> list[bytes]:
    return [
        PLANTED_CMDLINE.encode(),
        PLANTED_ENV.encode(),
        b"PLANTED_ENV",
        b"lease_worker",  # the worker's process name / script
        sys.executable.encode(),
        *(f'"pid":{p}'.encode() for p in pids),
        *(f'"pid": {p}'.encode() for p in pids),
    ]


def test_three_brokers_one_fleet_nothing_private_stored_fleet_cli(
    coordinator: CoordinatorProcess,
    uplink_broker: Callable[..., UplinkBroker],
    lease_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    env = {"PLANTED_ENV": PLANTED_ENV}
    brokers = {
        name: uplink_broker(coordinator, name, scenario=text, env=env)
        for name, text in SCENARIOS.items()
    }
    workers: list[Worker] = []
    for name, leases in LEASES.items():
        for mib, project, session, purpose, use in leases:
            workers.append(
                lease_worker(
                    brokers[name].broker,
                    mib,
                    project,
                    session,
                    purpose,
                    use_mib=use,
                    extra=(f"--api-token={PLANTED_CMDLINE}", "--verbose"),
                    env=env,
                )
            )
    pids = {w.pid for w in workers} | {b.broker.proc.pid for b in brokers.values()}
    owner = pwd.getpwuid(os.getuid()).pw_name

    def expected_seen() -> dict[str, Any] | None:
        fleet = coordinator.fleet()
        computers = by_name(fleet)
        for name, leases in LEASES.items():
            c = computers.get(name)
            if c is None or c["freshness"]["state"] != "online":
                return None
            seen = {
                (x["granted_mib"], x["project"], x["session"], x["purpose"]) for x in c["leases"]
            }
            if seen != {lease[:4] for lease in leases}:
                return None
            observed = sorted(sum(x["observed_mib"].values()) for x in c["leases"])
            if observed != sorted(lease[4] for lease in leases):
                return None
        return fleet

    fleet = wait_until(expected_seen, timeout_s=20, interval_s=0.3)
    assert isinstance(fleet, dict)
    (tmp_path / "fleet.json").write_text(json.dumps(fleet, indent=2))
    assert fleet["group"] == coordinator.group
    computers = by_name(fleet)
    assert sorted(computers) == ["lab-a", "lab-b", "lab-c"]
    assert len({c["id"] for c in computers.values()}) == 3
    for name, c in computers.items():
        assert c["id"] == brokers[name].computer_id
        assert c["telemetry_source"] == "simulated"
        assert c["reports_applied"] >= 1
        want_gpus = {line.split('"')[1] for line in SCENARIOS[name].splitlines() if "uuid" in line}
        assert {g["uuid"] for g in c["gpus"]} == want_gpus
        for g in c["gpus"]:
            assert g["total_mib"] > 0 and g["available_mib"] is not None
            assert g["state"] == ("busy" if g["leases"] else "free")
        for lease in c["leases"]:
            assert lease["owner"] == owner
            assert set(lease["gpu_uuids"]) <= want_gpus
    lab_a_gpu = computers["lab-a"]["gpus"][0]
    assert lab_a_gpu["leases"] == 2
    assert lab_a_gpu["outstanding_mib"] == 4096 - 1024 + 2048

    # the broker's own view of its link, and `rbroker status`
    for b in brokers.values():
        link = b.link()
        assert link["link"] == "ok", link
        assert link["computer_id"] == b.computer_id
    done = rbroker_cli("status", "--socket", brokers["lab-a"].broker.socket, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"]["coordinator"]["link"] == "ok"
    done = rbroker_cli("status", "--socket", brokers["lab-a"].broker.socket)
    assert "coordinator: ok" in done.stdout

    # privacy: every byte the coordinator keeps, and every API answer
    answers: list[tuple[str, bytes]] = []
    for path in ["/api/v1/fleet"] + [
        f"/api/v1/computers/{b.computer_id}{suffix}"
        for b in brokers.values()
        for suffix in ("", "/history")
    ]:
        r = coordinator.get(path)
        assert r.status_code == 200, r.text
        answers.append((path, r.content))
        _audit_json(r.json(), path, pids)
    stored = [(str(p), p.read_bytes()) for p in coordinator.data_dir.rglob("*") if p.is_file()]
    assert any(p.endswith("rbroker-server.db") for p, _ in stored)
    for where, data in answers + stored:
        for needle in _planted(pids):
            assert needle not in data, f"{needle!r} found in {where}"
    db = sqlite3.connect(f"file:{coordinator.db_path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT id, state, flags FROM computers").fetchall()
        history = db.execute("SELECT computer_id, data FROM history_points").fetchall()
    finally:
        db.close()
    ours = {b.computer_id for b in brokers.values()}
    rows = [r for r in rows if r[0] in ours]  # the coordinator is shared with other groups
    history = [h for h in history if h[0] in ours]
    assert len(rows) == 3 and history
    for cid, state, flags in rows:
        _audit_json(json.loads(state), f"computers.state[{cid}]", pids)
        assert flags is None or json.loads(flags) == [], flags
    for cid, data in history:
        _audit_json(json.loads(data), f"history_points[{cid}]", pids)

    _check_fleet_cli(coordinator, brokers, tmp_path)


def _check_fleet_cli(
    coordinator: CoordinatorProcess, brokers: dict[str, UplinkBroker], tmp_path: Path
) -> None:
    """`rbroker fleet` with a viewer token, signed with a computer's key, as a table, and
    its failures."""
    a, b = brokers["lab-a"], brokers["lab-b"]
    wide = py_env(COLUMNS="200")
    done = rbroker_cli(
        "fleet", "--url", coordinator.url, "--token", coordinator.token, "--json",
        "--data-dir", str(tmp_path / "not-enrolled"), env=wide,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    by_token = json.loads(done.stdout)
    assert [c["name"] for c in by_token["computers"]] == ["lab-a", "lab-b", "lab-c"]

    done = rbroker_cli("fleet", "--data-dir", str(b.broker.data_dir), "--json")
    assert done.returncode == 0, done.stderr
    signed = json.loads(done.stdout)
    assert signed["group"] == by_token["group"] == coordinator.group
    assert [c["id"] for c in signed["computers"]] == [c["id"] for c in by_token["computers"]]
    lease = {x["session"]: x for x in by_name(signed)["lab-a"]["leases"]}["run-42"]
    assert (lease["project"], lease["purpose"], lease["granted_mib"]) == (
        "vision",
        "fine-tune ViT-B",
        4096,
    )

    # where is there room for 30 000 MiB: only lab-b's 48 GiB GPU, signed by lab-b's key
    done = rbroker_cli("fleet", "--data-dir", str(b.broker.data_dir), "--room", "30000", env=wide)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("lab-")]
    assert len(rows) == 1 and re.split(r"\s{2,}", rows[0])[:2] == ["lab-b", "online"], rows
    assert rows[0].endswith("GPU-b0000000-0000-0000-0000-000000000002") and "49152" in rows[0]

    done = rbroker_cli("fleet", "--data-dir", str(a.broker.data_dir), env=wide)
    assert done.returncode == 0, done.stderr
    # stdout is a pipe: plain rows, whole, with the grant as a bare number
    row = next(line for line in done.stdout.splitlines() if "fine-tune ViT-B" in line)
    owner = pwd.getpwuid(os.getuid()).pw_name
    assert re.split(r"\s{2,}", row)[:6] == [
        "lab-a",
        owner,
        "vision",
        "run-42",
        "fine-tune ViT-B",
        "4096",
    ], row
    assert "│" not in done.stdout and "…" not in done.stdout
    for width in (80, 120):  # in a terminal: every number whole, every line within the width
        out = io.StringIO()
        Console(file=out, width=width, force_terminal=True, color_system=None).print(
            fleet_view(FleetView.model_validate(signed))
        )
        text = out.getvalue()
        assert all(len(line) <= width for line in text.splitlines()), text
        for c in signed["computers"]:
            for g in c["gpus"]:
                assert fmt_mib(g["total_mib"]) in text and fmt_mib(g["available_mib"]) in text
        assert "4 096" in text and "GPU 0" in text and "freshness" in text, text
    for text in (
        f"Fleet of group {coordinator.group}",
        "lab-a",
        "lab-b",
        "lab-c",
        "online",
        "fine-tune ViT-B",
    ):
        assert text in done.stdout, done.stdout

    key_file = Path(a.broker.data_dir) / "computer.key"
    key_file.chmod(0o644)
    done = rbroker_cli("fleet", "--data-dir", str(a.broker.data_dir))
    key_file.chmod(0o600)
    assert done.returncode == 1, done.stderr
    assert "readable by others" in done.stderr and "Traceback" not in done.stderr, done.stderr

    done = rbroker_cli("fleet", "--url", coordinator.url, "--token", "rbv_x_nope")
    assert done.returncode == 1
    assert "401" in done.stderr
    done = rbroker_cli(
        "fleet", "--url", coordinator.url, "--data-dir", str(tmp_path / "not-enrolled")
    )
    assert done.returncode == 1
    assert "--token" in done.stderr
