"""The Grafana dashboard shipped in packaging/grafana/rbroker.json queries only what a
running coordinator's `/metrics` serves: every metric name its panels and variables use,
and every label they select, group or join by, is in the exposition."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import Coordinator
from tests.server.test_web import _report_with_everything

DASHBOARD = Path(__file__).parents[2] / "packaging" / "grafana" / "rbroker.json"

METRIC = re.compile(r"\brbroker_[a-z0-9_]+")
SELECTOR = re.compile(r"\b(rbroker_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LABEL_VALUES = re.compile(r"label_values\(\s*(rbroker_[a-z0-9_]+)\s*,\s*([A-Za-z0-9_]+)\s*\)")
# the tail of `label_replace(v, "dst", "replacement", "src", "regex")`: dst is made, src read
LABEL_REPLACE = re.compile(
    r',\s*"([A-Za-z_]\w*)"\s*,\s*"[^"]*"\s*,\s*"([A-Za-z_]\w*)"\s*,\s*"[^"]*"\s*\)'
)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable."""
    for p in _panels(dashboard["panels"]):
        for t in p.get("targets") or []:
            yield f"panel {p['title']!r} target {t['refId']}", t["expr"]
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            yield f"variable {v['name']!r}", query


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # /metrics reads no SQL of its own
def test_the_dashboard_uses_only_served_metrics_and_labels(coordinator: Coordinator) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    coordinator.group("alpha")
    _report_with_everything(coordinator, "alpha", "lab-a")  # a GPU, a lease, a job
    r = coordinator.http.get("/metrics", headers=coordinator.viewer("alpha"))
    assert r.status_code == 200, r.text
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    expressions = list(_expressions(dashboard))
    assert len(expressions) >= 10
    problems = []
    for where, expr in expressions:
        names = set(METRIC.findall(expr))
        if not names:
            problems.append(f"{where}: no rbroker metric in {expr!r}")
        for name in sorted(names - set(labels)):
            problems.append(f"{where}: {name} is not served by /metrics")
        for name, body in SELECTOR.findall(expr):
            for label in MATCHER.findall(body):
                if name in labels and label not in labels[name]:
                    problems.append(f"{where}: {name} has no label {label!r}")
        for name, label in LABEL_VALUES.findall(expr):
            if name in labels and label not in labels[name]:
                problems.append(f"{where}: {name} has no label {label!r}")
        known = set().union(*(labels.get(n, set()) for n in names))
        for made, read in LABEL_REPLACE.findall(expr):
            if read not in known:
                problems.append(f"{where}: label_replace reads {read!r}, which no metric has")
            known.add(made)
        for group in GROUPING.findall(expr):
            for label in filter(None, (part.strip() for part in group.split(","))):
                if label not in known:
                    problems.append(f"{where}: no metric of the expression has label {label!r}")
    assert not problems, "\n".join(problems)
