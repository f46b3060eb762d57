"""Prometheus' own tool on what rbroker ships: `promtool check metrics` on a real scrape of
`/metrics`, `promtool check rules` on the example alerts, and `promtool test rules`
evaluating every expression of the Grafana dashboard against that scrape recorded as two
coordinator processes (two `instance`s of the same series): each gives what one process
alone means (no doubled sums, no many-to-many matching), with the names people read on the
job rows, and an offline computer not counted. Then a Prometheus server scrapes two
coordinator processes on one database (SQLite and PostgreSQL) with a valid token beside a
forgotten job with a revoked one: the valid scrapes stay up and the panels give the same.
Needs promtool and prometheus (Debian: prometheus), required under CI (.ci/run installs
them)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from prometheus_client.parser import text_string_to_metric_families

from rbroker_protocol.reports import LeaseReport
from rbroker_server.admin import operations as admin
from rbroker_server.db import engine as db
from rbroker_server.reports import statements as st
from tests.fakes.reports import GPU_A, gpu_report, payload
from tests.server.conftest import Coordinator
from tests.server.test_grafana import DASHBOARD, _expressions
from tests.server.test_web import _report_with_everything

ALERTS = Path(__file__).parents[2] / "packaging" / "prometheus" / "rbroker-alerts.yml"
INSTANCES = ("coordinator-a:8787", "coordinator-b:8787")

Labels = tuple[tuple[str, str], ...]


def promtool(program: str = "promtool") -> str:
    path = shutil.which(program)
    if path is None:
        reason = f"needs {program} (Debian: prometheus)"
        if os.environ.get("CI"):
            pytest.fail(reason + " (.ci/run installs it)")
        pytest.skip(reason)
    return path


def _run(*args: str, stdin: str | None = None, cwd: Path | None = None) -> str:
    out = subprocess.run(
        [promtool(), *args], input=stdin, capture_output=True, text=True, timeout=60, cwd=cwd
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def _series(name: str, labels: dict[str, str]) -> str:
    def quoted(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    return name + "{" + ", ".join(f"{k}={quoted(v)}" for k, v in sorted(labels.items())) + "}"


def _fleet(c: Coordinator) -> None:
    """Group alpha with one online computer (a GPU, a lease, bookings, a job with a total),
    one whose broker stopped (offline, a lease at its last report) and one that went silent
    (stale: its last report halfway between `stale_after_s` and `offline_after_s` ago)."""
    c.group("alpha")
    _report_with_everything(c, "alpha", "lab-a")
    stopped = c.enroll("alpha", "lab-b")
    lease = LeaseReport(lease_id="l9", gpu_uuids=[GPU_A], granted_mib=1000, owner="bo")
    for stopping in (False, True):
        r = stopped.report(payload("lab-b", gpus=[gpu_report()], leases=[lease], stopping=stopping))
        assert r.status_code == 200 and r.json()["applied"], r.text
    silent = c.enroll("alpha", "lab-c")
    lease = LeaseReport(lease_id="l7", gpu_uuids=[GPU_A], granted_mib=2000, owner="cy")
    r = silent.report(payload("lab-c", gpus=[gpu_report()], leases=[lease]))
    assert r.status_code == 200 and r.json()["applied"], r.text
    ago_s = (c.settings.stale_after_s + c.settings.offline_after_s) / 2
    with c.engine.begin() as conn:
        conn.execute(
            sa.update(st.COMPUTERS)
            .where(st.COMPUTERS.c.id == silent.id)
            .values(last_seen_at=db.utcnow() - timedelta(seconds=ago_s))
        )


def _samples(text: str) -> dict[tuple[str, Labels], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def scrape(coordinator_factory: Callable[..., Coordinator]) -> str:
    """A scrape of `_fleet` by a group that also reads the coordinator's own health."""
    coordinator = coordinator_factory(health_groups=("alpha",))
    _fleet(coordinator)
    r = coordinator.http.get("/metrics", headers=coordinator.viewer("alpha"))
    assert r.status_code == 200, r.text
    return r.text


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # /metrics reads no SQL of its own
def test_promtool_checks_a_scrape_and_the_alerts(scrape: str) -> None:
    assert "rbroker_server_reports_applied_total" in scrape
    _run("check", "metrics", stdin=scrape)
    assert "SUCCESS" in _run("check", "rules", str(ALERTS))


def _expected(samples: dict[tuple[str, Labels], float]) -> dict[str, list[tuple[Labels, float]]]:
    """What each dashboard expression means for the recorded scrape, from its samples."""

    def of(name: str, **match: str) -> list[tuple[dict[str, str], float]]:
        return [
            (dict(labels), v)
            for (n, labels), v in samples.items()
            if n == name and all(dict(labels).get(k) == x for k, x in match.items())
        ]

    def pick(labels: dict[str, str], *keys: str) -> Labels:
        return tuple(sorted((k, labels[k]) for k in keys))

    online = {
        lab["computer_id"] for lab, v in of("rbroker_computer_freshness", state="online") if v
    }
    fresh = {
        lab["computer_id"]: {"online": "now", "stale": "last known"}[lab["state"]]
        for lab, v in of("rbroker_computer_freshness")
        if v and lab["state"] != "offline"
    }
    offline = sum(1 for lab, v in of("rbroker_computer_freshness", state="offline") if v)

    def marked(labels: dict[str, str], *keys: str) -> Labels:
        """`keys` of `labels` and the freshness the panel joins in."""
        return tuple(sorted((*pick(labels, *keys), ("freshness", fresh[labels["computer_id"]]))))

    gpu = ("computer", "computer_id", "gpu_uuid")

    def per_computer(name: str) -> list[tuple[Labels, float]]:
        sums: dict[Labels, float] = {}
        for labels, v in of(name):
            key = marked(labels, "computer", "computer_id")
            sums[key] = sums.get(key, 0.0) + v
        return sorted(sums.items())

    headroom = {pick(lab, *gpu): v for lab, v in of("rbroker_gpu_headroom_bytes")}
    usable: dict[Labels, float] = {}
    for lab, v in of("rbroker_gpu_total_bytes"):
        computer = marked(lab, "computer", "computer_id")
        usable[computer] = usable.get(computer, 0.0) + v - headroom[pick(lab, *gpu)]
    info = {
        pick(lab, "computer_id", "job_id"): pick(lab, "project", "purpose")
        for lab, _ in of("rbroker_job_info")
    }

    def by_job(name: str) -> dict[Labels, float]:
        return {pick(lab, "computer_id", "job_id"): v for lab, v in of(name)}

    failed, items = by_job("rbroker_job_items_failed_total"), by_job("rbroker_job_items")
    jobs = []
    for labels, done in of("rbroker_job_items_completed_total"):
        key = pick(labels, "computer_id", "job_id")
        names = tuple(sorted((*pick(labels, "computer", "computer_id", "job_id"), *info[key])))
        jobs.append((names, (done + failed[key]) / items[key]))  # times rbroker_job_info's 1
    rates = [(names, 0.0) for names, _ in jobs]  # counters constant over the recording
    return {
        "A:Computers online": [((), float(len(online)))],
        "A:Computers stale or offline": [((), float(len(fresh) + offline - len(online)))],
        "A:Active leases": [
            ((), sum(v for lab, v in of("rbroker_computer_leases") if lab["computer_id"] in online))
        ],
        "A:Waiting requests": [((), 0.0)],
        "A:Available to a new lease, per GPU": [
            (marked(lab, "computer", "computer_id", "gpu_uuid", "gpu_index"), v)
            for lab, v in of("rbroker_gpu_available_bytes")
        ],
        "A:In use and granted-not-yet-used, per computer": per_computer("rbroker_gpu_in_use_bytes"),
        "B:In use and granted-not-yet-used, per computer": per_computer(
            "rbroker_gpu_outstanding_bytes"
        ),
        "C:In use and granted-not-yet-used, per computer": sorted(usable.items()),
        "A:GPU state": [
            (marked(lab, "computer", "computer_id", "gpu_index", "state"), 1.0)
            for lab, v in of("rbroker_gpu_state")
            if v == 1
        ],
        "A:Leases and waiting requests, per computer": [
            (marked(lab, "computer", "computer_id"), v) for lab, v in of("rbroker_computer_leases")
        ],
        "B:Leases and waiting requests, per computer": [
            (marked(lab, "computer", "computer_id"), v)
            for lab, v in of("rbroker_computer_waiting_requests")
        ],
        "A:Age of the last report": [
            (pick(lab, "computer", "computer_id"), v)
            for lab, v in of("rbroker_computer_last_report_age_seconds")
        ],
        "A:Items per second, per job": rates,
        "A:Job progress": jobs,
    }


def _dashboard_test(
    per_instance: list[dict[tuple[str, Labels], float]],
    expected: dict[str, list[tuple[Labels, float]]],
    tmp_path: Path,
) -> None:
    """`promtool test rules`: every panel of the dashboard, evaluated on the samples each
    instance of `INSTANCES` served (`per_instance`, in that order), gives `expected`."""
    input_series = [
        {
            "series": _series(name, {**dict(labels), "instance": instance, "job": "rbroker"}),
            "values": f"{value!r}x15",
        }
        for instance, samples in zip(INSTANCES, per_instance, strict=True)
        for (name, labels), value in samples.items()
    ]
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    tests: list[dict[str, Any]] = []
    for where, expr in _expressions(dashboard):
        if where.startswith("variable"):
            continue
        # "panel 'Job progress' target A" -> "A:Job progress"
        title, ref = where.removeprefix("panel '").rsplit("' target ", 1)
        key = f"{ref}:{title}"
        assert key in expected, f"no expectation for {where}"
        tests.append(
            {
                "expr": expr.replace("$computer", ".*"),
                "eval_time": "10m",
                "exp_samples": [
                    {"labels": _series("", dict(labels)), "value": value}
                    for labels, value in expected.pop(key)
                ],
            }
        )
    assert not expected, f"panels gone: {sorted(expected)}"
    (tmp_path / "rules.yml").write_text(ALERTS.read_text(encoding="utf-8"), encoding="utf-8")
    spec = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input_series, "promql_expr_test": tests}],
    }
    (tmp_path / "dashboard_test.yml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    assert "SUCCESS" in _run("test", "rules", "dashboard_test.yml", cwd=tmp_path)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_dashboard_means_one_process_when_two_are_scraped(scrape: str, tmp_path: Path) -> None:
    promtool()
    samples = _samples(scrape)
    expected = _expected(samples)
    # lab-a online, lab-b offline, lab-c stale (its series marked `last known`)
    assert expected["A:Computers online"] == [((), 1.0)]
    assert expected["A:Computers stale or offline"] == [((), 2.0)]
    marks = {dict(labels)["freshness"] for labels, _ in expected["A:GPU state"]}
    assert marks == {"now", "last known"}
    _dashboard_test([samples, samples], expected, tmp_path)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_dashboard_counts_a_computer_once_while_two_processes_disagree(
    scrape: str, tmp_path: Path
) -> None:
    """Two processes scraped a second apart while a computer turns stale: one says stale,
    the other online. The computer is online while any process says so: counted once, its
    series marked `now` (a join on the state label failed with many-to-many there, and the
    stale-or-offline stat counted it beside the online one)."""
    promtool()
    samples = _samples(scrape)
    stale = {
        dict(labels)["computer_id"]
        for (name, labels), v in samples.items()
        if name == "rbroker_computer_freshness" and dict(labels)["state"] == "stale" and v
    }
    assert len(stale) == 1
    other = dict(samples)
    for (name, labels), _ in samples.items():
        if name == "rbroker_computer_freshness" and dict(labels)["computer_id"] in stale:
            other[(name, labels)] = 1.0 if dict(labels)["state"] == "online" else 0.0
    expected = _expected(other)  # what the process that says online means
    assert expected["A:Computers online"] == [((), 2.0)]
    assert expected["A:Computers stale or offline"] == [((), 1.0)]
    _dashboard_test([samples, other], expected, tmp_path)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.contract
def test_a_prometheus_server_scraping_two_coordinators_on_one_database(
    coordinator_factory: Callable[..., Coordinator], tmp_path: Path
) -> None:
    """Prometheus itself scrapes two `rbroker-server serve` processes on one database with
    the valid token, and a forgotten job with a revoked token from the same address: the
    valid scrapes stay up, the dashboard's panels mean one process, and each process counts
    its own health (all four reports went to the first one)."""
    prometheus = promtool("prometheus")
    # lab-a reports once: it stays online for the whole test however slow the machine is
    # (with the default 15 s a loaded run once saw it stale before Prometheus was ready)
    kept = {"stale_after_s": 600.0, "offline_after_s": 1200.0, "health_groups": ("alpha",)}
    one = coordinator_factory(process=True, **kept)
    two = coordinator_factory(process=True, **kept)
    _fleet(one)
    valid = one.tokens["alpha"]
    revoked = admin.create_token(one.engine, "alpha", "old scrape job").text
    assert admin.revoke_token(one.engine, "alpha", revoked)
    one.fleet("alpha")  # the valid scraper was there first
    targets = [c.url.removeprefix("http://") for c in (one, two)]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "rbroker",
                "authorization": {"credentials": valid},
                "static_configs": [{"targets": targets}],
            },
            {
                "job_name": "forgotten",
                "scrape_interval": "200ms",
                "scrape_timeout": "200ms",
                "authorization": {"credentials": revoked},
                "static_configs": [{"targets": targets}],
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api/v1/query"
    with (tmp_path / "prometheus.log").open("wb") as log:
        server = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def query(expr: str) -> list[dict[str, Any]]:
            r = httpx.get(api, params={"query": expr}, timeout=5)
            body = r.json()
            assert body["status"] == "success", (expr, body)
            return list(body["data"]["result"])

        deadline = time.monotonic() + 30
        while True:
            try:  # 503 with a line of text until it is ready
                ready = httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=5).status_code
                if ready == 200 and len(query('rbroker_job_info{job="rbroker"}')) == 2:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.5)
        time.sleep(8)  # the forgotten job has failed 80 times by now
        assert query('max(up{job="forgotten"})')[0]["value"][1] == "0"
        up = query('min_over_time(up{job="rbroker"}[6s])')
        assert [u["value"][1] for u in up] == ["1", "1"], up
        applied = {
            sample["metric"]["instance"]: sample["value"][1]
            for sample in query('rbroker_server_reports_applied_total{job="rbroker"}')
        }
        assert applied == {targets[0]: "4", targets[1]: "0"}, applied
        # the panels mean one process (what one scrape says), whichever process it was
        r = one.http.get("/metrics", headers=one.viewer("alpha"))
        expected = _expected(_samples(r.text))
        dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
        for where, expr in _expressions(dashboard):
            if where.startswith("variable"):
                continue
            title, ref = where.removeprefix("panel '").rsplit("' target ", 1)
            got = {
                tuple(sorted((k, v) for k, v in sample["metric"].items() if k != "__name__")): (
                    float(sample["value"][1])
                )
                for sample in query(expr.replace("$computer", ".*"))
            }
            want = dict(expected[f"{ref}:{title}"])
            assert set(got) == set(want), (where, got, want)
            if title != "Age of the last report":
                assert got == want, (where, got, want)
    finally:
        server.terminate()
        server.wait(timeout=30)
